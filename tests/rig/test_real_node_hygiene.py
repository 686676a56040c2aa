"""The rig's real nodes leave the machine as they found it: every namespace, link, cgroup and
mount they make is theirs and goes on stop; a crashed run's leftovers are removed by the next
start; a node that cannot start says which condition failed. Each test starts a rig of its
own (the session's real-node rig is in tests/e2e/realnode)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodewright.rig import Rig, RigError
from nodewright.rig.realnode import CGROUP_ALL, CGROUP_ROOT, PREFIX, NodeSpec

# They start rigs of their own and compare the whole machine: never beside another rig.
pytestmark = [pytest.mark.timeout(300), pytest.mark.rig]

RIG_DIR = re.compile(r"/dev/shm/nodewright-rig-[^/ ]+")


def _run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout


@dataclass(frozen=True)
class Machine:
    """What the machine has that a rig could touch, with the rig's own things left out."""

    links: frozenset[str]
    addresses: frozenset[str]
    routes: frozenset[str]
    netns: frozenset[str]
    iptables: tuple[str, ...]
    mounts: frozenset[str]
    cgroups: frozenset[str]
    hosts: str
    forwarding: str

    @classmethod
    def now(cls) -> Machine:
        def ours(text: str) -> bool:
            return PREFIX in text or bool(RIG_DIR.search(text))

        mounts = {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}
        cgroups = {
            f"{h}/{p.name}"
            for h in CGROUP_ALL
            if (CGROUP_ROOT / h).is_dir()
            for p in (CGROUP_ROOT / h).iterdir()
            if p.is_dir()
        }
        rules = [line for line in _run("iptables-save").splitlines() if not line.startswith("#")]
        return cls(
            links=frozenset(
                line.split(":")[1].strip() for line in _run("ip", "-o", "link").splitlines()
            ),
            addresses=frozenset(_run("ip", "-o", "addr").splitlines()),
            routes=frozenset(_run("ip", "route", "show", "table", "all").splitlines()),
            netns=frozenset(_netns()),
            iptables=tuple(re.sub(r"\[\d+:\d+\]", "", r) for r in rules),
            mounts=frozenset(m for m in mounts if not ours(m)),
            cgroups=frozenset(c for c in cgroups if not ours(c)),
            hosts=Path("/etc/hosts").read_text(),
            forwarding=Path("/proc/sys/net/ipv4/ip_forward").read_text(),
        )

    def without_ours(self) -> Machine:
        """While a rig runs: its names, and the /run/netns mount `ip netns add` makes (the
        last rig to stop removes it when it made it), left out."""

        def drop(items: frozenset[str]) -> frozenset[str]:
            return frozenset(i for i in items if PREFIX not in i and i != "/run/netns")

        return Machine(
            links=drop(self.links),
            addresses=drop(self.addresses),
            routes=drop(self.routes),
            netns=drop(self.netns),
            iptables=self.iptables,
            mounts=drop(self.mounts),
            cgroups=self.cgroups,
            hosts=self.hosts,
            forwarding=self.forwarding,
        )


def _netns() -> list[str]:
    """Names of the network namespaces (`ip netns list` adds "(id: N)" to some)."""
    return [line.split()[0] for line in _run("ip", "netns", "list").splitlines() if line]


def _leftovers() -> list[str]:
    names = [n for n in _netns() if n.startswith(PREFIX)]
    names += [
        line.split(":")[1].strip()
        for line in _run("ip", "-o", "link").splitlines()
        if PREFIX in line.split(":")[1]
    ]
    names += [
        str(p) for h in CGROUP_ALL for p in (CGROUP_ROOT / h).glob(f"{PREFIX}*") if p.is_dir()
    ]
    return names


def test_a_real_node_rig_changes_nothing_outside_its_own_names_and_removes_those() -> None:
    before = Machine.now()
    rig = Rig(real_nodes=(NodeSpec(labels={"nodepool": "hygiene"}),))
    rig.start()
    try:
        during = Machine.now()
        assert rig.real is not None
        node = rig.real.nodes[0]
        # Its own names exist while it runs ...
        assert node.netns in during.netns
        assert rig.real.network is not None
        assert rig.real.network.bridge in during.links
        # ... and nothing else of the machine changed: no route, rule, mount, cgroup or
        # hosts line of anybody else's, forwarding as it was.
        assert during.without_ours() == before
    finally:
        rig.stop()
    assert Machine.now() == before
    assert _leftovers() == []
    assert not rig.dir.exists()


CRASHING_RIG = """
import sys, time
from nodewright.rig import Rig
from nodewright.rig.realnode import NodeSpec
rig = Rig(real_nodes=(NodeSpec(),))
rig.start()
node = rig.real.nodes[0]
# A container the crash will orphan: its shim outlives containerd.
print("STARTED", node.netns, rig.dir, flush=True)
time.sleep(600)
"""


def test_the_next_start_removes_what_a_crashed_rig_left() -> None:
    before = Machine.now()
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHING_RIG],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("STARTED"), line
    _, netns, rig_dir = line.split()
    os.kill(proc.pid, signal.SIGKILL)  # no stop(): the crash
    proc.wait()
    proc.stdout.close()
    # Its own processes die with it (the control plane, kubelet, containerd) ...
    deadline = time.monotonic() + 20
    while _processes_of(rig_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_of(rig_dir) == []
    # ... but the namespace, links, cgroups and work directory stay.
    assert netns in _netns(), "a crash leaves the namespace behind"
    assert Path(rig_dir).exists()

    rig = Rig(real_nodes=(NodeSpec(),))
    rig.start()  # cleans up first: the dead rig's ledger is read
    try:
        assert rig.real is not None
        live = {n.netns for n in rig.real.nodes}
        stale = [n for n in _leftovers() if not any(name in n for name in live)]
        stale = [n for n in stale if rig.real.network is None or rig.real.network.bridge not in n]
        assert stale == []
    finally:
        rig.stop()
    assert _leftovers() == []
    assert not Path(rig_dir).exists(), "the next start removed the dead rig's directory"
    assert Machine.now() == before


def _processes_of(rig_dir: str) -> list[str]:
    """Command lines naming ``rig_dir`` (every component's does) of processes alive now."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if rig_dir in cmdline:
                found.append(cmdline[:120])
    return found


def test_a_node_that_cannot_start_names_what_is_missing(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    real_bin = Rig().bin_dir
    for name in os.listdir(real_bin):
        if name != "kubelet":
            (bin_dir / name).symlink_to(real_bin / name)
    rig = Rig(bin_dir=bin_dir, real_nodes=(NodeSpec(),))
    with pytest.raises(RigError) as caught:
        rig.start()
    assert caught.value.component == "kubelet"
    assert "binary not found" in caught.value.problem
    assert "scripts/build-rig.sh" in caught.value.problem
    assert _leftovers() == []
