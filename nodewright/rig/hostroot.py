"""A throwaway host root: the tree the agent chroots into when the "host" must not be this
machine (the agent tests, and the rig's real nodes, whose package pods mount it instead of
``/``: ``NODEWRIGHT_PODS_HOST_ROOT``).

It is a private copy of the test root filesystem built by ``scripts/build-test-rootfs.sh``
(debootstrap minbase, cached outside the repo) with:

* ``reboot`` and ``systemctl`` replaced by stand-ins that only record their arguments under
  :data:`CALLS_DIR` (chroot does not isolate the kernel: a real ``reboot`` would reboot this
  machine); :func:`install_stand_ins` refuses a tree with any other reboot-capable command on
  the agent's PATH;
* ``/proc/sys`` as plain files (:func:`seed_proc_sys`), so a package that tunes kernel
  parameters changes files in the tree, never this kernel.

Building the base tree is the script's job; this module copies and prepares it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CALLS_DIR = "/var/tmp/nodewright-test-calls"
"""Host path where the reboot/systemctl stand-ins record calls, one file per interrupt ID."""
STAND_IN_MARK = "Test stand-in"
STAND_IN = """#!/bin/sh
# {mark} for {name}: records the call; never touches the machine.
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
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The agent's PATH inside the chroot (agent.steps.HOST_PATH; checked equal by a test)."""
SYSCTLS = (
    "vm/swappiness",
    "vm/max_map_count",
    "net/core/somaxconn",
    "kernel/pid_max",
    "fs/inotify/max_user_watches",
)
"""Kernel parameters present as files in a prepared tree, with this machine's values."""


class HostRootError(RuntimeError):
    """The tree cannot be built or is unsafe to chroot into; the message says why."""


def build_base() -> Path:
    """The cached base tree (built on first use; needs root and the Debian mirror)."""
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "build-test-rootfs.sh")],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    if proc.returncode != 0:
        raise HostRootError(f"building the host root filesystem failed:\n{proc.stderr[-3000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def install_stand_ins(root: Path) -> None:
    """Recording ``reboot``/``systemctl``; refuse if a real reboot-capable command remains."""
    (root / CALLS_DIR.lstrip("/")).mkdir(parents=True, exist_ok=True)
    for name, where in (("reboot", "usr/local/sbin"), ("systemctl", "usr/local/bin")):
        path = root / where / name
        path.parent.mkdir(parents=True, exist_ok=True)
        body = STAND_IN.format(mark=STAND_IN_MARK, name=name, calls=CALLS_DIR)
        if name == "systemctl":
            body += SYSTEMCTL_EXTRA.format(calls=CALLS_DIR)
        path.write_text(body)
        path.chmod(0o755)
    for name in DANGEROUS:
        for directory in HOST_PATH.split(":"):
            candidate = root / directory.lstrip("/") / name
            if candidate.exists() or candidate.is_symlink():
                text = candidate.read_text(errors="replace") if candidate.is_file() else ""
                if STAND_IN_MARK not in text:
                    raise HostRootError(f"refusing to use {root}: {candidate} is a real {name}")


def seed_proc_sys(root: Path, keys: Iterable[str] = SYSCTLS) -> None:
    """Plain files for ``keys`` under the tree's /proc/sys, holding this machine's values
    (read only). The tree's /proc must not be a mount: writes must stay in the tree."""
    for key in keys:
        path = root / "proc" / "sys" / key
        path.parent.mkdir(parents=True, exist_ok=True)
        live = Path("/proc/sys") / key
        path.write_text(live.read_text() if live.exists() else "0\n")


def prepare(dest: Path, *, base: Path | None = None) -> Path:
    """A fresh prepared host root at ``dest`` (copied from ``base``, or the cached tree)."""
    source = base or build_base()
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", str(source), str(dest)], check=True)
    install_stand_ins(dest)
    seed_proc_sys(dest)
    return dest
