"""Deleting a NodeWright: its finalizer uninstalls the uninstall-enabled packages through the
ordinary rollout; once it is gone each service removes its own records (pure cores, no
I/O)."""

from __future__ import annotations

from typing import Any

import msgspec

from services.drainer import core as drainer_core
from services.executor import core as executor_core
from services.scheduler import core
from services.status import core as status_core
from services.validator import core as validator_core
from shared import api, nodestate, progress
from shared.decisions import Keep, Remove
from shared.records.drainer import DrainRecord
from shared.records.executor import ExecutorRecord, PackageRecord
from shared.records.scheduler import Selection
from shared.records.validator import ValidatorRecord
from shared.rollout import kernel
from shared.rollout.book import BatchBook
from tests.helpers.facts import T0, node, nodewright

CR = "gpu-node-tuning"
PACKAGES: dict[str, dict[str, Any]] = {
    "tuning": {
        "version": "1.0.0",
        "image": "registry.example/tuning",
        "interrupt": {"type": "reboot"},
        "uninstall": {"enabled": True},
    },
    "driver": {"version": "2.0.0", "image": "registry.example/driver"},
}


def _cr(
    *, deleting: bool = True, finalizers: tuple[str, ...] = (core.FINALIZER,), **kw: Any
) -> api.NodeWright:
    cr = nodewright(packages=PACKAGES, **kw)
    meta = msgspec.structs.replace(
        cr.metadata,
        deletion_timestamp=T0 if deleting else None,
        finalizers=list(finalizers),
    )
    return msgspec.structs.replace(cr, metadata=meta)


def _installed(*names: str) -> ExecutorRecord:
    versions = {"tuning": "1.0.0", "driver": "2.0.0"}
    return ExecutorRecord(
        packages={
            n: PackageRecord(
                version=versions[n],
                stage="config",
                state="succeeded",
                installed=versions[n],
                config="c",
                cycle="install",
                updated=T0,
            )
            for n in names
        }
    )


def _selection() -> Selection:
    return Selection(
        generation=1,
        compartment="__default__",
        batch=1,
        selected_at=T0,
        disruptive=True,
        target="x",
    )


def _facts(*nodes: dict[str, Any]) -> list[progress.NodeFacts]:
    return [progress.facts(n, CR) for n in nodes]


def test_a_deletion_wants_only_the_uninstall_enabled_packages_and_wants_them_gone() -> None:
    live, gone = progress.desired(_cr(deleting=False)), progress.desired(_cr())
    assert set(live) == {"tuning", "driver"}
    assert not live["tuning"].uninstall_requested
    assert set(gone) == {"tuning"}, "a package without uninstall steps is left as it is"
    assert gone["tuning"].uninstall_requested
    assert progress.target_digest(_cr()) != progress.target_digest(_cr(deleting=False))


def test_during_a_deletion_only_nodes_with_the_package_installed_have_work() -> None:
    cr = _cr()
    with_it, without, other_only = _facts(
        node("a", records={nodestate.EXECUTOR: _installed("tuning", "driver")}),
        node("b"),
        node("c", records={nodestate.EXECUTOR: _installed("driver")}),
    )
    assert progress.turn(cr, with_it) == "scheduler"
    assert progress.turn(cr, without) == "done", "never admitted, never cordoned"
    assert progress.turn(cr, other_only) == "done"
    plan = kernel.plan(
        cr=cr,
        policy=None,
        nodes=[with_it, without, other_only],
        book=BatchBook(),
        ctx=kernel.Context(now=T0),
    )
    assert [a.node for a in plan.admit] == ["a"]
    assert plan.admit[0].selection.disruptive, "the package's reboot needs a drained node"


def test_the_finalizer_is_added_to_a_live_nodewright_and_kept_until_nothing_is_pending() -> None:
    assert core.finalizer(_cr(deleting=False, finalizers=()), []).action == "add"
    assert core.finalizer(_cr(deleting=False), []).action == "none"
    assert core.finalizer(_cr(finalizers=()), []).action == "none", "not ours to remove"
    pending = _facts(
        node("installed", records={nodestate.EXECUTOR: _installed("tuning")}),
        node("admitted", records={nodestate.SCHEDULER: _selection()}),
        node(
            "cordoned",
            records={
                nodestate.DRAINER: DrainRecord(phase="drained", started=T0, since=T0, cordoned=True)
            },
        ),
        node("clean"),
        node("kept", records={nodestate.EXECUTOR: _installed("driver")}),
        node(
            "ignored",
            labels={nodestate.IGNORE_LABEL: "true"},
            records={nodestate.EXECUTOR: _installed("tuning")},
        ),
        node(
            "left-the-selector",
            labels={"nodepool": "cpu"},
            records={nodestate.EXECUTOR: _installed("tuning")},
        ),
    )
    decision = core.finalizer(_cr(), pending)
    assert decision == core.Finalizer("wait", ("admitted", "cordoned", "installed"))
    assert core.finalizer(_cr(), pending[3:]).action == "remove"


def test_once_the_nodewright_is_gone_each_owner_removes_only_its_own_record() -> None:
    """Nothing removes another service's record any more (the scheduler's cleanup patch did):
    the executor keeps a record that still tracks installed packages (a NodeWright of the
    same name created later does not install them again) and drops the rest, an undecodable
    one too; the validator drops its record; the requests annotation is the CLI's."""
    kept = progress.facts(node("kept", records={nodestate.EXECUTOR: _installed("driver")}), CR)
    assert isinstance(executor_core.forget(kept, CR).record, Keep)
    emptied = progress.facts(node("emptied", records={nodestate.EXECUTOR: ExecutorRecord()}), CR)
    # An empty record is no record: nothing to remove, nothing kept.
    assert isinstance(executor_core.forget(emptied, CR).record, Keep)
    uninstalled = progress.facts(
        node("done", records={nodestate.EXECUTOR: ExecutorRecord(honoured=3)}), CR
    )
    assert isinstance(executor_core.forget(uninstalled, CR).record, Remove)
    garbage = node("garbage")
    garbage["metadata"]["annotations"][nodestate.key(nodestate.EXECUTOR, CR)] = "{not json"
    assert isinstance(executor_core.forget(progress.facts(garbage, CR), CR).record, Remove)
    verdicts = progress.facts(
        node("v", records={nodestate.VALIDATOR: ValidatorRecord(validated="x")}), CR
    )
    assert isinstance(validator_core.forget(verdicts, CR).record, Remove)
    assert isinstance(validator_core.forget(progress.facts(node("clean"), CR), CR).record, Keep)


def test_the_drainer_keeps_a_deleting_nodewrights_cordon_until_its_uninstall_finished() -> None:
    drained = DrainRecord(phase="drained", started=T0, since=T0, cordoned=True)
    busy, finished = _facts(
        node(
            "busy",
            records={
                nodestate.SCHEDULER: _selection(),
                nodestate.DRAINER: drained,
                nodestate.EXECUTOR: _installed("tuning"),
            },
        ),
        node(
            "finished",
            records={nodestate.SCHEDULER: _selection(), nodestate.DRAINER: drained},
        ),
    )
    assert not drainer_core.must_release(_cr(), busy)
    assert drainer_core.must_release(_cr(), finished)
    assert drainer_core.must_release(None, busy), "the CR is gone: release at once"


def _conditions(cr: api.NodeWright, *nodes: dict[str, Any]) -> dict[str, api.Condition]:
    status = status_core.compute_status(cr, None, _facts(*nodes), T0)
    return {c.type: c for c in status.conditions}


def test_status_says_why_a_deletion_cannot_finish() -> None:
    installed = node("a", records={nodestate.EXECUTOR: _installed("tuning")})
    running = _conditions(_cr(), installed)
    assert running[api.ConditionType.UNINSTALL_IN_PROGRESS].reason == "Deleting"
    assert api.ConditionType.DELETION_BLOCKED not in running

    paused = _conditions(_cr(annotations={api.PAUSE_ANNOTATION: "true"}), installed)
    blocked = paused[api.ConditionType.DELETION_BLOCKED]
    assert blocked.reason == "PausedWithPendingUninstall"
    assert api.PAUSE_ANNOTATION in blocked.message

    disabled = _conditions(_cr(annotations={api.DISABLE_ANNOTATION: "true"}), installed)
    assert disabled[api.ConditionType.DELETION_BLOCKED].reason == "DisabledWithPendingUninstall"

    failing = _installed("tuning")
    failing = msgspec.structs.replace(
        failing,
        packages={
            "tuning": msgspec.structs.replace(
                failing.packages["tuning"], stage="uninstall", state="failed", cycle="uninstall"
            )
        },
    )
    failed = _conditions(_cr(), node("a", records={nodestate.EXECUTOR: failing}))
    assert failed[api.ConditionType.DELETION_BLOCKED].reason == "UninstallFailed"
    assert "a" in failed[api.ConditionType.DELETION_BLOCKED].message

    done = _conditions(_cr(), node("a"))
    assert api.ConditionType.UNINSTALL_IN_PROGRESS not in done
    assert done[api.ConditionType.READY].status == "True"
