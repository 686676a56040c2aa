"""Issue 12 end to end, on the real rig (kube-apiserver, kwok nodes, nats-server, the five
services as processes), one test per case the issue reports, written from its descriptions:

1. the budget is a hard cap at every instant (6 nodes, count 2, one node failing its apply;
   five runs, a 50 ms sampler and a watch that sees every single node change);
2. ``nodewright plan`` taken at any moment of a linear, an exponential and a multi-
   compartment rollout matches the batches that then run;
3. under a cluster budget of 1 the waiting NodeWright says ``ClusterBudgetExhausted``,
   naming the node that holds it;
4. a node cordoned by hand does not deadlock the default budget: every node completes;
5. ``nodewright node reset`` repairs a record that does not decode;
6. correcting the image of a package that could not pull it starts it over by itself;
7. a reinstall after an uninstall never reuses the first install's pod names.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from nodewright import manifests, plan_cmd
from nodewright.rig import Rig
from shared import nodestate, progress
from shared.informer import Informer
from shared.kube import Kube
from shared.records.executor import ExecutorRecord
from shared.records.scheduler import Selection
from shared.rollout import slots
from tests.e2e.conftest import NODES, Sampler, Services, pod_ledger, read_cr
from tests.e2e.test_lifecycle import _patch_cr, _wait_done
from tests.e2e.test_policies import (  # the autouse fixture: policies go while the webhook runs
    BatchLog,
    _all_done,
    _cr,
    _nodes,
    _policy,
    _remove_crs_while_the_webhook_runs,  # noqa: F401
)
from tests.helpers.cli import cli
from tests.helpers.waiting import Pending, eventually

# End-to-end runs take minutes on 2 cores; the suite-wide 120 s limit is for unit tests.
pytestmark = pytest.mark.timeout(600)

SIM = "sim.nodewright.nvidia.com"


# ---- 1. the budget at every instant ----------------------------------------------------------


@dataclass
class SlotWatch:
    """Every state the nodes go through, as a node watch delivers them (in resourceVersion
    order), counting after each change the nodes that hold a slot of ``cr`` (admitted, or
    NotReady, or cordoned by someone else and not done: ``shared.rollout.slots.hold``)."""

    cr: Any
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    worst: int = 0
    changes: int = 0
    admitted_at_once: int = 0

    def on_change(self, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        obj = new or old
        assert obj is not None
        name = obj["metadata"]["name"]
        if new is None:
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = new
        self.changes += 1
        name_ = self.cr.metadata.name
        facts = [progress.facts(n, name_) for n in self.nodes.values()]
        held = sum(1 for f in facts if slots.hold(self.cr, f, {}) is not None)
        admitted = sum(1 for f in facts if f.selection is not None)
        self.worst = max(self.worst, held)
        self.admitted_at_once = max(self.admitted_at_once, admitted)


@contextlib.asynccontextmanager
async def slot_watch(kapi: Kube, cr: Any) -> AsyncIterator[SlotWatch]:
    watch = SlotWatch(cr=cr)
    informer = Informer(kube=kapi, path=NODES, on_change=watch.on_change, name="slots")
    task = asyncio.create_task(informer.run(), name="slot-watch")
    try:
        await asyncio.wait_for(informer.synced.wait(), 30)
        yield watch
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _admitted(kapi: Kube, cr: str) -> int:
    listed = await kapi.get(NODES)
    return sum(
        1
        for n in listed["items"]
        if nodestate.key(nodestate.SCHEDULER, cr) in (n["metadata"].get("annotations") or {})
    )


@pytest.mark.parametrize("run", [1, 2, 3, 4, 5])
async def test_case_1_the_budget_holds_at_every_instant_with_a_node_failing_its_apply(
    cluster: Kube, services: Services, run: int
) -> None:
    """Issue 12, case 1: 6 nodes, budget 2, one node failing its apply; in 2 of 3 runs three
    nodes held admissions at once for 120-175 ms."""
    kapi = cluster
    names = await _nodes(kapi, [f"s{run}-{i:02d}" for i in range(6)], nodepool="s5")
    await kapi.patch(
        f"{NODES}/{names[1]}", {"metadata": {"annotations": {f"{SIM}/fail": "tuning/apply"}}}
    )
    body = _cr("s5", pool="s5", interruptionBudget={"count": 2})
    await asyncio.to_thread(services.fleet.start_all)
    await manifests.apply(kapi, body)
    cr = await read_cr(kapi, "s5")
    sampler = Sampler(lambda: _admitted(kapi, "s5"), interval_s=0.05)
    async with slot_watch(kapi, cr) as watch, sampler:

        async def settled() -> bool | Pending:
            obj = await read_cr(kapi, "s5")
            listed = await kapi.get(NODES)
            turns = {
                n["metadata"]["name"]: progress.turn(obj, progress.facts(n, "s5"))
                for n in listed["items"]
            }
            if turns.get(names[1]) == "failed" and sum(t == "done" for t in turns.values()) == 5:
                return True
            return Pending(f"turns: {turns}")

        await eventually(settled, timeout_s=240, interval_s=1, what="5 nodes done, 1 failed")
        await sampler.stop()
    assert len(sampler.samples) > 100, "the 50 ms sampler ran throughout"
    assert max(sampler.samples) <= 2, "never more than 2 admissions at once (sampled)"
    assert watch.changes > 50
    assert watch.admitted_at_once <= 2, "never more than 2 admissions at once (every change)"
    assert watch.worst <= 2, "never more than 2 nodes holding a slot (every change)"
    # The failed node keeps its slot; the others went through the one left.
    failed = progress.facts(await kapi.get(f"{NODES}/{names[1]}"), "s5")
    assert failed.selection is not None
    assert failed.unschedulable


# ---- 2. nodewright plan at any moment ----------------------------------------------------------


@dataclass
class PlanSamples:
    """``nodewright plan`` documents taken while the rollout runs."""

    kapi: Kube
    cr: str
    docs: list[dict[str, Any]] = field(default_factory=list)

    async def probe(self) -> int:
        self.docs.append(await plan_cmd.plan_for(self.kapi, self.cr, datetime.now(UTC)))
        return len(self.docs)


def _check_plans(samples: PlanSamples, log: BatchLog) -> int:
    """Every sampled plan predicted exactly the batches that then ran, from the one in
    flight (or the next one) on; returns how many samples were taken mid-batch."""
    ran = log.batches()
    mid = 0
    for doc in samples.docs:
        predicted = {(b["compartment"], b["batch"]): set(b["nodes"]) for b in doc["batches"]}
        if any(b["inFlight"] for b in doc["batches"]):
            mid += 1
        for key, planned in predicted.items():
            assert ran.get(key) == planned, (key, planned, ran.get(key), doc["batches"])
        for comp in {c for c, _ in predicted}:
            first = min(b for c, b in predicted if c == comp)
            later = {k for k in ran if k[0] == comp and k[1] >= first}
            assert later == {k for k in predicted if k[0] == comp}, (comp, later, predicted)
    return mid


async def _plans_match(
    kapi: Kube, services: Services, cr: dict[str, Any], expected: dict[str, list[int]]
) -> None:
    name = cr["metadata"]["name"]
    await asyncio.to_thread(services.fleet.start_all)
    log = BatchLog(kapi, name)
    samples = PlanSamples(kapi, name)
    await manifests.apply(kapi, cr)
    async with Sampler(log.probe, interval_s=0.1) as s1, Sampler(samples.probe, interval_s=0.5):
        await eventually(
            lambda: _all_done(kapi, name), timeout_s=400, interval_s=1, what="the rollout"
        )
        await s1.stop()
    sizes: dict[str, list[int]] = {}
    for (comp, _batch), members in sorted(log.batches().items()):
        sizes.setdefault(comp, []).append(len(members))
    assert sizes == expected
    mid = _check_plans(samples, log)
    assert len(samples.docs) > 10
    assert mid > 5, "plans were taken while batches were in flight"


async def test_case_2_plan_mid_batch_matches_a_linear_rollout(
    cluster: Kube, services: Services
) -> None:
    """Issue 12, case 2: count 4, linear delta 1, 15 nodes ran 1,2,3,4,4,1 while plan said
    1,2,3,3,3,3 during batch 1 and 4,1,1,1,1,1 with batch 4 in flight."""
    kapi = cluster
    await _nodes(kapi, [f"lin-{i:02d}" for i in range(15)], nodepool="lin")
    spec = {"budget": {"count": 4}, "strategy": {"linear": {"initialBatch": 1, "delta": 1}}}
    await manifests.apply(kapi, _policy("lin", {"default": spec}))
    await _plans_match(
        kapi, services, _cr("lin", pool="lin", policy="lin"), {"__default__": [1, 2, 3, 4, 4, 1]}
    )


async def test_case_2_plan_mid_batch_matches_an_exponential_rollout(
    cluster: Kube, services: Services
) -> None:
    kapi = cluster
    await _nodes(kapi, [f"exp-{i:02d}" for i in range(12)], nodepool="exp")
    spec = {
        "budget": {"count": 4},
        "strategy": {"exponential": {"initialBatch": 1, "growthFactor": 2}},
    }
    await manifests.apply(kapi, _policy("exp", {"default": spec}))
    await _plans_match(
        kapi, services, _cr("exp", pool="exp", policy="exp"), {"__default__": [1, 2, 4, 4, 1]}
    )


async def test_case_2_plan_mid_batch_matches_a_multi_compartment_rollout(
    cluster: Kube, services: Services
) -> None:
    kapi = cluster
    await _nodes(kapi, [f"mc-a{i}" for i in range(5)], nodepool="mc", rack="a")
    await _nodes(kapi, [f"mc-b{i}" for i in range(6)], nodepool="mc", rack="b")
    await manifests.apply(
        kapi,
        _policy(
            "mc",
            {
                "default": {"budget": {"count": 1}},
                "compartments": [
                    {
                        "name": "rack-a",
                        "selector": {"matchLabels": {"rack": "a"}},
                        "budget": {"count": 2},
                        "strategy": {"fixed": {"batchSize": 2}},
                    },
                    {
                        "name": "rack-b",
                        "selector": {"matchLabels": {"rack": "b"}},
                        "budget": {"count": 3},
                        "strategy": {"linear": {"initialBatch": 1, "delta": 1}},
                    },
                ],
            },
        ),
    )
    await _plans_match(
        kapi,
        services,
        _cr("mc", pool="mc", policy="mc"),
        {"rack-a": [2, 2, 1], "rack-b": [1, 2, 3]},
    )


# ---- 3. the cluster budget's reason ------------------------------------------------------------


async def test_case_3_a_nodewright_held_back_by_the_cluster_budget_says_so_and_names_the_holder(
    cluster: Kube, services: Services
) -> None:
    """Issue 12, case 3: with the cluster-wide budget at 1 and two NodeWrights, the waiting
    one said WaitingForBatch/BudgetExhausted ("1 of 1 budgeted nodes ... are busy")."""
    kapi = cluster
    await _nodes(kapi, [f"a-{i}" for i in range(3)], nodepool="a")
    await _nodes(kapi, [f"b-{i}" for i in range(3)], nodepool="b")
    # Slow stages so the wait lasts long enough to be seen.
    for n in [f"a-{i}" for i in range(3)] + [f"b-{i}" for i in range(3)]:
        await kapi.patch(
            f"{NODES}/{n}", {"metadata": {"annotations": {f"{SIM}/stage-duration": "4s"}}}
        )
    for service in ("drainer", "executor", "validator", "status"):
        await asyncio.to_thread(services.fleet.start, service)
    services.fleet.extra_env["NODEWRIGHT_SCHEDULER_CLUSTER_BUDGET"] = "1"
    await asyncio.to_thread(services.fleet.start, "scheduler")
    await manifests.apply(kapi, _cr("first", pool="a", interruptionBudget={"count": 1}))
    await manifests.apply(kapi, _cr("second", pool="b", interruptionBudget={"count": 1}))

    async def held_back() -> tuple[str, str, str] | Pending:
        for name, other in (("first", "second"), ("second", "first")):
            obj = await read_cr(kapi, name)
            comps = [c for c in obj.status.compartments if c.waiting_reason]
            for c in comps:
                if c.waiting_reason == "ClusterBudgetExhausted":
                    return name, other, c.waiting_message
        return Pending("no compartment says ClusterBudgetExhausted yet")

    found = await eventually(
        held_back, timeout_s=120, interval_s=0.5, what="a ClusterBudgetExhausted wait"
    )
    assert isinstance(found, tuple)
    waiting, holder, message = found
    assert message.startswith("1 of 1 nodes of the cluster budget are disrupted: ")
    assert f"admitted by NodeWright {holder}" in message, message
    obj = await read_cr(kapi, waiting)
    reasons = {d.reason for d in obj.status.node_details}
    assert "ClusterBudgetExhausted" in reasons, obj.status.node_details
    assert "BudgetExhausted" not in reasons, "its own budget is not what holds it back"

    async def both_done() -> bool | Pending:
        return await _all_done(kapi, "first") and await _all_done(kapi, "second")

    await eventually(both_done, timeout_s=240, interval_s=1, what="both rollouts")


# ---- 4. a hand-cordoned node ------------------------------------------------------------------


async def test_case_4_a_hand_cordoned_node_does_not_deadlock_the_default_budget(
    cluster: Kube, services: Services
) -> None:
    """Issue 12, case 4: 3 nodes, one cordoned by hand, no budget (one at a time): only the
    cordoned node completed and the other two waited for good."""
    kapi = cluster
    names = await _nodes(kapi, ["hc-1", "hc-2", "hc-3"], nodepool="hc")
    await kapi.patch(f"{NODES}/hc-2", {"spec": {"unschedulable": True}})
    await asyncio.to_thread(services.fleet.start_all)
    await manifests.apply(kapi, _cr("hand", pool="hc"))
    messages: list[str] = []

    async def waits() -> int:
        obj = await read_cr(kapi, "hand")
        messages.extend(f"{d.node}: {d.reason}: {d.message}" for d in obj.status.node_details)
        return len(messages)

    async with Sampler(waits, interval_s=0.5) as s:
        await eventually(
            lambda: _all_done(kapi, "hand"), timeout_s=240, interval_s=1, what="every node"
        )
        await s.stop()
    hand = await kapi.get(f"{NODES}/hc-2")
    assert hand["spec"].get("unschedulable"), "the cordon is the person's, and stays"
    for name in names:
        assert progress.facts(await kapi.get(f"{NODES}/{name}"), "hand").selection is None
    # No wait was silent: a wait on the budget names who holds it.
    for text in messages:
        if "BudgetExhausted" in text:
            assert "budgeted nodes of compartment __default__ are busy: " in text, text


# ---- 5. node reset repairs an undecodable record ---------------------------------------------


async def test_case_5_node_reset_repairs_a_record_that_does_not_decode(
    rig: Rig, cluster: Kube, services: Services
) -> None:
    """Issue 12, case 5: a corrupt executor record made NodeStateMalformed appear; the docs
    and the CLI name ``node reset`` as the remedy, but the record stayed broken for good."""
    kapi = cluster
    await _nodes(kapi, ["mf-0", "mf-1"], nodepool="mf")
    await asyncio.to_thread(services.fleet.start_all)
    await manifests.apply(kapi, _cr("mal", pool="mf", interruptionBudget={"count": 2}))
    await eventually(lambda: _all_done(kapi, "mal"), timeout_s=120, interval_s=1, what="install")
    key = nodestate.key(nodestate.EXECUTOR, "mal")
    await kapi.patch(f"{NODES}/mf-0", {"metadata": {"annotations": {key: "{garbage"}}})

    async def malformed() -> bool:
        obj = await read_cr(kapi, "mal")
        return any(
            d.node == "mf-0" and d.reason == "NodeStateMalformed" for d in obj.status.node_details
        )

    await eventually(malformed, timeout_s=60, what="NodeStateMalformed in the status")
    out = await cli(rig, "node", "reset", "mf-0", "--nodewright", "mal")
    assert out.code == 0, out.err

    async def repaired() -> bool | Pending:
        raw = await kapi.get(f"{NODES}/mf-0")
        try:
            rec = nodestate.read(raw, nodestate.EXECUTOR, "mal", ExecutorRecord)
        except Exception as exc:  # still the garbage
            return Pending(f"record: {exc}")
        obj = await read_cr(kapi, "mal")
        turn = progress.turn(obj, progress.facts(raw, "mal"))
        if rec is not None and rec.packages.get("tuning") and turn == "done":
            return True
        return Pending(f"turn {turn}, record {rec}")

    await eventually(repaired, timeout_s=180, interval_s=1, what="mf-0 repaired and done again")

    async def complete() -> bool:
        o = await read_cr(kapi, "mal")
        return o.status.state == "Complete"

    await eventually(complete, timeout_s=60, what="the NodeWright Complete again")


# ---- 6. fixing the spec recovers a failed package ---------------------------------------------


async def test_case_6_correcting_the_image_starts_a_package_that_could_not_pull_over(
    cluster: Kube, services: Services
) -> None:
    """Issue 12, case 6: after ImagePullFailed, correcting the package's image in the CR did
    nothing until someone ran ``node retry``; the message did not say so."""
    kapi = cluster
    await _nodes(kapi, ["ip-0"], nodepool="ip")
    pull = f"{SIM}/image-pull-error"
    await kapi.patch(f"{NODES}/ip-0", {"metadata": {"annotations": {pull: "tuning"}}})
    services.fleet.extra_env["NODEWRIGHT_PODS_IMAGE_PULL_GRACE_S"] = "3"
    await asyncio.to_thread(services.fleet.start_all)
    body = _cr("pull", pool="ip")
    body["spec"]["packages"]["tuning"]["image"] = "registry.example/tuning-typo"
    await manifests.apply(kapi, body)

    async def pull_failed() -> str | Pending:
        obj = await read_cr(kapi, "pull")
        for d in obj.status.node_details:
            if d.node == "ip-0" and d.reason == "ImagePullFailed":
                return d.message
        return Pending(f"details: {obj.status.node_details}")

    message = await eventually(pull_failed, timeout_s=90, what="ImagePullFailed")
    assert isinstance(message, str)
    assert "registry.example/tuning-typo" in message
    assert "the stage starts over by itself" in message, message
    # The simulated registry serves the corrected image only (the pull error goes with the
    # typo), and the fix of the spec starts the stage over, as a new attempt, without
    # `nodewright node retry`.
    await kapi.patch(f"{NODES}/ip-0", {"metadata": {"annotations": {pull: None}}})
    await _patch_cr(kapi, "pull", {"packages": {"tuning": {"image": "registry.example/tuning"}}})
    await eventually(lambda: _all_done(kapi, "pull"), timeout_s=120, interval_s=1, what="done")
    # As the services read it: the cycle ended with its last check (progress.finished_cycles).
    rec = progress.facts(await kapi.get(f"{NODES}/ip-0"), "pull").executor
    tuning = rec.packages["tuning"]
    assert tuning.installed == "1.0.0"
    assert rec.honoured == 0, "no recovery request was made"


# ---- 7. pod names across cycles ----------------------------------------------------------------


async def test_case_7_a_reinstall_after_an_uninstall_gets_new_pod_names(
    cluster: Kube, services: Services
) -> None:
    """Issue 12, case 7: a reinstall after an uninstall reused the first install's pod names,
    so Events and log tooling mixed the two."""
    kapi = cluster
    await _nodes(kapi, ["cy-0"], nodepool="gpu")
    await asyncio.to_thread(services.fleet.start_all)
    tuning: dict[str, Any] = {
        "version": "1.0.0",
        "image": "registry.example/tuning",
        "uninstall": {"enabled": True, "requested": False},
    }
    body = _cr("cycles", pool="gpu")
    body["spec"]["packages"] = {"tuning": tuning}
    async with pod_ledger(kapi, services.namespace) as ledger:
        await manifests.apply(kapi, body)
        await _wait_done(kapi, "cycles", "the first install")
        first = set(ledger.uids)
        await _patch_cr(
            kapi, "cycles", {"packages": {"tuning": {"uninstall": {"requested": True}}}}
        )
        await _wait_done(kapi, "cycles", "the uninstall")
        removed = nodestate.read(
            await kapi.get(f"{NODES}/cy-0"), nodestate.EXECUTOR, "cycles", ExecutorRecord
        )
        assert removed is None or "tuning" not in removed.packages
        await _patch_cr(
            kapi, "cycles", {"packages": {"tuning": {"uninstall": {"requested": False}}}}
        )
        await _wait_done(kapi, "cycles", "the reinstall")
        second = set(ledger.uids) - first
    assert not ledger.duplicates(), "a pod name was used twice"
    apply_pods = sorted(n for n in ledger.uids if "-tuning-apply-" in n)
    assert len(apply_pods) >= 2, apply_pods  # apply (and its check, in the same pod), twice
    assert {n for n in second if "-apply-" in n}, "the reinstall ran apply with new names"
    assert not first & second
    sel = nodestate.read(await kapi.get(f"{NODES}/cy-0"), nodestate.SCHEDULER, "cycles", Selection)
    assert sel is None
