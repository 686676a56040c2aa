"""Explicit uninstall in the executor core: the uninstall cycle (uninstall, its check, the
package's interrupt), the package marked absent afterwards, cancellation before the
interrupt, and the drain decision an uninstall implies."""

from __future__ import annotations

from typing import Any

from services.executor import core
from shared import nodestate, progress
from shared.decisions import Keep
from shared.pods import PodView
from shared.podspec import PodRequest
from shared.records.drainer import DrainRecord
from shared.records.executor import ExecutorRecord, PackageRecord
from shared.records.scheduler import Selection
from shared.records.validator import CheckRecord, ValidatorRecord
from tests.helpers.facts import T0, node, nodewright, written

CR = "gpu-node-tuning"
SEL = Selection(
    generation=1, compartment="default", batch=1, selected_at=T0, disruptive=True, target="t"
)
DRAINED = DrainRecord(phase="drained", cordoned=True, started=T0, since=T0)


def _pkg(requested: bool, **extra: Any) -> dict[str, Any]:
    return {
        "version": "1.0.0",
        "image": "r/k",
        "uninstall": {"enabled": True, "requested": requested},
        **extra,
    }


def _installed(stage: str = "config") -> PackageRecord:
    return PackageRecord(
        version="1.0.0", stage=stage, state="succeeded", installed="1.0.0", updated=T0
    )


def _facts(
    executor: ExecutorRecord, checks: dict[str, tuple[str, int]] | None = None
) -> progress.NodeFacts:
    records: dict[str, Any] = {
        nodestate.SCHEDULER: SEL,
        nodestate.DRAINER: DRAINED,
        nodestate.EXECUTOR: executor,
    }
    if checks:
        records[nodestate.VALIDATOR] = ValidatorRecord(
            checks={
                k: CheckRecord(verdict=v, at=T0, attempt=a, cycle=_cycle_of(executor, k))  # type: ignore[arg-type]
                for k, (v, a) in checks.items()
            }
        )
    return progress.facts(node("n1", records=records), CR)


def _cycle_of(executor: ExecutorRecord, key: str) -> str:
    """The cycle of the run a verdict under ``key`` is about (the record's, at that stage)."""
    name, version, stage = key.split("/", 2)
    r = executor.packages.get(name)
    if r is None or (r.version, r.stage) != (version, stage):
        return ""
    return progress.cycle_of(r)


def _pod(req: PodRequest, phase: str) -> PodView:
    """The stage part of a stage pod (its check runs after it in the same pod)."""
    return PodView(
        checked=req.role == "stage",
        ended=T0 if phase == "Succeeded" else None,
        name=req.name,
        cr=CR,
        node="n1",
        role=req.role,
        package=req.package,
        stage=req.stage,
        version=req.version,
        attempt=req.attempt,
        cycle=req.cycle,
        phase=phase,
        deleting=False,
        created=T0,
    )


def _rec(d: core.Decision) -> ExecutorRecord:
    return written(d.record, ExecutorRecord)


def test_an_uninstall_without_interrupt_runs_uninstall_then_its_check_then_drops_the_record() -> (
    None
):
    cr = nodewright(packages={"k": _pkg(True)})
    d1 = core.decide(
        cr=cr, node=_facts(ExecutorRecord(packages={"k": _installed()})), node_pods=[], now=T0
    )
    (req,) = d1.create
    assert (req.role, req.stage, req.version) == ("stage", "uninstall", "1.0.0")
    rec = _rec(d1).packages["k"]
    assert (rec.cycle, rec.stage, rec.state, rec.installed) == (
        "uninstall",
        "uninstall",
        "running",
        "1.0.0",
    )
    d2 = core.decide(cr=cr, node=_facts(_rec(d1)), node_pods=[_pod(req, "Succeeded")], now=T0)
    assert isinstance(d2.record, Keep), "its check runs in the pod: the verdict records it"
    # Not absent before the validator passed the uninstall-check.
    assert not progress.package_done(
        progress.desired(cr)["k"], _facts(_rec(d1)).executor.packages["k"]
    )
    passed = {nodestate.check_key("k", "1.0.0", "uninstall"): ("passed", 1)}
    d3 = core.decide(
        cr=cr, node=_facts(_rec(d1), passed), node_pods=[_pod(req, "Succeeded")], now=T0
    )
    assert "k" not in _rec(d3).packages
    assert d3.create == ()
    assert progress.package_done(progress.desired(cr)["k"], None)


def test_an_uninstall_with_an_interrupt_runs_it_and_skips_post_interrupt() -> None:
    cr = nodewright(packages={"k": _pkg(True, interrupt={"type": "reboot"})})
    d1 = core.decide(
        cr=cr, node=_facts(ExecutorRecord(packages={"k": _installed()})), node_pods=[], now=T0
    )
    (req,) = d1.create
    passed = {nodestate.check_key("k", "1.0.0", "uninstall"): ("passed", 1)}
    # Checked: the interrupt starts in the same pass (the boot ID recorded for the reboot),
    # and the uninstall pod goes.
    d4 = core.decide(
        cr=cr, node=_facts(_rec(d1), passed), node_pods=[_pod(req, "Succeeded")], now=T0
    )
    assert d4.delete == (req.name,)
    (intr,) = d4.create
    assert intr.role == "interrupt"
    assert intr.interrupt is not None
    assert intr.interrupt.type == "reboot"
    started = _rec(d4).interrupt
    assert started is not None
    assert started.boot_id_before == "boot-1"
    assert _rec(d4).packages["k"].stage == "interrupt"
    # The pod exited but the boot ID is unchanged: still uninstalling.
    same = core.decide(cr=cr, node=_facts(_rec(d4)), node_pods=[_pod(intr, "Succeeded")], now=T0)
    assert isinstance(same.record, Keep)
    # The boot ID changed: the uninstall is done; no post-interrupt stage.
    rebooted = progress.facts(
        node(
            "n1",
            boot_id="boot-2",
            records={
                nodestate.SCHEDULER: SEL,
                nodestate.DRAINER: DRAINED,
                nodestate.EXECUTOR: _rec(d4),
            },
        ),
        CR,
    )
    d5 = core.decide(cr=cr, node=rebooted, node_pods=[], now=T0)
    assert d5.create == ()
    assert "k" not in _rec(d5).packages
    finished = _rec(d5).interrupt
    assert finished is not None
    assert finished.state == "succeeded"


def test_cancelling_before_the_interrupt_reinstalls_from_apply() -> None:
    requested = nodewright(packages={"k": _pkg(True, interrupt={"type": "reboot"})})
    d1 = core.decide(
        cr=requested,
        node=_facts(ExecutorRecord(packages={"k": _installed()})),
        node_pods=[],
        now=T0,
    )
    (req,) = d1.create
    cancelled = nodewright(packages={"k": _pkg(False, interrupt={"type": "reboot"})})
    # The uninstall pod is still running: it finishes first.
    running = core.decide(
        cr=cancelled, node=_facts(_rec(d1)), node_pods=[_pod(req, "Running")], now=T0
    )
    assert running.create == ()
    assert isinstance(running.record, Keep)
    # The stage ended; its check runs in the pod: that finishes first too.
    checking = core.decide(
        cr=cancelled, node=_facts(_rec(d1)), node_pods=[_pod(req, "Succeeded")], now=T0
    )
    assert checking.create == ()
    assert isinstance(checking.record, Keep)
    checked = _facts(_rec(d1), {nodestate.check_key("k", "1.0.0", "uninstall"): ("passed", 1)})
    # Its uninstall stage ran: the package is not "installed and done", whatever the spec.
    assert not progress.package_done(
        progress.desired(cancelled)["k"], checked.executor.packages["k"]
    )
    # Then the package is installed again, from apply, with its interrupt.
    again = core.decide(cr=cancelled, node=checked, node_pods=[], now=T0)
    (apply,) = again.create
    assert (apply.stage, apply.version) == ("apply", "1.0.0")
    rec = _rec(again).packages["k"]
    assert (rec.cycle, rec.interrupt) == ("install", "reboot")
    assert not progress.package_done(progress.desired(cancelled)["k"], rec)


def test_cancelling_after_the_interrupt_started_lets_the_uninstall_finish() -> None:
    rec = PackageRecord(
        version="1.0.0",
        stage="interrupt",
        state="running",
        installed="1.0.0",
        previous="1.0.0",
        cycle="uninstall",
        interrupt="reboot",
        updated=T0,
    )
    cancelled = nodewright(packages={"k": _pkg(False, interrupt={"type": "reboot"})})
    d = core.decide(
        cr=cancelled, node=_facts(ExecutorRecord(packages={"k": rec})), node_pods=[], now=T0
    )
    assert [r.role for r in d.create] == ["interrupt"]
    assert _rec(d).packages["k"].cycle == "uninstall"


def test_a_dependency_is_uninstalled_only_after_its_dependents() -> None:
    cr = nodewright(
        packages={
            "base": _pkg(True),
            "app": _pkg(True, dependsOn={"base": "1.0.0"}),
        }
    )
    recs = ExecutorRecord(packages={"base": _installed(), "app": _installed()})
    d = core.decide(cr=cr, node=_facts(recs), node_pods=[], now=T0)
    assert [(r.package, r.stage) for r in d.create] == [("app", "uninstall")]
    gone = core.decide(
        cr=cr, node=_facts(ExecutorRecord(packages={"base": _installed()})), node_pods=[], now=T0
    )
    assert [(r.package, r.stage) for r in gone.create] == [("base", "uninstall")]


def test_a_node_without_the_package_has_nothing_to_uninstall() -> None:
    cr = nodewright(packages={"k": _pkg(True)})
    d = core.decide(cr=cr, node=_facts(ExecutorRecord()), node_pods=[], now=T0)
    assert d.create == ()
    assert isinstance(d.record, Keep)


def test_an_uninstall_drains_only_when_it_runs_an_interrupt() -> None:
    rec = ExecutorRecord(packages={"k": _installed()})
    facts = _facts(rec)
    quiet = nodewright(
        packages={
            "k": _pkg(True, configInterrupts={"a*": {"type": "reboot"}}, configMap={"a": "1"})
        },
        drain={"onlyForInterrupts": True},
    )
    loud = nodewright(
        packages={"k": _pkg(True, interrupt={"type": "reboot"})},
        drain={"onlyForInterrupts": True},
    )
    assert not progress.disruptive(quiet, facts)
    assert progress.disruptive(loud, facts)
