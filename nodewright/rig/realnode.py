"""Real nodes beside the kwok nodes: containerd 2.x, kubelet and kube-proxy, really running pods.

A real node lives in namespaces the rig creates and removes, so that nothing on the machine
outside the rig's own directories, namespaces and links changes:

* **network**: one bridge per rig on the machine (``nwrig<slot>``, the only address the
  control plane adds besides loopback) and, per node, a network namespace ``nwrig<slot>n<i>``
  joined to it by a veth pair. The API server listens on the bridge address; pods reach it
  through the ``kubernetes`` Service (kube-proxy, iptables mode, inside the node's namespace),
  with everything leaving a pod masqueraded to the node's address. The node namespace has no
  default route: nothing a pod does can leave the machine.
* **mounts**: a *holder* process (``ip netns exec`` + ``sleep``) owns the node's mount
  namespace, in which ``/`` is made shared (kubelet's HostToContainer mounts need it) and the
  node's own ``run``, ``var-lib`` and ``var-log`` directories are bind-mounted over ``/run``,
  ``/var/lib`` and ``/var/log``. containerd, kubelet and kube-proxy enter it with nsenter, so
  every path they hard-code lands in the rig's directory.
* **cgroups**: kubelet's cgroup root ``/nwrig<slot>n<i>`` in every v1 hierarchy.
* **the host root**: a copy of the test root filesystem (debootstrap minbase) under the rig
  directory; package pods mount it instead of ``/`` (``NODEWRIGHT_PODS_HOST_ROOT``), so the
  agent chroots into it and never changes this machine. Its ``reboot`` and ``systemctl`` are
  stand-ins that record their calls, and its ``/proc/sys`` is plain files.

Every slot records what it made in a ledger (``<cache>/slots/<slot>.json``); stop removes
it all, and a later start first removes what a crashed run's ledger lists (and any
``nwrig*`` namespace or link that no live ledger claims).

Images come from ``scripts/build-images.sh`` (``index.tsv``) and are imported into each
node's containerd before kubelet starts. Any other image is pulled as on a cluster: each
node's containerd reaches the rig's registry (:attr:`Network.registry`, plain HTTP on the
bridge, served by the rig) through a ``hosts.toml`` of its own. A component that fails
raises :class:`RigError` naming it and the condition, with the tail of its log. Building
binaries or images is not this module's job.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

REAL_NODE_BINARIES = ("kubelet", "kube-proxy")
REGISTRY_PORT = 5000
"""The rig's registry listens here on the bridge address, which is the rig's own."""
REGISTRY_HOSTS = "certs.d"
"""containerd's registry host directory in a node's directory: ``<host:port>/hosts.toml``."""
RUNTIME_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr")
Runtime = Literal["containerd", "containerd-1.6"]
"""``containerd``: 2.2 from the Go module proxy (image volumes); ``containerd-1.6``:
Debian's package (no image volumes), for the runtime many fleets still have."""


@dataclass(frozen=True)
class NodeSpec:
    """One real node the rig should start."""

    labels: Mapping[str, str] = field(default_factory=dict)
    runtime: Runtime = "containerd"


def runtime_dir(bin_dir: Path, runtime: Runtime) -> Path:
    """Where a runtime's containerd, shim and ctr are (scripts/build-rig.sh puts them)."""
    return bin_dir if runtime == "containerd" else bin_dir.parent / "containerd-1.6" / "usr" / "bin"


HOST_TOOLS = ("ip", "nsenter", "runc", "iptables")
CNI_DIR = Path("/usr/lib/cni")
CNI_PLUGINS = ("bridge", "host-local", "loopback")
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_V1 = ("cpu", "cpuacct", "cpuset", "memory", "pids", "devices", "freezer", "blkio", "systemd")
CGROUP_ALL = (*CGROUP_V1, "unified")
"""Hierarchies kubelet may create its cgroups in (on this hybrid machine: the v1 ones, and
the v2 mount that carries only hugetlb); all are cleaned up."""
PAUSE_IMAGE = "nodewright.local/rig/pause:1"
LABEL_REAL = "nodewright.nvidia.com/rig-node"
"""Label of the rig's real nodes (value ``real``); kwok nodes never carry it."""
HOST_ROOT = "/var/lib/nodewright-host"
"""Where every real node's throwaway host root is, inside the node's mount namespace (the
node's own ``var-lib`` directory is its /var/lib): one NODEWRIGHT_PODS_HOST_ROOT for all."""
MAX_SLOT = 50
PREFIX = "nwrig"


class NodeStartError(RuntimeError):
    """Raised inside this module; the rig turns it into a RigError naming the component."""

    def __init__(self, component: str, problem: str, log: Path | None = None) -> None:
        super().__init__(problem)
        self.component = component
        self.problem = problem
        self.log = log


# ---- addresses ----


@dataclass(frozen=True)
class Network:
    """The addresses of one rig's real-node network (derived from its slot, 1..MAX_SLOT)."""

    slot: int

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.slot}"

    @property
    def host_ip(self) -> str:
        """The machine's end: the API server (and NATS, for pods) listen here."""
        return f"10.213.{self.slot}.1"

    @property
    def registry(self) -> str:
        """``host:port`` of the rig's OCI registry on the bridge: a package pushed there is
        pulled by the real nodes as a cluster's nodes pull from theirs."""
        return f"{self.host_ip}:{REGISTRY_PORT}"

    @property
    def service_cidr(self) -> str:
        return f"10.{100 + self.slot}.0.0/16"

    @property
    def kubernetes_service_ip(self) -> str:
        return f"10.{100 + self.slot}.0.1"

    @property
    def dns_service_ip(self) -> str:
        """The cluster DNS Service (kube-system/kube-dns), as kubelet tells pods."""
        return f"10.{100 + self.slot}.0.10"

    def node_ip(self, index: int) -> str:
        return f"10.213.{self.slot}.{10 + index}"

    def pod_cidr(self, index: int) -> str:
        return f"10.{150 + self.slot}.{index}.0/24"

    def netns(self, index: int) -> str:
        return f"{PREFIX}{self.slot}n{index}"

    def host_veth(self, index: int) -> str:
        return f"{PREFIX}{self.slot}v{index}"


# ---- commands ----


def run(argv: list[str], *, check: bool = True, component: str = "real-node") -> str:
    """Run a setup command; a failure raises NodeStartError quoting the command's stderr."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NodeStartError(
            component, f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}"
        )
    return done.stdout


def _quiet(argv: list[str]) -> None:
    subprocess.run(argv, capture_output=True, check=False)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _kill_all(pids: Iterator[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _cgroup_dirs(path: Path) -> list[Path]:
    """``path`` and every cgroup below it, leaves first; cgroups vanishing meanwhile (kubelet
    and containerd remove their own as containers stop) are skipped, not errors."""
    found: list[Path] = []
    for root, _dirs, _files in os.walk(path, topdown=False, onerror=lambda _exc: None):
        found.append(Path(root))
    return found


def _cgroup_pids(path: Path) -> Iterator[int]:
    for directory in _cgroup_dirs(path):
        with contextlib.suppress(OSError, ValueError):
            yield from (int(line) for line in (directory / "cgroup.procs").read_text().split())


def _remove_cgroup(path: Path) -> None:
    """Kill what is left in ``path`` (a v1 cgroup directory) and remove it, leaves first."""
    if not path.is_dir():
        return
    for _ in range(50):
        pids = list(_cgroup_pids(path))
        if not pids:
            break
        _kill_all(iter(pids))
        time.sleep(0.1)
    for directory in _cgroup_dirs(path):
        with contextlib.suppress(OSError):
            directory.rmdir()


def _netns_pids(name: str) -> Iterator[int]:
    out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    yield from (int(p) for p in out.stdout.split() if p.isdigit())


# ---- the ledger of what a slot made ----


@dataclass
class Ledger:
    """What one rig's real nodes made on the machine, written before each thing is made."""

    path: Path
    pid: int = field(default_factory=os.getpid)
    netns: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)

    def save(self) -> None:
        doc = {"pid": self.pid, "netns": self.netns, "links": self.links, "cgroups": self.cgroups}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.path)

    def add(self, kind: str, name: str) -> None:
        items: list[str] = getattr(self, kind)
        if name not in items:
            items.append(name)
            self.save()

    @classmethod
    def load(cls, path: Path) -> Ledger:
        doc = json.loads(path.read_text() or "{}")
        return cls(
            path=path,
            pid=int(doc.get("pid", 0)),
            netns=list(doc.get("netns", [])),
            links=list(doc.get("links", [])),
            cgroups=list(doc.get("cgroups", [])),
        )

    def clean(self) -> None:
        """Remove everything listed, processes first; safe to call twice."""
        for name in self.netns:
            _kill_all(_netns_pids(name))
        for name in self.cgroups:
            for hierarchy in CGROUP_ALL:
                _remove_cgroup(CGROUP_ROOT / hierarchy / name)
        for name in self.netns:
            _quiet(["ip", "netns", "delete", name])
        for name in self.links:
            _quiet(["ip", "link", "delete", name])
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        _release_netns_dir(self.path.parent)


NETNS_DIR = Path("/run/netns")
_NETNS_MARK = "netns-dir-is-ours"


def _is_mount(path: Path) -> bool:
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    return any(line.split()[4] == str(path) for line in mounts)


def _claim_netns_dir(slots_dir: Path) -> None:
    """`ip netns add` makes /run/netns a mount point the first time; remember when it was us
    who made it, so the last rig to go can undo it."""
    if not _is_mount(NETNS_DIR):
        (slots_dir / _NETNS_MARK).touch()


def _release_netns_dir(slots_dir: Path) -> None:
    mark = slots_dir / _NETNS_MARK
    if not mark.exists() or run(["ip", "netns", "list"], check=False).split():
        return
    _quiet(["umount", str(NETNS_DIR)])
    with contextlib.suppress(OSError):
        NETNS_DIR.rmdir()
    mark.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def claim_slot(slots_dir: Path) -> Ledger:
    """Clean up after crashed rigs, then claim the lowest free slot (an O_EXCL ledger file)."""
    slots_dir.mkdir(parents=True, exist_ok=True)
    live: set[str] = set()
    for path in sorted(slots_dir.glob("*.json")):
        try:
            ledger = Ledger.load(path)
        except (OSError, ValueError):
            ledger = Ledger(path=path, pid=0)
        if _alive(ledger.pid):
            live.update(ledger.netns + ledger.links)
        else:
            ledger.clean()
    # Namespaces and links of a run that died before its ledger named them.
    for name in run(["ip", "netns", "list"], check=False).split():
        if name.startswith(PREFIX) and name not in live:
            _kill_all(_netns_pids(name))
            _quiet(["ip", "netns", "delete", name])
    for line in run(["ip", "-o", "link", "show"], check=False).splitlines():
        parts = line.split(":")
        name = parts[1].strip().split("@")[0] if len(parts) > 1 else ""
        if name.startswith(PREFIX) and name not in live:
            _quiet(["ip", "link", "delete", name])
    _claim_netns_dir(slots_dir)
    for slot in range(1, MAX_SLOT + 1):
        path = slots_dir / f"{slot}.json"
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            continue
        os.close(fd)
        ledger = Ledger(path=path)
        ledger.save()
        return ledger
    raise NodeStartError("real-node", f"all {MAX_SLOT} rig slots in {slots_dir} are in use")


def slot_of(ledger: Ledger) -> int:
    return int(ledger.path.stem)


# ---- preflight ----


def preflight(bin_dir: Path, runtimes: set[Runtime]) -> None:
    """Say exactly what is missing before anything is made."""
    if os.geteuid() != 0:
        raise NodeStartError("real-node", "needs root (network and mount namespaces, cgroups)")
    wanted = [bin_dir / name for name in REAL_NODE_BINARIES] + [
        runtime_dir(bin_dir, r) / name for r in sorted(runtimes) for name in RUNTIME_BINARIES
    ]
    for path in wanted:
        if not os.access(path, os.X_OK):
            raise NodeStartError(
                path.name,
                f"binary not found at {path}; build it with scripts/build-rig.sh "
                "k8s containerd containerd-1.6",
            )
    for tool in HOST_TOOLS:
        if not any(os.access(Path(d) / tool, os.X_OK) for d in os.environ["PATH"].split(":")):
            raise NodeStartError(
                "real-node",
                f"{tool} is not installed; run scripts/install-host-deps.sh "
                "(Debian packages iproute2, util-linux, runc, iptables)",
            )
    for plugin in CNI_PLUGINS:
        if not os.access(CNI_DIR / plugin, os.X_OK):
            raise NodeStartError(
                "real-node",
                f"CNI plugin {CNI_DIR / plugin} is missing; install the Debian package "
                "containernetworking-plugins (scripts/install-host-deps.sh)",
            )
    missing = [h for h in ("cpu", "memory", "pids", "cpuset") if not (CGROUP_ROOT / h).is_dir()]
    if missing:
        raise NodeStartError(
            "real-node",
            f"cgroup v1 hierarchies {', '.join(missing)} are not mounted under {CGROUP_ROOT} "
            "(this rig drives kubelet with the cgroupfs driver on cgroup v1)",
        )


# ---- images ----


@dataclass(frozen=True)
class Image:
    name: str
    ref: str
    archive: Path


def image_index(cache: Path) -> dict[str, Image]:
    """The images scripts/build-images.sh exported, by name (empty when none were built)."""
    index = cache / "index.tsv"
    images: dict[str, Image] = {}
    if index.is_file():
        for line in index.read_text().splitlines():
            name, ref, archive = line.split("\t")
            if Path(archive).is_file():
                images[name] = Image(name=name, ref=ref, archive=Path(archive))
    return images


def default_image_cache() -> Path:
    override = os.environ.get("NODEWRIGHT_IMAGE_CACHE")
    if override:
        return Path(override)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nodewright-images"


# ---- configuration files ----


def containerd_config(node_dir: Path, runtime: Runtime = "containerd") -> str:
    """containerd's configuration (2.x: config version 3; 1.6: version 2). Paths are the
    standard ones: inside the node's mount namespace they are the node's own directories."""
    if runtime == "containerd-1.6":
        return _containerd_16_config(node_dir)
    return f"""version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[ttrpc]
  address = "/run/containerd/containerd.sock.ttrpc"

[metrics]
  address = ""

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{node_dir / REGISTRY_HOSTS}"

[plugins."io.containerd.cri.v1.runtime"]
  # Root here cannot lower oom_score_adj ("Permission denied"): without this every sandbox
  # fails with "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{CNI_DIR}"]
    conf_dir = "{node_dir / "cni"}"
    max_conf_num = 1
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "runc"
        SystemdCgroup = false
"""


def _containerd_16_config(node_dir: Path) -> str:
    return f"""version = 2
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{node_dir / REGISTRY_HOSTS}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_DIR}"
    conf_dir = "{node_dir / "cni"}"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "runc"
        SystemdCgroup = false
"""


def registry_hosts(address: str) -> str:
    """The ``hosts.toml`` by which a node's containerd (2.x and 1.6 alike) pulls from the
    registry at ``address`` over plain HTTP, as a cluster's nodes are told of a mirror."""
    return f"""server = "http://{address}"

[host."http://{address}"]
  capabilities = ["pull", "resolve"]
"""


def cni_config(pod_cidr: str) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": "nwrig",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                # Pods' traffic leaves the node as the node's address: the machine has no
                # route to pod addresses and must not get one.
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            }
        ],
    }


def kubelet_config(*, node_ip: str, cgroup_root: str, ca_file: Path, dns_ip: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node_ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        # Only the API server (a client certificate from the rig's CA) may call the kubelet.
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        # This machine has cgroup v1, and root here cannot lower its own OOM score.
        "failCgroupV1": False,
        "failSwapOn": False,
        "oomScoreAdj": 0,
        # Pods resolve through the rig's CoreDNS only: nothing upstream is reachable.
        "resolvConf": "",
        "clusterDNS": [dns_ip],
        "clusterDomain": "cluster.local",
        "serializeImagePulls": False,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # A busy test machine must not have its pods evicted for pressure it does not have.
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "nodeStatusUpdateFrequency": "5s",
        "nodeStatusReportFrequency": "30s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "maxPods": 110,
        "shutdownGracePeriod": "0s",
        "featureGates": {"ImageVolume": True},
        "protectKernelDefaults": False,
        "localStorageCapacityIsolation": True,
    }


def kube_proxy_config(
    *, kubeconfig: Path, node: str, node_ip: str, cluster_cidr: str
) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node,
        "bindAddress": node_ip,
        "clusterCIDR": cluster_cidr,
        "mode": "iptables",
        "iptables": {"masqueradeAll": True},
        # Leave the kernel's (machine-wide) conntrack settings alone.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "metricsBindAddress": "127.0.0.1:10249",
        "healthzBindAddress": "127.0.0.1:10256",
    }


# ---- one real node ----

Spawn = Callable[..., Any]
"""Rig._spawn: (name, argv, env=) -> Process."""


@dataclass
class RealNode:
    """One real node. Made by :class:`RealNodes`; start() and stop() are its lifecycle."""

    name: str
    index: int
    network: Network
    ledger: Ledger
    work_dir: Path
    bin_dir: Path
    host_root: Path
    labels: dict[str, str] = field(default_factory=dict)
    runtime: Runtime = "containerd"
    holder_pid: int = 0
    processes: dict[str, Any] = field(default_factory=dict)
    """By role: holder, containerd, kubelet, kube-proxy (rig Process objects)."""

    @property
    def netns(self) -> str:
        return self.network.netns(self.index)

    @property
    def ip(self) -> str:
        return self.network.node_ip(self.index)

    @property
    def cgroup(self) -> str:
        return self.netns

    def enter(self, *argv: str) -> list[str]:
        """``argv`` run inside this node's network and mount namespaces."""
        return ["nsenter", f"--target={self.holder_pid}", "--mount", "--net", "--", *argv]

    # ---- setup steps, each recorded in the ledger before it is made ----------------------

    def make_network(self) -> None:
        ns, veth = self.netns, self.network.host_veth(self.index)
        self.ledger.add("netns", ns)
        run(["ip", "netns", "add", ns])
        self.ledger.add("links", veth)
        run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
        run(["ip", "link", "set", veth, "master", self.network.bridge, "up"])
        run(["ip", "-n", ns, "addr", "add", f"{self.ip}/24", "dev", "eth0"])
        run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        run(["ip", "-n", ns, "link", "set", "lo", "up"])
        # Pods' packets to Service addresses are routed through the node: forwarding inside
        # the node's own namespace only (the machine's setting is untouched).
        run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"])

    def make_cgroups(self) -> None:
        self.ledger.add("cgroups", self.cgroup)
        for hierarchy in CGROUP_V1:
            root = CGROUP_ROOT / hierarchy
            if not root.is_dir():
                continue
            path = root / self.cgroup
            path.mkdir(exist_ok=True)
            if hierarchy == "cpuset":
                # A new v1 cpuset has no CPUs or memory nodes until given its parent's.
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    (path / knob).write_text((root / knob).read_text())

    def write_files(self, *, api_url: str, ca_file: Path, token: str, proxy_token: str) -> None:
        d = self.work_dir
        for sub in ("run", "var-lib", "var-log", "cni"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        _write(d / "containerd.toml", containerd_config(d, self.runtime))
        registry = self.network.registry
        _write(d / REGISTRY_HOSTS / registry / "hosts.toml", registry_hosts(registry))
        _write(
            d / "cni" / "10-nwrig.conflist",
            json.dumps(cni_config(self.network.pod_cidr(self.index))),
        )
        for who, tok in (("kubelet", token), ("kube-proxy", proxy_token)):
            _write(d / f"{who}.kubeconfig", yaml.safe_dump(_kubeconfig(api_url, ca_file, tok)))
        kubelet = kubelet_config(
            node_ip=self.ip,
            cgroup_root=f"/{self.cgroup}",
            ca_file=ca_file,
            dns_ip=self.network.dns_service_ip,
        )
        _write(d / "kubelet.yaml", yaml.safe_dump(kubelet))
        proxy = kube_proxy_config(
            kubeconfig=d / "kube-proxy.kubeconfig",
            node=self.name,
            node_ip=self.ip,
            cluster_cidr=self.network.pod_cidr(self.index),
        )
        _write(d / "kube-proxy.yaml", yaml.safe_dump(proxy))

    def start_holder(self, spawn: Spawn) -> None:
        d = self.work_dir
        ready = d / "holder.ready"
        script = (
            "set -e; mount --make-rshared /; "
            f"mount --bind {d / 'run'} /run; mount --bind {d / 'var-lib'} /var/lib; "
            f"mount --bind {d / 'var-log'} /var/log; echo ok > {ready}; exec sleep infinity"
        )
        # Not `ip netns exec`: it mounts a sysfs of its own over /sys, which hides the cgroup
        # hierarchies kubelet needs ("failed to find cgroup mounts").
        proc = spawn(
            f"{self.name}-namespace",
            [
                "nsenter",
                f"--net=/run/netns/{self.netns}",
                "--",
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                script,
            ],
        )
        self.processes["holder"] = proc
        _wait_for(lambda: ready.exists(), proc=proc, what="its mount namespace", timeout=20)
        self.holder_pid = int(proc.popen.pid)

    @property
    def runtime_bin(self) -> Path:
        return runtime_dir(self.bin_dir, self.runtime)

    def start_containerd(self, spawn: Spawn) -> None:
        # containerd finds its shim on PATH: the runtime's own first.
        env = {"PATH": f"{self.runtime_bin}:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"}
        proc = spawn(
            f"{self.name}-containerd",
            self.enter(
                str(self.runtime_bin / "containerd"),
                "--config",
                str(self.work_dir / "containerd.toml"),
            ),
            env=env,
        )
        self.processes["containerd"] = proc
        sock = self.work_dir / "run" / "containerd" / "containerd.sock"
        _wait_for(
            lambda: sock.exists() and self.ctr("version", check=False) != "",
            proc=proc,
            what="serving on its socket",
            timeout=60,
        )

    def ctr(self, *args: str, check: bool = True) -> str:
        return run(
            self.enter(
                str(self.runtime_bin / "ctr"),
                "--address",
                "/run/containerd/containerd.sock",
                "-n",
                "k8s.io",
                *args,
            ),
            check=check,
            component=f"{self.name}-containerd",
        )

    def import_images(self, images: list[Image]) -> None:
        for image in images:
            self.ctr("images", "import", str(image.archive))
        present = self.ctr("images", "list", "-q")
        missing = [i.ref for i in images if i.ref not in present.split()]
        if missing:
            raise NodeStartError(
                f"{self.name}-containerd", f"images not imported: {', '.join(missing)}"
            )

    def start_kubelet(self, spawn: Spawn) -> None:
        labels = ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
        proc = spawn(
            f"{self.name}-kubelet",
            self.enter(
                str(self.bin_dir / "kubelet"),
                f"--config={self.work_dir / 'kubelet.yaml'}",
                f"--kubeconfig={self.work_dir / 'kubelet.kubeconfig'}",
                f"--hostname-override={self.name}",
                f"--node-ip={self.ip}",
                "--root-dir=/var/lib/kubelet",
                f"--node-labels={labels}",
                "--v=1",
            ),
            env={"PATH": f"{self.bin_dir}:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"},
        )
        self.processes["kubelet"] = proc

    def start_kube_proxy(self, spawn: Spawn) -> None:
        proc = spawn(
            f"{self.name}-kube-proxy",
            self.enter(
                str(self.bin_dir / "kube-proxy"),
                f"--config={self.work_dir / 'kube-proxy.yaml'}",
                "--v=1",
            ),
            env={"PATH": "/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"},
        )
        self.processes["kube-proxy"] = proc

    def import_archive(self, archive: Path) -> None:
        """Load one more image (an OCI or docker archive) into the node's containerd."""
        self.ctr("images", "import", str(archive))

    def reset_host_root(self, base: Path) -> None:
        """Replace the node's host root with a fresh copy (between tests: no pod uses it)."""
        from nodewright.rig import hostroot

        subprocess.run(["rm", "-rf", str(self.host_root)], check=True)
        hostroot.prepare(self.host_root, base=base)

    def power_off(self) -> str:
        """The first half of a reboot, as far as a node can go down here: kubelet and
        kube-proxy stop, every container and containerd are killed (nothing keeps running
        on a rebooting machine), and the boot ID the node reports once back is set (as in
        :meth:`simulate_reboot`). What a disk keeps stays: /var/lib (images, kubelet's pod
        directories) and the host root; /run is not emptied (containerd recovers from the
        state of its dead shims, as after a crash). The node's namespaces stay. Where a node
        lifecycle controller runs (``Rig.start_node_lifecycle``), the node then goes
        NotReady and is tainted unreachable. Returns the new boot ID."""
        for role in ("kube-proxy", "kubelet"):
            self.processes.pop(role).stop(timeout=10)
        for hierarchy in CGROUP_ALL:
            _remove_cgroup(CGROUP_ROOT / hierarchy / self.cgroup)
        self.processes.pop("containerd").stop(timeout=5)
        _kill_all(pid for pid in _netns_pids(self.netns) if pid != self.holder_pid)
        return self._next_boot_id()

    def power_on(self, spawn: Spawn) -> None:
        """The second half: containerd, kubelet and kube-proxy start again, as at boot."""
        self.make_cgroups()
        self.start_containerd(spawn)
        self.start_kubelet(spawn)
        self.start_kube_proxy(spawn)

    def _next_boot_id(self) -> str:
        boot_id = str(uuid.uuid4())
        path = self.work_dir / "boot_id"
        path.write_text(boot_id + "\n")
        run(self.enter("mount", "--bind", str(path), "/proc/sys/kernel/random/boot_id"))
        return boot_id

    def simulate_reboot(self, spawn: Spawn) -> str:
        """What a reboot changes that NodeWright observes: the node's boot ID. A new ID is
        bind-mounted over the kernel's in the node's mount namespace and kubelet restarted
        to report it; pods' containers see the real kernel's (a real reboot is impossible
        here: the agent would reboot this machine). Returns the new boot ID."""
        boot_id = self._next_boot_id()
        self.processes.pop("kubelet").stop(timeout=10)
        self.start_kubelet(spawn)
        return boot_id

    def stop(self) -> None:
        """Stop kubelet and kube-proxy, then every container and containerd, then the holder."""
        for role in ("kube-proxy", "kubelet"):
            if role in self.processes:
                self.processes.pop(role).stop(timeout=10)
        # Containers are gone with their cgroups; shims and containerd with the namespace.
        for hierarchy in CGROUP_ALL:
            _remove_cgroup(CGROUP_ROOT / hierarchy / self.cgroup)
        _kill_all(_netns_pids(self.netns))
        for role in ("containerd", "holder"):
            if role in self.processes:
                self.processes.pop(role).stop(timeout=5)


COREFILE = """.:53 {
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
}
"""
"""Cluster names only: there is no upstream to forward to (nothing off the machine)."""


def coredns_manifests(*, image: str, ip: str, node: str) -> str:
    """CoreDNS as a cluster runs it (ServiceAccount, RBAC, Deployment, the kube-dns Service),
    on the real nodes, preferably ``node``."""
    meta = {"namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}}
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "coredns", **meta}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "system:coredns"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:coredns"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:coredns",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "coredns", **meta},
            "data": {"Corefile": COREFILE},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "coredns", **meta},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"k8s-app": "kube-dns"}},
                "template": {
                    "metadata": {"labels": {"k8s-app": "kube-dns"}},
                    "spec": {
                        "serviceAccountName": "coredns",
                        # Scheduled, not pinned (nodeName): a drain of its node evicts it and
                        # the scheduler puts it elsewhere (or leaves it Pending); a pinned pod
                        # came back to the cordoned node at once, and the drain never ended.
                        "nodeSelector": {LABEL_REAL: "real"},
                        "affinity": {
                            "nodeAffinity": {
                                "preferredDuringSchedulingIgnoredDuringExecution": [
                                    {
                                        "weight": 1,
                                        "preference": {
                                            "matchFields": [
                                                {
                                                    "key": "metadata.name",
                                                    "operator": "In",
                                                    "values": [node],
                                                }
                                            ]
                                        },
                                    }
                                ]
                            }
                        },
                        "priorityClassName": "system-cluster-critical",
                        "dnsPolicy": "Default",
                        "containers": [
                            {
                                "name": "coredns",
                                "image": image,
                                "imagePullPolicy": "IfNotPresent",
                                "args": ["-conf", "/etc/coredns/Corefile"],
                                "ports": [
                                    {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                                    {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
                                ],
                                "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}},
                                "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns"}],
                            }
                        ],
                        "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", **meta},
            "spec": {
                "clusterIP": ip,
                "selector": {"k8s-app": "kube-dns"},
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
                ],
            },
        },
    ]
    return yaml.safe_dump_all(docs)


def _kubeconfig(api_url: str, ca_file: Path, token: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "rig", "cluster": {"server": api_url, "certificate-authority": str(ca_file)}}
        ],
        "users": [{"name": "node", "user": {"token": token}}],
        "contexts": [{"name": "rig", "context": {"cluster": "rig", "user": "node"}}],
        "current-context": "rig",
    }


def _wait_for(probe: Callable[[], bool], *, proc: Any, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise NodeStartError(
                proc.name, f"exited with code {proc.popen.returncode} before {what}", proc.log
            )
        with contextlib.suppress(OSError, NodeStartError):
            if probe():
                return
        time.sleep(0.2)
    raise NodeStartError(proc.name, f"not {what} after {timeout:.0f}s", proc.log)


# ---- the set of real nodes of one rig ----


@dataclass
class RealNodes:
    """The real nodes of one rig and the bridge they share.

    Lifecycle, driven by the rig: :meth:`prepare` before the API server starts (it needs
    the bridge address to listen on and the nodes' tokens), :meth:`start` once the control
    plane is up, :meth:`stop` (idempotent) when the rig stops.
    """

    specs: tuple[NodeSpec, ...]
    bin_dir: Path
    work_dir: Path
    slots_dir: Path
    images: list[Image]
    host_root_base: Path | None = None
    ledger: Ledger | None = None
    network: Network | None = None
    nodes: list[RealNode] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)

    def prepare(self, *, new_token: Callable[[], str]) -> Network:
        preflight(self.bin_dir, {spec.runtime for spec in self.specs})
        self.ledger = claim_slot(self.slots_dir)
        self.network = Network(slot_of(self.ledger))
        bridge = self.network.bridge
        self.ledger.add("links", bridge)
        run(["ip", "link", "add", bridge, "type", "bridge"])
        run(["ip", "addr", "add", f"{self.network.host_ip}/24", "dev", bridge])
        run(["ip", "link", "set", bridge, "up"])
        for index, spec in enumerate(self.specs):
            name = f"real-{index + 1}"
            node_dir = self.work_dir / f"node-{name}"
            self.nodes.append(
                RealNode(
                    name=name,
                    index=index + 1,
                    network=self.network,
                    ledger=self.ledger,
                    work_dir=node_dir,
                    bin_dir=self.bin_dir,
                    host_root=node_dir / "var-lib" / HOST_ROOT.removeprefix("/var/lib/"),
                    labels={LABEL_REAL: "real", **spec.labels},
                    runtime=spec.runtime,
                )
            )
            self.tokens[name] = new_token()
        self.tokens["kube-proxy"] = new_token()
        return self.network

    def token_lines(self) -> list[str]:
        """Lines for the API server's token file: each kubelet as its node, kube-proxy."""
        lines = [
            f'{self.tokens[n.name]},system:node:{n.name},node-{n.name},"system:nodes"'
            for n in self.nodes
        ]
        lines.append(f"{self.tokens['kube-proxy']},system:kube-proxy,kube-proxy,")
        return lines

    def start(
        self,
        *,
        spawn: Spawn,
        api_url: str,
        ca_file: Path,
        is_ready: Callable[[str], bool],
        timeout_s: float,
    ) -> None:
        from nodewright.rig import hostroot  # the test root filesystem is built on first use

        base = self.host_root_base or hostroot.build_base()
        for node in self.nodes:
            node.make_network()
        self._route_pods()
        for node in self.nodes:
            hostroot.prepare(node.host_root, base=base)
            node.make_cgroups()
            node.write_files(
                api_url=api_url,
                ca_file=ca_file,
                token=self.tokens[node.name],
                proxy_token=self.tokens["kube-proxy"],
            )
            node.start_holder(spawn)
            node.start_containerd(spawn)
            node.import_images(self.images)
            node.start_kubelet(spawn)
            node.start_kube_proxy(spawn)
        for node in self.nodes:
            kubelet = node.processes["kubelet"]
            _wait_for(
                functools.partial(is_ready, node.name),
                proc=kubelet,
                what="Ready (node condition)",
                timeout=timeout_s,
            )

    def _route_pods(self) -> None:
        """Each node's pod network is reachable from the other nodes (a pod reaching a Service
        whose pod is elsewhere) and from the machine (the API server calling a webhook's pod:
        it runs with --enable-aggregator-routing). All routes are on the rig's own links and
        namespaces, and go with them."""
        assert self.network is not None
        for node in self.nodes:
            cidr, via = self.network.pod_cidr(node.index), node.ip
            run(["ip", "route", "add", cidr, "via", via, "dev", self.network.bridge])
            for other in self.nodes:
                if other is not node:
                    run(["ip", "-n", other.netns, "route", "add", cidr, "via", via, "dev", "eth0"])

    def deploy_dns(self, kubectl: Callable[[str], None]) -> None:
        """CoreDNS for the cluster (kube-system/kube-dns at the address kubelet gives pods),
        on the first real node; ``kubectl`` applies a manifest."""
        assert self.network is not None
        dns = next((i for i in self.images if i.name == "coredns"), None)
        if dns is None:
            return
        kubectl(
            coredns_manifests(
                image=dns.ref, ip=self.network.dns_service_ip, node=self.nodes[0].name
            )
        )

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()
        if self.ledger is not None:
            self.ledger.clean()
            self.ledger = None
