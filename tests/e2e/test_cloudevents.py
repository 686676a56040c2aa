"""Every message on the event stream is a CloudEvent (NATS binding, binary content mode), as
the standard ``nats`` CLI (built from the Go module proxy by scripts/build-rig.sh) reads it
from a real rollout: the attributes are there and agree with the payload, the payload
validates against the schema ``dataschema`` names, ``Nats-Msg-Id`` still dedupes, and a
dead letter is a CloudEvent of its own. The payload is what it was, so every consumer reads
it as before (the rollout completing is that check)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import jsonschema
import nats
import pytest

from nodewright import manifests
from nodewright.rig import Rig, nodes
from shared import cloudevents, events, subjects
from shared.kube import Kube
from tests.e2e.conftest import Services, cr_ready
from tests.helpers.waiting import eventually

pytestmark = pytest.mark.timeout(600)

SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "events.v1.json"
SERVICES = ("scheduler", "drainer", "executor", "validator")


async def nats_cli(rig: Rig, *args: str) -> str:
    binary = rig.bin_dir / "nats"
    assert binary.exists(), "scripts/build-rig.sh natscli builds the nats CLI"
    proc = await asyncio.create_subprocess_exec(
        str(binary),
        "--server",
        rig.endpoints.nats_url,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


def headers_of(encoded: str) -> dict[str, str]:
    """The headers of a stored message (`nats stream get --json`: the NATS/1.0 block, base64)."""
    block = base64.b64decode(encoded).decode()
    lines = block.split("\r\n")
    assert lines[0].startswith("NATS/1.0")
    return dict(line.split(": ", 1) for line in lines[1:] if line)


async def _stored(rig: Rig) -> list[dict[str, Any]]:
    info = json.loads(await nats_cli(rig, "stream", "info", "NODEWRIGHT", "--json"))
    first, last = info["state"]["first_seq"], info["state"]["last_seq"]
    out = []
    for seq in range(first, last + 1):
        got = json.loads(await nats_cli(rig, "stream", "get", "NODEWRIGHT", str(seq), "--json"))
        out.append(
            {
                "subject": got["subject"],
                "headers": headers_of(got["hdrs"]),
                "data": base64.b64decode(got["data"]),
            }
        )
    return out


async def test_the_nats_cli_reads_every_stream_message_as_a_cloudevent(
    rig: Rig, cluster: Kube, services: Services
) -> None:
    kapi = cluster
    names = await nodes.create_nodes(
        kapi, [f"gpu-node-{i:03d}" for i in range(3)], labels={"nodepool": "gpu"}
    )
    await nodes.wait_ready(kapi, names)
    await asyncio.to_thread(services.fleet.start_all)
    example = manifests.sample("nodewright-gpu-node-tuning.yaml")
    await manifests.apply(kapi, example)
    await eventually(
        lambda: cr_ready(kapi, example["metadata"]["name"]), timeout_s=240, what="Ready"
    )
    # A message no consumer can decode: the status service dead-letters it.
    nc = await nats.connect(rig.endpoints.nats_url)
    try:
        bad = subjects.event(cr="gpu-node-tuning", node="gpu-node-000", kind="stage.failed")
        await nc.jetstream().publish(bad, b"{not json", stream="NODEWRIGHT")
    finally:
        await nc.close()

    async def dead_letter() -> list[dict[str, Any]]:
        return [m for m in await _stored(rig) if m["subject"].startswith(subjects.DEAD_LETTERS)]

    await eventually(dead_letter, timeout_s=60, what="a dead letter")
    stored = await _stored(rig)
    schema = json.loads(SCHEMA.read_text())
    kinds: set[str] = set()
    sources: set[str] = set()
    for msg in stored:
        h, subject = msg["headers"], msg["subject"]
        if subject == bad:
            assert not any(k.startswith("ce-") for k in h), "the test's garbage is no CloudEvent"
            continue
        assert h["ce-specversion"] == "1.0", (subject, h)
        if subject.startswith(subjects.DEAD_LETTERS):
            assert h["ce-type"] == "com.nvidia.nodewright.dead-letter"
            assert h["ce-source"] == "/nodewright/status"
            assert h["ce-subject"] == bad
            assert h["ce-datacontenttype"] == "application/octet-stream"
            assert h["ce-id"] == h["Nats-Msg-Id"]
            assert msg["data"] == b"{not json"
            continue
        event = events.decode(msg["data"])  # every consumer reads the payload as before
        kinds.add(event.kind)
        assert h["ce-id"] == h["Nats-Msg-Id"] == cloudevents.encode_value(event.id)
        assert h["ce-type"] == f"com.nvidia.nodewright.{event.kind}"
        service = event.source.split("/")[0]
        sources.add(service)
        assert h["ce-source"] == f"/nodewright/{service}"
        expected = f"nodewrights/{event.cr}" + (f"/nodes/{event.node}" if event.node else "")
        assert cloudevents.decode_value(h["ce-subject"]) == expected
        assert datetime.fromisoformat(h["ce-time"]) == event.at
        assert h["ce-datacontenttype"] == "application/json"
        base, _, pointer = h["ce-dataschema"].partition("#")
        assert base == schema["$id"] == "https://nodewright.nvidia.com/schemas/events.v1.json"
        # The payload validates against the very definition the dataschema points at.
        definition = {"$ref": f"#{pointer}", "$defs": schema["$defs"]}
        jsonschema.validate(json.loads(msg["data"]), definition)
    assert {"node.selected", "node.drained", "stage.started", "node.completed"} <= kinds, kinds
    assert set(SERVICES) <= sources, sources
    # `nodewright events -o json` prints each message as a structured CloudEvent.
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nodewright.cli",
        "events",
        "--all",
        "-o",
        "json",
        env={**os.environ, "NATS_URL": rig.endpoints.nats_url},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        docs = [json.loads(await asyncio.wait_for(proc.stdout.readline(), 30)) for _ in range(5)]
    finally:
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    for doc in docs:
        assert doc["specversion"] == "1.0"
        assert doc["type"] == f"com.nvidia.nodewright.{doc['data']['kind']}"
        assert doc["id"] == doc["data"]["id"]
    # The human readout of the nats CLI shows the attributes too.
    shown = await nats_cli(
        rig, "sub", "nw.ev.>", "--stream", "NODEWRIGHT", "--all", "--count", "1", "--headers-only"
    )
    assert "ce-type: com.nvidia.nodewright." in shown
    assert "ce-specversion: 1.0" in shown
