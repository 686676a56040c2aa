"""Smoke tests proving the rig is real: kwok nodes, scheduled pods with simulated exits, the
Eviction API guarded by the real disruption controller, and JetStream semantics."""

from __future__ import annotations

import uuid
from typing import Any

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from nodewright.rig import Rig, nodes
from shared.kube import ApiError, Kube, path_of
from tests.helpers.waiting import eventually

SIM = "sim.nodewright.nvidia.com"


async def test_two_hundred_kwok_nodes_become_ready(kapi: Kube) -> None:
    run = uuid.uuid4().hex[:6]
    names = [f"smoke-{run}-{i:03d}" for i in range(200)]
    await nodes.create_nodes(kapi, names, labels={"nodepool": "gpu", "smoke": run})
    await nodes.wait_ready(kapi, names, timeout_s=180)
    listed = await kapi.get(path_of(plural="nodes"), labelSelector=f"smoke={run}")
    assert len(listed["items"]) == 200
    assert all(nodes.is_ready(n) for n in listed["items"])


def _pod(name: str, node: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},  # bound by the real scheduler
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "registry.example/sim:1"}],
        },
    }


async def test_pods_on_kwok_nodes_run_and_end_as_their_annotations_say(
    kapi: Kube, namespace: str
) -> None:
    node = f"smoke-pods-{uuid.uuid4().hex[:6]}"
    await nodes.create_nodes(kapi, [node])
    await nodes.wait_ready(kapi, [node])
    pods = path_of(plural="pods", namespace=namespace)
    await kapi.create(pods, _pod("ok", node, {f"{SIM}/succeed-after": "1s"}))
    await kapi.create(pods, _pod("bad", node, {f"{SIM}/fail-after": "1s", f"{SIM}/exit-code": "3"}))
    await kapi.create(pods, _pod("long", node, {}))

    async def pod(name: str) -> dict[str, Any]:
        return await kapi.get(path_of(plural="pods", namespace=namespace, name=name))

    async def in_phase(name: str, want: str) -> bool:
        return bool((await pod(name)).get("status", {}).get("phase") == want)

    await eventually(lambda: in_phase("ok", "Succeeded"), what="pod ok to succeed")
    await eventually(lambda: in_phase("bad", "Failed"), what="pod bad to fail")
    await eventually(lambda: in_phase("long", "Running"), what="pod long to run")
    bad = await pod("bad")
    assert bad["spec"]["nodeName"] == node
    assert bad["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
    assert await in_phase("long", "Running"), "an un-annotated pod keeps running"


def _segment(name: str, node: str, annotations: dict[str, str]) -> dict[str, Any]:
    """A pod like a segment pod: two init containers, then the main one."""
    pod = _pod(name, node, {f"{SIM}/part-duration": "1s", **annotations})
    pod["spec"]["initContainers"] = [
        {"name": n, "image": "registry.example/sim:1"} for n in ("apply", "apply-check")
    ]
    pod["spec"]["containers"][0]["name"] = "config"
    return pod


def _states(pod: dict[str, Any]) -> dict[str, str]:
    st = pod.get("status") or {}
    return {
        c["name"]: next(iter(c.get("state") or {"none": 0}))
        for c in [*(st.get("initContainerStatuses") or ()), *(st.get("containerStatuses") or ())]
    }


def _ended(pod: dict[str, Any], name: str) -> str:
    st = pod["status"]
    (c,) = [
        c for c in [*st["initContainerStatuses"], *st["containerStatuses"]] if c["name"] == name
    ]
    return str(c["state"]["terminated"]["finishedAt"])


async def test_a_segment_pods_containers_run_in_turn_as_a_kubelet_runs_them(
    kapi: Kube, namespace: str
) -> None:
    """part-duration: one container at a time, each for its time; the failing one named by
    fail-init fails once it ran, and the ones after it never start."""
    node = f"smoke-turn-{uuid.uuid4().hex[:6]}"
    await nodes.create_nodes(kapi, [node])
    await nodes.wait_ready(kapi, [node])
    pods = path_of(plural="pods", namespace=namespace)
    await kapi.create(pods, _segment("ok", node, {f"{SIM}/succeed-after": "1s"}))
    fail = {f"{SIM}/fail-after": "1s", f"{SIM}/fail-init": "apply-check", f"{SIM}/exit-code": "3"}
    await kapi.create(pods, _segment("bad", node, fail))

    seen: dict[str, list[dict[str, str]]] = {"ok": [], "bad": []}

    async def ended(name: str) -> dict[str, Any] | None:
        pod = await kapi.get(f"{pods}/{name}")
        states = _states(pod)
        if states and (not seen[name] or seen[name][-1] != states):
            seen[name].append(states)
        phase = (pod.get("status") or {}).get("phase")
        return pod if phase in ("Succeeded", "Failed") else None

    ok = await eventually(lambda: ended("ok"), interval_s=0.05, what="pod ok to end")
    bad = await eventually(lambda: ended("bad"), interval_s=0.05, what="pod bad to end")
    assert ok is not None
    assert bad is not None
    assert ok["status"]["phase"] == "Succeeded"
    # Each container ran while the ones after it waited.
    assert {"apply": "running", "apply-check": "waiting", "config": "waiting"} in seen["ok"]
    assert {"apply": "terminated", "apply-check": "running", "config": "waiting"} in seen["ok"]
    assert {"apply": "terminated", "apply-check": "terminated", "config": "running"} in seen["ok"]
    assert _ended(ok, "apply") < _ended(ok, "apply-check") <= _ended(ok, "config")
    assert bad["status"]["phase"] == "Failed"
    assert _states(bad) == {"apply": "terminated", "apply-check": "terminated", "config": "waiting"}
    (check,) = [c for c in bad["status"]["initContainerStatuses"] if c["name"] == "apply-check"]
    assert check["state"]["terminated"]["exitCode"] == 3
    assert _ended(bad, "apply") < _ended(bad, "apply-check")


async def test_eviction_respects_a_pdb_kept_by_the_disruption_controller(
    kapi: Kube, namespace: str
) -> None:
    node = f"smoke-pdb-{uuid.uuid4().hex[:6]}"
    await nodes.create_nodes(kapi, [node])
    await nodes.wait_ready(kapi, [node])
    labels = {"app": "guarded"}
    await kapi.create(
        path_of(group="apps", plural="deployments", namespace=namespace),
        {
            "metadata": {"name": "guarded"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeSelector": {"kubernetes.io/hostname": node},
                        "containers": [{"name": "main", "image": "registry.example/app:1"}],
                    },
                },
            },
        },
    )
    pdb = path_of(group="policy", plural="poddisruptionbudgets", namespace=namespace, name="guard")
    await kapi.create(
        path_of(group="policy", plural="poddisruptionbudgets", namespace=namespace),
        {
            "metadata": {"name": "guard"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": labels}},
        },
    )

    async def pdb_is(healthy: int, allowed: int) -> bool:
        st = (await kapi.get(pdb)).get("status") or {}
        return (st.get("currentHealthy", 0), st.get("disruptionsAllowed", 0)) == (healthy, allowed)

    await eventually(lambda: pdb_is(2, 0), what="PDB to count 2 healthy, 0 allowed")
    listed = await kapi.get(
        path_of(plural="pods", namespace=namespace), labelSelector="app=guarded"
    )
    victim = listed["items"][0]["metadata"]["name"]
    evict = path_of(plural="pods", namespace=namespace, name=victim, subresource="eviction")
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": victim, "namespace": namespace},
    }
    with pytest.raises(ApiError) as refused:
        await kapi.create(evict, eviction)
    assert refused.value.status == 429
    assert "disruption budget" in refused.value.message

    await kapi.patch(
        path_of(group="apps", plural="deployments", namespace=namespace, name="guarded"),
        {"spec": {"replicas": 3}},
    )
    await eventually(lambda: pdb_is(3, 1), what="PDB to allow one disruption after scale-up")
    await kapi.create(evict, eviction)

    async def gone() -> bool:
        try:
            pod = await kapi.get(path_of(plural="pods", namespace=namespace, name=victim))
        except ApiError as exc:
            return exc.not_found
        return bool(pod["metadata"].get("deletionTimestamp"))

    await eventually(gone, what="the evicted pod to go")


async def test_jetstream_dedupes_by_msg_id_and_redelivers_unacked(rig: Rig) -> None:
    nc = await nats.connect(rig.endpoints.nats_url)
    try:
        js = nc.jetstream()
        stream = f"SMOKE{uuid.uuid4().hex[:8]}"
        subject = f"{stream.lower()}.events"
        await js.add_stream(name=stream, subjects=[subject])
        first = await js.publish(subject, b"one", headers={"Nats-Msg-Id": "same-id"})
        second = await js.publish(subject, b"one again", headers={"Nats-Msg-Id": "same-id"})
        assert not first.duplicate
        assert second.duplicate
        info = await js.stream_info(stream)
        assert info.state.messages == 1

        sub = await js.pull_subscribe(
            subject,
            durable="smoke",
            stream=stream,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=1.0, max_deliver=5),
        )
        (msg,) = await sub.fetch(1, timeout=5)
        assert msg.data == b"one"
        assert msg.metadata.num_delivered == 1
        # Not acked: after AckWait the server hands the same message out again.
        (again,) = await sub.fetch(1, timeout=10)
        assert again.data == b"one"
        assert again.metadata.num_delivered == 2
        await again.ack()
        await js.delete_stream(stream)
    finally:
        await nc.close()
