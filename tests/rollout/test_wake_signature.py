"""``shared.rollout.fleet.wake_signature``: the node changes the scheduler is not woken for
change no plan. A node is walked through a whole rollout the way the services write it
(admission, cordon, drain, each stage and check, the installed version, the validation,
the release of the cordon, the status service's condition and outbox drains in between)
next to nodes waiting for the batch; wherever two successive node objects have equal
signatures, the kernel's decisions on the two fleets must be equal too."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any

import msgspec
import pytest

from shared import nodestate, progress
from shared.records.drainer import DrainRecord
from shared.records.executor import ExecutorRecord, PackageRecord
from shared.records.validator import CheckRecord, ValidatorRecord
from shared.rollout import fleet
from shared.rollout.book import BatchBook
from tests.helpers.facts import T0, node, nodewright, selection

CR = "gpu-node-tuning"
PKG, VERSION = "nvidia-tuned", "0.9.0"


def _steps(cr: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """(what changed, the node object after it) for node n0 through one rollout."""
    target = progress.target_digest(cr)
    sel = selection(target, order=0)
    records: dict[str, msgspec.Struct] = {}
    unschedulable = False
    conditions: list[dict[str, Any]] = []
    extra: dict[str, str] = {}
    version = 10

    def now() -> dict[str, Any]:
        nonlocal version
        version += 1
        obj = node("n0", records=records, unschedulable=unschedulable, conditions=conditions)
        obj["metadata"]["resourceVersion"] = str(version)
        obj["metadata"]["annotations"].update(extra)
        return obj

    def condition(state: str) -> None:
        conditions[:] = [
            {"type": f"nodewright.nvidia.com/{CR}", "status": "False", "reason": state}
        ]

    condition("Waiting")
    yield "status: waiting", now()
    records[nodestate.SCHEDULER] = sel
    yield "admitted", now()
    extra[f"outbox.{nodestate.SCHEDULER}/{CR}"] = "[]"
    yield "outbox drained", now()
    condition("InProgress")
    yield "status: in progress", now()
    records[nodestate.DRAINER] = DrainRecord(phase="cordoned", cordoned=True, started=T0, since=T0)
    unschedulable = True
    yield "cordoned", now()
    records[nodestate.DRAINER] = DrainRecord(phase="drained", cordoned=True, started=T0, since=T0)
    yield "drained", now()
    at = T0
    checks: dict[str, CheckRecord] = {}
    rec = PackageRecord(
        version=VERSION,
        stage="apply",
        state="running",
        cycle="install",
        updated=at,
        cycle_started=at,
    )
    for stage in ("apply", "config"):
        at += timedelta(seconds=1)
        rec = msgspec.structs.replace(rec, stage=stage, state="running", updated=at)
        records[nodestate.EXECUTOR] = ExecutorRecord(packages={PKG: rec})
        yield f"{stage} running", now()
        rec = msgspec.structs.replace(rec, state="succeeded", updated=at)
        records[nodestate.EXECUTOR] = ExecutorRecord(packages={PKG: rec})
        yield f"{stage} succeeded", now()
        key = nodestate.check_key(PKG, VERSION, stage)
        checks = {key: CheckRecord(verdict="running", at=at)}
        records[nodestate.VALIDATOR] = ValidatorRecord(checks=checks)
        yield f"{stage} check running", now()
        checks = {key: CheckRecord(verdict="passed", at=at)}
        records[nodestate.VALIDATOR] = ValidatorRecord(checks=checks)
        yield f"{stage} check passed", now()
        extra[f"outbox.{nodestate.VALIDATOR}/{CR}"] = "[]"
        yield f"{stage} outbox drained", now()
    done = progress.desired(cr)[PKG]
    rec = msgspec.structs.replace(rec, installed=VERSION, config=done.config_digest)
    records[nodestate.EXECUTOR] = ExecutorRecord(packages={PKG: rec}, boot_id="boot-1")
    yield "installed", now()
    records[nodestate.VALIDATOR] = ValidatorRecord(checks=checks, validated=target, at=at)
    yield "validated", now()
    del records[nodestate.DRAINER]
    unschedulable = False
    yield "uncordoned", now()
    condition("Complete")
    yield "status: complete", now()
    del records[nodestate.SCHEDULER]
    yield "released", now()


def _plan(cr: Any, nodes: list[Mapping[str, Any]], book: BatchBook) -> Any:
    plan = fleet.decide(fleet.Fleet(crs=[cr], policies={}, nodes=nodes), cr, T0, book=book)
    return (plan.admit, plan.release, plan.book, plan.behind)


@pytest.mark.parametrize("budget", [1, 2])
def test_a_change_with_an_equal_signature_changes_no_plan(budget: int) -> None:
    cr = nodewright(interruptionBudget={"count": budget})
    waiting = [node(f"n{i}") for i in (1, 2, 3)]
    book = BatchBook()
    quiet: list[str] = []
    steps = list(_steps(cr))
    for (_, before), (what, after) in itertools.pairwise(steps):
        same = fleet.wake_signature([cr], before, progress.facts) == fleet.wake_signature(
            [cr], after, progress.facts
        )
        if not same:
            continue
        quiet.append(what)
        assert _plan(cr, [before, *waiting], book) == _plan(cr, [after, *waiting], book), what
    # The test proves something only if the signature lets changes through unwoken: the
    # steps between the drain and the installed version, and the writes of nobody's state.
    assert {
        "outbox drained",
        "status: in progress",
        "apply succeeded",
        "apply check running",
        "apply check passed",
        "config running",
        "config check running",
        "status: complete",
    } <= set(quiet), quiet


def test_the_changes_that_move_a_rollout_wake_the_scheduler() -> None:
    cr = nodewright()
    steps = dict(_steps(cr))
    order = list(steps)
    woken = {
        what
        for prev, what in itertools.pairwise(order)
        if fleet.wake_signature([cr], steps[prev], progress.facts)
        != fleet.wake_signature([cr], steps[what], progress.facts)
    }
    assert {"admitted", "cordoned", "drained", "installed", "validated", "uncordoned"} <= woken
    assert "released" in woken
    # A waiting node wakes it on any change: a batch book's fence entry holds while the
    # node it names has not changed.
    a, b = node("n1"), node("n1")
    b["metadata"]["resourceVersion"] = "2"
    assert fleet.wake_signature([cr], a) != fleet.wake_signature([cr], b)


def test_what_the_kernel_derives_from_a_node_is_computed_once_per_node_and_nodewright() -> None:
    """``progress.turn`` and its kin are memoised on the (immutable) facts for the last
    :func:`progress.derivation_key` asked about: the same answer, computed once, for every
    NodeWright object that wants the same; no NodeWright object is kept alive."""
    cr = nodewright()
    facts = progress.facts(node("n1"), CR)
    assert progress.turn(cr, facts) == "scheduler"
    assert progress.turn(cr, facts) == "scheduler"
    assert facts.derived["turn"] == (progress.derivation_key(cr), "scheduler")
    assert all(not isinstance(k, type(cr)) for k, _ in facts.derived.values())
    assert progress.facts(node("n1"), CR).derived == {}, "fresh facts, nothing computed yet"


def _done_node(cr: Any, **package: Any) -> progress.NodeFacts:
    rec = PackageRecord(
        version=VERSION,
        stage="config",
        state="succeeded",
        installed=VERSION,
        config=progress.desired(cr)[PKG].config_digest,
        spec=progress.desired(cr)[PKG].spec_digest,
        updated=T0,
        **package,
    )
    raw = node("n1")
    raw["metadata"]["annotations"] = {
        nodestate.key(nodestate.EXECUTOR, CR): msgspec.json.encode(
            ExecutorRecord(packages={PKG: rec})
        ).decode(),
        nodestate.key(nodestate.VALIDATOR, CR): msgspec.json.encode(
            ValidatorRecord(validated=progress.target_digest(cr))
        ).decode(),
    }
    return progress.facts(raw, CR)


def test_the_memo_follows_what_the_nodewright_wants_not_its_object() -> None:
    """A status or batch book change (a new object, the same spec) keeps every answer;
    a change of anything the answers read gives new ones, on the same facts."""
    cr = nodewright()
    facts = _done_node(cr)
    assert progress.turn(cr, facts) == "done"
    status_only = msgspec.structs.replace(
        cr,
        metadata=msgspec.structs.replace(
            cr.metadata, resource_version="99", annotations={"nodewright.nvidia.com/x": "1"}
        ),
    )
    assert progress.derivation_key(status_only) == progress.derivation_key(cr)
    assert progress.turn(status_only, facts) == "done"

    def package(**changes: Any) -> Any:
        pkg = msgspec.structs.replace(cr.spec.packages[PKG], **changes)
        return msgspec.structs.replace(
            cr, spec=msgspec.structs.replace(cr.spec, packages={PKG: pkg})
        )

    # A new version, new configuration, a new image: the node has work again.
    for changed in (
        package(version="1.0.0"),
        package(config_map={"k": "v"}),
        package(image="registry.example/other"),
    ):
        assert progress.derivation_key(changed) != progress.derivation_key(cr)
        assert progress.turn(changed, facts) != "done"
        assert progress.turn(cr, facts) == "done", "and back"
    # Being deleted, with no uninstall-enabled package: nothing left to do on the node.
    gone = msgspec.structs.replace(
        cr, metadata=msgspec.structs.replace(cr.metadata, deletion_timestamp=T0)
    )
    assert progress.derivation_key(gone) != progress.derivation_key(cr)
    assert progress.node_done(gone, facts)


def test_a_failure_for_another_spec_of_the_package_stops_counting_on_the_same_facts() -> None:
    """``failed`` reads each package's spec digest (what the target digest leaves out): a
    corrected spec of the same version must be seen through the memo."""
    cr = nodewright()
    facts = _done_node(cr)
    failing = progress.facts(
        {
            **node("n1"),
            "metadata": {
                **node("n1")["metadata"],
                "annotations": {
                    nodestate.key(nodestate.EXECUTOR, CR): msgspec.json.encode(
                        ExecutorRecord(
                            packages={
                                PKG: PackageRecord(
                                    version=VERSION,
                                    stage="apply",
                                    state="failed",
                                    spec=progress.desired(cr)[PKG].spec_digest,
                                    updated=T0,
                                )
                            }
                        )
                    ).decode()
                },
            },
        },
        CR,
    )
    assert progress.failed(cr, failing)
    pkg = msgspec.structs.replace(cr.spec.packages[PKG], graceful_shutdown_seconds=60)
    fixed = msgspec.structs.replace(cr, spec=msgspec.structs.replace(cr.spec, packages={PKG: pkg}))
    assert progress.target_digest(fixed) == progress.target_digest(cr), "same target"
    assert not progress.failed(fixed, failing), "the failure was about the old spec"
    assert progress.failed(cr, failing)
    assert progress.turn(cr, facts) == "done"
