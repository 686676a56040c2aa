"""Issue 5 end to end, on the real rig with kwok nodes and the five services as processes:
DeploymentPolicy strategies batch by batch as ``nodewright plan`` predicts, a failing
compartment that stops alone and resumes after a batch-state reset, a cluster budget
shared by two NodeWrights, and a maintenance window closing mid-rollout."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from nodewright import manifests, plan_cmd
from nodewright.rig import nodes
from shared import api, nodestate, progress
from shared.kube import ApiError, Kube
from tests.e2e.conftest import NODES, Sampler, Services, read_cr
from tests.helpers.waiting import eventually

# End-to-end runs take minutes on 2 cores; the suite-wide 120 s limit is for unit tests.
pytestmark = pytest.mark.timeout(600)

SIM = "sim.nodewright.nvidia.com"


@pytest.fixture(autouse=True)
async def _remove_crs_while_the_webhook_runs(
    cluster: Kube, services: Services
) -> AsyncIterator[None]:
    """NodeWrights and DeploymentPolicies are deleted while the validator (and its webhook)
    still runs: the shared teardown runs after the services stopped, when the webhook
    refuses calls."""
    yield
    for path in (manifests.NODEWRIGHTS, manifests.POLICIES):
        for obj in (await cluster.get(path))["items"]:
            name = obj["metadata"]["name"]
            with contextlib.suppress(ApiError):
                await cluster.patch(f"{path}/{name}", {"metadata": {"finalizers": None}})
            with contextlib.suppress(ApiError):
                await cluster.delete_if_present(f"{path}/{name}")


def _cr(name: str, *, pool: str, policy: str | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "nodeSelectors": {"matchLabels": {"nodepool": pool}},
        "packages": {"tuning": {"version": "1.0.0", "image": "registry.example/tuning"}},
        **spec,
    }
    if policy:
        body["deploymentPolicy"] = policy
    return {
        "apiVersion": api.API_VERSION,
        "kind": "NodeWright",
        "metadata": {"name": name},
        "spec": body,
    }


def _policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "DeploymentPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }


async def _nodes(kapi: Kube, names: list[str], **labels: str) -> list[str]:
    created = await nodes.create_nodes(kapi, names, labels=labels)
    await nodes.wait_ready(kapi, created)
    return created


async def _selections(kapi: Kube, cr: str) -> dict[str, nodestate.Selection]:
    listed = await kapi.get(NODES)
    out = {}
    for n in listed["items"]:
        sel = nodestate.read(n, nodestate.SCHEDULER, cr, nodestate.Selection)
        if sel is not None:
            out[n["metadata"]["name"]] = sel
    return out


class BatchLog:
    """Every admission seen: node -> (compartment, batch, selected_at)."""

    def __init__(self, kapi: Kube, cr: str) -> None:
        self.kapi, self.cr = kapi, cr
        self.seen: dict[str, tuple[str, int, datetime]] = {}

    async def probe(self) -> int:
        sels = await _selections(self.kapi, self.cr)
        for node, sel in sels.items():
            self.seen.setdefault(node, (sel.compartment, sel.batch, sel.selected_at))
        return len(sels)

    def batches(self) -> dict[tuple[str, int], set[str]]:
        out: dict[tuple[str, int], set[str]] = {}
        for node, (comp, batch, _) in self.seen.items():
            out.setdefault((comp, batch), set()).add(node)
        return out


async def _done(kapi: Kube, cr: str) -> dict[str, str]:
    obj = await read_cr(kapi, cr)
    listed = await kapi.get(NODES)
    return {
        n["metadata"]["name"]: progress.turn(obj, progress.facts(n, cr))
        for n in listed["items"]
        if progress.selector_matches(obj.spec.node_selectors, n["metadata"].get("labels") or {})
    }


async def _all_done(kapi: Kube, cr: str) -> bool:
    turns = await _done(kapi, cr)
    return bool(turns) and set(turns.values()) == {"done"}


async def test_linear_growth_runs_exactly_the_batches_nodewright_plan_predicts(
    cluster: Kube, services: Services
) -> None:
    kapi = cluster
    await _nodes(kapi, [f"lin-{i:02d}" for i in range(10)], nodepool="lin")
    await manifests.apply(
        kapi,
        _policy(
            "linear",
            {"default": {"budget": {"count": 10}, "strategy": {"linear": {"initialBatch": 1}}}},
        ),
    )
    await manifests.apply(kapi, _cr("lin", pool="lin", policy="linear"))
    doc = await plan_cmd.plan_for(kapi, "lin", datetime.now(UTC))
    planned = {(b["compartment"], b["batch"]): set(b["nodes"]) for b in doc["batches"]}
    assert [b["size"] for b in doc["batches"]] == [1, 2, 3, 4]
    assert "__default__ batch 1: 1 nodes" in plan_cmd.render(doc)
    log = BatchLog(kapi, "lin")
    await asyncio.to_thread(services.fleet.start_all)
    async with Sampler(log.probe) as s:
        await eventually(
            lambda: _all_done(kapi, "lin"), timeout_s=170, interval_s=1, what="linear rollout"
        )
        await s.stop()
    assert log.batches() == planned
    # The batches never overlapped: each started after the previous one's nodes were admitted.
    starts = sorted((b, at) for _, (_, b, at) in log.seen.items())
    assert [b for b, _ in starts] == sorted(b for b, _ in starts)


async def test_a_failing_compartment_stops_alone_and_resumes_after_a_reset(
    cluster: Kube, services: Services
) -> None:
    kapi = cluster
    bad = await _nodes(kapi, [f"bad-{i}" for i in range(4)], nodepool="mix", rack="bad")
    good = await _nodes(kapi, [f"good-{i}" for i in range(5)], nodepool="mix", rack="good")
    for name in bad:
        await kapi.patch(
            f"{NODES}/{name}", {"metadata": {"annotations": {f"{SIM}/fail": "tuning/apply"}}}
        )
    await manifests.apply(
        kapi,
        _policy(
            "gates",
            {
                "default": {"budget": {"count": 5}, "strategy": {"fixed": {"batchSize": 2}}},
                "compartments": [
                    {
                        "name": "bad",
                        "selector": {"matchLabels": {"rack": "bad"}},
                        "budget": {"count": 4},
                        "strategy": {"fixed": {"batchSize": 1}},
                        "stopAfterConsecutiveFailedBatches": 2,
                    },
                    {
                        "name": "good",
                        "selector": {"matchLabels": {"rack": "good"}},
                        "budget": {"count": 5},
                        "strategy": {"exponential": {"initialBatch": 1}},
                    },
                ],
            },
        ),
    )
    await manifests.apply(kapi, _cr("gates", pool="mix", policy="gates"))
    log = BatchLog(kapi, "gates")
    await asyncio.to_thread(services.fleet.start_all)

    async def settled() -> bool:
        turns = await _done(kapi, "gates")
        cr = await read_cr(kapi, "gates")
        book = progress.read_batch_book(cr.metadata.annotations)
        stopped = book.compartments.get("bad")
        return (
            all(turns[n] == "done" for n in good) and stopped is not None and stopped.state.stopped
        )

    async with Sampler(log.probe) as s:
        await eventually(settled, timeout_s=150, interval_s=1, what="good done, bad stopped")
        await asyncio.sleep(3)
        await s.stop()
    batches = log.batches()
    assert len(batches[("bad", 1)]) == 1
    assert len(batches[("bad", 2)]) == 1
    assert ("bad", 3) not in batches, "the compartment stopped at exactly 2 failed batches"
    sizes = [len(batches[("good", b)]) for b in (1, 2, 3)]
    assert sizes == [1, 2, 2], "exponential 1, 2, then the 2 remaining nodes"
    untouched = set(bad) - batches[("bad", 1)] - batches[("bad", 2)]

    async def status_shows_the_stop() -> bool:
        cr = await read_cr(kapi, "gates")
        comps = {c.name: c for c in cr.status.compartments}
        waiting = {d.node: d.reason for d in cr.status.node_details}
        return (
            "bad" in comps
            and comps["bad"].batch.stopped
            and comps["bad"].batch.stop_reason == "FailedBatchesLimit"
            and all(waiting.get(n) == "CompartmentStopped" for n in untouched)
            and cr.status.state == "Stopped"
        )

    await eventually(status_shows_the_stop, what="status to show the stopped compartment")

    # Reset by command: the stopped compartment starts again at batch 1.
    await kapi.patch(
        f"{manifests.NODEWRIGHTS}/gates",
        {"metadata": {"annotations": {progress.RESET_ANNOTATION: "reset-1"}}},
    )

    async def resumed() -> bool:
        sels = await _selections(kapi, "gates")
        return any(n in sels and sels[n].batch == 1 for n in untouched)

    await eventually(resumed, timeout_s=30, what="a stopped node admitted into batch 1 again")


async def test_two_nodewrights_under_a_cluster_budget_of_one_never_disrupt_two_nodes(
    cluster: Kube, services: Services
) -> None:
    kapi = cluster
    await _nodes(kapi, [f"a-{i}" for i in range(3)], nodepool="a")
    await _nodes(kapi, [f"b-{i}" for i in range(3)], nodepool="b")
    # The setting is the scheduler's alone (the others refuse unknown NODEWRIGHT_* variables).
    for service in ("drainer", "executor", "validator", "status"):
        await asyncio.to_thread(services.fleet.start, service)
    services.fleet.extra_env["NODEWRIGHT_SCHEDULER_CLUSTER_BUDGET"] = "1"
    await asyncio.to_thread(services.fleet.start, "scheduler")

    async def disrupted() -> int:
        listed = await kapi.get(NODES)
        return sum(
            1
            for n in listed["items"]
            if (n.get("spec") or {}).get("unschedulable")
            or nodestate.crs_with(n, nodestate.SCHEDULER)
        )

    async with Sampler(disrupted) as s:
        await manifests.apply(kapi, _cr("first", pool="a", interruptionBudget={"count": 1}))
        await manifests.apply(kapi, _cr("second", pool="b", interruptionBudget={"count": 1}))

        async def both_done() -> bool:
            return await _all_done(kapi, "first") and await _all_done(kapi, "second")

        await eventually(both_done, timeout_s=170, interval_s=1, what="both rollouts")
        await s.stop()
    assert max(s.samples) == 1, "never two nodes disrupted at once"
    assert len(s.samples) > 50


async def test_a_window_closing_mid_rollout_lets_running_nodes_finish_and_starts_none(
    cluster: Kube, services: Services
) -> None:
    kapi = cluster
    names = await _nodes(kapi, [f"win-{i:02d}" for i in range(12)], nodepool="win")
    now = datetime.now(UTC)
    end = (now + timedelta(minutes=1)).replace(second=0, microsecond=0)
    if (end - now).total_seconds() < 20:
        end += timedelta(minutes=1)
    start = now - timedelta(minutes=5)
    window = {"start": start.strftime("%H:%M"), "end": end.strftime("%H:%M"), "timeZone": "UTC"}
    await manifests.apply(
        kapi,
        _policy(
            "win",
            {
                "default": {"budget": {"count": 1}, "strategy": {"fixed": {"batchSize": 1}}},
                "maintenanceWindows": [window],
            },
        ),
    )
    log = BatchLog(kapi, "win")
    await asyncio.to_thread(services.fleet.start_all)
    async with Sampler(log.probe) as s:
        await manifests.apply(kapi, _cr("win", pool="win", policy="win"))
        wait_s = (end - datetime.now(UTC)).total_seconds() + 25
        await asyncio.sleep(max(wait_s, 0))
        await s.stop()
    started = {n for n, (_, _, at) in log.seen.items()}
    assert started, "nodes started inside the window"
    assert all(at < end for _, (_, _, at) in log.seen.items()), "nothing started after it"
    assert len(started) < len(names)
    turns = await _done(kapi, "win")
    assert all(turns[n] == "done" for n in started), "work in progress finished"
    assert all(turns[n] == "scheduler" for n in set(names) - started)
    cr = await read_cr(kapi, "win")
    waiting = {d.node: d.reason for d in cr.status.node_details}
    assert set(waiting.values()) == {"WaitingForWindow"}
