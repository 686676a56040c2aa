"""``make sandbox-real`` (``nodewright sandbox --real-node``) does what the README says: the
example package sysctl-tuning runs in real containers on one real node and changes that
node's throwaway host root, where the sandbox says to look, and Ctrl-C leaves nothing."""

from __future__ import annotations

import asyncio
import re
import signal
import uuid
from pathlib import Path

import pytest

from tests.e2e.test_sandbox import _nothing_left, _read_until, _rig_dirs, _sandbox

pytestmark = [pytest.mark.timeout(600), pytest.mark.rig]


def _changed(conf: str, swappiness: str, logs: str) -> tuple[str, str, list[Path]]:
    """The node's sysctl file, its (throwaway) vm.swappiness and the package's log files."""
    return (
        Path(conf).read_text(),
        Path(swappiness).read_text().strip(),
        [p for p in Path(logs).rglob("*") if p.is_file()],
    )


async def test_the_real_node_sandbox_runs_the_example_package_for_real() -> None:
    mark, before = uuid.uuid4().hex, _rig_dirs()
    proc = await _sandbox(
        "--real-node", "--gpu-nodes", "3", "--cpu-nodes", "1", "--stage-duration", "1s",
        "--timeout", "300", mark=mark,
    )  # fmt: skip
    assert proc.stdout is not None
    text = ""
    try:
        text = await _read_until(proc.stdout, "Press Ctrl-C", 420)
        assert "NodeWright sysctl-tuning is Ready on the real node" in text, text
        assert "NodeWright gpu-node-tuning is Ready" in text, text
        # What the package changed, where the sandbox says to look (the node's host root).
        conf = re.search(r"cat (\S+/etc/sysctl\.d/90-nodewright-sysctl-tuning\.conf)", text)
        swappiness = re.search(r"cat (\S+/proc/sys/vm/swappiness)", text)
        logs = re.search(r"ls -R (\S+/var/log/nodewright/sysctl-tuning)", text)
        assert conf, text
        assert swappiness, text
        assert logs, text
        sysctl, value, files = await asyncio.to_thread(
            _changed, conf.group(1), swappiness.group(1), logs.group(1)
        )
        assert "vm.swappiness = 10" in sysctl, sysctl
        assert value == "10", value
        assert files, "the package's stage logs on the node"
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        rest, _ = await asyncio.wait_for(proc.communicate(), 240)
        text += rest.decode(errors="replace")
    assert proc.returncode == 0, text
    await _nothing_left(mark, before)
