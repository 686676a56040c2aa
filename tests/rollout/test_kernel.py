"""The rollout kernel: budgets, compartments, strategies, gates and resets, as properties
(hypothesis drives whole rollouts step by step, the way the scheduler's shell does) and as
tables of exact cases."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings, strategies as st

from shared import api, progress
from shared.progress import NodeFacts
from shared.records.drainer import DrainRecord
from shared.records.executor import ExecutorRecord, PackageRecord
from shared.records.scheduler import Selection
from shared.rollout import approvals, kernel, rules, simulation, slots
from shared.rollout.book import (
    RESET_ANNOTATION,
    BatchBook,
    CompartmentBatch,
    encode_batch_book,
    versions_digest,
)
from shared.rollout.rules import DEFAULT_COMPARTMENT
from tests.helpers.facts import T0, node, nodewright

CR = "gpu-node-tuning"


def _policy(spec: Mapping[str, Any]) -> api.DeploymentPolicy:
    return api.from_dict({"metadata": {"name": "p"}, "spec": spec}, api.DeploymentPolicy)


def _cr(**spec: Any) -> api.NodeWright:
    return nodewright(deploymentPolicy="p", **spec)


def _fleet(n: int, labels: Callable[[int], Mapping[str, str]] = lambda i: {}) -> list[NodeFacts]:
    return [progress.facts(node(f"n{i:03d}", labels=labels(i)), CR) for i in range(n)]


def _failed(cr: api.NodeWright, n: NodeFacts) -> NodeFacts:
    d = next(iter(progress.desired(cr).values()))
    rec = PackageRecord(version=d.version, stage="apply", state="failed", updated=T0)
    return simulation.written(n, executor=ExecutorRecord(packages={d.name: rec}))


def _selected(n: NodeFacts, admit: kernel.Admit) -> NodeFacts:
    return simulation.written(n, selection=admit.selection)


def _released(n: NodeFacts) -> NodeFacts:
    return simulation.written(n, selection=None)


def _done(cr: api.NodeWright, n: NodeFacts) -> NodeFacts:
    """Done and released: nothing of the rollout left on the node."""
    return _released(simulation.as_done(cr, n))


@dataclass
class Rollout:
    """Drives the planner like the services would: admitted nodes finish (or fail) between
    decisions; the batch book is carried from one decision to the next."""

    cr: api.NodeWright
    policy: api.DeploymentPolicy | None
    nodes: dict[str, NodeFacts]
    fails: set[str] = field(default_factory=set)
    book: BatchBook = field(default_factory=BatchBook)
    batches: list[tuple[str, int, tuple[str, ...]]] = field(default_factory=list)
    plans: list[kernel.Plan] = field(default_factory=list)
    caps: tuple[kernel.SharedCap, ...] = ()
    now: datetime = T0
    released: list[list[str]] = field(default_factory=list)
    """Per step, the nodes whose admissions it released."""

    def decide(self) -> kernel.Plan:
        def plan(explain_waits: bool) -> kernel.Plan:
            return kernel.plan(
                cr=self.cr,
                policy=self.policy,
                nodes=list(self.nodes.values()),
                book=self.book,
                ctx=kernel.Context(now=self.now, caps=self.caps),
                explain_waits=explain_waits,
            )

        explained = plan(True)
        # The scheduler's decision, without the reasons, is the same decision at every step.
        assert plan(False) == replace(
            explained,
            nodes={},
            compartments=tuple(replace(c, waiting=None) for c in explained.compartments),
        )
        return explained

    def step(self) -> kernel.Plan:
        """One pass of the scheduler's shell: the releases are written, the decision is
        taken again on what was written, then the book and the admissions."""
        p = self.decide()
        released = [r.node for r in p.release]
        if released:
            for name in released:
                self.nodes[name] = _released(self.nodes[name])
            p = self.decide()
        self.released.append(released)
        self.plans.append(p)
        for comp in p.compartments:
            key = (comp.name, comp.batch.state.current_batch, comp.batch.nodes)
            if comp.batch.nodes and key not in self.batches:
                self.batches.append(key)
        for a in p.admit:
            self.nodes[a.node] = _selected(self.nodes[a.node], a)
        self.book = p.book
        return p

    def finish_admitted(self) -> None:
        for name, n in list(self.nodes.items()):
            if n.selection is None or progress.turn(self.cr, n) in ("failed", "done", "release"):
                continue
            if name in self.fails:
                self.nodes[name] = _failed(self.cr, n)
            else:
                self.nodes[name] = simulation.as_done(self.cr, n)

    def run(self, max_steps: int = 500) -> None:
        for _ in range(max_steps):
            p = self.step()
            before = dict(self.nodes)
            self.finish_admitted()
            if not p.admit and not self.released[-1] and before == self.nodes and not p.events:
                given = simulation.approve_waits(self.cr, p)
                if given is not self.cr:
                    self.cr = given  # a compartment waits for approval: a person gives it
                    continue
                if p.wake_at is None or p.wake_at <= self.now:
                    return
                self.now = p.wake_at  # a compartment soaks: time goes on to its end
        raise AssertionError("the rollout did not settle")

    def sizes(self, compartment: str = DEFAULT_COMPARTMENT) -> list[int]:
        return [len(nodes) for c, _, nodes in self.batches if c == compartment]


def _strategy(kind: str, a: int, b: int) -> dict[str, Any]:
    if kind == "fixed":
        return {"fixed": {"batchSize": a}}
    if kind == "linear":
        return {"linear": {"initialBatch": a, "delta": b}}
    return {"exponential": {"initialBatch": a, "growthFactor": max(2, b)}}


# ---- tables ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "nodes", "budget", "expected"),
    [
        pytest.param(_strategy("fixed", 5, 0), 15, 100, [5, 5, 5], id="fixed-5-5-5"),
        pytest.param(_strategy("linear", 1, 1), 10, 100, [1, 2, 3, 4], id="linear-1-2-3-4"),
        pytest.param(_strategy("exponential", 1, 2), 15, 100, [1, 2, 4, 8], id="exp-1-2-4-8"),
        pytest.param(_strategy("exponential", 1, 2), 12, 100, [1, 2, 4, 5], id="exp-remaining"),
        pytest.param(_strategy("exponential", 1, 2), 16, 3, [1, 2, 3, 3, 3, 3, 1], id="exp-budget"),
        pytest.param(_strategy("linear", 2, 3), 20, 100, [2, 5, 8, 5], id="linear-2-by-3"),
        pytest.param(None, 7, 3, [3, 3, 1], id="no-strategy-is-the-budget"),
    ],
)
def test_growth_sequences_are_exact_capped_by_budget_and_remaining_nodes(
    strategy: dict[str, Any] | None, nodes: int, budget: int, expected: list[int]
) -> None:
    default: dict[str, Any] = {"budget": {"count": budget}}
    if strategy:
        default["strategy"] = strategy
    r = Rollout(_cr(), _policy({"default": default}), {n.name: n for n in _fleet(nodes)})
    r.run()
    assert r.sizes() == expected
    assert all(progress.node_done(r.cr, n) for n in r.nodes.values())


@pytest.mark.parametrize(
    ("budget", "matched", "expected"),
    [
        ({"percent": 25}, 10, 2),
        ({"percent": 30}, 10, 3),
        ({"percent": 10}, 5, 1),
        ({"percent": 1}, 100, 1),
        ({"percent": 50}, 0, 0),
        ({"count": 4}, 2, 4),
        (None, 9, 1),
    ],
)
def test_percent_budgets_round_down_with_a_minimum_of_one(
    budget: dict[str, int] | None, matched: int, expected: int
) -> None:
    b = api.from_dict(budget, api.Budget) if budget else None
    assert rules.budget_nodes(b, matched) == expected


def test_overlapping_selectors_go_to_the_safest_compartment() -> None:
    pol = _policy(
        {
            "default": {"budget": {"count": 1}},
            "compartments": [
                {
                    "name": "a-exp",
                    "selector": {"matchLabels": {"rack": "1"}},
                    "budget": {"count": 1},
                    "strategy": _strategy("exponential", 1, 2),
                },
                {
                    "name": "b-lin-big",
                    "selector": {"matchLabels": {"zone": "x"}},
                    "budget": {"count": 5},
                    "strategy": _strategy("linear", 1, 1),
                },
                {
                    "name": "c-lin-small",
                    "selector": {"matchLabels": {"gpu": "a100"}},
                    "budget": {"count": 2},
                    "strategy": _strategy("linear", 1, 1),
                },
                {
                    "name": "d-none",
                    "selector": {"matchLabels": {"zone": "x"}},
                    "budget": {"count": 1},
                },
            ],
        }
    )
    nodes = _fleet(
        5,
        lambda i: [
            {"rack": "1", "zone": "x"},  # exponential vs linear: linear
            {"zone": "x", "gpu": "a100"},  # two linear: the smaller budget
            {"rack": "1"},  # only one
            {"zone": "x"},  # linear vs none: linear
            {},  # none: the default
        ][i],
    )
    got = rules.assign_compartments(rules.compartment_rules(_cr(), pol), nodes)
    assert got == {
        "n000": "b-lin-big",
        "n001": "c-lin-small",
        "n002": "a-exp",
        "n003": "b-lin-big",
        "n004": DEFAULT_COMPARTMENT,
    }


def test_equal_rank_and_budget_break_ties_by_name() -> None:
    comps = [
        {"name": name, "selector": {"matchLabels": {k: "1"}}, "budget": {"count": 2}}
        for name, k in (("zeta", "a"), ("alpha", "b"))
    ]
    pol = _policy({"default": {"budget": {"count": 1}}, "compartments": comps})
    nodes = _fleet(1, lambda i: {"a": "1", "b": "1"})
    got = rules.assign_compartments(rules.compartment_rules(_cr(), pol), nodes)
    assert got == {"n000": "alpha"}


def test_nodes_unavailable_for_other_reasons_count_against_the_budget() -> None:
    pol = _policy({"default": {"budget": {"count": 3}}})
    nodes = [
        progress.facts(node("a", ready=False), CR),
        progress.facts(node("b", unschedulable=True), CR),
        *_fleet(5),
    ]
    p = kernel.plan(cr=_cr(), policy=pol, nodes=nodes, book=BatchBook(), ctx=kernel.Context(now=T0))
    # 3 slots, 2 held by unavailable nodes: one new node is disrupted; the node cordoned by
    # someone else may join the batch without taking another slot.
    assert sorted(a.node for a in p.admit) == ["b", "n000"]
    assert p.compartments[0].busy == 2
    assert p.compartments[0].holders == (("a", "NotReady"), ("b", "cordoned by someone else"))


def test_the_budget_caps_a_strategy_whose_batch_is_larger() -> None:
    pol = _policy({"default": {"budget": {"count": 2}, "strategy": _strategy("fixed", 10, 0)}})
    p = kernel.plan(
        cr=_cr(), policy=pol, nodes=_fleet(10), book=BatchBook(), ctx=kernel.Context(now=T0)
    )
    assert len(p.admit) == 2


def _failing_policy(stop: int | None, *, shrink: int = 50, kind: str = "linear") -> dict[str, Any]:
    rollout: dict[str, Any] = {
        "budget": {"count": 100},
        "strategy": _strategy(kind, 2, 2),
        "batchSuccessPercent": 100,
        "shrinkAfterFailureUntilPercent": shrink,
    }
    if stop is not None:
        rollout["stopAfterConsecutiveFailedBatches"] = stop
    return {"default": rollout}


def test_a_failing_batch_shrinks_the_next_one_and_the_compartment_stops_at_its_threshold() -> None:
    r = Rollout(_cr(), _policy(_failing_policy(3)), {n.name: n for n in _fleet(40)})
    r.fails = set(r.nodes)
    r.run()
    # linear 2 (fails) -> 2-2 -> at least 1 -> 1 -> stop after the third failed batch.
    assert r.sizes() == [2, 1, 1]
    state = r.book.compartments[DEFAULT_COMPARTMENT].state
    assert state.stopped
    assert state.stop_reason == "FailedBatchesLimit"
    assert state.consecutive_failed_batches == 3
    last = r.plans[-1]
    assert {w.code for w in last.waiting.values()} == {"CompartmentStopped"}


def test_the_stop_gate_holds_past_the_shrink_limit() -> None:
    # The reference silently ignored failureThreshold above safetyLimit; here it never is.
    r = Rollout(_cr(), _policy(_failing_policy(2, shrink=1)), {n.name: n for n in _fleet(10)})
    done = set(list(r.nodes)[:2])
    for name in done:
        r.nodes[name] = _done(r.cr, r.nodes[name])
    r.fails = set(r.nodes) - done
    r.run()
    assert r.sizes() == [2, 2]  # above the shrink limit a failed batch keeps its size
    assert r.book.compartments[DEFAULT_COMPARTMENT].state.stopped


def test_a_passing_batch_after_failures_restarts_the_count() -> None:
    r = Rollout(_cr(), _policy(_failing_policy(2)), {n.name: n for n in _fleet(12)})
    r.fails = {"n000", "n001", "n004"}  # batch 1 fails, batch 2 (n002) passes, batch 3 fails
    r.run()
    state = r.book.compartments[DEFAULT_COMPARTMENT].state
    assert not state.stopped
    assert r.sizes()[:3] == [2, 1, 3]


@pytest.mark.parametrize(("count_blocked", "stopped"), [(True, True), (False, False)])
def test_blocked_nodes_never_hold_a_batch_open_and_the_policy_says_how_they_count(
    count_blocked: bool, stopped: bool
) -> None:
    pol = _policy(
        {
            "default": {
                "budget": {"count": 2},
                "strategy": _strategy("fixed", 2, 0),
                "stopAfterConsecutiveFailedBatches": 1,
                "blockedNodesCountAsFailed": count_blocked,
            }
        }
    )
    r = Rollout(_cr(), pol, {n.name: n for n in _fleet(4)})
    r.step()
    assert r.book.compartments[DEFAULT_COMPARTMENT].nodes == ("n000", "n001")
    # n001 gets the ignore label before it did anything, n000 completes.
    r.nodes["n001"] = replace(
        r.nodes["n001"], labels={**r.nodes["n001"].labels, "nodewright.nvidia.com/ignore": "true"}
    )
    r.nodes["n000"] = _done(r.cr, r.nodes["n000"])
    r.step()
    entry = r.book.compartments[DEFAULT_COMPARTMENT]
    assert entry.state.current_batch == 2
    assert entry.state.stopped is stopped
    assert entry.state.total_failed_nodes == (1 if count_blocked else 0)


def test_failed_nodes_end_their_batch_but_keep_their_budget_slot() -> None:
    pol = _policy({"default": {"budget": {"count": 2}, "strategy": _strategy("fixed", 2, 0)}})
    r = Rollout(_cr(), pol, {n.name: n for n in _fleet(5)})
    r.fails = {"n000"}
    r.step()
    r.finish_admitted()
    p = r.step()
    # batch 1 is over (n000 failed, n001 done); n000 is still cordoned: one slot is free.
    assert r.book.compartments[DEFAULT_COMPARTMENT].state.current_batch == 2
    assert [a.node for a in p.admit] == ["n002"]


def test_a_node_of_the_batch_in_flight_finishing_writes_no_book_its_close_does() -> None:
    """Issue 15: the counts of a batch in flight follow from its nodes on every pass, so the
    book (a NodeWright write every service watching NodeWrights is sent) keeps them only
    when the batch closes; the plan's compartments carry them as they are now."""
    pol = _policy({"default": {"budget": {"count": 3}, "strategy": _strategy("fixed", 3, 0)}})
    r = Rollout(_cr(), pol, {n.name: n for n in _fleet(6)})
    opened = r.step()
    (first, second, third) = (a.node for a in opened.admit)
    r.step()  # the admissions landed: the fence goes (one write per batch)
    r.nodes[first] = simulation.as_done(r.cr, r.nodes[first])
    r.nodes[second] = _failed(r.cr, r.nodes[second])
    p = r.decide()
    assert p.book == r.book, "no book write while the batch runs"
    (comp,) = p.compartments
    live = comp.batch.state
    assert (live.batch_succeeded_nodes, live.batch_failed_nodes) == (1, 1)
    r.nodes[third] = simulation.as_done(r.cr, r.nodes[third])
    closed = r.step().book.compartments[DEFAULT_COMPARTMENT].state
    assert (closed.current_batch, closed.total_succeeded_nodes, closed.total_failed_nodes) == (
        2,
        2,
        1,
    )


def test_a_soak_holds_the_next_batch_until_it_ends_and_says_until_when() -> None:
    pol = _policy(
        {
            "default": {
                "budget": {"count": 2},
                "strategy": _strategy("fixed", 2, 0),
                "batchSoakSeconds": 600,
            }
        }
    )
    r = Rollout(_cr(), pol, {n.name: n for n in _fleet(4)})
    assert [a.node for a in r.step().admit] == ["n000", "n001"]
    assert r.plans[-1].wake_at is None, "nothing soaks during a batch"
    r.finish_admitted()
    r.now = T0 + timedelta(seconds=5)
    p = r.step()
    assert (p.admit, r.released[-1]) == ((), ["n000", "n001"])
    until = T0 + timedelta(seconds=5 + 600)
    assert r.book.compartments["__default__"].finished == T0 + timedelta(seconds=5)
    assert p.wake_at == until
    reasons_now = {w.code for w in p.waiting.values()}
    assert reasons_now == {"BatchSoaking"}, p.waiting
    why = p.waiting["n002"]
    assert why.details["until"] == until.isoformat()
    assert "soaks after batch 1 until" in why.message
    (comp,) = p.compartments
    assert comp.waiting is not None
    assert comp.waiting.code == "BatchSoaking"
    r.now = until - timedelta(seconds=1)
    assert r.step().admit == ()
    r.now = until
    opened = r.step()
    assert [a.node for a in opened.admit] == ["n002", "n003"]
    assert opened.wake_at is None
    in_flight = r.book.compartments["__default__"]
    assert in_flight.finished is None, "a batch in flight"
    r.finish_admitted()
    r.run()
    assert [b[2] for b in r.batches] == [("n000", "n001"), ("n002", "n003")]


def test_the_plan_of_a_soaking_rollout_still_predicts_every_batch() -> None:
    """``nodewright plan``'s simulation moves on to each soak's end."""
    pol = _policy(
        {
            "default": {
                "budget": {"count": 1},
                "strategy": _strategy("fixed", 1, 0),
                "batchSoakSeconds": 60,
            }
        }
    )
    batches, first = simulation.simulate(
        cr=_cr(), policy=pol, nodes=_fleet(3), book=BatchBook(), ctx=kernel.Context(now=T0)
    )
    assert [b.nodes for b in batches] == [("n000",), ("n001",), ("n002",)]
    assert [a.node for a in first.admit] == ["n000"]


def _approve(
    cr: api.NodeWright, compartment: str, batch: int, finished: datetime | None
) -> api.NodeWright:
    """``cr`` with what ``nodewright approve`` writes for one compartment."""
    got = approvals.read(cr.metadata.annotations).by_compartment
    value = approvals.encode(
        {**got, compartment: approvals.Approval(batch=batch, finished=finished)}
    )
    notes = {**cr.metadata.annotations, approvals.APPROVALS_ANNOTATION: value}
    return msgspec.structs.replace(
        cr, metadata=msgspec.structs.replace(cr.metadata, annotations=notes)
    )


def _gated(after: list[int], **rollout: Any) -> api.DeploymentPolicy:
    return _policy(
        {
            "default": {
                "budget": {"count": 2},
                "strategy": _strategy("fixed", 2, 0),
                "approvalAfterBatches": after,
                **rollout,
            }
        }
    )


def test_an_approval_gate_holds_the_next_batch_until_a_person_approves_that_batch() -> None:
    r = Rollout(_cr(), _gated([1]), {n.name: n for n in _fleet(6)})
    assert [a.node for a in r.step().admit] == ["n000", "n001"]
    r.finish_admitted()
    r.now = T0 + timedelta(seconds=5)
    p = r.step()
    assert (p.admit, r.released[-1]) == ((), ["n000", "n001"])
    finished = r.book.compartments[DEFAULT_COMPARTMENT].finished
    assert finished == T0 + timedelta(seconds=5)
    assert {w.code for w in p.waiting.values()} == {"BatchAwaitingApproval"}, p.waiting
    why = p.waiting["n002"]
    assert why.details == {
        "batch": "1",
        "finished": finished.isoformat(),
        "command": f"nodewright approve {CR} --compartment __default__",
    }
    assert "waits for approval after batch 1 (approvalAfterBatches)" in why.message
    assert f"`nodewright approve {CR} --compartment __default__`" in why.message
    (comp,) = p.compartments
    assert comp.waiting is not None
    assert comp.waiting.code == "BatchAwaitingApproval"
    assert p.wake_at is None, "no time ends this wait: the approval's change wakes the pass"
    r.now += timedelta(days=30)
    assert r.step().admit == (), "it waits for as long as it takes"
    # An approval of another batch, or of another run of batch 1, opens nothing.
    for batch, at in ((2, finished), (1, finished - timedelta(seconds=1)), (1, None)):
        r.cr = _approve(_cr(), DEFAULT_COMPARTMENT, batch, at)
        assert r.step().admit == (), (batch, at)
    r.cr = _approve(_cr(), "other", 1, finished)
    assert r.step().admit == (), "another compartment's approval"
    r.cr = _approve(_cr(), DEFAULT_COMPARTMENT, 1, finished)
    assert [a.node for a in r.step().admit] == ["n002", "n003"]
    # Batch 2 is not gated: batch 3 opens once it finished, with no approval.
    r.finish_admitted()
    r.step()
    r.finish_admitted()
    r.run()
    assert [b[2] for b in r.batches] == [("n000", "n001"), ("n002", "n003"), ("n004", "n005")]


def test_an_approval_does_not_carry_over_to_a_new_run_of_the_batches() -> None:
    """After the batch state is reset, batch 1 finishes again at another time: the
    approval of the earlier run is not one of this run."""
    r = Rollout(_cr(), _gated([1]), {n.name: n for n in _fleet(6)})
    r.step()
    r.finish_admitted()
    r.step()
    first_run = r.book.compartments[DEFAULT_COMPARTMENT].finished
    r.cr = _approve(_cr(annotations={RESET_ANNOTATION: "t1"}), DEFAULT_COMPARTMENT, 1, first_run)
    r.now = T0 + timedelta(seconds=10)
    assert [a.node for a in r.step().admit] == ["n002", "n003"], "batch 1 again"
    assert r.book.compartments[DEFAULT_COMPARTMENT].state.current_batch == 1
    r.finish_admitted()
    r.now = T0 + timedelta(seconds=20)
    p = r.step()
    again = r.book.compartments[DEFAULT_COMPARTMENT].finished
    assert again == r.now != first_run
    assert p.admit == ()
    assert p.waiting["n004"].code == "BatchAwaitingApproval"
    r.cr = _approve(r.cr, DEFAULT_COMPARTMENT, 1, again)
    assert [a.node for a in r.step().admit] == ["n004", "n005"]


def test_a_malformed_approval_reads_as_none_and_the_wait_says_what_is_wrong() -> None:
    r = Rollout(_cr(), _gated([1]), {n.name: n for n in _fleet(4)})
    r.step()
    r.finish_admitted()
    r.step()
    r.cr = _cr(annotations={approvals.APPROVALS_ANNOTATION: '{"__default__": 1}'})
    p = r.step()
    assert p.admit == ()
    message = p.waiting["n002"].message
    assert f"annotation {approvals.APPROVALS_ANNOTATION} does not decode" in message
    assert "`nodewright approve` writes it" in message


def test_a_soak_and_an_approval_gate_hold_the_next_batch_until_both_are_over() -> None:
    r = Rollout(_cr(), _gated([1], batchSoakSeconds=60), {n.name: n for n in _fleet(4)})
    r.step()
    r.finish_admitted()
    p = r.step()
    finished = r.book.compartments[DEFAULT_COMPARTMENT].finished
    assert p.waiting["n002"].code == "BatchSoaking"
    r.cr = _approve(_cr(), DEFAULT_COMPARTMENT, 1, finished)  # approved during the soak
    assert r.step().admit == ()
    r.now = T0 + timedelta(seconds=60)
    assert [a.node for a in r.step().admit] == ["n002", "n003"]


def test_the_plan_of_a_gated_rollout_predicts_every_batch_as_if_approved() -> None:
    """``nodewright plan``'s simulation gives the approvals a person would."""
    batches, first = simulation.simulate(
        cr=_cr(),
        policy=_gated([1, 2]),
        nodes=_fleet(6),
        book=BatchBook(),
        ctx=kernel.Context(now=T0),
    )
    assert [b.nodes for b in batches] == [("n000", "n001"), ("n002", "n003"), ("n004", "n005")]
    assert [b.after_approval for b in batches] == [False, True, True]
    assert [a.node for a in first.admit] == ["n000", "n001"]


def test_windows_gate_only_the_start_of_new_nodes() -> None:
    window = {"start": "10:00", "end": "11:00", "timeZone": "UTC"}
    pol = _policy(
        {
            "default": {"budget": {"count": 2}, "strategy": _strategy("fixed", 2, 0)},
            "maintenanceWindows": [window],
        }
    )
    inside = datetime(2026, 1, 5, 10, 30, tzinfo=UTC)
    outside = datetime(2026, 1, 5, 11, 0, tzinfo=UTC)
    r = Rollout(_cr(), pol, {n.name: n for n in _fleet(4)}, now=inside)
    assert len(r.step().admit) == 2
    r.now = outside
    r.finish_admitted()
    p = r.step()
    assert p.admit == ()
    assert r.released[-1] == ["n000", "n001"], "work in progress finishes and is released"
    assert {w.code for w in p.waiting.values()} == {"WaitingForWindow"}


@pytest.mark.parametrize(
    ("window", "at", "inside"),
    [
        ({"start": "22:00", "end": "02:00", "days": ["Mon"]}, (2026, 1, 5, 23, 0), True),
        ({"start": "22:00", "end": "02:00", "days": ["Mon"]}, (2026, 1, 6, 1, 59), True),
        ({"start": "22:00", "end": "02:00", "days": ["Mon"]}, (2026, 1, 6, 23, 0), False),
        ({"start": "09:00", "end": "17:00", "days": ["Sat", "Sun"]}, (2026, 1, 5, 12, 0), False),
        (
            {"start": "09:00", "end": "17:00", "timeZone": "America/New_York"},
            (2026, 1, 5, 15, 0),
            True,
        ),
        (
            {"start": "09:00", "end": "17:00", "timeZone": "America/New_York"},
            (2026, 1, 5, 13, 0),
            False,
        ),
    ],
)
def test_maintenance_windows(window: dict[str, Any], at: tuple[int, ...], inside: bool) -> None:
    w = api.from_dict(window, api.MaintenanceWindow)
    y, mo, d, h, mi = at
    assert rules.in_window([w], datetime(y, mo, d, h, mi, tzinfo=UTC)) is inside


def test_batch_state_resets_by_annotation_version_change_and_completion() -> None:
    pol = _policy(_failing_policy(1))
    r = Rollout(_cr(), pol, {n.name: n for n in _fleet(6)})
    r.fails = set(r.nodes)
    r.run()
    assert r.book.compartments[DEFAULT_COMPARTMENT].state.stopped
    # By annotation: the compartment starts again at batch 1.
    r.cr = _cr(annotations={RESET_ANNOTATION: "t1"})
    r.fails = set()
    for name in list(r.nodes):
        r.nodes[name] = progress.facts(node(name), CR)
    p = r.step()
    assert p.book.compartments[DEFAULT_COMPARTMENT].state.current_batch == 1
    assert p.admit
    assert not p.book.compartments[DEFAULT_COMPARTMENT].state.stopped
    # The same token again does nothing; completion resets.
    r.run()
    assert r.book.compartments[DEFAULT_COMPARTMENT] == CompartmentBatch()
    # A version change resets a stopped compartment too.
    stopped = BatchBook(
        compartments={
            DEFAULT_COMPARTMENT: CompartmentBatch(
                state=api.BatchState(current_batch=4, stopped=True)
            )
        },
        versions="old",
    )
    p = kernel.plan(cr=_cr(), policy=pol, nodes=_fleet(2), book=stopped, ctx=kernel.Context(now=T0))
    assert p.admit
    kept = kernel.plan(
        cr=_cr(deploymentPolicyOptions={"resetBatchStateOnVersionChange": False}),
        policy=pol,
        nodes=_fleet(2),
        book=stopped,
        ctx=kernel.Context(now=T0),
    )
    assert kept.admit == ()
    assert kept.book.compartments[DEFAULT_COMPARTMENT].state.stopped


def test_pause_disable_and_priority_start_nothing() -> None:
    nodes = _fleet(2)
    paused = kernel.plan(
        cr=nodewright(annotations={api.PAUSE_ANNOTATION: "true"}),
        policy=None,
        nodes=nodes,
        book=BatchBook(),
        ctx=kernel.Context(now=T0),
    )
    assert paused.admit == ()
    assert paused.waiting["n000"].code == "Paused"
    disabled = kernel.plan(
        cr=nodewright(annotations={api.DISABLE_ANNOTATION: "true"}),
        policy=None,
        nodes=nodes,
        book=BatchBook(),
        ctx=kernel.Context(now=T0),
    )
    assert disabled.admit == ()
    assert disabled.book == BatchBook()
    waits = kernel.plan(
        cr=nodewright(interruptionBudget={"count": 2}),
        policy=None,
        nodes=nodes,
        book=BatchBook(),
        ctx=kernel.Context(now=T0, priority_waits={"n000": "first"}),
    )
    assert [a.node for a in waits.admit] == ["n001"]
    assert waits.waiting["n000"].code == "WaitingForPriority"


def _raw(name: str, **kw: Any) -> dict[str, Any]:
    return node(name, **kw)


def test_priority_and_sequencing_across_nodewrights() -> None:
    first = nodewright("first", priority=1, sequencing="node")
    second = nodewright("second", priority=5)
    nodes = [_raw("a"), _raw("b")]
    assert rules.priority_waits(second, [first, second], nodes) == {"a": "first", "b": "first"}
    assert rules.priority_waits(first, [first, second], nodes) == {}
    gate_all = nodewright("first", priority=1, sequencing="all", nodeSelectors={})
    only_a = [_raw("a", labels={"pool": "x"}), _raw("b")]
    narrow = nodewright(
        "first", priority=1, sequencing="all", nodeSelectors={"matchLabels": {"pool": "x"}}
    )
    assert rules.priority_waits(second, [narrow, second], only_a) == {
        "a": "first",
        "b": "first",
    }
    per_node = nodewright(
        "first", priority=1, sequencing="node", nodeSelectors={"matchLabels": {"pool": "x"}}
    )
    assert rules.priority_waits(second, [per_node, second], only_a) == {"a": "first"}
    assert gate_all.spec.sequencing == "all"
    disabled = nodewright("first", priority=1, annotations={api.DISABLE_ANNOTATION: "true"})
    assert rules.priority_waits(second, [disabled, second], nodes) == {}


def test_a_shared_cap_counts_distinct_nodes_across_nodewrights() -> None:
    cap = kernel.SharedCap(
        name="cluster budget",
        code="ClusterBudgetExhausted",
        limit=1,
        holders={"n000": "admitted by NodeWright other"},
    )
    p = kernel.plan(
        cr=nodewright(interruptionBudget={"count": 3}),
        policy=None,
        nodes=_fleet(3),
        book=BatchBook(),
        ctx=kernel.Context(now=T0, caps=(cap,)),
    )
    # n000 is already disrupted by another NodeWright: this one may join it, nothing more.
    assert [a.node for a in p.admit] == ["n000"]
    assert p.waiting["n001"].code == "ClusterBudgetExhausted"


def test_simulation_lists_the_batches_the_rollout_runs() -> None:
    pol = _policy(
        {
            "default": {"budget": {"count": 10}, "strategy": _strategy("linear", 1, 1)},
            "compartments": [
                {
                    "name": "canary",
                    "selector": {"matchLabels": {"canary": "true"}},
                    "budget": {"count": 1},
                }
            ],
        }
    )
    nodes = _fleet(8, lambda i: {"canary": "true"} if i < 2 else {})
    batches, first = simulation.simulate(
        cr=_cr(), policy=pol, nodes=nodes, book=BatchBook(), ctx=kernel.Context(now=T0)
    )
    assert [(b.compartment, b.batch, b.nodes) for b in batches] == [
        ("canary", 1, ("n000",)),
        (DEFAULT_COMPARTMENT, 1, ("n002",)),
        ("canary", 2, ("n001",)),
        (DEFAULT_COMPARTMENT, 2, ("n003", "n004")),
        (DEFAULT_COMPARTMENT, 3, ("n005", "n006", "n007")),
    ]
    assert sorted(a.node for a in first.admit) == ["n000", "n002"]
    r = Rollout(_cr(), pol, {n.name: n for n in nodes})
    r.run()
    assert sorted(r.batches) == sorted((b.compartment, b.batch, b.nodes) for b in batches)


# ---- properties -------------------------------------------------------------------------------


@st.composite
def rollouts(draw: st.DrawFn) -> tuple[api.NodeWright, api.DeploymentPolicy, list[NodeFacts]]:
    n = draw(st.integers(1, 30))
    n_comps = draw(st.integers(0, 3))
    kinds = st.sampled_from(["fixed", "linear", "exponential", "none"])

    def rollout() -> dict[str, Any]:
        budget = draw(
            st.one_of(
                st.builds(lambda c: {"count": c}, st.integers(1, 8)),
                st.builds(lambda p: {"percent": p}, st.integers(1, 100)),
            )
        )
        out: dict[str, Any] = {"budget": budget}
        kind = draw(kinds)
        if kind != "none":
            out["strategy"] = _strategy(kind, draw(st.integers(1, 5)), draw(st.integers(1, 3)))
        return out

    comps = [
        {"name": f"c{i}", "selector": {"matchLabels": {f"l{i}": "y"}}, **rollout()}
        for i in range(n_comps)
    ]
    pol = _policy({"default": rollout(), "compartments": comps})
    label_sets = draw(
        st.lists(st.sets(st.integers(0, max(0, n_comps - 1))), min_size=n, max_size=n)
    )
    unready = draw(st.sets(st.integers(0, n - 1), max_size=3))
    cordoned = draw(st.sets(st.integers(0, n - 1), max_size=3))
    nodes = [
        progress.facts(
            node(
                f"n{i:03d}",
                labels={f"l{j}": "y" for j in label_sets[i]} if n_comps else {},
                ready=i not in unready,
                unschedulable=i in cordoned,
                created=f"2026-01-01T00:00:{i % 60:02d}Z",
            ),
            CR,
        )
        for i in range(n)
    ]
    return _cr(), pol, nodes


def _busy_per_compartment(r: Rollout, rule_list: Sequence[rules.CompartmentRule]) -> dict[str, int]:
    targets = list(r.nodes.values())
    assigned = rules.assign_compartments(rule_list, targets)
    known = {x.name for x in rule_list}
    out: dict[str, int] = {x.name: 0 for x in rule_list}
    for n in targets:
        if slots.hold(r.cr, n, r.book.admitting) is not None:
            out[rules.compartment_of(n, assigned, known)] += 1
    return out


@settings(max_examples=60, deadline=None)
@given(rollouts(), st.randoms(use_true_random=False))
def test_the_budget_is_never_exceeded_and_succeeding_batches_reach_every_eligible_node(
    case: tuple[api.NodeWright, api.DeploymentPolicy, list[NodeFacts]], rng: random.Random
) -> None:
    cr, pol, nodes = case
    r = Rollout(cr, pol, {n.name: n for n in nodes})
    rule_list = rules.compartment_rules(cr, pol)
    matched = rules.assign_compartments(rule_list, nodes)
    budgets = {
        rule.name: rules.budget_nodes(
            rule.rollout.budget, sum(1 for c in matched.values() if c == rule.name)
        )
        for rule in rule_list
    }
    for i in range(400):
        if i == 5:  # unavailable nodes recover: until then they hold budget slots
            for name, n in list(r.nodes.items()):
                r.nodes[name] = simulation.written(n, ready=True, unschedulable=False)
        before = _busy_per_compartment(r, rule_list)
        p = r.step()
        after = _busy_per_compartment(r, rule_list)
        for comp in p.compartments:
            admitted = sum(1 for a in p.admit if a.selection.compartment == comp.name)
            if admitted:
                grew = after[comp.name] > before[comp.name]
                assert not grew or after[comp.name] <= budgets[comp.name], (before, after)
        # Finish a random part of the admitted nodes (all eventually).
        for name, n in list(r.nodes.items()):
            if n.selection is not None and rng.random() < 0.6:
                r.nodes[name] = simulation.as_done(cr, n)
        if (
            i > 5
            and not p.admit
            and not p.release
            and all(n.selection is None for n in r.nodes.values())
            and not p.events
        ):
            break
    assert i > 5
    assert all(progress.node_done(cr, n) for n in r.nodes.values())


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(["fixed", "linear", "exponential"]),
    st.integers(1, 4),
    st.integers(1, 3),
    st.integers(1, 60),
    st.integers(1, 20),
)
def test_growth_sequences_match_the_formula(
    kind: str, initial: int, step: int, n: int, budget: int
) -> None:
    strategy = _strategy(kind, initial, step)
    pol = _policy({"default": {"budget": {"count": budget}, "strategy": strategy}})
    r = Rollout(_cr(), pol, {x.name: x for x in _fleet(n)})
    r.run()
    expected: list[int] = []
    size, left = min(initial, budget), n
    while left:
        take = min(size, left)
        expected.append(take)
        left -= take
        if kind == "linear":
            size = min(size + step, budget)
        elif kind == "exponential":
            size = min(size * max(2, step), budget)
    assert r.sizes() == expected


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(20, 60), st.sampled_from(["fixed", "linear", "exponential"]))
def test_a_compartment_stops_exactly_at_its_failure_threshold_and_only_that_one(
    threshold: int, n: int, kind: str
) -> None:
    pol = _policy(
        {
            "default": {"budget": {"count": 50}, "strategy": _strategy(kind, 1, 2)},
            "compartments": [
                {
                    "name": "bad",
                    "selector": {"matchLabels": {"bad": "y"}},
                    "budget": {"count": 50},
                    "strategy": _strategy(kind, 1, 2),
                    "stopAfterConsecutiveFailedBatches": threshold,
                    "shrinkAfterFailureUntilPercent": 1,
                }
            ],
        }
    )
    fleet = _fleet(n + 10, lambda i: {"bad": "y"} if i < n else {})
    r = Rollout(_cr(), pol, {x.name: x for x in fleet})
    r.fails = {x.name for x in fleet[:n]}
    r.run()
    bad = r.book.compartments["bad"].state
    assert bad.stopped
    assert bad.consecutive_failed_batches == threshold
    assert len(r.sizes("bad")) == threshold
    assert all(progress.node_done(r.cr, x) for x in list(r.nodes.values())[n:])


@settings(max_examples=40, deadline=None)
@given(rollouts(), st.randoms(use_true_random=False))
def test_overlap_resolution_does_not_depend_on_order(
    case: tuple[api.NodeWright, api.DeploymentPolicy, list[NodeFacts]], rng: random.Random
) -> None:
    cr, pol, nodes = case
    rule_list = rules.compartment_rules(cr, pol)
    want = rules.assign_compartments(rule_list, nodes)
    shuffled_rules, shuffled_nodes = list(rule_list), list(nodes)
    rng.shuffle(shuffled_rules)
    rng.shuffle(shuffled_nodes)
    assert rules.assign_compartments(shuffled_rules, shuffled_nodes) == want
    for n in nodes:
        candidates = [
            x
            for x in rule_list
            if x.selector is not None and progress.selector_matches(x.selector, n.labels)
        ]
        if not candidates:
            assert want[n.name] == DEFAULT_COMPARTMENT
        else:
            chosen = next(x for x in rule_list if x.name == want[n.name])
            rank = rules.STRATEGY_RANK[rules.strategy_kind(chosen.rollout)]
            assert rank == min(
                rules.STRATEGY_RANK[rules.strategy_kind(x.rollout)] for x in candidates
            )


def test_selection_records_carry_compartment_and_batch() -> None:
    pol = _policy({"default": {"budget": {"count": 5}, "strategy": _strategy("linear", 1, 1)}})
    r = Rollout(_cr(), pol, {x.name: x for x in _fleet(3)})
    r.step()
    r.finish_admitted()
    r.step()
    r.step()
    selections: list[Selection] = [a.selection for p in r.plans for a in p.admit]
    assert [(s.compartment, s.batch) for s in selections] == [
        (DEFAULT_COMPARTMENT, 1),
        (DEFAULT_COMPARTMENT, 2),
        (DEFAULT_COMPARTMENT, 2),
    ]


# ---- node order (NODEWRIGHT_NODE_ORDER) -------------------------------------------------------


def _orders(r: Rollout) -> dict[str, tuple[int, int | None]]:
    """node -> (batch, order) of every admission the rollout made, in admission order."""
    return {a.node: (a.selection.batch, a.selection.order) for p in r.plans for a in p.admit}


def test_nodes_get_their_zero_based_rollout_order_across_batches() -> None:
    pol = _policy({"default": {"budget": {"count": 10}, "strategy": _strategy("linear", 1, 1)}})
    r = Rollout(_cr(), pol, {x.name: x for x in _fleet(10)})
    r.run()
    assert _orders(r) == {
        "n000": (1, 0),
        "n001": (2, 1),
        "n002": (2, 2),
        "n003": (3, 3),
        "n004": (3, 4),
        "n005": (3, 5),
        "n006": (4, 6),
        "n007": (4, 7),
        "n008": (4, 8),
        "n009": (4, 9),
    }
    # The book counted them while the rollout ran; completion reset it for the next one.
    assert max(p.book.admitted for p in r.plans) == 10
    assert r.book.admitted == 0
    assert "admitted" not in encode_batch_book(r.book)  # omitted at its default


def test_each_compartment_admits_from_the_one_counter_in_rule_order() -> None:
    pol = _policy(
        {
            "default": {"budget": {"count": 10}, "strategy": _strategy("fixed", 2, 0)},
            "compartments": [
                {
                    "name": "canary",
                    "selector": {"matchLabels": {"canary": "y"}},
                    "budget": {"count": 1},
                }
            ],
        }
    )
    r = Rollout(
        _cr(), pol, {x.name: x for x in _fleet(5, lambda i: {"canary": "y"} if i < 2 else {})}
    )
    r.step()
    assert [(a.node, a.selection.compartment, a.selection.order) for a in r.plans[0].admit] == [
        ("n000", "canary", 0),
        ("n002", DEFAULT_COMPARTMENT, 1),
        ("n003", DEFAULT_COMPARTMENT, 2),
    ]
    assert r.book.admitted == 3


def test_every_reset_starts_the_order_at_zero_unless_a_node_still_holds_one() -> None:
    pol = _policy({"default": {"budget": {"count": 10}, "strategy": _strategy("fixed", 2, 0)}})
    fleet = _fleet(4)
    # By annotation, nothing admitted any more: a new rollout with its own node 0.
    book = BatchBook(admitted=4, versions=versions_digest(_cr()))
    p = kernel.plan(
        cr=_cr(annotations={RESET_ANNOTATION: "t1"}),
        policy=pol,
        nodes=fleet,
        book=book,
        ctx=kernel.Context(now=T0),
    )
    assert [(a.node, a.selection.order) for a in p.admit] == [("n000", 0), ("n001", 1)]
    assert p.book.admitted == 2
    # Versions changed while n003 (order 5) still runs: it runs the new packages with its
    # order, so the new rollout continues past it instead of handing 5 out twice.
    running = replace(
        fleet[3],
        selection=Selection(
            generation=1,
            compartment=DEFAULT_COMPARTMENT,
            batch=3,
            selected_at=T0,
            disruptive=False,
            target="old",
            order=5,
        ),
    )
    p = kernel.plan(
        cr=_cr(),
        policy=pol,
        nodes=[*fleet[:3], running],
        book=BatchBook(admitted=6, versions="old"),
        ctx=kernel.Context(now=T0),
    )
    assert "batch state reset: package versions changed" in p.events
    assert [(a.node, a.selection.order) for a in p.admit] == [("n000", 6), ("n001", 7)]
    # Without the version-change reset the count simply goes on.
    p = kernel.plan(
        cr=_cr(deploymentPolicyOptions={"resetBatchStateOnVersionChange": False}),
        policy=pol,
        nodes=fleet,
        book=BatchBook(admitted=6, versions="old"),
        ctx=kernel.Context(now=T0),
    )
    assert [(a.node, a.selection.order) for a in p.admit] == [("n000", 6), ("n001", 7)]
    # A record without an order (written before the field existed) is unknown, not 0.
    legacy = msgspec.json.decode(
        b'{"generation":1,"compartment":"__default__","batch":1,'
        b'"selected_at":"2026-01-01T00:00:00Z","disruptive":false,"target":"t"}',
        type=Selection,
    )
    assert legacy.order is None
    p = kernel.plan(
        cr=_cr(),
        policy=pol,
        nodes=[*fleet[:3], replace(fleet[3], selection=legacy)],
        book=BatchBook(admitted=2, versions="old"),
        ctx=kernel.Context(now=T0),
    )
    assert [(a.node, a.selection.order) for a in p.admit] == [("n000", 0), ("n001", 1)]


def test_an_admission_made_again_keeps_the_order_reserved_for_it() -> None:
    """The linear e2e test once saw orders 1..10: the first node's admission lost a race with
    a status write on the node, and the next pass admitted it again with the next order."""
    pol = _policy({"default": {"budget": {"count": 10}, "strategy": _strategy("fixed", 2, 0)}})
    fleet = _fleet(3)
    first = kernel.plan(
        cr=_cr(), policy=pol, nodes=fleet, book=BatchBook(), ctx=kernel.Context(now=T0)
    )
    assert [(a.node, a.selection.order) for a in first.admit] == [("n000", 0), ("n001", 1)]
    assert first.book.compartments[DEFAULT_COMPARTMENT].orders == (0, 1)
    # Only n001's write landed; the book was written before either.
    n001 = next(a for a in first.admit if a.node == "n001")
    again = kernel.plan(
        cr=_cr(),
        policy=pol,
        nodes=[fleet[0], _selected(fleet[1], n001), fleet[2]],
        book=first.book,
        ctx=kernel.Context(now=T0),
    )
    assert [(a.node, a.selection.order) for a in again.admit] == [("n000", 0)]
    assert again.book.admitted == 2
    # A book written before reservations existed: the admission takes the next order.
    legacy = msgspec.structs.replace(
        first.book,
        compartments={
            DEFAULT_COMPARTMENT: msgspec.structs.replace(
                first.book.compartments[DEFAULT_COMPARTMENT], orders=()
            )
        },
    )
    old = kernel.plan(
        cr=_cr(),
        policy=pol,
        nodes=[fleet[0], _selected(fleet[1], n001), fleet[2]],
        book=legacy,
        ctx=kernel.Context(now=T0),
    )
    assert [(a.node, a.selection.order) for a in old.admit] == [("n000", 2)]
    assert old.book.admitted == 3


def test_completion_resets_the_order_even_without_batch_state() -> None:
    pol = _policy({"default": {"budget": {"count": 10}}})
    cr = _cr()
    done = [_done(cr, x) for x in _fleet(2)]
    p = kernel.plan(
        cr=cr, policy=pol, nodes=done, book=BatchBook(admitted=2), ctx=kernel.Context(now=T0)
    )
    assert p.book.admitted == 0
    assert p.events == ("batch state reset: rollout complete",)
    kept = kernel.plan(
        cr=_cr(deploymentPolicyOptions={"resetBatchStateOnCompletion": False}),
        policy=pol,
        nodes=done,
        book=BatchBook(admitted=2),
        ctx=kernel.Context(now=T0),
    )
    assert kept.book.admitted == 2


@settings(max_examples=60, deadline=None)
@given(rollouts(), st.randoms(use_true_random=False), st.sampled_from([0.0, 0.3, 0.7]))
def test_node_orders_are_unique_gapless_and_increase_with_the_batch_even_across_crashes(
    case: tuple[api.NodeWright, api.DeploymentPolicy, list[NodeFacts]],
    rng: random.Random,
    crash: float,
) -> None:
    """The shell writes the book (with the advanced counter and the batch's reserved orders)
    before the admissions; a crash in between, or a node write that loses a race, loses any
    subset of them (each is its own node write). The next decision starts from the written
    book: the lost admissions are made again with the orders reserved for them."""
    cr, pol, nodes = case
    state = {n.name: n for n in nodes}
    book = BatchBook()
    written: list[tuple[int, str, int, int]] = []  # (rollout, compartment, batch, order)
    rollout = 0
    crashed = False
    for i in range(600):
        if i == 5:
            for name, n in list(state.items()):
                state[name] = simulation.written(n, ready=True, unschedulable=False)
        p = kernel.plan(
            cr=cr, policy=pol, nodes=list(state.values()), book=book, ctx=kernel.Context(now=T0)
        )
        if any("batch state reset" in e for e in p.events):
            rollout += 1
        given = [o for a in p.admit if (o := a.selection.order) is not None]
        assert len(given) == len(p.admit)
        assert len(set(given)) == len(given)
        assert all(o < p.book.admitted for o in given)
        for r in p.release:
            state[r.node] = _released(state[r.node])
        if p.release:  # the shell decides again on the releases it wrote
            p = kernel.plan(
                cr=cr,
                policy=pol,
                nodes=list(state.values()),
                book=book,
                ctx=kernel.Context(now=T0),
            )
        book = p.book  # written first, with a resourceVersion precondition
        lost = rng.random() < crash
        crashed = crashed or (lost and bool(p.admit))
        for a in p.admit:
            if lost and rng.random() < 0.5:
                continue  # crashed before this admission was written
            state[a.node] = _selected(state[a.node], a)
            assert a.selection.order is not None
            written.append((rollout, a.selection.compartment, a.selection.batch, a.selection.order))
        for name, n in list(state.items()):
            if n.selection is not None and rng.random() < 0.6:
                state[name] = simulation.as_done(cr, n)
        if (
            i > 5
            and not p.admit
            and not p.release
            and all(n.selection is None for n in state.values())
            and not p.events
        ):
            break
    assert all(progress.node_done(cr, n) for n in state.values())
    assert book.admitted == 0  # completion reset the counter with the batch state
    for epoch in set(r for r, *_ in written):
        mine = [w for w in written if w[0] == epoch]
        orders = [o for *_, o in mine]
        assert len(orders) == len(set(orders)), "an order was handed out twice"
        assert sorted(orders) == list(range(len(orders))), "a gap in the orders"
        if not crashed:
            assert orders == sorted(orders)  # no admission made again: in admission order
        for _, comp, batch, order in mine:
            for _, comp2, batch2, order2 in mine:
                if comp2 == comp and batch2 > batch:
                    assert order2 > order


def test_the_next_batch_waits_for_the_last_one_to_be_released_rather_than_shrink() -> None:
    pol = _policy({"default": {"budget": {"count": 3}, "strategy": _strategy("linear", 1, 1)}})
    r = Rollout(_cr(), pol, {n.name: n for n in _fleet(6)})
    r.step()  # batch 1: n000
    r.finish_admitted()
    r.step()  # n000 released, batch 2: n001, n002
    r.finish_admitted()
    # n001 is done but the drainer still holds its cordon: it keeps its slot a moment longer.
    cordon = DrainRecord(phase="drained", cordoned=True, started=T0, since=T0)
    r.nodes["n001"] = replace(r.nodes["n001"], drain=cordon)
    p = r.step()
    assert p.admit == ()
    entry = r.book.compartments[DEFAULT_COMPARTMENT]
    assert (entry.state.current_batch, entry.nodes) == (3, ()), "not opened with 2 of 3 nodes"
    (comp,) = p.compartments
    assert comp.waiting is None, "waiting for the batch in flight is no compartment wait"
    assert comp.unopened is not None
    assert comp.unopened.code == "WaitingForBatch"
    assert (
        comp.unopened.message
        == "1 nodes of compartment __default__'s last batch are being released"
    )
    # Released: batch 3 opens at its full size.
    r.nodes["n001"] = replace(r.nodes["n001"], drain=None)
    p = r.step()
    assert [a.node for a in p.admit] == ["n003", "n004", "n005"]


def test_a_pass_that_changes_nothing_but_the_caches_progress_keeps_the_book() -> None:
    """Every node change starts a pass and moves the node cache on; the watermark alone is
    no reason for a book write (issue 15). It moves with a write that drops fence entries."""
    r = Rollout(cr=_cr(), policy=None, nodes={n.name: n for n in _fleet(4)})
    first = r.step()
    assert first.book.admitting == {"n000": "1"}, "the fence holds the pass's admission"

    def again(book: BatchBook, seen: str) -> BatchBook:
        return kernel.plan(
            cr=r.cr,
            policy=None,
            nodes=list(r.nodes.values()),
            book=book,
            ctx=kernel.Context(now=T0, nodes_seen=seen),
        ).book

    # The admission landed (the node changed): the entry goes, the watermark moves with it.
    dropped = again(first.book, "900")
    assert (dropped.admitting, dropped.nodes_seen) == ({}, "900")
    # Heartbeats: the cache moves on, the book stays as it is (no write).
    assert again(dropped, "950") is dropped
    assert again(dropped, "990") is dropped
