"""Where things live on the host, and how a host path is turned into a path the agent can use.

The agent sees the host's ``/`` at ``host_root`` (``/host``). Every host path here is given
as the host sees it (``/var/lib/nodewright/...``), which is also what steps see after the
chroot, and is mapped into the container with :func:`resolve_in_root`: that follows
symlinks the way the host kernel would, so an absolute symlink on the host (``/var/lib ->
/data/lib``) stays inside the host root instead of escaping into the container's own
filesystem.

Host layout (``<state>`` = ``/var/lib/nodewright`` and ``<logs>`` = ``/var/log/nodewright``
by default, ``<cr>`` = the NodeWright CR name)::

    <state>/<cr>/packages/<pkg>/<version>/   staged copy: config.json, steps/, config/,
                                              node-metadata/
    <state>/<cr>/data/<pkg>/                  the package's own persistent data (steps write)
    <state>/<cr>/flags/<pkg>/<version>/apply/<step>.<hash>.json   idempotence flags
    <state>/<cr>/history/<pkg>.json           version history
    <state>/<cr>/interrupts/<id>/<n>-<what>.json   interrupt command flags
    <state>/<cr>/locks/<pkg>.lock, interrupt.lock
    <logs>/<cr>/<pkg>/<version>/<mode>/<step>/<UTC time>.log
    <logs>/<cr>/interrupts/<id>/<n>-<what>/<UTC time>.log

This module computes paths only; it creates nothing and runs nothing.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Final

MAX_SYMLINKS: Final = 40
"""Linux's own limit (MAXSYMLINKS) for one path resolution."""


def resolve_in_root(root: Path, host_path: str) -> Path:
    """Map an absolute host path to a path under ``root``, following symlinks as the host does.

    Absolute symlink targets restart at ``root`` and ``..`` never climbs above it, like
    ``openat2(RESOLVE_IN_ROOT)``. Components that do not exist yet are kept as they are, so
    the result can be created. Raises ``OSError(ELOOP)`` on a symlink loop.
    """
    if not host_path.startswith("/"):
        raise ValueError(f"host path must be absolute: {host_path!r}")
    pending = list(PurePosixPath(host_path).parts[1:])
    resolved: list[str] = []
    hops = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = root.joinpath(*resolved, part)
        try:
            mode = os.lstat(candidate).st_mode
        except FileNotFoundError:
            resolved.append(part)
            continue
        except NotADirectoryError:
            resolved.append(part)
            continue
        if not stat.S_ISLNK(mode):
            resolved.append(part)
            continue
        hops += 1
        if hops > MAX_SYMLINKS:
            raise OSError(errno.ELOOP, "too many levels of symbolic links", host_path)
        target = os.readlink(candidate)
        if target.startswith("/"):
            resolved = []
        pending = list(PurePosixPath(target).parts[1 if target.startswith("/") else 0 :]) + pending
    return root.joinpath(*resolved)


@dataclass(frozen=True, slots=True)
class HostLayout:
    """Host paths of one CR's state and logs; both the host view and the container view."""

    host_root: Path
    """Where the host's ``/`` is mounted in the agent's container."""
    state_dir: str
    """Host path of the state root (without the CR)."""
    log_dir: str
    """Host path of the log root (without the CR)."""
    cr: str

    # Host views: what a step (chrooted on the host) sees.

    def cr_state(self) -> str:
        return f"{self.state_dir.rstrip('/')}/{self.cr}"

    def package_root(self, package: str, version: str) -> str:
        return f"{self.cr_state()}/packages/{package}/{version}"

    def packages_of(self, package: str) -> str:
        return f"{self.cr_state()}/packages/{package}"

    def package_data(self, package: str) -> str:
        return f"{self.cr_state()}/data/{package}"

    def flags_dir(self, package: str, version: str | None = None) -> str:
        base = f"{self.cr_state()}/flags/{package}"
        return base if version is None else f"{base}/{version}"

    def history_file(self, package: str) -> str:
        return f"{self.cr_state()}/history/{package}.json"

    def interrupt_dir(self, interrupt_id: str) -> str:
        return f"{self.cr_state()}/interrupts/{interrupt_id}"

    def lock_file(self, name: str) -> str:
        return f"{self.cr_state()}/locks/{name}.lock"

    def step_log_dir(self, package: str, version: str, mode: str, step: str) -> str:
        return f"{self.log_dir.rstrip('/')}/{self.cr}/{package}/{version}/{mode}/{step}"

    def interrupt_log_dir(self, interrupt_id: str, command: str) -> str:
        return f"{self.log_dir.rstrip('/')}/{self.cr}/interrupts/{interrupt_id}/{command}"

    # Container view: where the agent itself reads and writes.

    def local(self, host_path: str) -> Path:
        """The container path of a host path (symlinks resolved inside the host root)."""
        return resolve_in_root(self.host_root, host_path)
