"""The README's main command works: ``nodewright sandbox`` brings up everything, rolls the
example out on simulated nodes until Ready, says it is simulated, and cleans up."""

from __future__ import annotations

import asyncio
import sys

import pytest

# End-to-end runs take minutes on 2 cores; the suite-wide 120 s limit is for unit tests.
pytestmark = pytest.mark.timeout(600)


async def test_the_sandbox_rolls_the_example_out_and_stops_cleanly() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nodewright.cli",
        "sandbox",
        "--gpu-nodes",
        "6",
        "--cpu-nodes",
        "2",
        "--stage-duration",
        "1s",
        "--exit-when-ready",
        "--timeout",
        "240",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 400)
    text = out.decode()
    assert proc.returncode == 0, text
    assert "SIMULATED" in text
    assert "NodeWright gpu-node-tuning is Ready" in text
    assert "kubectl wait --for=condition=Ready nodewright/gpu-node-tuning" in text
    assert "nodewright events --server nats://127.0.0.1:" in text
    assert "Stopping the sandbox" in text
