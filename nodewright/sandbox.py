"""``nodewright sandbox``: the whole system on this machine, on simulated nodes.

Starts the rig (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok,
nats-server) on loopback, installs the CRDs, creates simulated nodes (default 30
``nodepool=gpu`` + 10 ``nodepool=cpu``), starts the five services as processes, and prints
how to follow along — the kubeconfig, the rig's own kubectl (the version of the control
plane), the NATS URL, the status service's web page — before it applies the example
NodeWright (deploy/samples/nodewright-gpu-node-tuning.yaml). Then it shows the rollout live
until the NodeWright is Ready: the batches, which node is in which at what stage, the
budget and an estimate of the time left (``nodewright.liveview``; a terminal gets a live
table, a pipe or a file one line per change). It keeps running until Ctrl-C.

Stopping is the part that must not fail: Ctrl-C (SIGINT), SIGTERM or SIGHUP at any moment
stops every process the sandbox started and removes the rig's directory (in /dev/shm) after
copying the logs out, whatever stdout is connected to. Output never raises: a reader that
went away (``make sandbox | tee log`` and Ctrl-C kills tee too) turns later output into
nothing instead of an exception that skipped the clean-up. Every process is started from
the main thread, so each also gets the kernel's parent-death signal (a child started from a
worker thread gets it when that thread ends, so it was not armed), and the clean-up ignores
further signals until it is done.

Nodes and package runs are SIMULATED by kwok: nothing on this machine is changed. With
``--real-node`` the rig also starts one REAL node (containerd + kubelet in namespaces of its
own: ``nodewright.rig.realnode``), and the example package sysctl-tuning
(deploy/samples/nodewright-sysctl-tuning.yaml) runs on it in real containers, changing the
node's throwaway host root only.

With ``--helm`` the services are installed as a user installs them (``nodewright.rig.
helminstall``): the rig starts two REAL nodes (``nodepool=system``), the official NATS chart
puts three JetStream servers on them, and ``helm install`` of deploy/chart/nodewright runs
the services there as pods (two replicas each), reaching the API server and NATS through
Services. The example NodeWright then rolls out across the kwok nodes as above.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final, Protocol

import msgspec

from nodewright import liveview, manifests
from nodewright.rig import Rig, RigError, helminstall, nodes
from nodewright.rig.fleet import Fleet
from nodewright.rig.realnode import NodeSpec
from shared import pods
from shared.config import KubeSettings
from shared.kube import connect, path_of

GPU_LABELS: Final = {"nodepool": "gpu", "nvidia.com/gpu.present": "true"}
CPU_LABELS: Final = {"nodepool": "cpu"}
EXAMPLE: Final = "nodewright-gpu-node-tuning.yaml"
REAL_EXAMPLE: Final = "nodewright-sysctl-tuning.yaml"
REAL_LABELS: Final = {"nodepool": "real"}
NAMESPACE: Final = "nodewright-system"
STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Screen:
    """stdout and stderr that never raise: once the reader is gone, output goes nowhere."""

    def __init__(self) -> None:
        self.gone = False
        self.tty = sys.stdout.isatty()

    def lost(self) -> None:
        self.gone = True
        # Later writes (ours, rich's, the interpreter's last flush) go to /dev/null instead
        # of failing again.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)

    def say(self, text: str = "", *, err: bool = False) -> None:
        if self.gone and not err:
            return
        stream = sys.stderr if err else sys.stdout
        try:
            print(text, file=stream, flush=True)
        except OSError:  # BrokenPipeError, or EIO from a terminal that was closed
            if not err:
                self.lost()


def follow_along(rig: Rig, fleet: Fleet, name: str) -> str:
    """How to watch the rollout with the usual tools while it runs."""
    ep = rig.endpoints
    kubectl = rig.bin_dir / "kubectl"
    nats_cli = rig.bin_dir / "nats"
    status = fleet.replicas.get("status") or []
    page = (
        f"http://127.0.0.1:{status[0].health_port}/ui/?token={ep.token}"
        if status
        else "(the status service is not running)"
    )
    nats_line = (
        f"  {nats_cli} --server {ep.nats_url} sub 'nw.ev.>' --stream NODEWRIGHT --all"
        "   (CloudEvents)"
        if nats_cli.exists()
        else "  (the nats CLI: scripts/build-rig.sh natscli builds it into the same directory)"
    )
    what = (
        "the gpu/cpu nodes and their package runs are SIMULATED by kwok; the real node runs "
        "sysctl-tuning in real containers, changing its throwaway host root, never this machine"
        if rig.real is not None
        else "nodes and package runs are SIMULATED by kwok; nothing on this machine changes"
    )
    return f"""
Follow along ({what}):
  export KUBECONFIG={ep.kubeconfig}
  {kubectl} get nodewright {name} -w        (the rig's kubectl, the control plane's version)
  {kubectl} get nodes -L nodepool
  {kubectl} get events -A
  .venv/bin/nodewright node list --nodewright {name}
  kubectl nodewright plan {name}            (with .venv/bin on PATH: the kubectl plugin)
Follow the event stream:
  .venv/bin/nodewright events --server {ep.nats_url} --all
{nats_line}
The live page of the status service (the token is the sandbox's admin token):
  {page}
Logs of every component, while it runs: {rig.dir}
"""


class Services(Protocol):
    """Where the five services run: processes on this machine, or pods installed by Helm."""

    def start(self) -> None: ...
    def check_alive(self) -> None: ...
    def follow_along(self, name: str) -> str: ...
    def stop(self) -> None: ...


class ProcessServices:
    """The five services as processes of this machine (the default)."""

    def __init__(self, rig: Rig, fleet: Fleet) -> None:
        self.rig, self.fleet = rig, fleet

    def start(self) -> None:
        # From the main thread, on purpose: see the module docstring (parent-death signal).
        self.fleet.start_all()

    def check_alive(self) -> None:
        self.fleet.check_alive()

    def follow_along(self, name: str) -> str:
        return follow_along(self.rig, self.fleet, name)

    def stop(self) -> None:
        self.fleet.stop(timeout_s=15.0)


class HelmServices:
    """The services as pods on the rig's real nodes, installed with Helm (``--helm``). The
    kubelets restart a pod that fails; the rig's stop takes the nodes and their pods."""

    def __init__(self, rig: Rig, nats_chart: Path) -> None:
        self.rig, self.nats_chart = rig, nats_chart
        self.nats: helminstall.NatsInstall | None = None
        self.status_ip = ""

    def install(self, screen: Screen) -> None:
        t0 = time.monotonic()
        screen.say(
            f"Installing NATS with its official chart ({self.nats_chart.name}): three "
            "JetStream servers on the real nodes ..."
        )
        self.nats = helminstall.install_nats(self.rig, self.nats_chart, self.rig.dir / "nats-users")
        t1 = time.monotonic()
        screen.say(
            f"NATS up in {t1 - t0:.1f}s. Installing NodeWright with Helm "
            "(deploy/chart/nodewright, two replicas of each service) ..."
        )
        helminstall.install_nodewright(self.rig)
        screen.say(f"NodeWright installed in {time.monotonic() - t1:.1f}s.")
        listed = json.loads(
            helminstall.run_tool(
                self.rig, "kubectl", "get", "pods", "-n", NAMESPACE, "-o", "json",
                "-l", "app.kubernetes.io/component=status",
            )
        )  # fmt: skip
        ips = [p["status"].get("podIP", "") for p in listed["items"]]
        self.status_ip = next((ip for ip in ips if ip), "")

    def start(self) -> None:
        """Nothing to start: :meth:`install` did, before the rollout."""

    def check_alive(self) -> None:
        """Nothing to check: a pod that fails is restarted by its kubelet, visibly."""

    def stop(self) -> None:
        """Nothing to stop (the rig's stop takes the real nodes and every pod on them), but
        the pods' logs go into the rig's directory first, to be kept with its own."""
        for namespace, selector, log in (
            (NAMESPACE, "app.kubernetes.io/name=nodewright", "nodewright-pods.log"),
            (helminstall.NATS_NAMESPACE, helminstall.NATS_PODS, "nats-pods.log"),
        ):
            with contextlib.suppress(RigError, OSError):
                text = helminstall.run_tool(
                    self.rig, "kubectl", "logs", "-n", namespace, "-l", selector,
                    "--all-containers", "--prefix", "--tail=-1", "--max-log-requests=20",
                    "--request-timeout=10s",
                )  # fmt: skip
                (self.rig.dir / log).write_text(text)

    def follow_along(self, name: str) -> str:
        ep = self.rig.endpoints
        kubectl = self.rig.bin_dir / "kubectl"
        helm = self.rig.bin_dir / "helm"
        events = "  (NATS is not installed)"
        if self.nats is not None:
            reader = self.nats.secrets.get(f"{helminstall.USERS_SECRET}-reader", {})
            password_file = self.rig.dir / "nats-reader-password"
            password_file.write_text(reader.get("password", ""))
            password_file.chmod(0o600)
            server = self.nats.urls[0] if self.nats.urls else "nats://<a NATS pod IP>:4222"
            events = (
                f"  .venv/bin/nodewright events --server {server} --user "
                f"{reader.get('user', '')} --password-file {password_file} --all"
            )
        page = (
            f"http://{self.status_ip}:8080/ui/?token={ep.token}"
            if self.status_ip
            else "(no status pod has an address yet: kubectl get pods -n nodewright-system)"
        )
        return f"""
Follow along (NodeWright and three NATS servers run as pods on the rig's two REAL nodes,
installed with Helm; the gpu/cpu nodes and their package runs are SIMULATED by kwok):
  export KUBECONFIG={ep.kubeconfig}
  {kubectl} get pods -n {NAMESPACE} -o wide
  {kubectl} get pods -n {helminstall.NATS_NAMESPACE} -o wide
  {kubectl} get nodewright {name} -w
  {kubectl} logs -n {NAMESPACE} deploy/nodewright-scheduler
  {helm} list -A
  .venv/bin/nodewright node list --nodewright {name}
Follow the event stream (as the reader user `nodewright nats-users` made):
{events}
The live page of the status service (a status pod's address; the sandbox's admin token):
  {page}
Logs of the rig's own components, while it runs: {self.rig.dir}
"""


def _ready(raw: dict[str, Any]) -> bool:
    conditions = (raw.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def real_node_hint(rig: Rig) -> str:
    """Where to see what the example package changed on the real node (--real-node)."""
    assert rig.real is not None
    node = rig.real.nodes[0]
    kubectl = rig.bin_dir / "kubectl"
    return f"""
The REAL node {node.name} ran sysctl-tuning in real containers (containerd): it changed the
node's throwaway host root, never this machine:
  cat {node.host_root}/etc/sysctl.d/90-nodewright-sysctl-tuning.conf
  cat {node.host_root}/proc/sys/vm/swappiness
  ls -R {node.host_root}/var/log/nodewright/sysctl-tuning
  {kubectl} get pods -n {NAMESPACE} -o wide --field-selector spec.nodeName={node.name}

To try a package of your own on it, push its image to the rig's registry, {rig.registry}
(plain HTTP; the real node pulls from it), and target the node (docs/packages.md, "Trying a
package on a real node"):
  buildah bud -t {rig.registry}/my-package:1.0.0 DIR
  buildah push --tls-verify=false {rig.registry}/my-package:1.0.0
  then a NodeWright with `nodeSelectors: {{matchLabels: {{nodepool: real}}}}` and a package
  `image: {rig.registry}/my-package`, `version: 1.0.0`
"""


class Live:
    """The rollout as it goes: a live table in a terminal, a line per change elsewhere."""

    def __init__(self, screen: Screen) -> None:
        self.screen = screen
        self.last = ""
        self._live: Any = None
        if screen.tty:
            from rich.console import Console
            from rich.live import Live as RichLive

            self._live = RichLive(console=Console(), auto_refresh=False, transient=False)
            self._live.start()

    def show(self, snap: liveview.Snapshot, left: float | None, elapsed: float) -> None:
        if self._live is not None and not self.screen.gone:
            try:
                self._live.update(liveview.panel(snap, left, elapsed), refresh=True)
            except OSError:
                self.screen.lost()
            return
        # A pipe or a file gets the summary and the batches in flight whenever they change.
        first, *rest = liveview.lines(snap, left)
        text = "\n".join([first, *rest])
        if text != self.last:
            self.screen.say("\n".join([f"  [{elapsed:6.1f}s] {first}", *rest]))
            self.last = text

    def close(self) -> None:
        if self._live is not None:
            with contextlib.suppress(OSError):
                self._live.stop()
            self._live = None


async def _rollout(
    rig: Rig, services: Services, screen: Screen, opts: Options, stop: asyncio.Event
) -> bool:
    async with connect(KubeSettings(kubeconfig=str(rig.endpoints.kubeconfig))) as kube:
        await manifests.install_crds(kube)
        await manifests.ensure_namespace(kube, NAMESPACE)
        names = await nodes.create_nodes(
            kube, [f"gpu-node-{i:03d}" for i in range(opts.gpu_nodes)], labels=GPU_LABELS
        )
        names += await nodes.create_nodes(
            kube, [f"cpu-node-{i:03d}" for i in range(opts.cpu_nodes)], labels=CPU_LABELS
        )
        await nodes.wait_ready(kube, names)
        screen.say(f"Created {opts.gpu_nodes} simulated GPU nodes and {opts.cpu_nodes} CPU nodes.")
        if stop.is_set():
            return False
        if isinstance(services, ProcessServices):
            screen.say(
                "Starting the five services (scheduler, drainer, executor, validator, status) ..."
            )
        services.start()
        example = manifests.sample(EXAMPLE)
        name = example["metadata"]["name"]
        screen.say(services.follow_along(name))
        if stop.is_set():
            return False
        await manifests.apply(kube, example)
        screen.say(f"Applied NodeWright {name} (deploy/samples/{EXAMPLE}); rolling out:")
        # The real node's own NodeWright, beside the simulated one (--real-node).
        real = manifests.sample(REAL_EXAMPLE) if opts.real_node else None
        real_ready = real is None
        if real is not None:
            await manifests.apply(kube, real)
            screen.say(
                f"Applied NodeWright {real['metadata']['name']} (deploy/samples/{REAL_EXAMPLE}) "
                "for the real node."
            )
        t0 = time.monotonic()
        clock = liveview.Clock(started=t0)
        live = Live(screen)
        try:
            while not stop.is_set():
                services.check_alive()
                rig.check_alive()
                raw_cr = await kube.get(f"{manifests.NODEWRIGHTS}/{name}")
                listed = await kube.get(path_of(plural="nodes"))
                stage_pods = await kube.get(
                    path_of(plural="pods", namespace=NAMESPACE),
                    labelSelector=pods.selector("stage"),
                )
                snap = liveview.snapshot(raw_cr, listed["items"], stage_pods["items"])
                now = time.monotonic()
                clock.observe(snap, now)
                live.show(snap, clock.left_s(snap, now), now - t0)
                if real is not None and not real_ready:
                    real_name = real["metadata"]["name"]
                    raw_real = await kube.get(f"{manifests.NODEWRIGHTS}/{real_name}")
                    if _ready(raw_real):
                        real_ready = True
                        screen.say(
                            f"NodeWright {real_name} is Ready on the real node after "
                            f"{now - t0:.1f}s."
                        )
                if snap.done and _ready(raw_cr) and real_ready:
                    live.close()
                    screen.say(f"NodeWright {name} is Ready after {now - t0:.1f}s.")
                    return True
                if now - t0 > opts.timeout_s:
                    live.close()
                    screen.say(
                        f"NodeWright {name} not Ready after {opts.timeout_s:.0f}s; logs: {rig.dir}"
                    )
                    return False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
        finally:
            live.close()
    return False


class Options(msgspec.Struct, frozen=True, kw_only=True):
    gpu_nodes: int = 30
    cpu_nodes: int = 10
    stage_duration: str = "2s"
    exit_when_ready: bool = False
    timeout_s: float = 900.0
    real_node: bool = False
    """--real-node: the real node's own NodeWright (sysctl-tuning) too. Not with --helm,
    whose real nodes are the cluster's own (NATS, NodeWright), not a package's target."""


async def _main(rig: Rig, services: Services, screen: Screen, opts: Options) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    try:
        ok = await _rollout(rig, services, screen, opts, stop)
        if stop.is_set():
            return 0
        if opts.real_node:
            screen.say(real_node_hint(rig))
        if opts.exit_when_ready:
            return 0 if ok else 1
        name = manifests.sample(EXAMPLE)["metadata"]["name"]
        screen.say(
            f"\nThe rollout is done; look around as above, e.g. "
            f"`{rig.bin_dir / 'kubectl'} --kubeconfig {rig.endpoints.kubeconfig} wait "
            f"--for=condition=Ready nodewright/{name}`."
        )
        screen.say("Press Ctrl-C to stop everything.")
        while not stop.is_set():
            try:
                services.check_alive()
                rig.check_alive()
            except RigError as exc:
                screen.say(f"sandbox: {exc}", err=True)
                return 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
        return 0 if ok else 1
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP stop the synchronous phases (starting the rig) as Ctrl-C does."""
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def save_logs(rig: Rig) -> Path | None:
    """Copy the rig's logs out of its directory (which goes, with etcd's data) to /tmp."""
    if rig.work_dir is None or not rig.work_dir.is_dir():
        return None
    logs = sorted(rig.work_dir.glob("*.log"))
    if not logs:
        return None
    target = Path(tempfile.mkdtemp(prefix="nodewright-sandbox-logs-", dir=tempfile.gettempdir()))
    for log in logs:
        with contextlib.suppress(OSError):
            shutil.copy2(log, target / log.name)
    return target


def run(
    *,
    gpu_nodes: int = 30,
    cpu_nodes: int = 10,
    stage_duration: str = "2s",
    exit_when_ready: bool = False,
    timeout_s: float = 900.0,
    real_node: bool = False,
    helm: bool = False,
    nats_chart: Path | None = None,
) -> int:
    opts = Options(
        gpu_nodes=gpu_nodes,
        cpu_nodes=cpu_nodes,
        stage_duration=stage_duration,
        exit_when_ready=exit_when_ready,
        timeout_s=timeout_s,
        real_node=real_node,
    )
    screen = Screen()
    services: Services
    installed: HelmServices | None = None
    if helm:
        try:
            chart = helminstall.find_nats_chart(nats_chart)
        except RigError as exc:
            screen.say(f"sandbox: {exc.problem}", err=True)
            return 1
        rig = Rig(
            keep_work_dir=False,
            real_nodes=helminstall.system_nodes(2),
            real_node_images=helminstall.IMAGES,
        )
        services = installed = HelmServices(rig, chart)
    else:
        # The directory goes at the end: etcd's data is throw-away, the logs are copied out.
        rig = Rig(
            keep_work_dir=False, real_nodes=(NodeSpec(labels=REAL_LABELS),) if real_node else ()
        )
        fleet = Fleet(
            rig,
            namespace=NAMESPACE,
            extra_env={"NODEWRIGHT_PODS_SIM_STAGE_DURATION": opts.stage_duration},
        )
        services = ProcessServices(rig, fleet)
    code = 1
    try:
        with _signals_interrupt():
            what = (
                "simulated nodes, two real nodes for NATS and NodeWright's pods"
                if helm
                else "simulated nodes, one real node"
                if real_node
                else "simulated nodes, nothing real"
            )
            screen.say(f"Starting a local control plane and NATS on loopback ({what}) ...")
            rig.start()
            up = "Control plane and two real nodes" if helm else "Control plane and NATS"
            screen.say(f"{up} up in {rig.timings['total']:.1f}s.")
            if installed is not None:
                # Synchronous, before the loop: Ctrl-C interrupts helm as it does the rig.
                installed.install(screen)
            code = asyncio.run(_main(rig, services, screen, opts))
    except KeyboardInterrupt:
        code = 0  # stopping is what Ctrl-C asks for; the clean-up below does it
    except RigError as exc:
        screen.say(f"sandbox: {exc}", err=True)
    except msgspec.ValidationError as exc:
        screen.say(f"sandbox: unexpected NodeWright content: {exc}", err=True)
    finally:
        # Nothing may interrupt the clean-up: a second Ctrl-C would leave processes behind.
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS}
        try:
            screen.say("Stopping the sandbox (every process it started) ...")
            services.stop()
            logs = save_logs(rig)
            rig.stop()
            screen.say(f"Stopped. Logs: {logs}" if logs else "Stopped.")
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return code
