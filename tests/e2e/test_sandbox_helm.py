"""``nodewright sandbox --helm`` (``make sandbox-helm``) installs NodeWright as a user does,
and a user can follow it with what it prints: the official NATS chart's three JetStream
servers and the NodeWright chart's pods on two real nodes, the example rolled out by those
pods, the status page and ``nodewright events`` as printed, and Ctrl-C leaves nothing."""

from __future__ import annotations

import asyncio
import re
import shlex
import signal
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest

from nodewright.rig import helminstall
from tests.e2e.test_sandbox import _nothing_left, _read_until, _rig_dirs, _sandbox

# Two real nodes, three NATS servers and ten service pods: minutes on 2 cores.
pytestmark = [pytest.mark.timeout(900), pytest.mark.rig]


def _fetch(url: str, token: str) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as r:
        return r.status, r.read().decode(errors="replace")


async def test_the_helm_sandbox_runs_the_installed_chart_and_says_how_to_follow_it() -> None:
    helminstall.find_nats_chart()  # the vendored chart is there (fails with what to do)
    mark, before = uuid.uuid4().hex, _rig_dirs()
    proc = await _sandbox(
        "--helm", "--gpu-nodes", "3", "--cpu-nodes", "1", "--timeout", "400", mark=mark
    )
    assert proc.stdout is not None
    text = ""
    try:
        text = await _read_until(proc.stdout, "Press Ctrl-C", 700)
        assert "NodeWright installed in" in text, text
        assert "three NATS servers run as pods on the rig's two REAL nodes" in text, text
        assert "NodeWright gpu-node-tuning is Ready" in text, text
        # The real nodes are the cluster's own here, no package's target (--real-node's).
        assert "sysctl-tuning" not in text, text
        # The page, at a status pod's address, with the token the sandbox printed.
        page = re.search(r"(http://\d+\.\d+\.\d+\.\d+:8080)/ui/\?token=(\S+)", text)
        assert page, text
        base, token = page.groups()
        status, body = await asyncio.to_thread(_fetch, f"{base}/ui/", token)
        assert status == 200, body[:300]
        status, body = await asyncio.to_thread(_fetch, f"{base}/ui/api/overview", token)
        assert status == 200, body[:300]
        assert "gpu-node-tuning" in body, body[:300]
        # `nodewright events` as printed, as the reader user, replays the rollout's events.
        command = re.search(r"\.venv/bin/nodewright (events --server nats://\S+ .*--all)", text)
        assert command, text
        events = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "nodewright.cli", *shlex.split(command.group(1)),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        assert events.stdout is not None
        try:
            seen = await _read_until(events.stdout, "gpu-node-tuning", 60)
        finally:
            events.send_signal(signal.SIGINT)
            await asyncio.wait_for(events.wait(), 30)
        assert "gpu-node-tuning" in seen, seen
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        rest, _ = await asyncio.wait_for(proc.communicate(), 240)
        text += rest.decode(errors="replace")
    assert proc.returncode == 0, text
    assert "Stopping the sandbox" in text
    logs = re.search(r"Stopped\. Logs: (\S+)", text)
    assert logs, text
    pods = Path(logs.group(1)) / "nodewright-pods.log"
    assert "nodewright-scheduler" in pods.read_text(), "the pods' logs were kept"
    await _nothing_left(mark, before)


async def test_the_helm_sandbox_refuses_real_node_and_a_missing_chart_in_one_line() -> None:
    mark = uuid.uuid4().hex
    proc = await _sandbox("--helm", "--real-node", mark=mark)
    out, _ = await proc.communicate()
    assert proc.returncode == 2, out.decode()
    assert "cannot be combined" in out.decode()
    assert "Traceback" not in out.decode()
    proc = await _sandbox("--helm", "--nats-chart", "/nonexistent/nats.tgz", mark=mark)
    out, _ = await proc.communicate()
    lines = out.decode().strip().splitlines()
    assert proc.returncode == 1, out.decode()
    assert len(lines) == 1, lines
    assert "helm pull nats" in lines[0], lines
    assert "--nats-chart" in lines[0], lines
