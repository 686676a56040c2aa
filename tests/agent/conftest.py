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

from nodewright.rig import hostroot
from tests.agent.harness import Node


def _build_rootfs() -> Path:
    try:
        return hostroot.build_base()
    except hostroot.HostRootError as exc:
        pytest.fail(str(exc))


def _install_stand_ins(root: Path) -> None:
    try:
        hostroot.install_stand_ins(root)
    except hostroot.HostRootError as exc:
        pytest.fail(str(exc))


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
