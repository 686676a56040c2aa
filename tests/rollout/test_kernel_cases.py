"""The rollout kernel admits nodes within the budget and says why others wait: single
decisions, as tables."""

from __future__ import annotations

from typing import Any

import pytest

from shared import api, nodestate, progress
from shared.records.drainer import DrainRecord
from shared.records.executor import ExecutorRecord, PackageRecord
from shared.records.scheduler import Selection
from shared.records.validator import ValidatorRecord
from shared.rollout import fleet, kernel, rules
from shared.rollout.book import BATCHES_ANNOTATION, BatchBook, encode_batch_book
from tests.helpers.facts import T0, node, nodewright, selection


def _plan(cr: api.NodeWright, nodes: list[progress.NodeFacts], **ctx: Any) -> kernel.Plan:
    return kernel.plan(
        cr=cr, policy=None, nodes=nodes, book=BatchBook(), ctx=kernel.Context(now=T0, **ctx)
    )


def _facts(*nodes: dict[str, object]) -> list[progress.NodeFacts]:
    return [progress.facts(n, "gpu-node-tuning") for n in nodes]


def _selection(target: str = "x") -> Selection:
    return selection(target)


@pytest.mark.parametrize(
    ("budget", "matched", "expected"),
    [
        pytest.param(None, 10, 1, id="unset-one-at-a-time"),
        pytest.param({"count": 3}, 10, 3, id="count"),
        pytest.param({"percent": 33}, 30, 9, id="percent-rounds-down"),
        pytest.param({"percent": 33}, 2, 1, id="percent-minimum-one"),
        pytest.param({"percent": 50}, 0, 0, id="no-nodes"),
    ],
)
def test_budget_of(budget: dict[str, int] | None, matched: int, expected: int) -> None:
    cr = nodewright(interruptionBudget=budget) if budget else nodewright()
    assert rules.budget_nodes(cr.spec.interruption_budget, matched) == expected


def test_only_target_nodes_are_admitted_and_never_more_than_the_budget() -> None:
    cr = nodewright(interruptionBudget={"percent": 33})
    nodes = [node(f"gpu-{i}") for i in range(9)] + [
        node(f"cpu-{i}", labels={"nodepool": "cpu"}) for i in range(3)
    ]
    plan = _plan(cr, _facts(*nodes))
    assert plan.targets == tuple(f"gpu-{i}" for i in range(9))
    assert [a.node for a in plan.admit] == ["gpu-0", "gpu-1"]  # 33% of 9 = 2.97 -> 2
    # The batch in flight holds the whole budget: the others wait for it to finish.
    assert plan.waiting["gpu-5"].code == "WaitingForBatch"
    assert plan.book.compartments["__default__"].nodes == ("gpu-0", "gpu-1")
    assert all(not n.startswith("cpu") for n in plan.waiting)


def test_admitted_unfinished_nodes_and_unavailable_nodes_hold_budget_slots() -> None:
    cr = nodewright(interruptionBudget={"count": 2})
    nodes = _facts(
        node("a", records={nodestate.SCHEDULER: _selection()}),
        node("b", ready=False),
        node("c"),
    )
    plan = _plan(cr, nodes)
    assert plan.in_flight == 2
    assert plan.compartments[0].holders == (("a", "admitted"), ("b", "NotReady"))
    assert plan.admit == ()
    assert plan.waiting["c"].code == "BudgetExhausted"
    assert plan.waiting["b"].code == "NodeNotReady"


def test_a_node_cordoned_by_someone_else_counts_against_the_budget() -> None:
    cr = nodewright(interruptionBudget={"count": 1})
    plan = _plan(cr, _facts(node("a", unschedulable=True), node("b")))
    assert plan.in_flight == 1
    # The cordoned node may join without another slot; b would need one.
    assert [a.node for a in plan.admit] == ["a"]


def test_finished_nodes_are_released_only_after_the_drainer_let_go() -> None:
    cr = nodewright()
    target = progress.target_digest(cr)
    d = progress.desired(cr)["nvidia-tuned"]
    done = ExecutorRecord(
        packages={
            "nvidia-tuned": PackageRecord(
                version="0.9.0",
                stage="config",
                state="succeeded",
                installed="0.9.0",
                config=d.config_digest,
                updated=T0,
            )
        }
    )
    validated = ValidatorRecord(validated=target)
    drain = DrainRecord(phase="drained", cordoned=True, started=T0, since=T0)
    still_cordoned = node(
        "a",
        records={
            nodestate.SCHEDULER: _selection(target),
            nodestate.EXECUTOR: done,
            nodestate.VALIDATOR: validated,
            nodestate.DRAINER: drain,
        },
    )
    released = node(
        "b",
        records={
            nodestate.SCHEDULER: _selection(target),
            nodestate.EXECUTOR: done,
            nodestate.VALIDATOR: validated,
        },
    )
    plan = _plan(cr, _facts(still_cordoned, released))
    assert plan.release == (kernel.Release("b", done=True),)


@pytest.mark.parametrize(
    ("node_kwargs", "code"),
    [
        pytest.param({"labels": {nodestate.IGNORE_LABEL: "true"}}, "NodeIgnored", id="ignored"),
        pytest.param(
            {"taints": [{"key": "gpu", "value": "broken", "effect": "NoSchedule"}]},
            "TaintNotTolerated",
            id="taint",
        ),
    ],
)
def test_ineligible_nodes_wait_with_a_reason(node_kwargs: dict[str, object], code: str) -> None:
    plan = _plan(nodewright(), _facts(node("a", **node_kwargs)))  # type: ignore[arg-type]
    assert plan.admit == ()
    assert plan.waiting["a"].code == code


def test_a_paused_nodewright_admits_nothing_new() -> None:
    cr = nodewright(annotations={"nodewright.nvidia.com/pause": "true"})
    plan = _plan(cr, _facts(node("a")))
    assert plan.admit == ()
    assert plan.waiting["a"].code == "Paused"


def test_drain_only_for_interrupts_admits_non_disruptively() -> None:
    cr = nodewright(drain={"onlyForInterrupts": True})
    plan = _plan(cr, _facts(node("a")))
    assert plan.admit[0].selection.disruptive is False
    cr2 = nodewright(
        drain={"onlyForInterrupts": True},
        packages={"k": {"version": "1.0.0", "image": "r/k", "interrupt": {"type": "reboot"}}},
    )
    plan2 = _plan(cr2, _facts(node("a")))
    assert plan2.admit[0].selection.disruptive is True


_APPLIED = {"a.conf": "1", "b.conf": "1"}


@pytest.mark.parametrize(
    ("package", "installed", "expected"),
    [
        pytest.param({}, "", False, id="install-without-interrupt"),
        pytest.param(
            {"configInterrupts": {"b*": {"type": "reboot"}}},
            "",
            False,
            id="install-runs-no-config-interrupt",
        ),
        pytest.param({"interrupt": {"type": "reboot"}}, "", True, id="install-with-interrupt"),
        pytest.param(
            {
                "configInterrupts": {"b*": {"type": "reboot"}},
                "configMap": {**_APPLIED, "a.conf": "2"},
            },
            "1.0.0",
            False,
            id="config-change-of-keys-without-interrupt",
        ),
        pytest.param(
            {
                "configInterrupts": {"b*": {"type": "reboot"}},
                "configMap": {**_APPLIED, "b.conf": "2"},
            },
            "1.0.0",
            True,
            id="config-change-of-a-key-with-interrupt",
        ),
        pytest.param(
            {"interrupt": {"type": "reboot"}, "configMap": {**_APPLIED, "a.conf": "2"}},
            "1.0.0",
            False,
            id="config-change-runs-no-package-interrupt",
        ),
        pytest.param(
            {"configInterrupts": {"b*": {"type": "reboot"}}},
            "0.9.0",
            False,
            id="upgrade-without-interrupt",
        ),
    ],
)
def test_drain_only_for_interrupts_drains_a_node_only_where_its_cycle_runs_one(
    package: dict[str, Any], installed: str, expected: bool
) -> None:
    """A configuration change runs the configInterrupts of the keys that changed, an install
    or upgrade the package's interrupt (``progress.cycle_interrupt``, which the executor starts
    each cycle with): only a node where one will run is cordoned and drained first."""
    spec = {"version": "1.0.0", "image": "r/k", "configMap": _APPLIED, **package}
    cr = nodewright(drain={"onlyForInterrupts": True}, packages={"k": spec})
    records = {}
    if installed:
        applied = progress.config_key_digests(_APPLIED)
        done = PackageRecord(
            version=installed,
            stage="config",
            state="succeeded",
            installed=installed,
            config=progress.desired(nodewright(packages={"k": {**spec, "configMap": _APPLIED}}))[
                "k"
            ].config_digest,
            config_keys=applied,
            updated=T0,
        )
        records[nodestate.EXECUTOR] = ExecutorRecord(packages={"k": done})
    (facts,) = _facts(node("a", records=records))
    assert not progress.package_done(progress.desired(cr)["k"], facts.executor.packages.get("k"))
    assert progress.disruptive(cr, facts) is expected
    always = nodewright(packages={"k": spec})
    assert progress.disruptive(always, facts), "without onlyForInterrupts every node is drained"


def test_the_cluster_budget_counts_another_nodewrights_admission_in_flight() -> None:
    """NodeWright a wrote its book with the fence and is about to admit a-0; b decides on
    nodes that do not show that admission yet: the cluster budget of 1 is taken."""
    nodes = [node("a-0", labels={"pool": "a"}), node("b-0", labels={"pool": "b"})]
    fence = BatchBook(admitting={"a-0": nodes[0]["metadata"]["resourceVersion"]})
    a = nodewright(
        "a",
        nodeSelectors={"matchLabels": {"pool": "a"}},
        annotations={BATCHES_ANNOTATION: encode_batch_book(fence)},
    )
    b = nodewright("b", nodeSelectors={"matchLabels": {"pool": "b"}})
    world = fleet.Fleet(
        crs=[a, b], policies={}, nodes=nodes, settings=fleet.Settings(cluster_budget=1)
    )
    plan = fleet.decide(world, b, T0)
    assert plan.admit == ()
    reason = plan.waiting["b-0"]
    assert reason.code == "ClusterBudgetExhausted"
    assert reason.message == (
        "1 of 1 nodes of the cluster budget are disrupted: a-0: being admitted by NodeWright a"
    )
    # Once a-0 changed without its admission (the write lost its race), it holds nothing.
    moved = [dict(nodes[0], metadata={**nodes[0]["metadata"], "resourceVersion": "9"}), nodes[1]]
    again = fleet.decide(
        fleet.Fleet(crs=[a, b], policies={}, nodes=moved, settings=world.settings), b, T0
    )
    assert [x.node for x in again.admit] == ["b-0"]
