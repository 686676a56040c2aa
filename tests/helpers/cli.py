"""Running the real ``nodewright`` command line against the rig, as a user would: a process
of its own with the rig's kubeconfig."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from nodewright.rig import Rig


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


async def cli(rig: Rig, *args: str) -> Result:
    """Run ``python -m nodewright.cli ARGS --kubeconfig <the rig's>``."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nodewright.cli",
        *args,
        "--kubeconfig",
        str(rig.endpoints.kubeconfig),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), err.decode())


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Children started inside get SIGINT's default action, as from a terminal, so that a
    test's ^C (``send_signal(SIGINT)``) reaches them as a user's would.

    A test run started in the background by a shell without job control (``make test &``
    in a script) has SIGINT ignored; its children inherit that across exec, and Python then
    installs no KeyboardInterrupt handler: ^C does nothing to a command that relies on it,
    as POSIX intends for background jobs. Handled signals are reset to their default at
    exec, hence a handler for the time of the start. Main thread only (signal.signal)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)
