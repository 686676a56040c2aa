"""Fixtures of the agent tests: a real root filesystem to chroot into, and a Node per test.

The root filesystem is built once (``scripts/build-test-rootfs.sh``: debootstrap minbase,
or busybox when the mirror is unreachable) into a cache outside the repo, then copied once
per test session so tests never modify the cache. ``reboot`` and ``systemctl`` in it are
stand-ins that only record their arguments: chroot does not isolate the kernel, and the
fixture refuses to run if any real reboot-capable command is on the chroot's PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.steps import HOST_PATH
from tests.agent.harness import CALLS_DIR, REPO, Node

STAND_IN = """#!/bin/sh
# Test stand-in for {name}: records the call; never touches the machine.
log="{calls}/${{NODEWRIGHT_INTERRUPT_ID:-none}}.log"
echo "{name} $*" >> "$log"
"""
SYSTEMCTL_EXTRA = """case "$1" in
  list-units)
    printf '%s\\n' "containerd.service loaded active running containerd" \\
      "dbus.service loaded active running D-Bus System Message Bus" \\
      "systemd-journald.service loaded active running Journal Service" \\
      "kubelet.service loaded active running kubelet" ;;
  restart)
    # A test makes a unit fail by creating fail-<unit>.
    if [ -e "{calls}/fail-$2" ]; then echo "Job for $2 failed." >&2; exit 1; fi ;;
esac
exit 0
"""
DANGEROUS = ("reboot", "halt", "poweroff", "shutdown", "systemctl", "init", "telinit")


def _build_rootfs() -> Path:
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "build-test-rootfs.sh")],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"building the test root filesystem failed:\n{proc.stderr[-3000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def _install_stand_ins(root: Path) -> None:
    (root / CALLS_DIR.lstrip("/")).mkdir(parents=True, exist_ok=True)
    for name, where in (("reboot", "usr/local/sbin"), ("systemctl", "usr/local/bin")):
        path = root / where / name
        path.parent.mkdir(parents=True, exist_ok=True)
        body = STAND_IN.format(name=name, calls=CALLS_DIR)
        if name == "systemctl":
            body += SYSTEMCTL_EXTRA.format(calls=CALLS_DIR)
        path.write_text(body)
        path.chmod(0o755)
    # Every dangerous name reachable on the agent's chroot PATH must be a stand-in.
    for name in DANGEROUS:
        for directory in HOST_PATH.split(":"):
            candidate = root / directory.lstrip("/") / name
            if candidate.exists() or candidate.is_symlink():
                text = candidate.read_text(errors="replace") if candidate.is_file() else ""
                if "Test stand-in" not in text:
                    pytest.fail(f"refusing to run: {candidate} is a real {name} command")


@pytest.fixture(scope="session")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private copy of the test root filesystem, with recording stand-ins installed."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("the agent's chroot tests must run as root in CI")
        pytest.skip("the agent's chroot tests need root (chroot)")
    cached = _build_rootfs()
    root = tmp_path_factory.mktemp("host") / "root"
    subprocess.run(["cp", "-a", str(cached), str(root)], check=True)
    _install_stand_ins(root)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def node(rootfs: Path, tmp_path: Path) -> Node:
    """This test's node: the shared root filesystem with a CR name of its own."""
    return Node(rootfs=rootfs, workdir=tmp_path)
