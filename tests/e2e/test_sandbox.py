"""The README's main command works: ``nodewright sandbox`` brings up everything, says how to
follow along before the rollout starts (kubeconfig, the rig's own kubectl, NATS, the web
page), shows the rollout live (batches, nodes and stages, budget, time left), and stops
cleanly; and Ctrl-C stops every process it started and leaves nothing in /dev/shm, also
when its output goes through a pipe whose reader died (``make sandbox | tee log``: Ctrl-C
kills tee too)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import uuid
from pathlib import Path

import pytest

from nodewright.rig import default_bin_dir

# End-to-end runs take minutes on 2 cores; the suite-wide 120 s limit is for unit tests. It
# starts a rig of its own (the sandbox), so it is a rig test: `make unit` leaves it out.
pytestmark = [pytest.mark.timeout(600), pytest.mark.rig]

SHM = Path("/dev/shm")
MARK = "NW_SANDBOX_TEST_MARK"
"""An environment variable every process the sandbox starts inherits: how the test finds
them all, whatever became of their parents."""


def _rig_dirs() -> set[Path]:
    return set(SHM.glob("nodewright-rig-*")) if SHM.is_dir() else set()


def _marked(mark: str) -> list[str]:
    """The processes (pid and command) whose environment carries ``mark``."""
    found = []
    needle = f"{MARK}={mark}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle in (proc / "environ").read_bytes().split(b"\0"):
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (proc / "stat").read_text().split(") ", 1)[1].split()[0]
                if state != "Z":  # a zombie is gone, its parent just has not reaped it
                    found.append(f"{proc.name} {cmd[:160]}")
        except OSError:
            continue
    return found


def _kept(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 0


async def _sandbox(*args: str, mark: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nodewright.cli",
        "sandbox",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, MARK: mark},
        # Its own process group, like a shell job: the test signals only it.
        start_new_session=True,
    )


async def _nothing_left(mark: str, before: set[Path]) -> None:
    left: list[str] = []
    for _ in range(50):  # processes SIGKILLed at the end may take a moment to vanish
        left = _marked(mark)
        if not left:
            break
        await asyncio.sleep(0.2)
    assert left == [], "processes the sandbox started are still running"
    assert _rig_dirs() - before == set(), "the sandbox left its directory in /dev/shm"


async def test_the_sandbox_says_how_to_follow_along_shows_the_rollout_and_stops_cleanly() -> None:
    mark, before = uuid.uuid4().hex, _rig_dirs()
    proc = await _sandbox(
        "--gpu-nodes",
        "6",
        "--cpu-nodes",
        "2",
        "--stage-duration",
        "1s",
        "--exit-when-ready",
        "--timeout",
        "240",
        mark=mark,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 400)
    text = out.decode()
    assert proc.returncode == 0, text
    lines = text.splitlines()

    def index(fragment: str) -> int:
        return next(i for i, line in enumerate(lines) if fragment in line)

    applied = index("Applied NodeWright gpu-node-tuning")
    kubectl = str(default_bin_dir() / "kubectl")
    # Everything a newcomer needs to follow along is printed before the rollout starts.
    for fragment in (
        "export KUBECONFIG=",
        f"{kubectl} get nodewright gpu-node-tuning -w",
        "nodewright events --server nats://127.0.0.1:",
        "http://127.0.0.1:",
    ):
        assert index(fragment) < applied, fragment
    assert "SIMULATED" in text
    page = re.search(r"http://127\.0\.0\.1:\d+/ui/\?token=\S+", text)
    assert page, text
    # The live view (here a pipe: a line whenever it changes) shows batches, stages, budget
    # and, once a batch finished, how long is left.
    progress = lines[applied + 1 : index("is Ready after")]
    # 33 % of 6 nodes: a budget of 1.
    assert any(re.search(r"budget 1 \| __default__ batch \d", line) for line in progress), progress
    assert any(re.search(r"time left \d+s", line) for line in progress), progress
    assert any(re.match(r"  __default__ batch \d+: gpu-node-\d{3} ", line) for line in progress)
    assert "NodeWright gpu-node-tuning is Ready" in text
    assert "Stopping the sandbox" in text
    logs = re.search(r"Stopped\. Logs: (\S+)", text)
    assert logs, text
    assert _kept(Path(logs.group(1)) / "kube-apiserver.log"), "the logs were kept"
    assert not str(logs.group(1)).startswith(str(SHM))
    await _nothing_left(mark, before)


async def _read_until(stream: asyncio.StreamReader, fragment: str, timeout_s: float) -> str:
    seen: list[str] = []

    async def read() -> str:
        while True:
            line = (await stream.readline()).decode()
            if not line:
                raise AssertionError("the sandbox ended early:\n" + "".join(seen))
            seen.append(line)
            if fragment in line:
                return "".join(seen)

    return await asyncio.wait_for(read(), timeout_s)


@pytest.mark.parametrize(
    "moment",
    [
        pytest.param("rolling out:", id="during-the-rollout"),
        pytest.param("Control plane and NATS up", id="while-it-starts-the-services"),
    ],
)
async def test_ctrl_c_through_a_dead_pipe_stops_everything_it_started(moment: str) -> None:
    """`make sandbox 2>&1 | tee log`, Ctrl-C: the terminal's SIGINT also kills tee, so the
    sandbox's next output hits a broken pipe. It used to skip the clean-up there and leave
    kube-apiserver and the services running under pid 1, and its directory in /dev/shm."""
    mark, before = uuid.uuid4().hex, _rig_dirs()
    read_fd, write_fd = os.pipe()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nodewright.cli",
        "sandbox",
        "--stage-duration",
        "2s",
        "--timeout",
        "300",
        stdout=write_fd,
        stderr=write_fd,
        env={**os.environ, MARK: mark},
        start_new_session=True,
    )
    os.close(write_fd)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", buffering=0)
    )
    try:
        await _read_until(reader, moment, 240)
        assert _marked(mark), "the sandbox runs processes"
        # tee dies: the reading end of the pipe closes, then the SIGINT arrives.
        transport.close()
        proc.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(proc.wait(), 120)
    finally:
        transport.close()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert code == 0, f"exit code {code}"
    await _nothing_left(mark, before)
