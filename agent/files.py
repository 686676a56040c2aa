"""File operations on the host: atomic writes, staging a package, laying static files.

Every write the agent makes on the host goes through here so that (a) small state files
(flags, history) are replaced atomically -- a node that loses power mid-write keeps the old
file, never half a file -- and (b) paths are resolved inside the host root
(``layout.resolve_in_root``), so host symlinks cannot redirect a write into the container.

Not this module's job: deciding *which* files go where (``agent.modes``), or running steps.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from agent.errors import HostError, Terminated


def write_json_atomic(path: Path, document: object) -> None:
    """Write ``document`` as JSON to ``path`` via a temp file, fsync and rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=2, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def copy_tree(source: Path, dest: Path, *, file_mode: int | None = None, _depth: int = 0) -> int:
    """Copy ``source``'s contents into a fresh ``dest`` (must not exist), following symlinks.

    Names starting with ``..`` are skipped: a ConfigMap volume keeps its bookkeeping in
    ``..data`` and ``..<timestamp>`` entries (keys may not start with ``..``), and the real
    keys are symlinks into them.
    ``file_mode`` forces the mode of copied files (staged step files are made executable).
    Returns the number of files copied.
    """
    if _depth > 40:
        raise HostError(f"{source}: directories nested too deep (a symlink loop?)")
    dest.mkdir(parents=True)
    count = 0
    for entry in sorted(os.scandir(source), key=lambda e: e.name):
        if entry.name.startswith(".."):
            continue
        target = dest / entry.name
        if entry.is_dir():
            count += copy_tree(Path(entry.path), target, file_mode=file_mode, _depth=_depth + 1)
        elif entry.is_file():
            shutil.copyfile(entry.path, target)
            os.chmod(
                target,
                file_mode if file_mode is not None else stat.S_IMODE(os.stat(entry.path).st_mode),
            )
            count += 1
    return count


def replace_dir(build: Callable[[Path], object], dest: Path) -> None:
    """Build a directory with ``build(tmp)`` next to ``dest`` and swap it in for ``dest``.

    A crash leaves either the old or the new directory at ``dest`` (plus a stray temp
    directory that the next call removes), never a mix of both.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    for stale in dest.parent.glob(f".{dest.name}.*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.new.", dir=dest.parent))
    tmp.rmdir()
    try:
        build(tmp)
        if dest.exists():
            old = dest.parent / f".{dest.name}.old.{os.getpid()}"
            os.rename(dest, old)
            os.rename(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def lay_files(source: Path, resolve: Callable[[str], Path]) -> list[str]:
    """Copy the tree under ``source`` onto the host; ``resolve`` maps a host path to a local one.

    Directories are created as needed (existing ones keep their mode and owner); files are
    replaced atomically with the package's mode; symlinks are recreated as symlinks. A
    package file where the host has a directory is an error rather than a silent merge.
    Returns the host paths written, in order.
    """
    written: list[str] = []
    for dirpath, dirnames, filenames in os.walk(source):
        dirnames.sort()
        rel_dir = Path(dirpath).relative_to(source)
        host_dir = "/" if rel_dir == Path(".") else f"/{rel_dir.as_posix()}"
        for name in sorted(dirnames):
            src = Path(dirpath) / name
            if src.is_symlink():
                # os.walk does not descend into directory symlinks; lay the link itself.
                filenames.append(name)
                continue
            host_path = f"{host_dir.rstrip('/')}/{name}"
            local = resolve(host_path)
            if local.exists() and not local.is_dir():
                raise HostError(f"cannot lay directory {host_path}: the host has a file there")
            if not local.exists():
                local.mkdir(parents=True)
                os.chmod(local, stat.S_IMODE(os.lstat(src).st_mode))
        dirnames[:] = [d for d in dirnames if not (Path(dirpath) / d).is_symlink()]
        for name in sorted(filenames):
            src = Path(dirpath) / name
            host_path = f"{host_dir.rstrip('/')}/{name}"
            # A file follows a symlink the host has at its place (as cp would); a symlink
            # from the package replaces whatever is there.
            local = resolve(host_dir) / name if src.is_symlink() else resolve(host_path)
            if local.is_dir() and not local.is_symlink():
                raise HostError(f"cannot lay file {host_path}: the host has a directory there")
            local.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".nodewright", dir=local.parent)
            os.close(fd)
            try:
                if src.is_symlink():
                    os.unlink(tmp)
                    os.symlink(os.readlink(src), tmp)
                else:
                    shutil.copyfile(src, tmp)
                    os.chmod(tmp, stat.S_IMODE(os.stat(src).st_mode))
                os.replace(tmp, local)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            written.append(host_path)
    return written


@contextlib.contextmanager
def host_lock(
    path: Path, *, stop: Callable[[], bool], on_wait: Callable[[], None]
) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path``; wait (polling ``stop``) while another agent has it.

    Two agents must never work on the same package (or interrupt) of a node at once: a pod
    replaced while its predecessor is still terminating would otherwise race it. The lock
    dies with the process, so a killed agent never leaves it held.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        waited = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited:
                    on_wait()
                    waited = True
                if stop():
                    raise Terminated(
                        f"stopped by a termination signal while waiting for {path}"
                    ) from None
                time.sleep(0.5)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)
