"""Issue 5 end to end, on the real rig with kwok nodes and the five services as processes:
DeploymentPolicy strategies batch by batch as ``nodewright plan`` predicts, a failing
compartment that stops alone (told by its per-compartment Events: BatchStarted,
BatchFinished, CompartmentStopped; CompartmentCompleted for the other) and resumes after a
batch-state reset, a cluster budget
shared by two NodeWrights, a maintenance window closing mid-rollout (the compartment's
waitingReason and a CompartmentWaiting Event), three compartments
(fixed, linear, exponential) each running its own batch sequence without waiting for the
others, nodes several compartments select admitted into the safest one (strategy, then
budget, then name) and counted there in status, priority with ``sequencing: node`` (the
later NodeWright follows node by node) and ``sequencing: all`` (it waits until the earlier
one is done everywhere) with ``WaitingForPriority`` in status, pause (nothing starts,
status Paused) then unpause, a budget lowered mid-rollout (the open batch finishes, then
one node at a time), and compartments edited mid-rollout (a selector moved to other nodes, then
the compartment removed) with no admission ever over the budget in force, and a strategy
changed mid-rollout (the batches ``nodewright plan`` predicts right after the edit)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from nodewright import manifests, plan_cmd
from nodewright.connecting import CommandError
from nodewright.rig import nodes
from services.status import kube_events
from shared import api, nodestate, podspec, progress
from shared.kube import ApiError, Kube, path_of
from shared.records.scheduler import Selection
from shared.rollout import book as rollout_book
from tests.deploy.argocd import health_everywhere
from tests.e2e.conftest import NODES, Sampler, Services, read_cr
from tests.helpers.waiting import Pending, eventually

# End-to-end runs take minutes on 2 cores; the suite-wide 120 s limit is for unit tests.
pytestmark = pytest.mark.timeout(600)

SIM = "sim.nodewright.nvidia.com"
SEEN_WITHIN = timedelta(seconds=2)
"""How long after an edit of a policy is written the scheduler may still decide on the old one
(its watch delivers it in milliseconds on an idle rig)."""


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


async def _selections(kapi: Kube, cr: str) -> dict[str, Selection]:
    listed = await kapi.get(NODES)
    out = {}
    for n in listed["items"]:
        sel = nodestate.read(n, nodestate.SCHEDULER, cr, Selection)
        if sel is not None:
            out[n["metadata"]["name"]] = sel
    return out


class BatchLog:
    """Every admission seen: node -> (compartment, batch, selected_at) and its node order;
    and per probe, the compartments with a node admitted at that moment."""

    def __init__(self, kapi: Kube, cr: str) -> None:
        self.kapi, self.cr = kapi, cr
        self.seen: dict[str, tuple[str, int, datetime]] = {}
        self.orders: dict[str, int | None] = {}
        self.at_once: list[frozenset[str]] = []

    async def probe(self) -> int:
        sels = await _selections(self.kapi, self.cr)
        for node, sel in sels.items():
            self.seen.setdefault(node, (sel.compartment, sel.batch, sel.selected_at))
            self.orders.setdefault(node, sel.order)
        self.at_once.append(frozenset(sel.compartment for sel in sels.values()))
        return len(sels)

    def batches(self) -> dict[tuple[str, int], set[str]]:
        out: dict[tuple[str, int], set[str]] = {}
        for node, (comp, batch, _) in self.seen.items():
            out.setdefault((comp, batch), set()).add(node)
        return out


async def _compartment_events(kapi: Kube, cr: str) -> list[tuple[str, str, str, str]]:
    """(compartment, reason, type, batch) of the per-compartment Events on NodeWright ``cr``,
    oldest first."""
    listed = await kapi.get(
        path_of(plural="events", namespace=kube_events.EVENT_NAMESPACE),
        labelSelector=f"{kube_events.LABEL_NODEWRIGHT}={cr}",
    )
    out = []
    for e in sorted(
        listed["items"], key=lambda e: (e.get("firstTimestamp") or "", e["metadata"]["name"])
    ):
        if e.get("reason") not in kube_events.COMPARTMENT_REASONS:
            continue
        notes = e["metadata"].get("annotations") or {}
        out.append(
            (
                notes.get(kube_events.ANNOTATION_COMPARTMENT, ""),
                str(e["reason"]),
                str(e["type"]),
                notes.get(kube_events.ANNOTATION_BATCH, ""),
            )
        )
    return out


async def _done(kapi: Kube, cr: str) -> dict[str, str]:
    obj = await read_cr(kapi, cr)
    listed = await kapi.get(NODES)
    return {
        n["metadata"]["name"]: progress.turn(obj, progress.facts(n, cr))
        for n in listed["items"]
        if progress.selector_matches(obj.spec.node_selectors, n["metadata"].get("labels") or {})
    }


async def _all_done(kapi: Kube, cr: str) -> bool | Pending:
    turns = await _done(kapi, cr)
    if turns and set(turns.values()) == {"done"}:
        return True
    return Pending(
        f"{cr}: nodes not done: { {n: t for n, t in sorted(turns.items()) if t != 'done'} }"
    )


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
    # The plan's table: batch 1 of __default__ holds 1 node.
    rows = [line.split() for line in plan_cmd.render(doc).splitlines()]
    assert any(row[:4] == ["__default__", "1", "1", "planned"] for row in rows), rows
    planned_orders = {
        n: o for b in doc["batches"] for n, o in zip(b["nodes"], b["orders"], strict=True)
    }
    assert sorted(planned_orders.values()) == list(range(10))
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
    # NODEWRIGHT_NODE_ORDER: the admissions are numbered 0..9 across the batches, as the plan
    # said, each batch after the one before (nothing crashed, so there is no gap).
    orders = {node: order for node, order in log.orders.items() if order is not None}
    assert len(orders) == len(log.orders) == 10
    assert sorted(orders.values()) == list(range(10))
    assert orders == planned_orders
    by_batch = sorted((log.seen[n][1], o) for n, o in orders.items())
    assert [o for _, o in by_batch] == list(range(10))


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
        book = rollout_book.read_batch_book(cr.metadata.annotations)
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

    # Each compartment's story as Kubernetes Events on the NodeWright.
    async def stopped_event() -> list[tuple[str, str, str, str]]:
        seen = await _compartment_events(kapi, "gates")
        return seen if ("bad", "CompartmentStopped", "Warning", "3") in seen else []

    story = await eventually(stopped_event, what="the CompartmentStopped Event")
    stopped = [e for e in story if e[0] == "bad"]
    assert ("bad", "BatchStarted", "Normal", "1") in stopped
    assert ("bad", "BatchFinished", "Warning", "2") in stopped, "the second failed batch"
    assert not any(e[1] == "BatchStarted" and e[3] == "3" for e in stopped), "no third batch"
    # A compartment's completion is an Event only in verbose mode (the rollout's completion
    # is one anyway): the status says it.
    assert not any(e[1] == "CompartmentCompleted" for e in story), story
    comps = {c.name: c for c in (await read_cr(kapi, "gates")).status.compartments}
    assert comps["good"].complete_nodes == comps["good"].matched_nodes == len(good)

    # Reset by command: the stopped compartment starts again at batch 1.
    await kapi.patch(
        f"{manifests.NODEWRIGHTS}/gates",
        {"metadata": {"annotations": {rollout_book.RESET_ANNOTATION: "reset-1"}}},
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

        async def both_done() -> bool | Pending:
            return await _all_done(kapi, "first") and await _all_done(kapi, "second")

        await eventually(both_done, timeout_s=170, interval_s=1, what="both rollouts")
        await s.stop()
    assert max(s.samples) == 1, "never two nodes disrupted at once"
    assert len(s.samples) > 50


async def test_a_window_closing_mid_rollout_lets_running_nodes_finish_and_starts_none(
    cluster: Kube, services: Services
) -> None:
    kapi = cluster
    names = await _nodes(kapi, [f"win-{i:02d}" for i in range(16)], nodepool="win")
    # The window is 20 to 80 s long (it ends on a whole minute): with 3 s stages a node takes
    # over 12 s, so at most 7 nodes can start in it and some are always left waiting.
    for name in names:
        await kapi.patch(
            f"{NODES}/{name}", {"metadata": {"annotations": {podspec.SIM_STAGE_DURATION: "3s"}}}
        )
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
        # Long enough for the node started last to finish (about 4 x 3 s plus checks).
        wait_s = (end - datetime.now(UTC)).total_seconds() + 40
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
    (comp,) = cr.status.compartments
    assert comp.waiting_reason == "WaitingForWindow"
    left = len(names) - len(started)
    assert comp.waiting_message.startswith(f"outside every maintenance window ({left} nodes, e.g.")

    # The wait is in the status (above) and the nodes' reasons; a CompartmentWaiting Event
    # only in verbose mode (NODEWRIGHT_STATUS_VERBOSE_EVENTS).
    seen = await _compartment_events(kapi, "win")
    assert not any(r == "CompartmentWaiting" for _, r, _, _ in seen), seen


def _started(log: BatchLog, compartment: str, batch: int) -> datetime:
    """When the first node of a batch was admitted."""
    return min(at for c, b, at in log.seen.values() if (c, b) == (compartment, batch))


async def test_three_compartments_with_their_own_strategies_progress_independently(
    cluster: Kube, services: Services
) -> None:
    kapi = cluster
    racks = {"a": 4, "b": 6, "c": 7}
    for rack, count in racks.items():
        await _nodes(kapi, [f"tri-{rack}{i}" for i in range(count)], nodepool="tri", rack=rack)
    # Rack c's package stages take four times as long: the other compartments must not wait
    # for its batches.
    for i in range(racks["c"]):
        await kapi.patch(
            f"{NODES}/tri-c{i}", {"metadata": {"annotations": {f"{SIM}/stage-duration": "4s"}}}
        )

    def compartment(name: str, rack: str, budget: int, strategy: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": name,
            "selector": {"matchLabels": {"rack": rack}},
            "budget": {"count": budget},
            "strategy": strategy,
        }

    await manifests.apply(
        kapi,
        _policy(
            "tri",
            {
                "default": {"budget": {"count": 1}},
                "compartments": [
                    compartment("fixed-a", "a", 2, {"fixed": {"batchSize": 2}}),
                    compartment("linear-b", "b", 3, {"linear": {"initialBatch": 1, "delta": 1}}),
                    compartment(
                        "exp-c", "c", 4, {"exponential": {"initialBatch": 1, "growthFactor": 2}}
                    ),
                ],
            },
        ),
    )
    await manifests.apply(kapi, _cr("tri", pool="tri", policy="tri"))
    doc = await plan_cmd.plan_for(kapi, "tri", datetime.now(UTC))
    planned = {(b["compartment"], b["batch"]): set(b["nodes"]) for b in doc["batches"]}
    sizes: dict[str, list[int]] = {}
    for b in doc["batches"]:
        sizes.setdefault(b["compartment"], []).append(b["size"])
    assert sizes == {"fixed-a": [2, 2], "linear-b": [1, 2, 3], "exp-c": [1, 2, 4]}
    assert {c["name"]: c["matchedNodes"] for c in doc["compartments"]} == {
        "fixed-a": 4,
        "linear-b": 6,
        "exp-c": 7,
        "__default__": 0,
    }
    log = BatchLog(kapi, "tri")
    await asyncio.to_thread(services.fleet.start_all)
    async with Sampler(log.probe) as s:
        await eventually(
            lambda: _all_done(kapi, "tri"), timeout_s=200, interval_s=1, what="three compartments"
        )
        await s.stop()
    assert log.batches() == planned
    for comp, count in (("fixed-a", 2), ("linear-b", 3), ("exp-c", 3)):
        starts = [_started(log, comp, b) for b in range(1, count + 1)]
        assert starts == sorted(starts), f"{comp}: batches in order"
    # All three began together, and the fast compartments went on to their last batches while
    # the slow one was still on its first: no compartment waits for another.
    assert max(_started(log, c, 1) for c in sizes) < min(_started(log, c, 2) for c in sizes)
    # At the probe's resolution: two batches first seen by the same probe started together
    # as far as it can tell.
    assert _started(log, "fixed-a", 2) <= _started(log, "exp-c", 2)
    assert _started(log, "linear-b", 3) <= _started(log, "exp-c", 2)
    assert frozenset(sizes) in log.at_once, "nodes of all three compartments in flight at once"


async def test_nodes_several_compartments_select_go_to_the_safest(
    cluster: Kube, services: Services
) -> None:
    kapi = cluster
    # node -> its labels besides nodepool, and the compartment the rule assigns it to.
    layout: dict[str, tuple[dict[str, str], str]] = {
        # linear before exponential, though the exponential compartment's budget is smaller
        "ov-0": ({"rack": "r1", "zone": "z1"}, "beta-lin"),
        # both linear: the smaller budget (not the name)
        "ov-1": ({"zone": "z1", "gpu": "yes"}, "gamma-lin"),
        # both fixed, same budget: the name
        "ov-2": ({"ssd": "yes", "nvme": "yes"}, "eta-fixed"),
        # exponential before no strategy, though the latter's name comes first
        "ov-3": ({"tier": "t1", "rack": "r1"}, "alpha-exp"),
        # fixed before linear, though the linear compartment's budget and name are smaller
        "ov-4": ({"zone": "z1", "ssd": "yes"}, "zeta-fixed"),
        # four compartments: linear, then the smaller budget
        "ov-5": ({"rack": "r1", "zone": "z1", "gpu": "yes", "tier": "t1"}, "gamma-lin"),
        # one compartment each, or none
        "ov-6": ({"tier": "t1"}, "all-none"),
        "ov-7": ({"zone": "z1"}, "beta-lin"),
        "ov-8": ({}, "__default__"),
    }
    for name, (labels, _) in layout.items():
        await _nodes(kapi, [name], nodepool="ov", **labels)

    def compartment(
        name: str, key: str, budget: int, strategy: dict[str, Any] | None
    ) -> dict[str, Any]:
        value = {"rack": "r1", "zone": "z1", "tier": "t1"}.get(key, "yes")
        c: dict[str, Any] = {
            "name": name,
            "selector": {"matchLabels": {key: value}},
            "budget": {"count": budget},
        }
        if strategy is not None:
            c["strategy"] = strategy
        return c

    linear = {"linear": {"initialBatch": 1, "delta": 1}}
    fixed = {"fixed": {"batchSize": 4}}
    await manifests.apply(
        kapi,
        _policy(
            "overlap",
            {
                "default": {"budget": {"count": 1}},
                # Listed in no particular order: the assignment must not depend on it.
                "compartments": [
                    compartment("zeta-fixed", "ssd", 4, fixed),
                    compartment("all-none", "tier", 1, None),
                    compartment("beta-lin", "zone", 2, linear),
                    compartment("alpha-exp", "rack", 1, {"exponential": {"initialBatch": 1}}),
                    compartment("gamma-lin", "gpu", 1, linear),
                    compartment("eta-fixed", "nvme", 4, fixed),
                ],
            },
        ),
    )
    await manifests.apply(kapi, _cr("overlap", pool="ov", policy="overlap"))
    expected = {name: comp for name, (_, comp) in layout.items()}
    counts: dict[str, int] = {}
    for comp in expected.values():
        counts[comp] = counts.get(comp, 0) + 1
    doc = await plan_cmd.plan_for(kapi, "overlap", datetime.now(UTC))
    assert {c["name"]: c["matchedNodes"] for c in doc["compartments"]} == counts
    log = BatchLog(kapi, "overlap")
    await asyncio.to_thread(services.fleet.start_all)
    async with Sampler(log.probe) as s:
        await eventually(
            lambda: _all_done(kapi, "overlap"), timeout_s=150, interval_s=1, what="overlap rollout"
        )
        await s.stop()
    assert {node: comp for node, (comp, _, _) in log.seen.items()} == expected

    async def status_counts() -> dict[str, int]:
        cr = await read_cr(kapi, "overlap")
        return {c.name: c.matched_nodes for c in cr.status.compartments}

    async def status_agrees() -> bool:
        return await status_counts() == counts

    await eventually(
        status_agrees, timeout_s=30, what=f"status.compartments matchedNodes to be {counts}"
    )


async def test_priority_holds_a_later_nodewright_back_per_node_or_everywhere_by_sequencing(
    cluster: Kube, services: Services
) -> None:
    """The sequencing of the NodeWright ahead decides: ``node`` holds the later one back on
    each node until it is done there, ``all`` on every node until it is done everywhere."""
    kapi = cluster
    sn = await _nodes(kapi, [f"sn-{i}" for i in range(3)], nodepool="sn")
    sa = await _nodes(kapi, [f"sa-{i}" for i in range(3)], nodepool="sa")
    sx = await _nodes(kapi, ["sx-0"], nodepool="sx")
    one = {"count": 1}
    sa_and_sx = {
        "matchExpressions": [{"key": "nodepool", "operator": "In", "values": ["sa", "sx"]}]
    }
    bodies = [
        _cr("early-node", pool="sn", priority=1, sequencing="node", interruptionBudget=one),
        # Two: the node early-node has cordoned counts against late-node's budget too (a
        # disrupted node of its pool), so with one late-node could start only in the gap
        # between two of early-node's nodes, a race the drainer often won under CI load.
        _cr("late-node", pool="sn", priority=2, interruptionBudget={"count": 2}),
        # early-all does not target sx-0; late-all waits there too.
        _cr("early-all", pool="sa", priority=3, sequencing="all", interruptionBudget=one),
        _cr(
            "late-all",
            pool="sa",
            priority=4,
            nodeSelectors=sa_and_sx,
            interruptionBudget={"count": 4},
        ),
    ]
    for body in bodies:
        await manifests.apply(kapi, body)
    crs = {b["metadata"]["name"]: await read_cr(kapi, b["metadata"]["name"]) for b in bodies}
    targets = {"early-node": sn, "late-node": sn, "early-all": sa, "late-all": sa + sx}

    Turns = dict[tuple[str, str], str]
    Details = dict[tuple[str, str], tuple[str, str]]

    async def probe() -> tuple[Turns, Details]:
        listed = {n["metadata"]["name"]: n for n in (await kapi.get(NODES))["items"]}
        turns: Turns = {
            (cr, node): progress.turn(crs[cr], progress.facts(listed[node], cr))
            for cr, names in targets.items()
            for node in names
        }
        details: Details = {}
        for cr in ("late-node", "late-all"):
            status = (await read_cr(kapi, cr)).status
            for d in status.node_details:
                details[(cr, d.node)] = (d.reason, d.message)
        return turns, details

    await asyncio.to_thread(services.fleet.start_all)
    async with Sampler(probe) as s:

        async def all_done() -> bool:
            return all([await _all_done(kapi, cr) for cr in crs])

        await eventually(all_done, timeout_s=200, interval_s=1, what="four rollouts")
        await s.stop()
    samples: list[tuple[Turns, Details]] = s.samples
    assert len(samples) > 50

    def started(turns: Turns, cr: str, node: str) -> bool:
        return turns[(cr, node)] != "scheduler"

    for turns, _ in samples:
        for node in sn:
            if started(turns, "late-node", node):
                assert turns[("early-node", node)] == "done", f"late-node started on {node} early"
        if any(started(turns, "late-all", node) for node in sa + sx):
            assert all(turns[("early-all", node)] == "done" for node in sa), (
                "late-all started before early-all was done on all its nodes"
            )
    # sequencing node: the later one ran on a node while the earlier one was busy on another.
    assert any(
        any(started(t, "late-node", n) for n in sn)
        and any(t[("early-node", n)] != "done" for n in sn)
        for t, _ in samples
    )
    # sequencing all: the earlier one was done on some nodes and the later one waited there.
    assert any(
        any(t[("early-all", n)] == "done" for n in sa)
        and not all(t[("early-all", n)] == "done" for n in sa)
        for t, _ in samples
    )
    waited: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for _, details in samples:
        for key, detail in details.items():
            waited.setdefault(key, set()).add(detail)
    for cr, ahead, nodes_ in (("late-node", "early-node", sn), ("late-all", "early-all", sa + sx)):
        for node in nodes_:
            assert (
                "WaitingForPriority",
                f"waiting for NodeWright {ahead} (priority and sequencing)",
            ) in waited.get((cr, node), set()), f"{cr} on {node}"


async def test_a_paused_nodewright_starts_nothing_until_it_is_unpaused(
    cluster: Kube, services: Services
) -> None:
    kapi = cluster
    names = await _nodes(kapi, ["pz-0", "pz-1"], nodepool="pz")
    body = _cr("pz", pool="pz", interruptionBudget={"count": 2})
    body["metadata"]["annotations"] = {api.PAUSE_ANNOTATION: "true"}
    await manifests.apply(kapi, body)
    log = BatchLog(kapi, "pz")
    await asyncio.to_thread(services.fleet.start_all)
    async with Sampler(log.probe) as s:

        async def paused() -> bool:
            cr = await read_cr(kapi, "pz")
            waiting = {d.node: d.reason for d in cr.status.node_details}
            book = rollout_book.read_batch_book(cr.metadata.annotations)
            return (
                cr.status.state == "Paused"
                and waiting == dict.fromkeys(names, "Paused")
                # The scheduler has decided on it (its finalizer and batch book are written).
                and bool(cr.metadata.finalizers)
                and bool(book.versions)
            )

        await eventually(paused, timeout_s=60, what="status Paused after a scheduler pass")
        await asyncio.sleep(3)
        assert log.seen == {}, "nothing started while paused"
        cr = await read_cr(kapi, "pz")
        book = rollout_book.read_batch_book(cr.metadata.annotations)
        assert all(not c.nodes for c in book.compartments.values()), "no batch opened"
        await kapi.patch(
            f"{manifests.NODEWRIGHTS}/pz",
            {"metadata": {"annotations": {api.PAUSE_ANNOTATION: None}}},
        )
        await eventually(
            lambda: _all_done(kapi, "pz"), timeout_s=120, interval_s=1, what="unpaused rollout"
        )
        await s.stop()
    assert {n: (c, b) for n, (c, b, _) in log.seen.items()} == dict.fromkeys(
        names, ("__default__", 1)
    )


async def test_a_budget_lowered_mid_rollout_lets_the_open_batch_finish_and_holds_after(
    cluster: Kube, services: Services
) -> None:
    """Someone lowers the DeploymentPolicy's budget from 4 to 1 while a batch of 4 runs (a
    job found that needs the capacity): the 4 nodes in flight finish, nothing new starts
    while they do, and from then on one node at a time, as the status then says."""
    kapi = cluster
    names = await _nodes(kapi, [f"lo-{i}" for i in range(8)], nodepool="lo")
    for name in names:
        await kapi.patch(
            f"{NODES}/{name}", {"metadata": {"annotations": {podspec.SIM_STAGE_DURATION: "2s"}}}
        )
    await manifests.apply(kapi, _policy("lo", {"default": {"budget": {"count": 4}}}))
    log = BatchLog(kapi, "lo")
    await asyncio.to_thread(services.fleet.start_all)
    async with Sampler(log.probe) as before:
        await manifests.apply(kapi, _cr("lo", pool="lo", policy="lo"))

        async def batch_open() -> bool | Pending:
            sels = await _selections(kapi, "lo")
            return len(sels) == 4 or Pending(f"{len(sels)} admitted")

        await eventually(batch_open, timeout_s=60, interval_s=0.2, what="a batch of 4")
        await before.stop()
    await kapi.patch(f"{manifests.POLICIES}/lo", {"spec": {"default": {"budget": {"count": 1}}}})
    edited = datetime.now(UTC)
    async with Sampler(log.probe) as after:
        await eventually(
            lambda: _all_done(kapi, "lo"), timeout_s=240, interval_s=1, what="the rollout"
        )
        await after.stop()
    batches = log.batches()
    assert len(batches[("__default__", 1)]) == 4, batches
    later = {key: nodes_ for key, nodes_ in batches.items() if key[1] > 1}
    assert later, batches
    assert all(len(n) == 1 for n in later.values()), batches
    assert sum(len(n) for n in later.values()) == 4
    assert all(at > edited for c, b, at in log.seen.values() if b > 1)
    # Measured from outside: the admitted count only fell while the first batch drained,
    # then never went above 1.
    samples = after.samples
    drained = next(i for i, n in enumerate(samples) if n <= 1)
    assert samples[:drained] == sorted(samples[:drained], reverse=True), samples
    assert max(samples[drained:]) <= 1, samples
    (comp,) = (await read_cr(kapi, "lo")).status.compartments
    assert comp.budget_nodes == 1


async def test_compartments_edited_mid_rollout_never_let_an_admission_exceed_a_budget(
    cluster: Kube, services: Services
) -> None:
    """Someone edits the policy's compartments while their nodes are in flight: first the
    compartment's selector moves to the other rack (with new budgets), then the compartment
    is removed. A node in flight counts where it was admitted while that compartment exists
    (``rules.compartment_of``), else where its labels now put it; no admission after an
    edit takes a compartment over its new budget, and the rollout completes."""
    kapi = cluster
    racks = {"a": [f"mv-a{i}" for i in range(4)], "b": [f"mv-b{i}" for i in range(4)]}
    # Rack b's work takes twice as long, so a rack-b node admitted into "moving" is still in
    # flight when rack a's nodes beside it are done and the default may admit again.
    for rack, names in racks.items():
        await _nodes(kapi, names, nodepool="mv", rack=rack)
        for name in names:
            duration = {"a": "2s", "b": "4s"}[rack]
            await kapi.patch(
                f"{NODES}/{name}",
                {"metadata": {"annotations": {podspec.SIM_STAGE_DURATION: duration}}},
            )

    def policy(default: int, compartments: list[tuple[str, int]]) -> dict[str, Any]:
        return {
            "default": {"budget": {"count": default}},
            "compartments": [
                {
                    "name": "moving",
                    "selector": {"matchLabels": {"rack": rack}},
                    "budget": {"count": budget},
                    "strategy": {"fixed": {"batchSize": budget}},
                }
                for rack, budget in compartments
            ],
        }

    rack_of = {n: rack for rack, names in racks.items() for n in names}
    # (from when, policy in force): who counts where, and the budgets. An admission decided
    # on the policy before an edit may land just after it (the scheduler's watch brings the
    # edit); one made SEEN_WITHIN after the edit was written is judged by the new policy.
    edits: list[tuple[datetime, dict[str, str], dict[str, int]]] = []

    def counts_in(sels: dict[str, Selection], where: dict[str, str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for node, sel in sels.items():
            comp = sel.compartment if sel.compartment in set(where.values()) else where[node]
            out.setdefault(comp, []).append(node)
        return out

    # Every sample after an edit: (edit index, admissions per compartment, admitted after it).
    seen: list[tuple[int, dict[str, list[str]], set[str]]] = []

    async def probe() -> int:
        sels = await _selections(kapi, "mv")
        if edits:
            at, where, _ = edits[-1]
            later = {n for n, s in sels.items() if s.selected_at > at}
            seen.append((len(edits) - 1, counts_in(sels, where), later))
        return len(sels)

    await manifests.apply(kapi, _policy("mv", policy(1, [("a", 2)])))
    await asyncio.to_thread(services.fleet.start_all)
    await manifests.apply(kapi, _cr("mv", pool="mv", policy="mv"))

    async def admitted(expected: dict[str, int]) -> bool | Pending:
        sels = await _selections(kapi, "mv")
        got: dict[str, int] = {}
        for sel in sels.values():
            got[sel.compartment] = got.get(sel.compartment, 0) + 1
        return got == expected or Pending(f"admitted per compartment: {got}")

    await eventually(
        lambda: admitted({"moving": 2, "__default__": 1}),
        timeout_s=60,
        interval_s=0.2,
        what="the first batches",
    )
    async with Sampler(probe) as s:
        # The compartment now selects rack b with a budget of 1; the default takes rack a
        # with 2. Rack a's two nodes in flight still count in "moving".
        await kapi.patch(f"{manifests.POLICIES}/mv", {"spec": policy(2, [("b", 1)])})
        edits.append(
            (
                datetime.now(UTC) + SEEN_WITHIN,
                {n: "moving" if r == "b" else "__default__" for n, r in rack_of.items()},
                {"moving": 1, "__default__": 2},
            )
        )

        async def moved_admitted() -> bool | Pending:
            await probe()  # the state that ends this edit's phase is judged by it too
            sels = await _selections(kapi, "mv")
            later = [n for n, sel in sels.items() if sel.compartment == "moving"]
            return any(rack_of[n] == "b" for n in later) or Pending(f"moving: {later}")

        await eventually(
            moved_admitted, timeout_s=120, interval_s=0.2, what="a rack b node in 'moving'"
        )
        # The compartment goes: everything counts in the default (budget 2), the node
        # admitted into "moving" included.
        await kapi.patch(
            f"{manifests.POLICIES}/mv",
            {"spec": {"default": {"budget": {"count": 2}}, "compartments": None}},
        )
        edits.append(
            (
                datetime.now(UTC) + SEEN_WITHIN,
                dict.fromkeys(rack_of, "__default__"),
                {"__default__": 2},
            )
        )
        await eventually(
            lambda: _all_done(kapi, "mv"), timeout_s=300, interval_s=1, what="the rollout"
        )
        await s.stop()
    assert seen, "no sample after the edits"
    for index, per_compartment, later in seen:
        budgets = edits[index][2]
        for comp, in_flight in per_compartment.items():
            if later & set(in_flight):
                assert len(in_flight) <= budgets[comp], (index, per_compartment, later)
    # Both edits were followed by admissions judged against them.
    assert {index for index, _, later in seen if later} == {0, 1}, seen
    status = (await read_cr(kapi, "mv")).status
    assert [(c.name, c.budget_nodes) for c in status.compartments] == [("__default__", 2)]


async def test_a_strategy_changed_mid_rollout_runs_the_batches_nodewright_plan_then_predicts(
    cluster: Kube, services: Services
) -> None:
    """The policy's strategy goes from fixed batches of 1 to exponential growth while the
    first batch runs: the batch in flight finishes as it was, then the rollout runs exactly
    the batches ``nodewright plan`` predicts right after the edit (the same kernel), growing
    from the batch in flight."""
    kapi = cluster
    names = await _nodes(kapi, [f"stc-{i}" for i in range(9)], nodepool="stc")
    for name in names:
        await kapi.patch(
            f"{NODES}/{name}", {"metadata": {"annotations": {podspec.SIM_STAGE_DURATION: "2s"}}}
        )
    fixed = {"fixed": {"batchSize": 1}}
    await manifests.apply(
        kapi, _policy("stc", {"default": {"budget": {"count": 9}, "strategy": fixed}})
    )
    log = BatchLog(kapi, "stc")
    await asyncio.to_thread(services.fleet.start_all)
    async with Sampler(log.probe) as s:
        await manifests.apply(kapi, _cr("stc", pool="stc", policy="stc"))

        async def first_batch() -> bool | Pending:
            await log.probe()
            return bool(log.seen) or Pending("nothing admitted")

        await eventually(first_batch, timeout_s=60, interval_s=0.2, what="the first batch")
        exponential = {"fixed": None, "exponential": {"initialBatch": 1, "growthFactor": 2}}
        await kapi.patch(
            f"{manifests.POLICIES}/stc", {"spec": {"default": {"strategy": exponential}}}
        )
        doc = await plan_cmd.plan_for(kapi, "stc", datetime.now(UTC))
        await eventually(
            lambda: _all_done(kapi, "stc"), timeout_s=240, interval_s=1, what="the rollout"
        )
        await s.stop()
    # Batch 1 ran as fixed had it; from 1, exponential doubles: 2, 4, then the last 2.
    assert [b["size"] for b in doc["batches"]] == [1, 2, 4, 2]
    planned = {(b["compartment"], b["batch"]): set(b["nodes"]) for b in doc["batches"]}
    assert log.batches() == planned


async def test_a_batch_soak_holds_the_next_batch_for_its_seconds_then_opens_it_at_once(
    cluster: Kube, services: Services
) -> None:
    """``batchSoakSeconds: 8``, one node a batch: each batch opens 8 s after the last one
    finished (as the batch book records it), not before, and at once then: the scheduler
    decides again at the soak's end (the resync is 2 minutes here, so nothing else would
    wake it). Meanwhile the waiting nodes say BatchSoaking, and ``nodewright plan`` still
    predicts every batch."""
    kapi, soak = cluster, timedelta(seconds=8)
    names = await _nodes(kapi, [f"soak-{i}" for i in range(3)], nodepool="soak")
    spec = {"budget": {"count": 1}, "strategy": {"fixed": {"batchSize": 1}}}
    await manifests.apply(kapi, _policy("soak", {"default": {**spec, "batchSoakSeconds": 8}}))
    log = BatchLog(kapi, "soak")
    finished: set[datetime] = set()
    said: dict[str, str] = {}

    async def probe() -> int:
        await log.probe()
        raw = await kapi.get(f"{manifests.NODEWRIGHTS}/soak")
        book = rollout_book.read_batch_book(raw["metadata"].get("annotations") or {})
        finished.update(c.finished for c in book.compartments.values() if c.finished)
        for d in api.from_dict(raw, api.NodeWright).status.node_details:
            said.setdefault(d.reason, d.message)
        return 0

    services.fleet.extra_env["NODEWRIGHT_RESYNC_INTERVAL_S"] = "120"
    await asyncio.to_thread(services.fleet.start_all)
    async with Sampler(probe) as s:
        await manifests.apply(kapi, _cr("soak", pool="soak", policy="soak"))

        async def soaking() -> bool:
            return "BatchSoaking" in said

        await eventually(soaking, timeout_s=60, what="a node saying BatchSoaking")
        planned = await plan_cmd.plan_for(kapi, "soak", datetime.now(UTC))
        await eventually(lambda: _all_done(kapi, "soak"), timeout_s=120, what="every node done")
        await s.stop()
    assert [b["nodes"] for b in planned["batches"]] == [[n] for n in names[1:]], planned
    (comp,) = planned["compartments"]
    assert comp["soakingUntil"] is not None, comp
    assert plan_cmd.compartment_state(comp, planned["batches"]).startswith("soaking until ")
    starts = sorted(at for _, _, at in log.seen.values())
    ends = sorted(finished)
    assert len(starts) == 3
    assert len(ends) >= 2, ends
    for end, start in zip(ends[:2], starts[1:], strict=True):
        assert end + soak <= start <= end + soak + timedelta(seconds=3), (end, start)
    assert "soaks after batch" in said["BatchSoaking"]
    assert "(batchSoakSeconds: 8)" in said["BatchSoaking"]


async def test_an_approval_gate_holds_the_next_batch_until_nodewright_approve(
    cluster: Kube, services: Services
) -> None:
    """``approvalAfterBatches: [1]``, two nodes a batch: once batch 1 finished, the waiting
    nodes, the compartment's status and a CompartmentWaiting Event say
    BatchAwaitingApproval with the command that approves it, and no node of batch 2 is
    admitted until ``nodewright approve`` wrote the approval; then batch 2 opens at once
    (the resync is 2 minutes here: the approval's change of the NodeWright wakes the
    scheduler). ``nodewright plan`` meanwhile says which batch awaits approval, and Argo CD's
    health check says Suspended."""
    kapi = cluster
    names = await _nodes(kapi, [f"appr-{i}" for i in range(4)], nodepool="appr")
    spec = {"budget": {"count": 2}, "strategy": {"fixed": {"batchSize": 2}}}
    await manifests.apply(kapi, _policy("appr", {"default": {**spec, "approvalAfterBatches": [1]}}))
    log = BatchLog(kapi, "appr")
    said: dict[str, str] = {}
    compartment_waits: set[str] = set()

    async def probe() -> int:
        await log.probe()
        obj = await read_cr(kapi, "appr")
        for d in obj.status.node_details:
            said.setdefault(d.reason, d.message)
        compartment_waits.update(c.waiting_reason for c in obj.status.compartments)
        return 0

    services.fleet.extra_env["NODEWRIGHT_RESYNC_INTERVAL_S"] = "120"
    await asyncio.to_thread(services.fleet.start_all)
    async with Sampler(probe) as s:
        await manifests.apply(kapi, _cr("appr", pool="appr", policy="appr"))

        async def awaiting() -> bool | Pending:
            if "BatchAwaitingApproval" in said and "BatchAwaitingApproval" in compartment_waits:
                return True
            return Pending(f"nodes say {sorted(said)}, compartments {sorted(compartment_waits)}")

        await eventually(awaiting, timeout_s=90, what="the rollout waiting for approval")

        async def suspended() -> bool | Pending:
            seen = health_everywhere(await kapi.get(f"{manifests.NODEWRIGHTS}/appr"))
            return seen[0] == "Suspended" or Pending(f"Argo CD health {seen}")

        await eventually(suspended, timeout_s=30, what="Argo CD health Suspended")
        planned = await plan_cmd.plan_for(kapi, "appr", datetime.now(UTC))
        first = {n for n, (_, batch, _) in log.seen.items() if batch == 1}
        assert len(log.seen) == 2, f"only batch 1 is admitted before the approval: {log.seen}"
        approved_at = datetime.now(UTC)
        lines = await plan_cmd.approve(kapi, "appr", None)
        await eventually(lambda: _all_done(kapi, "appr"), timeout_s=120, what="every node done")
        await s.stop()
    assert lines[0].startswith("Approved batch 1 of compartment __default__ of NodeWright appr")
    command = "nodewright approve appr --compartment __default__"
    why = said["BatchAwaitingApproval"]
    assert "waits for approval after batch 1 (approvalAfterBatches)" in why
    assert f"check its nodes, then `{command}`" in why
    (comp,) = planned["compartments"]
    assert comp["awaitingApproval"] == {"batch": 1, "command": command}, comp
    second = {n: at for n, (_, batch, at) in log.seen.items() if batch == 2}
    assert set(second) == set(names) - first, log.seen
    assert all(at >= approved_at - timedelta(seconds=1) for at in second.values()), (
        approved_at,
        second,
    )
    assert max(second.values()) <= approved_at + timedelta(seconds=10), "it opens at once then"
    listed = await kapi.get(
        path_of(plural="events", namespace=kube_events.EVENT_NAMESPACE),
        labelSelector=f"{kube_events.LABEL_NODEWRIGHT}=appr",
    )
    waits = [
        e["message"] for e in listed["items"] if e.get("reason") == kube_events.COMPARTMENT_WAITING
    ]
    assert any("waits for approval after batch 1" in m for m in waits), waits
    with pytest.raises(CommandError, match="waits for no approval"):
        await plan_cmd.approve(kapi, "appr", None)
