"""The NodeWright gauges: every series a status pass exports, from the same node views and
status the pass computes (``assessing.assess`` then ``core.summarize``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import msgspec

from services.status import assessing, core, metrics
from shared import api, nodestate, progress
from shared.records.drainer import DrainRecord
from shared.records.executor import ExecutorRecord, PackageRecord
from shared.records.scheduler import Selection
from shared.records.validator import ValidatorRecord
from shared.rollout import approvals, book as rollout_book
from tests.helpers import status as status_helpers
from tests.helpers.facts import T0, node, nodewright

CR = "gpu-node-tuning"
DRAINED = DrainRecord(phase="drained", cordoned=True, started=T0, since=T0)

POLICY = api.from_dict(
    {
        "metadata": {"name": "careful"},
        "spec": {
            "default": {
                "budget": {"count": 2},
                "strategy": {"linear": {"initialBatch": 1, "delta": 1}},
            },
            "compartments": [
                {
                    "name": "canary",
                    "selector": {"matchLabels": {"canary": "true"}},
                    "budget": {"percent": 50},
                    "strategy": {"fixed": {"batchSize": 1}},
                }
            ],
        },
    },
    api.DeploymentPolicy,
)


def _pkg(cr: api.NodeWright, state: str, **kw: Any) -> PackageRecord:
    fields: dict[str, Any] = {"version": "0.9.0", "stage": "config", "state": state, "updated": T0}
    if state == "succeeded":
        fields.update(installed="0.9.0", config=progress.desired(cr)["nvidia-tuned"].config_digest)
    fields.update(kw)
    return msgspec.convert(fields, PackageRecord)


def _complete(cr: api.NodeWright, name: str, **kw: Any) -> dict[str, Any]:
    records = {
        nodestate.EXECUTOR: ExecutorRecord(packages={"nvidia-tuned": _pkg(cr, "succeeded")}),
        nodestate.VALIDATOR: ValidatorRecord(validated=progress.target_digest(cr), at=T0),
    }
    return node(name, records=records, **kw)


def _working(
    cr: api.NodeWright, name: str, compartment: str, record: PackageRecord, **kw: Any
) -> dict[str, Any]:
    """A node admitted into ``compartment``, drained, with ``record`` for nvidia-tuned."""
    selection = Selection(
        generation=1,
        compartment=compartment,
        batch=1,
        selected_at=T0,
        disruptive=True,
        target=progress.target_digest(cr),
    )
    records = {
        nodestate.SCHEDULER: selection,
        nodestate.DRAINER: DRAINED,
        nodestate.EXECUTOR: ExecutorRecord(packages={"nvidia-tuned": record}),
    }
    return node(name, records=records, **kw)


def _pass(
    cr: api.NodeWright, policy: api.DeploymentPolicy | None, *nodes: Mapping[str, Any]
) -> list[metrics.Sample]:
    """The samples of one status pass over ``nodes``."""
    views, plan = status_helpers.assess(cr, policy, [assessing.observe(n, CR) for n in nodes], T0)
    return metrics.samples(cr, policy, core.summarize(cr, policy, views, T0, plan), views)


def _text(samples: Sequence[metrics.Sample]) -> list[str]:
    """Samples as ``name{label=value,...} value``, labels in the gauge's order."""
    return [
        f"{s.metric}{{{','.join(f'{k}={v}' for k, v in s.labels.items())}}} {s.value}"
        for s in samples
    ]


def _of(samples: Sequence[metrics.Sample], family: metrics.Family) -> list[str]:
    return _text([s for s in samples if s.metric == family.name])


def test_a_rollout_under_a_policy_with_two_compartments_exports_every_series() -> None:
    cr = nodewright(deploymentPolicy="careful")
    samples = _pass(
        cr,
        POLICY,
        _complete(cr, "a", labels={"canary": "true"}),
        _working(
            cr,
            "b",
            "canary",
            _pkg(cr, "running", stage="apply", attempt=2),
            labels={"canary": "true"},
        ),
        _working(cr, "c", "__default__", _pkg(cr, "failed", stage="apply", attempt=3)),
        node("d"),
    )
    nw = f"nodewright={CR}"
    pkg = f"{nw},package=nvidia-tuned,version=0.9.0"
    default = f"{nw},policy=careful,compartment=__default__,strategy=linear"
    canary = f"{nw},policy=careful,compartment=canary,strategy=fixed"
    assert _text(samples) == [
        f"nodewright_status{{{nw},status=Unknown}} 0",
        f"nodewright_status{{{nw},status=Waiting}} 0",
        f"nodewright_status{{{nw},status=InProgress}} 1",
        f"nodewright_status{{{nw},status=Complete}} 0",
        f"nodewright_status{{{nw},status=Failed}} 0",
        f"nodewright_status{{{nw},status=Blocked}} 0",
        f"nodewright_status{{{nw},status=Stopped}} 0",
        f"nodewright_status{{{nw},status=Paused}} 0",
        f"nodewright_status{{{nw},status=Disabled}} 0",
        f"nodewright_nodes{{{nw},status=Waiting}} 1",
        f"nodewright_nodes{{{nw},status=InProgress}} 1",
        f"nodewright_nodes{{{nw},status=Complete}} 1",
        f"nodewright_nodes{{{nw},status=Failed}} 1",
        f"nodewright_nodes{{{nw},status=Blocked}} 0",
        f"nodewright_target_nodes{{{nw}}} 4",
        f"nodewright_package_nodes{{{pkg},state=complete}} 1",
        f"nodewright_package_nodes{{{pkg},state=in_progress}} 1",
        f"nodewright_package_nodes{{{pkg},state=failed}} 1",
        f"nodewright_package_nodes{{{pkg},state=uninstalling}} 0",
        f"nodewright_package_stage_nodes{{{pkg},stage=apply}} 2",
        f"nodewright_package_stage_nodes{{{pkg},stage=upgrade}} 0",
        f"nodewright_package_stage_nodes{{{pkg},stage=config}} 1",
        f"nodewright_package_stage_nodes{{{pkg},stage=interrupt}} 0",
        f"nodewright_package_stage_nodes{{{pkg},stage=post-interrupt}} 0",
        f"nodewright_package_stage_nodes{{{pkg},stage=uninstall}} 0",
        # b is at its 2nd attempt of apply, c at its 3rd: 1 + 2 retries.
        f"nodewright_package_restarts{{{pkg}}} 3",
        f"nodewright_rollout_matched_nodes{{{default}}} 2",
        f"nodewright_rollout_matched_nodes{{{canary}}} 2",
        f"nodewright_rollout_budget_nodes{{{default}}} 2",
        f"nodewright_rollout_budget_nodes{{{canary}}} 1",
        f"nodewright_rollout_in_progress{{{default}}} 0",
        f"nodewright_rollout_in_progress{{{canary}}} 1",
        f"nodewright_rollout_completed{{{default}}} 0",
        f"nodewright_rollout_completed{{{canary}}} 1",
        f"nodewright_rollout_failed{{{default}}} 1",
        f"nodewright_rollout_failed{{{canary}}} 0",
        f"nodewright_rollout_progress_percent{{{default}}} 0",
        f"nodewright_rollout_progress_percent{{{canary}}} 50",
        f"nodewright_rollout_current_batch{{{default}}} 1",
        f"nodewright_rollout_current_batch{{{canary}}} 1",
        f"nodewright_rollout_consecutive_failed_batches{{{default}}} 0",
        f"nodewright_rollout_consecutive_failed_batches{{{canary}}} 0",
        f"nodewright_rollout_stopped{{{default}}} 0",
        f"nodewright_rollout_stopped{{{canary}}} 0",
        f"nodewright_rollout_awaiting_approval{{{default}}} 0",
        f"nodewright_rollout_awaiting_approval{{{canary}}} 0",
    ]


def test_a_stopped_compartment_without_a_policy_shows_its_gate_and_batch() -> None:
    stopped = api.BatchState(
        current_batch=3,
        consecutive_failed_batches=2,
        stopped=True,
        stop_reason="FailedBatchesLimit",
    )
    book = rollout_book.BatchBook(
        compartments={"__default__": rollout_book.CompartmentBatch(state=stopped)}
    )
    cr = nodewright(
        interruptionBudget={"count": 1},
        annotations={rollout_book.BATCHES_ANNOTATION: rollout_book.encode_batch_book(book)},
    )
    failed = _pkg(cr, "failed", stage="post-interrupt")
    samples = _pass(cr, None, _working(cr, "a", "__default__", failed), node("b"))

    nw = f"nodewright={CR}"
    assert [line for line in _of(samples, metrics.STATUS) if line.endswith(" 1")] == [
        f"nodewright_status{{{nw},status=Stopped}} 1"
    ]
    rollout = _text([s for s in samples if s.metric.startswith("nodewright_rollout_")])
    labels = f"{nw},policy=none,compartment=__default__,strategy=none"
    assert rollout == [
        f"nodewright_rollout_matched_nodes{{{labels}}} 2",
        f"nodewright_rollout_budget_nodes{{{labels}}} 1",
        f"nodewright_rollout_in_progress{{{labels}}} 0",
        f"nodewright_rollout_completed{{{labels}}} 0",
        f"nodewright_rollout_failed{{{labels}}} 1",
        f"nodewright_rollout_progress_percent{{{labels}}} 0",
        f"nodewright_rollout_current_batch{{{labels}}} 3",
        f"nodewright_rollout_consecutive_failed_batches{{{labels}}} 2",
        f"nodewright_rollout_stopped{{{labels}}} 1",
        f"nodewright_rollout_awaiting_approval{{{labels}}} 0",
    ]
    pkg = f"{nw},package=nvidia-tuned,version=0.9.0"
    assert [line for line in _of(samples, metrics.PACKAGE_STAGE_NODES) if line.endswith(" 1")] == [
        f"nodewright_package_stage_nodes{{{pkg},stage=post-interrupt}} 1"
    ]


def test_a_compartment_waiting_for_approval_says_so_until_it_is_approved() -> None:
    finished = T0 + timedelta(minutes=1)
    between = rollout_book.CompartmentBatch(
        state=api.BatchState(current_batch=2, total_succeeded_nodes=1), finished=finished
    )
    book = rollout_book.BatchBook(compartments={"__default__": between})
    notes = {rollout_book.BATCHES_ANNOTATION: rollout_book.encode_batch_book(book)}
    policy = api.from_dict(
        {
            "metadata": {"name": "careful"},
            "spec": {"default": {"budget": {"count": 1}, "approvalAfterBatches": [1]}},
        },
        api.DeploymentPolicy,
    )
    cr = nodewright(deploymentPolicy="careful", annotations=notes)
    labels = f"nodewright={CR},policy=careful,compartment=__default__,strategy=none"
    gauge = f"nodewright_rollout_awaiting_approval{{{labels}}}"
    waiting = _pass(cr, policy, _complete(cr, "a"), node("b"))
    assert _of(waiting, metrics.ROLLOUT_AWAITING_APPROVAL) == [f"{gauge} 1"]
    approval = approvals.encode({"__default__": approvals.Approval(batch=1, finished=finished)})
    approved = nodewright(
        deploymentPolicy="careful",
        annotations={**notes, approvals.APPROVALS_ANNOTATION: approval},
    )
    going = _pass(approved, policy, _complete(approved, "a"), node("b"))
    assert _of(going, metrics.ROLLOUT_AWAITING_APPROVAL) == [f"{gauge} 0"]


def test_the_status_series_switch_from_in_progress_to_complete() -> None:
    cr = nodewright()
    before = _pass(
        cr, None, _complete(cr, "a"), _working(cr, "b", "__default__", _pkg(cr, "running"))
    )
    after = _pass(cr, None, _complete(cr, "a"), _complete(cr, "b"))

    nw = f"nodewright={CR}"
    changed = sorted(set(_text(before)) ^ set(_text(after)))
    assert [line for line in changed if line.startswith("nodewright_status{")] == [
        f"nodewright_status{{{nw},status=Complete}} 0",
        f"nodewright_status{{{nw},status=Complete}} 1",
        f"nodewright_status{{{nw},status=InProgress}} 0",
        f"nodewright_status{{{nw},status=InProgress}} 1",
    ]
    assert [line for line in _of(after, metrics.STATUS) if line.endswith(" 1")] == [
        f"nodewright_status{{{nw},status=Complete}} 1"
    ]
    assert _of(after, metrics.NODES) == [
        f"nodewright_nodes{{{nw},status=Waiting}} 0",
        f"nodewright_nodes{{{nw},status=InProgress}} 0",
        f"nodewright_nodes{{{nw},status=Complete}} 2",
        f"nodewright_nodes{{{nw},status=Failed}} 0",
        f"nodewright_nodes{{{nw},status=Blocked}} 0",
    ]
    # The same series exist before and after: only values changed.
    assert [(s.metric, s.labels) for s in before] == [(s.metric, s.labels) for s in after]


def test_a_package_version_no_node_carries_and_the_spec_dropped_has_no_series() -> None:
    old = nodewright(
        packages={
            "nvidia-tuned": {"version": "0.9.0", "image": "ghcr.io/x/nvidia-tuned"},
            "extra": {"version": "1.0.0", "image": "ghcr.io/x/extra"},
        }
    )
    new = nodewright(packages={"nvidia-tuned": {"version": "1.0.0", "image": "ghcr.io/x/t"}})
    packaged = {
        (s.labels["package"], s.labels["version"])
        for s in _pass(old, None, node("a"))
        if "package" in s.labels
    }
    assert packaged == {("extra", "1.0.0"), ("nvidia-tuned", "0.9.0")}
    packaged = {
        (s.labels["package"], s.labels["version"])
        for s in _pass(new, None, node("a"))
        if "package" in s.labels
    }
    assert packaged == {("nvidia-tuned", "1.0.0")}


def test_samples_are_deterministic_unique_and_labelled_as_their_gauge_says() -> None:
    cr = nodewright(deploymentPolicy="careful")
    nodes = (
        _complete(cr, "a", labels={"canary": "true"}),
        _working(cr, "c", "__default__", _pkg(cr, "failed", stage="apply")),
        node("d"),
    )
    first = _pass(cr, POLICY, *nodes)
    assert _pass(cr, POLICY, *reversed(nodes)) == first
    families = {f.name: f for f in metrics.FAMILIES}
    assert [f.name for f in metrics.FAMILIES] == sorted(
        families, key=[s.metric for s in first].index
    )
    for s in first:
        assert tuple(s.labels) == families[s.metric].labels
    series = [(s.metric, tuple(s.labels.values())) for s in first]
    assert len(series) == len(set(series))
