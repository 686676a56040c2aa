"""Running the real ``nodewright`` command line against the rig, as a user would: a process
of its own with the rig's kubeconfig."""

from __future__ import annotations

import asyncio
import sys
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
