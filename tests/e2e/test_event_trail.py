"""The trail a person reads, on the rig with the five services: the README's example on the
sandbox's 30 GPU nodes writes a handful of Kubernetes Events (batches and the rollout's end;
none about a healthy node), at most 3 per node, while the step-by-step trail stays on the
event stream; a node that fails, recovers and fails again is one NodeFailed Event counting
two in its events.k8s.io series, on the Node and on the NodeWright."""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from typing import Any

import nats
import pytest

from nodewright import manifests
from nodewright.rig import Rig, nodes
from services.status import kube_events
from shared.kube import Kube, path_of
from tests.e2e.conftest import NODES, Services, read_cr
from tests.helpers.waiting import Pending, eventually

pytestmark = pytest.mark.timeout(600)

EXAMPLE = "nodewright-gpu-node-tuning.yaml"
SIM = "sim.nodewright.nvidia.com"
EVENTS = "/apis/events.k8s.io/v1/events"


async def _ours(kapi: Kube, cr: str) -> list[dict[str, Any]]:
    """NodeWright's Events about ``cr`` — this test's CR: earlier tests on the same rig used
    the same name (their Events stay in ``default``), so only Events about this CR's UID or
    created since it exists count."""
    obj = await kapi.get(f"{manifests.NODEWRIGHTS}/{cr}")
    uid, born = obj["metadata"]["uid"], obj["metadata"]["creationTimestamp"]
    listed = await kapi.get(EVENTS, labelSelector=f"{kube_events.LABEL_NODEWRIGHT}={cr}")
    return [
        e
        for e in listed["items"]
        if e.get("reportingController") == kube_events.CONTROLLER
        and (
            (e.get("involvedObject") or {}).get("uid") == uid
            or str(e["metadata"].get("creationTimestamp") or "") >= born
        )
    ]


async def _ready(kapi: Kube, cr: str) -> bool | Pending:
    obj = await read_cr(kapi, cr)
    if any(c.type == "Ready" and c.status == "True" for c in obj.status.conditions):
        return True
    return Pending(f"{obj.status.complete_nodes} complete, state {obj.status.state}")


async def _stream_messages(rig: Rig) -> int:
    nc = await nats.connect(rig.endpoints.nats_url)
    try:
        info = await nc.jetstream().stream_info("NODEWRIGHT")
        return int(info.state.messages)
    finally:
        await nc.close()


async def test_the_readme_example_writes_a_few_events_a_person_reads(
    rig: Rig, cluster: Kube, services: Services
) -> None:
    kapi = cluster
    gpu = await nodes.create_nodes(
        kapi, [f"gpu-node-{i:03d}" for i in range(30)], labels={"nodepool": "gpu"}
    )
    cpu = await nodes.create_nodes(
        kapi, [f"cpu-node-{i:03d}" for i in range(10)], labels={"nodepool": "cpu"}
    )
    await nodes.wait_ready(kapi, gpu + cpu)
    await asyncio.to_thread(services.fleet.start_all)
    example = manifests.sample(EXAMPLE)
    name = example["metadata"]["name"]
    t0 = time.monotonic()
    await manifests.apply(kapi, example)
    await eventually(lambda: _ready(kapi, name), timeout_s=400, interval_s=1, what="Ready")
    print(
        f"process-fleet rollout of the README example on {len(gpu)} nodes: "
        f"{time.monotonic() - t0:.1f}s",
        file=sys.stderr,
    )
    await asyncio.sleep(5)  # the last pass's Events
    found = await _ours(kapi, name)
    reasons = Counter(e["reason"] for e in found)
    print(f"Kubernetes Events of the README example on 30 nodes: {len(found)} {dict(reasons)}")
    assert len(found) <= 3 * len(gpu)
    assert set(reasons) == {"BatchStarted", "BatchFinished", "RolloutComplete"}, reasons
    assert reasons["RolloutComplete"] == 1
    # 33 % of 30 nodes: batches of 9, 9, 9, 3.
    assert reasons["BatchStarted"] == reasons["BatchFinished"] == 4
    assert all(e["regarding"]["kind"] == "NodeWright" for e in found), "no Event about a node"
    for e in found:
        assert e["metadata"]["namespace"] == "default"
        assert e["eventTime"]
        assert e["action"]
        assert e["note"]
        assert e["reportingInstance"].startswith("status-")
    # ... while the stream keeps every step (at least 10 events per node).
    assert await _stream_messages(rig) >= 10 * len(gpu)


async def _failed(kapi: Kube, cr: str, node: str) -> bool | Pending:
    obj = await read_cr(kapi, cr)
    details = {d.node: d for d in obj.status.node_details}
    got = details.get(node)
    if got is not None and got.state == "Failed":
        return True
    return Pending(f"{node}: {got}")


async def _cli(rig: Rig, *args: str) -> None:
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
    assert proc.returncode == 0, (out, err)


async def test_a_node_failing_twice_is_one_event_counting_two_and_its_recovery_is_told(
    rig: Rig, cluster: Kube, services: Services
) -> None:
    kapi = cluster
    names = await nodes.create_nodes(
        kapi, [f"gpu-node-{i:03d}" for i in range(3)], labels={"nodepool": "gpu"}
    )
    await nodes.wait_ready(kapi, names)
    bad = "gpu-node-001"
    fail = {"metadata": {"annotations": {f"{SIM}/fail": "nvidia-tuned/apply"}}}
    await kapi.patch(f"{NODES}/{bad}", fail)
    await asyncio.to_thread(services.fleet.start_all)
    example = manifests.sample(EXAMPLE)
    name = example["metadata"]["name"]
    await manifests.apply(kapi, example)
    await eventually(lambda: _failed(kapi, name, bad), timeout_s=200, what=f"{bad} Failed")

    async def events_about(reason: str, count: int) -> list[dict[str, Any]]:
        found = [e for e in await _ours(kapi, name) if e["reason"] == reason]
        counted = [(e.get("series") or {}).get("count", 1) for e in found]
        return found if len(found) == 2 and all(c >= count for c in counted) else []

    first = await eventually(lambda: events_about("NodeFailed", 1), what="NodeFailed twice")
    about = sorted((e["regarding"]["kind"], e["regarding"]["name"]) for e in first)
    assert about == [("Node", bad), ("NodeWright", name)]
    assert all(e["type"] == "Warning" for e in first)
    assert all("simulated failure of nvidia-tuned apply" in e["note"] for e in first)
    # Retried while the cause is still there: it runs again, and fails again.
    await _cli(rig, "node", "retry", bad)
    again = await eventually(lambda: events_about("NodeFailed", 2), timeout_s=200, what="a series")
    assert {e["metadata"]["name"] for e in again} == {e["metadata"]["name"] for e in first}
    for e in again:
        assert e["series"]["count"] == 2
        assert e["series"]["lastObservedTime"] >= e["eventTime"]
    # Fixed and retried: it recovers for good and the rollout completes.
    await kapi.patch(f"{NODES}/{bad}", {"metadata": {"annotations": {f"{SIM}/fail": None}}})
    await _cli(rig, "node", "retry", bad)
    await eventually(lambda: _ready(kapi, name), timeout_s=200, what="Ready")
    await eventually(lambda: events_about("NodeRecovered", 1), what="NodeRecovered")
    on_node = (
        await kapi.get(
            path_of(plural="events", namespace="default"),
            fieldSelector=f"involvedObject.kind=Node,involvedObject.name={bad}",
        )
    )["items"]
    # `kubectl describe node` shows them: the core/v1 view of the same Events.
    assert {e["reason"] for e in on_node} >= {"NodeFailed", "NodeRecovered"}
