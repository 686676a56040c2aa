"""``autoTaintNewNodes`` end to end, on the real rig with the five services as processes and
the real kube-scheduler placing a workload.

Turning the feature on taints no node that already exists; a node created afterwards is
tainted within moments, keeps workloads without the toleration off until NodeWright
validated it, loses the taint per node after validation and never gets it back, not even
from a second auto-taint NodeWright created later.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from nodewright import manifests
from nodewright.rig import Rig, nodes
from services.validator import core
from shared import api, podspec, progress
from shared.kube import Kube, path_of
from tests.e2e.conftest import NODES, Sampler, Services, read_cr
from tests.helpers.bus import nudge
from tests.helpers.waiting import eventually

pytestmark = pytest.mark.timeout(600)

GPU = {"nodepool": "gpu"}
TAINT_KEY = progress.RUNTIME_REQUIRED_TAINT
OLD, NEW = ["gpu-00", "gpu-01"], ["gpu-10", "gpu-11"]
PINNED = NEW[0]
"""The new node the workload pod asks for by hostname."""


def _cr(name: str) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "NodeWright",
        "metadata": {"name": name},
        "spec": {
            "nodeSelectors": {"matchLabels": GPU},
            "interruptionBudget": {"count": 4},
            "runtimeRequired": True,
            "autoTaintNewNodes": True,
            # No cordon: the readiness taint alone keeps the workload off the node, so the
            # pod staying Pending proves the taint works, not the cordon.
            "drain": {"onlyForInterrupts": True},
            "packages": {"tuning": {"version": "1.0.0", "image": "registry.example/tuning"}},
        },
    }


@dataclass(frozen=True)
class Look:
    """One node at one moment, as far as the readiness taint is concerned."""

    tainted: bool
    validated: bool
    marked: str


async def _look(kapi: Kube, cr: str) -> dict[str, Look]:
    obj = await read_cr(kapi, cr)
    target = progress.target_digest(obj)
    out = {}
    for n in (await kapi.get(NODES, labelSelector="nodepool=gpu"))["items"]:
        f = progress.facts(n, cr)
        out[f.name] = Look(
            tainted=any(t.get("key") == TAINT_KEY for t in f.taints),
            validated=f.validator.validated == target,
            marked=(n["metadata"].get("annotations") or {}).get(core.AUTO_TAINTED, ""),
        )
    return out


async def _turns(kapi: Kube, cr: str, names: list[str]) -> dict[str, str]:
    obj = await read_cr(kapi, cr)
    listed = (await kapi.get(NODES, labelSelector="nodepool=gpu"))["items"]
    return {
        n["metadata"]["name"]: progress.turn(obj, progress.facts(n, cr))
        for n in listed
        if n["metadata"]["name"] in names
    }


async def _wait_done(kapi: Kube, cr: str, names: list[str], what: str) -> None:
    async def done() -> dict[str, str] | None:
        turns = await _turns(kapi, cr, names)
        return turns if turns == dict.fromkeys(names, "done") else None

    await eventually(done, timeout_s=180, interval_s=0.5, what=what)


async def _create_slow_nodes(kapi: Kube, names: list[str], stage_duration: str) -> None:
    """Nodes whose simulated package stages take ``stage_duration`` each, so they stay
    tainted long enough to watch the kube-scheduler keep a workload off them."""
    for name in names:
        body = nodes.node_manifest(name, labels=GPU)
        body["metadata"]["annotations"][podspec.SIM_STAGE_DURATION] = stage_duration
        await kapi.create(NODES, body)


STREAM = "NODEWRIGHT"


async def _past_the_second_of(kapi: Kube, names: list[str]) -> None:
    """Until the clock is past the second the nodes were created in."""
    created = [
        datetime.fromisoformat((await kapi.get(f"{NODES}/{n}"))["metadata"]["creationTimestamp"])
        for n in names
    ]

    async def later() -> bool:
        return datetime.now(UTC).replace(microsecond=0) > max(created)

    await eventually(later, timeout_s=5, interval_s=0.05, what="the next second")


def _scheduled(pod: dict[str, Any]) -> tuple[str, str]:
    """(nodeName, the scheduler's message when it could not place the pod)."""
    message = ""
    for c in (pod.get("status") or {}).get("conditions") or ():
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            message = str(c.get("message") or "")
    return str((pod.get("spec") or {}).get("nodeName") or ""), message


async def test_only_nodes_created_after_the_nodewright_are_tainted_until_validated_once(
    rig: Rig, cluster: Kube, services: Services
) -> None:
    kapi, ns = cluster, services.namespace
    await nodes.create_nodes(kapi, OLD, labels=GPU)
    await nodes.wait_ready(kapi, OLD)
    await asyncio.to_thread(services.fleet.start_all)
    # creationTimestamps have whole seconds and a node created in the NodeWright's second
    # counts as new: make the existing nodes strictly older.
    await _past_the_second_of(kapi, OLD)
    await manifests.apply(kapi, _cr("first"))

    async with Sampler(lambda: _look(kapi, "first"), interval_s=0.1) as samples:
        await _wait_done(kapi, "first", OLD, "the existing nodes to be done")

        t0 = time.monotonic()
        await _create_slow_nodes(kapi, NEW, stage_duration="3s")

        async def new_tainted() -> bool:
            now = await _look(kapi, "first")
            return all(n in now and now[n].tainted for n in NEW)

        await eventually(new_tainted, timeout_s=20, interval_s=0.05, what="the new nodes' taint")
        print(f"new nodes tainted after {time.monotonic() - t0:.2f}s", file=sys.stderr)

        pods = path_of(plural="pods", namespace=ns)
        await kapi.create(
            pods,
            {
                "metadata": {"name": "workload"},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": PINNED},
                    "containers": [{"name": "w", "image": "registry.example/w:1"}],
                },
            },
        )

        async def pod_and_taint() -> tuple[tuple[str, str], bool]:
            pod = await kapi.get(f"{pods}/workload")
            node = await kapi.get(f"{NODES}/{PINNED}")
            tainted = any(t.get("key") == TAINT_KEY for t in node["spec"].get("taints") or ())
            return _scheduled(pod), tainted

        async with Sampler(pod_and_taint, interval_s=0.1) as placement:
            await _wait_done(kapi, "first", NEW, "the new nodes to be done")

            async def untainted() -> bool:
                now = await _look(kapi, "first")
                return not any(now[n].tainted for n in NEW)

            await eventually(untainted, what="the taint to leave the validated new nodes")

            async def bound() -> str:
                return (await pod_and_taint())[0][0]

            assert await eventually(bound, what="the workload to be scheduled") == PINNED
        # The validator looks at every node again (what a periodic resync would do).
        await nudge(
            rig.endpoints.nats_url,
            STREAM,
            cr="first",
            nodes=OLD + NEW,
            durable="validator",
            tag="first",
        )

    # One look after the nudge was handled, whatever the sampler's last one saw: on a loaded
    # machine a probe can be slower than the steps above it.
    looks: list[dict[str, Look]] = [*samples.samples, await _look(kapi, "first")]
    final = looks[-1]
    for name in OLD:
        assert not any(s[name].tainted for s in looks), f"existing node {name} was tainted"
        assert final[name].marked == ""
    for name in NEW:
        seen = [s[name] for s in looks if name in s]
        history = "".join("T" if s.tainted else ("v" if s.validated else ".") for s in seen)
        assert any(s.tainted for s in seen), f"{name} never tainted: {history}"
        first = next(i for i, s in enumerate(seen) if s.tainted)
        assert not seen[-1].tainted, f"{name} still tainted after the nudge: {history}"
        lifted = next(i for i, s in enumerate(seen) if i > first and not s.tainted)
        # Never untainted before validated, and never tainted again after.
        assert all(s.tainted or s.validated for s in seen[first:]), f"{name} untainted early"
        assert not any(s.tainted for s in seen[lifted:]), f"{name} was tainted again"
        assert final[name].marked == "first"
        assert final[name].validated

    # The kube-scheduler kept the workload off the node exactly while it was tainted.
    assert placement.samples, "no sample of the workload"
    for (node_name, _), tainted in placement.samples:
        assert not (tainted and node_name), "the workload was scheduled onto a tainted node"
    refused = [msg for (node_name, msg), tainted in placement.samples if tainted and not node_name]
    # kube-scheduler 1.36 does not name the taint: "... 1 node(s) had untolerated taint(s)".
    assert any("untolerated taint" in msg for msg in refused), f"not for a taint: {refused[-3:]}"

    # A second auto-taint NodeWright comes after every node: it taints none of them, neither
    # while it works on them nor afterwards.
    await _past_the_second_of(kapi, OLD + NEW)
    await manifests.apply(kapi, _cr("second"))
    async with Sampler(lambda: _look(kapi, "second"), interval_s=0.1) as second:
        await _wait_done(kapi, "second", OLD + NEW, "the second NodeWright to be done")
        await nudge(
            rig.endpoints.nats_url,
            STREAM,
            cr="second",
            nodes=OLD + NEW,
            durable="validator",
            tag="second",
        )
    assert second.samples
    tainted = {n for s in second.samples for n, look in s.items() if look.tainted}
    assert not tainted, f"the second NodeWright tainted {sorted(tainted)}"
    assert {n: look.marked for n, look in second.samples[-1].items()} == {
        **dict.fromkeys(OLD, ""),
        **dict.fromkeys(NEW, "first"),
    }
