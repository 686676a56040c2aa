"""The status core: each node's phase and reason, the CR status and its Ready condition, and
the per-node writes, computed from observed state alone."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import msgspec
import pytest
from hypothesis import given, strategies as st

from services.status import assessing, core
from shared import api, nodestate, progress
from shared.events import ObjectRef, Reason
from shared.records.drainer import DrainRecord
from shared.records.executor import ExecutorRecord, InterruptRecord, PackageRecord
from shared.records.scheduler import Selection
from shared.records.validator import CheckRecord, ValidatorRecord
from shared.rollout import book as rollout_book
from tests.helpers import status as status_helpers
from tests.helpers.facts import T0, node, nodewright

CR = "gpu-node-tuning"
T1 = T0 + timedelta(minutes=5)
T2 = T0 + timedelta(minutes=10)
BASE = nodewright()
TARGET = progress.target_digest(BASE)
DIGEST = progress.desired(BASE)["nvidia-tuned"].config_digest


def _sel(compartment: str = "__default__") -> Selection:
    return Selection(
        generation=1,
        compartment=compartment,
        batch=1,
        selected_at=T0,
        disruptive=True,
        target=TARGET,
    )


def _pkg(state: str = "succeeded", **kw: Any) -> PackageRecord:
    fields: dict[str, Any] = {
        "version": "0.9.0",
        "stage": "config",
        "state": state,
        "installed": "0.9.0" if state == "succeeded" else "",
        "config": DIGEST if state == "succeeded" else "",
        "updated": T0,
    }
    fields.update(kw)
    return msgspec.convert(fields, PackageRecord)


def _exe(**packages: PackageRecord) -> ExecutorRecord:
    return ExecutorRecord(packages=packages)


DONE = _exe(**{"nvidia-tuned": _pkg()})
VALIDATED = ValidatorRecord(validated=TARGET, at=T0)
DRAINED = DrainRecord(phase="drained", cordoned=True, started=T0, since=T0)
IMAGE_PULL = Reason(code="ImagePullFailed", message="cannot pull image ghcr.io/x:0.9.0")


def _complete(name: str, **kw: Any) -> dict[str, Any]:
    return node(name, records={nodestate.EXECUTOR: DONE, nodestate.VALIDATOR: VALIDATED}, **kw)


def _failed(name: str, reason: Reason = IMAGE_PULL) -> dict[str, Any]:
    failed = _pkg("failed", stage="apply", reason=reason, updated=T1)
    return node(
        name,
        records={
            nodestate.SCHEDULER: _sel(),
            nodestate.DRAINER: DRAINED,
            nodestate.EXECUTOR: _exe(**{"nvidia-tuned": failed}),
        },
    )


def _running(name: str) -> dict[str, Any]:
    return node(
        name,
        records={
            nodestate.SCHEDULER: _sel(),
            nodestate.DRAINER: DRAINED,
            nodestate.EXECUTOR: _exe(**{"nvidia-tuned": _pkg("running", stage="apply")}),
        },
    )


def _observed(*nodes: Mapping[str, Any]) -> list[assessing.Observed]:
    return [assessing.observe(n, CR) for n in nodes]


def _status(
    *nodes: Mapping[str, Any],
    cr: api.NodeWright = BASE,
    policy: api.DeploymentPolicy | None = None,
    now: Any = T0,
) -> api.NodeWrightStatus:
    return core.compute_status(cr, policy, _observed(*nodes), now)


def _view(
    n: Mapping[str, Any],
    *others: Mapping[str, Any],
    cr: api.NodeWright = BASE,
    policy: api.DeploymentPolicy | None = None,
) -> assessing.NodeView:
    views, _ = status_helpers.assess(cr, policy, _observed(n, *others), T0)
    return next(v for v in views if v.name == n["metadata"]["name"])


def _ready(status: api.NodeWrightStatus) -> api.Condition:
    return next(c for c in status.conditions if c.type == "Ready")


def _with_status(cr: api.NodeWright, status: api.NodeWrightStatus) -> api.NodeWright:
    return msgspec.structs.replace(cr, status=status)


# ---- each node's phase -------------------------------------------------------------------------

PAUSED = {api.PAUSE_ANNOTATION: "true"}
DISABLED = {api.DISABLE_ANNOTATION: "true"}


@pytest.mark.parametrize(
    ("records", "node_kw", "cr_kw", "expected"),
    [
        pytest.param(
            {nodestate.EXECUTOR: DONE, nodestate.VALIDATOR: VALIDATED},
            {},
            {},
            ("Complete", "Complete", "Complete", ""),
            id="done",
        ),
        pytest.param(
            {
                nodestate.EXECUTOR: DONE,
                nodestate.VALIDATOR: VALIDATED,
                nodestate.SCHEDULER: _sel(),
                nodestate.DRAINER: DRAINED,
            },
            {},
            {},
            ("Running", "InProgress", "Uncordoning", ""),
            id="validated-still-cordoned",
        ),
        pytest.param(
            {nodestate.EXECUTOR: DONE, nodestate.VALIDATOR: VALIDATED, nodestate.SCHEDULER: _sel()},
            {},
            {},
            ("Running", "InProgress", "Releasing", ""),
            id="validated-admission-held",
        ),
        pytest.param(
            {},
            {"labels": {nodestate.IGNORE_LABEL: "true"}},
            {},
            ("Blocked", "Blocked", "NodeIgnored", ""),
            id="ignored",
        ),
        pytest.param(
            {},
            {"taints": [{"key": "gpu", "value": "broken", "effect": "NoSchedule"}]},
            {},
            ("Blocked", "Blocked", "TaintNotTolerated", ""),
            id="untolerated-taint",
        ),
        pytest.param(
            {},
            {"taints": [{"key": "gpu", "value": "broken", "effect": "NoSchedule"}]},
            {"additionalTolerations": [{"key": "gpu", "operator": "Exists"}]},
            ("Waiting", "Waiting", "Admitting", ""),
            id="tolerated-taint",
        ),
        pytest.param(
            {},
            {},
            {"deploymentPolicy": "missing"},
            ("Blocked", "Blocked", "DeploymentPolicyNotFound", ""),
            id="policy-missing",
        ),
        pytest.param(
            {}, {}, {"annotations": DISABLED}, ("Waiting", "Waiting", "Disabled", ""), id="disabled"
        ),
        pytest.param(
            {}, {}, {"annotations": PAUSED}, ("Waiting", "Waiting", "Paused", ""), id="paused"
        ),
        pytest.param(
            {}, {"ready": False}, {}, ("Waiting", "Waiting", "NodeNotReady", ""), id="not-ready"
        ),
        pytest.param({}, {}, {}, ("Waiting", "Waiting", "Admitting", ""), id="slot-free"),
        pytest.param(
            {nodestate.SCHEDULER: _sel()},
            {},
            {},
            ("Pending", "InProgress", "Admitted", ""),
            id="admitted-not-cordoned-yet",
        ),
        pytest.param(
            {
                nodestate.SCHEDULER: _sel(),
                nodestate.DRAINER: DrainRecord(phase="draining", started=T0, since=T1),
            },
            {},
            {},
            ("Draining", "InProgress", "Draining", ""),
            id="draining",
        ),
        pytest.param(
            {
                nodestate.SCHEDULER: _sel(),
                nodestate.DRAINER: DrainRecord(
                    phase="waiting",
                    started=T0,
                    since=T0,
                    reason=Reason(code="ProtectedPodRunning", message="pod ns/train runs"),
                ),
            },
            {},
            {},
            ("Waiting", "Waiting", "ProtectedPodRunning", ""),
            id="drain-waits-for-protected-pods",
        ),
        pytest.param(
            {
                nodestate.SCHEDULER: _sel(),
                nodestate.DRAINER: DrainRecord(
                    phase="blocked",
                    started=T0,
                    since=T0,
                    reason=Reason(code="PodDisruptionBudgetBlocking", message="pdb ns/db at 0"),
                ),
            },
            {},
            {},
            ("Blocked", "Blocked", "PodDisruptionBudgetBlocking", ""),
            id="drain-blocked",
        ),
        pytest.param(
            {
                nodestate.SCHEDULER: _sel(),
                nodestate.DRAINER: DrainRecord(
                    phase="failed",
                    started=T0,
                    since=T0,
                    reason=Reason(code="DrainTimeout", message="drain took longer than 3600s"),
                ),
            },
            {},
            {},
            ("Failed", "Failed", "DrainTimeout", ""),
            id="drain-failed",
        ),
        pytest.param(
            {
                nodestate.SCHEDULER: _sel(),
                nodestate.DRAINER: DRAINED,
                nodestate.EXECUTOR: _exe(**{"nvidia-tuned": _pkg("running", stage="apply")}),
            },
            {},
            {},
            ("Running", "InProgress", "StageRunning", "nvidia-tuned"),
            id="stage-running",
        ),
        pytest.param(
            {
                nodestate.SCHEDULER: _sel(),
                nodestate.DRAINER: DRAINED,
                nodestate.EXECUTOR: _exe(
                    **{"nvidia-tuned": _pkg("failed", stage="apply", reason=IMAGE_PULL)}
                ),
            },
            {},
            {},
            ("Failed", "Failed", "ImagePullFailed", "nvidia-tuned"),
            id="stage-failed",
        ),
        pytest.param(
            {
                nodestate.SCHEDULER: _sel(),
                nodestate.DRAINER: DRAINED,
                nodestate.EXECUTOR: _exe(
                    **{"nvidia-tuned": _pkg("succeeded", stage="apply", installed="", config="")}
                ),
                nodestate.VALIDATOR: ValidatorRecord(
                    checks={
                        "nvidia-tuned/0.9.0/apply": CheckRecord(
                            verdict="failed",
                            at=T1,
                            reason=Reason(code="CheckFailed", message="exit 1: tuned not active"),
                        )
                    }
                ),
            },
            {},
            {},
            ("Failed", "Failed", "CheckFailed", "nvidia-tuned"),
            id="check-failed",
        ),
        pytest.param(
            {
                nodestate.SCHEDULER: _sel(),
                nodestate.DRAINER: DRAINED,
                nodestate.EXECUTOR: _exe(
                    **{"nvidia-tuned": _pkg("succeeded", stage="apply", installed="", config="")}
                ),
            },
            {},
            {},
            ("Running", "InProgress", "WaitingForCheck", "nvidia-tuned"),
            id="waiting-for-check",
        ),
        pytest.param(
            {
                nodestate.SCHEDULER: _sel(),
                nodestate.DRAINER: DRAINED,
                nodestate.EXECUTOR: ExecutorRecord(
                    packages={"nvidia-tuned": _pkg("running", stage="interrupt")},
                    interrupt=InterruptRecord(
                        type="reboot", state="running", packages=("nvidia-tuned",), started=T0
                    ),
                ),
            },
            {},
            {},
            ("Running", "InProgress", "Rebooting", "nvidia-tuned"),
            id="rebooting",
        ),
        pytest.param(
            {nodestate.SCHEDULER: _sel(), nodestate.DRAINER: DRAINED, nodestate.EXECUTOR: DONE},
            {},
            {},
            ("Validating", "InProgress", "Validating", ""),
            id="validating",
        ),
        pytest.param(
            {
                nodestate.SCHEDULER: _sel(),
                nodestate.DRAINER: DRAINED,
                nodestate.EXECUTOR: _exe(
                    **{"nvidia-tuned": _pkg("succeeded", stage="apply", installed="", config="")}
                ),
            },
            {},
            {"annotations": PAUSED},
            ("Running", "InProgress", "WaitingForCheck", "nvidia-tuned"),
            id="paused-admitted-node-finishes-its-stage",
        ),
        pytest.param(
            {nodestate.SCHEDULER: _sel(), nodestate.DRAINER: DRAINED},
            {},
            {"annotations": PAUSED, "drain": {"onlyForInterrupts": True}},
            ("Waiting", "Waiting", "Paused", ""),
            id="paused-admitted-node-starts-nothing",
        ),
    ],
)
def test_each_node_gets_a_phase_state_and_reason_from_its_records(
    records: dict[str, msgspec.Struct],
    node_kw: dict[str, Any],
    cr_kw: dict[str, Any],
    expected: tuple[str, str, str, str],
) -> None:
    view = _view(node("n1", records=records, **node_kw), cr=nodewright(**cr_kw))
    assert (view.phase, view.state, view.reason.code, view.package) == expected


def test_a_waiting_node_says_budget_exhausted_while_the_budget_is_full() -> None:
    cr = nodewright(interruptionBudget={"count": 1})
    full = _view(node("n2"), _running("n1"), cr=cr).reason
    assert full.code == "BudgetExhausted"
    assert full.message == "1 of 1 budgeted nodes of compartment __default__ are busy: n1: admitted"
    # A free slot: the kernel admits n2 now (status says so until the admission is written).
    assert _view(node("n2"), _complete("n1"), cr=cr).reason.code == "Admitting"
    # A policy's default budget counts instead of the CR's.
    policy = api.from_dict(
        {"metadata": {"name": "p"}, "spec": {"default": {"budget": {"count": 2}}}},
        api.DeploymentPolicy,
    )
    with_policy = nodewright(deploymentPolicy="p")
    view = _view(node("n2"), _running("n1"), cr=with_policy, policy=policy)
    assert view.reason.code == "Admitting"


def test_a_record_that_does_not_decode_blocks_the_node_and_raises_nothing() -> None:
    bad = node("n1")
    bad["metadata"]["annotations"][nodestate.key(nodestate.EXECUTOR, CR)] = "{not json"
    bad["status"]["conditions"].append({"type": assessing.condition_type(CR), "reason": 7})
    obs = assessing.observe(bad, CR)
    assert obs.reported is None
    status = core.compute_status(BASE, None, [obs], T0)
    assert status.node_counts.blocked == 1
    (detail,) = status.node_details
    assert detail.reason == "NodeStateMalformed"
    assert "executor.nodewright.nvidia.com/gpu-node-tuning" in detail.message
    malformed = next(c for c in status.conditions if c.type == "NodeStateMalformed")
    assert malformed.status == "True"


# ---- the CR status ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodes", "cr_kw", "ready", "reason"),
    [
        pytest.param([_complete("a"), _complete("b")], {}, "True", "Complete", id="all-complete"),
        pytest.param([], {}, "True", "Complete", id="no-target-nodes"),
        pytest.param(
            [_complete("a"), _running("b"), _failed("c")],
            {},
            "False",
            "InProgress",
            id="in-progress-wins",
        ),
        pytest.param([_complete("a"), _failed("b"), node("c")], {}, "False", "Failed", id="failed"),
        pytest.param(
            [node("a", labels={nodestate.IGNORE_LABEL: "true"}), node("b", ready=False)],
            {},
            "False",
            "Blocked",
            id="blocked-before-waiting",
        ),
        pytest.param([node("a")], {}, "False", "Waiting", id="waiting"),
        pytest.param(
            [_complete("a"), node("b")], {"annotations": PAUSED}, "False", "Paused", id="paused"
        ),
        pytest.param(
            [_running("a")], {"annotations": DISABLED}, "False", "Disabled", id="disabled"
        ),
        pytest.param(
            [_complete("a")],
            {"annotations": PAUSED},
            "True",
            "Complete",
            id="complete-even-when-paused",
        ),
        pytest.param(
            [_complete("a"), _complete("b", labels={"nodepool": "cpu"}), node("c")],
            {},
            "False",
            "Waiting",
            id="only-targets-count",
        ),
    ],
)
def test_ready_is_true_exactly_when_every_target_node_is_complete(
    nodes: list[dict[str, Any]], cr_kw: dict[str, Any], ready: str, reason: str
) -> None:
    status = _status(*nodes, cr=nodewright(**cr_kw))
    condition = _ready(status)
    assert (condition.status, condition.reason) == (ready, reason)
    assert status.state == reason
    assert condition.observed_generation == status.observed_generation == 1
    counts = status.node_counts
    total = counts.complete + counts.in_progress + counts.failed + counts.waiting + counts.blocked
    assert total == counts.target
    assert status.complete_nodes == f"{counts.complete}/{counts.target}"


def test_a_changed_spec_makes_complete_nodes_incomplete_again() -> None:
    upgraded = nodewright(
        generation=2,
        packages={"nvidia-tuned": {"version": "1.0.0", "image": "ghcr.io/n/nvidia-tuned"}},
    )
    status = _status(_complete("a"), cr=upgraded)
    assert _ready(status).status == "False"
    assert status.observed_generation == 2
    assert status.node_counts.complete == 0


def test_the_ready_message_counts_states_and_names_failures_with_their_reason() -> None:
    status = _status(
        _complete("a"), _failed("b"), _running("c"), node("d"), node("e"), _complete("f")
    )
    message = _ready(status).message
    assert message.startswith("2/6 nodes complete, 1 failed (b: ImagePullFailed: cannot pull")
    assert "1 in progress (c: StageRunning)" in message
    assert "2 waiting (d: BudgetExhausted; e: BudgetExhausted)" in message


def test_node_details_list_failed_then_blocked_in_progress_waiting() -> None:
    status = _status(
        node("w"),
        _running("r"),
        node("b", labels={nodestate.IGNORE_LABEL: "true"}),
        _failed("f"),
        _complete("c"),
    )
    assert [(d.node, d.state, d.reason) for d in status.node_details] == [
        ("f", "Failed", "ImagePullFailed"),
        ("b", "Blocked", "NodeIgnored"),
        ("r", "InProgress", "StageRunning"),
        ("w", "Waiting", "BudgetExhausted"),
    ]
    failed = status.node_details[0]
    assert failed.package == "nvidia-tuned"
    assert failed.since == T1
    assert "ghcr.io/x:0.9.0" in failed.message
    assert status.node_details_omitted == 0


def test_ten_thousand_nodes_give_a_bounded_status_quickly() -> None:
    nodes = [_failed(f"f-{i:05d}") for i in range(30)]
    nodes += [node(f"w-{i:05d}") for i in range(9_960)]
    nodes += [_complete(f"c-{i:05d}") for i in range(10)]
    observed = _observed(*nodes)
    started = time.perf_counter()
    status = core.compute_status(BASE, None, observed, T0)
    elapsed = time.perf_counter() - started
    assert len(status.node_details) == api.MAX_NODE_DETAILS
    assert [d.node for d in status.node_details] == [f"f-{i:05d}" for i in range(20)]
    assert status.node_details_omitted == 9_990 - api.MAX_NODE_DETAILS
    assert status.node_counts == api.NodeCounts(
        target=10_000, complete=10, failed=30, in_progress=0, waiting=9_960
    )
    assert len(_ready(status).message) < 1024
    assert len(api.encode(status)) < 32_000
    assert elapsed < 5.0, f"compute_status took {elapsed:.2f}s for 10,000 nodes"


def test_the_status_is_deterministic_and_valid_for_the_crd_whatever_the_records_say() -> None:
    odd = Reason(
        code="drain blocked!! 42 times",
        message="x" * 5_000,
        objects=tuple(ObjectRef(kind="Pod", name=f"p{i}") for i in range(50)),
    )
    nodes = [
        _failed("a", reason=odd),
        _failed("b"),
        _complete("c"),
        _running("d"),
        node("e", taints=[{"key": "k", "value": "v" * 60, "effect": "NoExecute"}]),
        node("f", labels={nodestate.IGNORE_LABEL: "true"}),
    ]
    first = _status(*nodes)
    shuffled = list(nodes)
    random.Random(7).shuffle(shuffled)
    second = _status(*shuffled)
    assert first == second
    assert api.encode(first) == api.encode(second)
    # Round-trips through the CRD's constraints (lengths, reason patterns, list sizes).
    decoded = api.decode(api.encode(first), api.NodeWrightStatus)
    assert decoded == first
    detail = next(d for d in first.node_details if d.node == "a")
    assert detail.reason == "drainblocked42times"
    assert len(detail.message) <= 1024


def test_last_transition_time_is_kept_while_a_condition_keeps_its_status() -> None:
    s0 = _status(_running("a"), node("b"), cr=nodewright(deploymentPolicy="gone"), now=T0)
    assert _ready(s0).last_transition_time == T0
    # More progress, still not Ready: same transition time, new message.
    cr1 = _with_status(nodewright(deploymentPolicy="gone"), s0)
    s1 = _status(_complete("a"), node("b"), cr=cr1, now=T1)
    assert _ready(s1).last_transition_time == T0
    assert _ready(s1).message != _ready(s0).message
    missing = [c for c in s1.conditions if c.type == "DeploymentPolicyNotFound"]
    assert [c.last_transition_time for c in missing] == [T0]
    # Complete: Ready flips, and its transition time moves.
    cr2 = _with_status(nodewright(), s1)
    s2 = _status(_complete("a"), _complete("b"), cr=cr2, now=T2)
    assert (_ready(s2).status, _ready(s2).last_transition_time) == ("True", T2)
    assert [c.type for c in s2.conditions] == ["Ready"]
    # Nothing changed: the very same status, so the shell writes nothing.
    cr3 = _with_status(nodewright(), s2)
    assert _status(_complete("a"), _complete("b"), cr=cr3, now=T2 + timedelta(hours=1)) == s2


def test_problem_conditions_name_the_nodes_concerned() -> None:
    taint = [{"key": "gpu", "value": "broken", "effect": "NoSchedule"}]
    blocked = DrainRecord(
        phase="blocked", started=T0, since=T0, reason=Reason(code="PdbBlocking", message="x")
    )
    status = _status(
        node("t1", taints=taint),
        node("t2", taints=taint),
        node("i1", labels={nodestate.IGNORE_LABEL: "true"}),
        node("d1", records={nodestate.SCHEDULER: _sel(), nodestate.DRAINER: blocked}),
        cr=nodewright(deploymentPolicy="nope"),
    )
    by_type = {c.type: c for c in status.conditions}
    assert list(by_type) == [
        "Ready",
        "DeploymentPolicyNotFound",
        "DrainBlocked",
        "NodesIgnored",
        "TaintNotTolerated",
    ]
    assert by_type["TaintNotTolerated"].message.startswith("2 nodes have taints")
    assert "t1, t2" in by_type["TaintNotTolerated"].message
    assert "i1" in by_type["NodesIgnored"].message
    assert "d1" in by_type["DrainBlocked"].message
    assert "nope" in by_type["DeploymentPolicyNotFound"].message
    assert all(c.status == "True" for t, c in by_type.items() if t != "Ready")


def test_packages_count_every_version_present_from_the_executor_records() -> None:
    upgrading = _pkg("running", stage="upgrade", installed="0.8.0", previous="0.8.0")
    old_elsewhere = _pkg(version="0.7.0", installed="0.7.0")
    status = _status(
        _complete("a"),
        node("b", records={nodestate.EXECUTOR: _exe(**{"nvidia-tuned": upgrading})}),
        _failed("c"),
        node(
            "x",
            labels={"nodepool": "cpu"},
            records={nodestate.EXECUTOR: _exe(**{"nvidia-tuned": old_elsewhere})},
        ),
    )
    assert status.package_list == "nvidia-tuned:0.9.0"
    rows = {(p.name, p.version): p for p in status.packages}
    assert list(rows) == [
        ("nvidia-tuned", "0.7.0"),
        ("nvidia-tuned", "0.8.0"),
        ("nvidia-tuned", "0.9.0"),
    ]
    assert rows["nvidia-tuned", "0.9.0"] == api.PackageStatus(
        name="nvidia-tuned",
        version="0.9.0",
        present_nodes=3,
        complete_nodes=1,
        in_progress_nodes=1,
        failed_nodes=1,
    )
    assert rows["nvidia-tuned", "0.8.0"].present_nodes == 1
    assert rows["nvidia-tuned", "0.7.0"].present_nodes == 1, "non-target nodes count too"


def test_uninstalled_versions_are_no_longer_present() -> None:
    uninstalling = _pkg("running", stage="uninstall", cycle="uninstall", installed="0.9.0")
    uninstalled = _pkg("succeeded", stage="uninstall", cycle="uninstall", installed="")
    status = _status(
        node("a", records={nodestate.EXECUTOR: _exe(**{"nvidia-tuned": uninstalling})}),
        node("b", records={nodestate.EXECUTOR: _exe(**{"nvidia-tuned": uninstalled})}),
    )
    (row,) = status.packages
    assert (row.present_nodes, row.uninstalling_nodes, row.in_progress_nodes) == (1, 1, 0)


def test_compartments_come_from_the_admissions_and_show_the_schedulers_batch_book() -> None:
    batch = api.BatchState(current_batch=3, batch_size=2, total_succeeded_nodes=4)
    book = rollout_book.BatchBook(
        compartments={"__default__": rollout_book.CompartmentBatch(state=batch, nodes=("b", "c"))}
    )
    stale = api.NodeWrightStatus(
        compartments=[api.CompartmentStatus(name="__default__", batch=api.BatchState())]
    )
    cr = _with_status(
        nodewright(
            interruptionBudget={"percent": 50},
            annotations={rollout_book.BATCHES_ANNOTATION: rollout_book.encode_batch_book(book)},
        ),
        stale,
    )
    status = _status(_complete("a"), _running("b"), _failed("c"), node("d"), cr=cr)
    (comp,) = status.compartments
    assert comp == api.CompartmentStatus(
        name="__default__",
        matched_nodes=4,
        budget_nodes=2,
        in_progress_nodes=1,
        complete_nodes=1,
        failed_nodes=1,
        progress_percent=25,
        # The book's batch, with the counts of its nodes now (c failed): the book keeps a
        # batch's counts only when it closes (issue 15).
        batch=msgspec.structs.replace(batch, batch_failed_nodes=1),
    )


def test_a_policy_compartment_gets_its_own_entry_and_budget() -> None:
    policy = api.from_dict(
        {
            "metadata": {"name": "p"},
            "spec": {
                "default": {"budget": {"count": 1}},
                "compartments": [
                    {
                        "name": "canary",
                        "selector": {"matchLabels": {"canary": "true"}},
                        "budget": {"count": 3},
                    }
                ],
            },
        },
        api.DeploymentPolicy,
    )
    canary = node(
        "a",
        labels={"canary": "true"},
        records={nodestate.SCHEDULER: _sel("canary"), nodestate.DRAINER: DRAINED},
    )
    status = _status(canary, node("b"), cr=nodewright(deploymentPolicy="p"), policy=policy)
    comps = {c.name: c for c in status.compartments}
    assert list(comps) == ["__default__", "canary"]
    assert (comps["canary"].matched_nodes, comps["canary"].budget_nodes) == (1, 3)
    assert (comps["__default__"].matched_nodes, comps["__default__"].budget_nodes) == (1, 1)


# ---- per-node writes ---------------------------------------------------------------------------


def _carrying(n: dict[str, Any], update: core.NodeUpdate) -> dict[str, Any]:
    """``n`` after ``update`` was written."""
    status_helpers.written(n, CR, update)
    return n


def _updates(*nodes: dict[str, Any], cr: api.NodeWright = BASE, now: Any = T0) -> list[Any]:
    observed = _observed(*nodes)
    views, _ = status_helpers.assess(cr, None, observed, now)
    return core.node_updates(CR, views, observed, now)


def test_each_target_node_gets_its_condition_once() -> None:
    a, b = _complete("a"), _failed("b")
    first = _updates(a, b)
    assert [(u.node, u.write_condition, u.remove_record) for u in first] == [
        ("a", True, None),
        ("b", True, None),
    ]
    ua, ub = first
    assert ua.condition is not None
    assert ub.condition is not None
    assert (ua.condition["type"], ua.condition["status"], ua.condition["reason"]) == (
        "nodewright.nvidia.com/gpu-node-tuning",
        "True",
        "Complete",
    )
    assert (ub.condition["status"], ub.condition["reason"]) == ("False", "Failed")
    assert ub.condition["message"].startswith("ImagePullFailed: cannot pull image")
    # Written: the next pass (later) has nothing to do.
    assert _updates(_carrying(a, ua), _carrying(b, ub), now=T2) == []


def test_the_node_condition_keeps_its_transition_time_while_its_status_is_unchanged() -> None:
    (first,) = _updates(node("b"), now=T0)
    waiting = _carrying(node("b"), first)
    running = _running("b")
    running["status"] = waiting["status"]
    (update,) = _updates(running, now=T1)
    assert update.condition is not None
    assert (update.condition["status"], update.condition["reason"]) == ("False", "InProgress")
    assert update.condition["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    done = _complete("b")
    done["status"] = _carrying(running, update)["status"]
    (flip,) = _updates(done, now=T2)
    assert flip.condition is not None
    assert (flip.condition["status"], flip.condition["lastTransitionTime"]) == (
        "True",
        "2026-01-01T00:10:00Z",
    )


def test_a_node_in_progress_keeps_its_condition_from_stage_to_stage() -> None:
    """The condition does not name the step (the services' own records do): naming it cost a
    node write per stage and check (issue 15)."""
    (first,) = _updates(_running("b"), now=T0)
    running = _carrying(_running("b"), first)
    checking = _carrying(
        node(
            "b",
            records={
                nodestate.SCHEDULER: _sel(),
                nodestate.DRAINER: DRAINED,
                nodestate.EXECUTOR: _exe(**{"nvidia-tuned": _pkg("succeeded", stage="apply")}),
            },
        ),
        first,
    )
    checking["status"] = running["status"]
    views, _ = status_helpers.assess(BASE, None, _observed(checking), T1)
    assert views[0].reason.code == "Validating", "the view moved on to the next step"
    assert _updates(checking, now=T1) == [], "and the node is not written"
    assert first.condition is not None
    assert first.condition["reason"] == "InProgress"
    assert "nodewright node status b" in first.condition["message"]


def _waiting_view(message: str) -> assessing.NodeView:
    (view,), _ = status_helpers.assess(BASE, None, _observed(node("w")), T0)
    return dataclasses.replace(view, reason=Reason(code="WaitingForBatch", message=message))


def test_a_waiting_node_is_not_rewritten_when_other_nodes_move() -> None:
    """The kernel's message for a compartment's turn counts and names other nodes; the
    node's condition keeps its code only, so it stays as it is while the batch before it runs
    and is released."""
    first_view = _waiting_view("waiting for batch 1 of compartment __default__ to finish")
    observed = _observed(node("w"))
    (first,) = core.node_updates(CR, [first_view], observed, T0)
    assert first.condition is not None
    assert first.condition["message"].startswith("WaitingForBatch: ")
    assert "batch 1" not in first.condition["message"]
    later = _observed(_carrying(node("w"), first))
    for message in (
        "2 nodes of compartment __default__'s last batch are being released",
        "1 nodes of compartment __default__'s last batch are being released",
        "waiting for batch 2 of compartment __default__ to finish",
    ):
        assert core.node_updates(CR, [_waiting_view(message)], later, T1) == []
    budget = dataclasses.replace(
        first_view,
        reason=Reason(code="BudgetExhausted", message="1 of 1 budgeted nodes are busy: a"),
    )
    (changed,) = core.node_updates(CR, [budget], later, T1)
    assert changed.condition is not None
    assert changed.condition["message"].startswith("BudgetExhausted: ")
    assert "budgeted nodes" not in changed.condition["message"]


def test_a_waiting_node_being_admitted_keeps_its_wait_and_a_new_one_says_admitting() -> None:
    """Admitting is the kernel's plan for this pass (the scheduler's write makes the node
    InProgress within moments): a node whose condition reports a wait for its compartment's
    turn keeps it, one Node write fewer for about a quarter of the nodes (issue 15). A node
    with no condition yet, or one that waited for anything else, says Admitting."""
    admitting = dataclasses.replace(
        _waiting_view("x"),
        reason=Reason(code="Admitting", message="being admitted into batch 2"),
    )
    (first,) = core.node_updates(CR, [admitting], _observed(node("w")), T0)
    assert first.condition is not None
    assert first.condition["message"] == "Admitting: being admitted into batch 2"
    for code in ("WaitingForBatch", "BudgetExhausted"):
        turn = _waiting_view("waiting for batch 1 of compartment __default__ to finish")
        turn = dataclasses.replace(turn, reason=Reason(code=code, message="m"))
        (wait,) = core.node_updates(CR, [turn], _observed(node("w")), T0)
        waiting = _observed(_carrying(node("w"), wait))
        assert core.node_updates(CR, [admitting], waiting, T1) == [], code
    other = dataclasses.replace(
        _waiting_view("x"),
        reason=Reason(code="WaitingForWindow", message="outside the maintenance window"),
    )
    (window,) = core.node_updates(CR, [other], _observed(node("w")), T0)
    (now_admitting,) = core.node_updates(
        CR, [admitting], _observed(_carrying(node("w"), window)), T1
    )
    assert now_admitting.condition is not None
    assert now_admitting.condition["message"].startswith("Admitting: ")


def test_a_node_with_no_condition_yet_gets_none_while_its_admission_is_due() -> None:
    """Issue 15: the first batch's nodes said Admitting first, one more Node write each, and
    the write landed between the scheduler's fence and its admission (refused, taken again
    half a second later). Within ADMIT_GRACE_S the scheduler's write makes InProgress the
    first condition; past it (the scheduler is down) the node says Admitting."""
    admitting = dataclasses.replace(
        _waiting_view("x"),
        reason=Reason(code="Admitting", message="being admitted into batch 1"),
    )
    bare = _observed(node("w"))
    since = core.due_since([admitting], bare, {}, T0)
    assert since == {"w": T0}
    assert core.node_updates(CR, [admitting], bare, T0, since) == []
    assert core.admitting_report_due(since, T0) == core.ADMIT_GRACE_S
    soon = T0 + timedelta(seconds=core.ADMIT_GRACE_S - 1)
    assert core.due_since([admitting], bare, since, soon) == since, "first seen, carried over"
    assert core.node_updates(CR, [admitting], bare, soon, since) == []
    assert core.admitting_report_due(since, soon) == 1.0
    late = T0 + timedelta(seconds=core.ADMIT_GRACE_S)
    (update,) = core.node_updates(CR, [admitting], bare, late, since)
    assert update.condition is not None
    assert update.condition["message"] == "Admitting: being admitted into batch 1"
    assert core.admitting_report_due(since, late) == 0.0
    # Once it has a condition, or is due no more, the node is not remembered.
    reported = _observed(_carrying(node("w"), update))
    assert core.due_since([admitting], reported, since, late) == {}
    assert core.due_since([_waiting_view("m")], bare, since, late) == {}
    assert core.admitting_report_due({}, late) is None
    # Any other first condition is written at once.
    (wait,) = core.node_updates(CR, [_waiting_view("m")], bare, T0, since)
    assert wait.condition is not None


def test_the_admitting_grace_runs_from_the_last_admission_seen() -> None:
    """Issue 15: at 10,000 nodes a batch of 1,000 admissions took 10-17 s, and the nodes at
    its end each got an Admitting condition first (184 more Node writes). While admissions
    of the NodeWright land, the scheduler is visibly at work: the grace starts again. Once
    they stop, the waiting nodes speak ADMIT_GRACE_S after the last one."""

    def due(name: str) -> assessing.NodeView:
        return dataclasses.replace(
            _waiting_view("waiting"),
            name=name,
            reason=Reason(code="Admitting", message="being admitted into batch 1"),
        )

    admitted = dataclasses.replace(
        due("a"), phase="Pending", reason=Reason(code="Admitted", message="admitted")
    )
    bare = _observed(node("a"), node("b"), node("c"))
    since = core.due_since([due("a"), due("b"), due("c")], bare, {}, T0)
    assert since == {"a": T0, "b": T0, "c": T0}
    # Four seconds on, "a" has been admitted: "b" and "c" wait from now.
    t4 = T0 + timedelta(seconds=4)
    since = core.due_since([admitted, due("b"), due("c")], bare, since, t4)
    assert since == {"b": t4, "c": t4}
    t8 = T0 + timedelta(seconds=8)
    writes = core.node_updates(CR, [admitted, due("b"), due("c")], bare, t8, since)
    assert [u.node for u in writes] == ["a"], "the others are within the grace again"
    # No admission since: carried over, and past the grace they say Admitting.
    since = core.due_since([admitted, due("b"), due("c")], bare, since, t8)
    assert since == {"b": t4, "c": t4}
    late = t4 + timedelta(seconds=core.ADMIT_GRACE_S)
    writes = core.node_updates(CR, [admitted, due("b"), due("c")], bare, late, since)
    assert sorted(u.node for u in writes) == ["a", "b", "c"]
    # A node that got its condition from this service is no sign of the scheduler's work.
    said = _observed(node("a"), _carrying(node("b"), writes[1]), node("c"))
    assert core.due_since([admitted, due("b"), due("c")], said, since, late) == {"c": t4}


def test_an_earlier_versions_status_record_is_removed_by_compare_and_swap() -> None:
    """The record once written per step goes: a JSON patch that tests the annotation is
    still the value the pass saw, then removes it; the condition is written as usual."""
    legacy = _complete("a")
    raw = '{"phase":"Running","since":"2026-01-01T00:00:00Z"}'
    legacy["metadata"]["annotations"][nodestate.key(nodestate.STATUS, CR)] = raw
    (update,) = _updates(legacy)
    assert (update.remove_record, update.write_condition) == (raw, True)
    path = "/metadata/annotations/status.nodewright.nvidia.com~1gpu-node-tuning"
    assert core.record_removal(CR, update) == [
        {"op": "test", "path": path, "value": raw},
        {"op": "remove", "path": path},
    ]
    assert _updates(_carrying(legacy, update), now=T2) == []


def test_a_failure_that_recurs_in_the_same_words_is_written_again() -> None:
    """The condition's time is the memory of what was reported: a retry that failed again
    (a record time after it) rewrites it, so its Event is raised once and then not again."""
    (first,) = _updates(_failed("b"), now=T1)
    reported_once = _carrying(_failed("b"), first)
    assert _updates(reported_once, now=T2) == []
    again = _failed("b")
    again["status"] = reported_once["status"]
    record = nodestate.read(again, nodestate.EXECUTOR, CR, ExecutorRecord)
    assert record is not None
    pkg = record.packages["nvidia-tuned"]
    later = msgspec.structs.replace(pkg, updated=T2)
    again["metadata"]["annotations"][nodestate.key(nodestate.EXECUTOR, CR)] = (
        msgspec.json.encode(msgspec.structs.replace(record, packages={"nvidia-tuned": later}))
    ).decode()
    (rewrite,) = _updates(again, now=T2)
    assert rewrite.write_condition
    assert _updates(_carrying(again, rewrite), now=T2) == []


def test_since_carries_over_while_phase_and_reason_stay() -> None:
    (first,) = _updates(node("w"), now=T0)
    waiting = _carrying(node("w"), first)
    view = status_helpers.assess(BASE, None, _observed(waiting), T1)[0][0]
    assert (view.reason.code, view.since) == ("Admitting", T0)
    paused_views, _ = status_helpers.assess(
        nodewright(annotations=PAUSED), None, _observed(waiting), T1
    )
    paused = paused_views[0]
    assert (paused.reason.code, paused.since) == ("Paused", T1)


def test_conditions_go_from_nodes_that_are_no_longer_targets() -> None:
    (update,) = _updates(_complete("a"))
    moved = _carrying(_complete("a", labels={"nodepool": "cpu"}), update)
    (removal,) = _updates(moved)
    assert (removal.condition, removal.write_condition, removal.remove_record) == (
        None,
        True,
        None,
    )
    gone = _carrying(moved, removal)
    assert _updates(gone) == []
    # When the CR is gone every node is cleaned the same way.
    observed = _observed(_carrying(_complete("b"), _updates(_complete("b"))[0]))
    (cleanup,) = core.node_updates(CR, [], observed, T0)
    assert (cleanup.write_condition, cleanup.condition) == (True, None)


# ---- merge patch --------------------------------------------------------------------------------


def _apply(doc: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(doc)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping):
            before = out.get(key)
            out[key] = _apply(before if isinstance(before, Mapping) else {}, value)
        else:
            out[key] = value
    return out


def test_merge_patch_removes_fields_that_went_back_to_their_default() -> None:
    old = {"nodeCounts": {"target": 3, "failed": 1}, "nodeDetailsOmitted": 5, "state": "Failed"}
    new = {"nodeCounts": {"target": 3}, "state": "Complete"}
    assert core.merge_patch(old, new) == {
        "nodeCounts": {"failed": None},
        "nodeDetailsOmitted": None,
        "state": "Complete",
    }
    assert core.merge_patch(new, new) == {}


_json = st.recursive(
    st.integers() | st.text(max_size=3) | st.booleans() | st.lists(st.integers(), max_size=2),
    lambda inner: st.dictionaries(st.sampled_from("abcd"), inner, max_size=3),
    max_leaves=12,
)


@given(
    st.dictionaries(st.sampled_from("abcde"), _json, max_size=4),
    st.dictionaries(st.sampled_from("abcde"), _json, max_size=4),
)
def test_applying_the_merge_patch_to_the_old_document_gives_the_new_one(
    old: dict[str, Any], new: dict[str, Any]
) -> None:
    assert _apply(old, core.merge_patch(old, new)) == new


def test_a_node_is_read_again_only_when_its_resource_version_changed() -> None:
    reads: list[str] = []

    def facts_of(seen: Mapping[str, Any], cr: str) -> progress.NodeFacts:
        reads.append(seen["metadata"]["resourceVersion"])
        return progress.facts(seen, cr)

    cache = assessing.ObservedCache(facts_of)
    obj: dict[str, Any] = {"metadata": {"name": "n1", "resourceVersion": "5"}}
    first = cache(obj, "cr")
    assert cache(dict(obj), "cr") is first, "same version: the same reading"
    assert cache(obj, "other") is not first, "per NodeWright"
    changed = cache({"metadata": {"name": "n1", "resourceVersion": "6"}}, "cr")
    assert changed is not first
    cache.forget("n1")
    cache(obj, "cr")
    assert reads == ["5", "5", "6", "5"]


def test_a_pass_writes_failures_first_and_leaves_only_waiting_nodes_to_the_next() -> None:
    """What a pass writes now, in order, and what waits for the next pass
    (``waiting_writes_per_pass``): failures are visible at once, and only waiting nodes wait,
    so a status saying every node is complete never goes out before their conditions."""

    def update(name: str, reason: str | None) -> core.NodeUpdate:
        condition = None if reason is None else {"reason": reason}
        return core.NodeUpdate(node=name, condition=condition, write_condition=True)

    updates = [
        update("a-waiting", "Waiting"),
        update("b-complete", "Complete"),
        update("c-blocked", "Blocked"),
        update("d-gone", None),  # a condition removed: no longer a target
        update("e-waiting", "Waiting"),
        update("f-failed", "Failed"),
        update("g-in-progress", "InProgress"),
        update("h-waiting", "Waiting"),
        *(update(f"i-complete-{i}", "Complete") for i in range(3)),
    ]
    now, later = core.this_pass(updates, waiting_limit=1)
    assert [u.node for u in now] == [
        "c-blocked",
        "f-failed",
        "b-complete",
        "d-gone",
        "g-in-progress",
        "i-complete-0",
        "i-complete-1",
        "i-complete-2",
        "a-waiting",
    ]
    assert [u.node for u in later] == ["e-waiting", "h-waiting"]
    assert core.this_pass(updates, waiting_limit=3)[1] == []


@pytest.mark.parametrize(
    ("targets", "most", "expected"),
    [
        (1, 40, 10),
        (1_000, 40, 10),
        (2_500, 40, 10),
        (5_000, 40, 20),
        (10_000, 40, 40),
        (50_000, 40, 40),
        (1_000, 4, 4),
    ],
)
def test_a_pass_writes_conditions_at_once_in_proportion_to_the_fleet(
    targets: int, most: int, expected: int
) -> None:
    assert core.write_concurrency(targets, most) == expected
