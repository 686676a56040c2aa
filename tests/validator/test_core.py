"""The validator core judges each finished stage's check (run in the stage's own pod),
records verdicts with reasons, validates the node, and lifts the readiness taint only when
allowed."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import msgspec
import pytest

from services.validator import core
from shared import nodestate, progress
from shared.decisions import Keep
from shared.pods import PodView
from shared.podspec import PodRequest
from shared.records.drainer import DrainRecord
from shared.records.executor import ExecutorRecord, InterruptRecord, PackageRecord
from shared.records.scheduler import Selection
from shared.records.validator import CheckRecord, ValidatorRecord
from tests.helpers.facts import T0, node, nodewright, written

CR = "gpu-node-tuning"
SEL = Selection(
    generation=1, compartment="default", batch=1, selected_at=T0, disruptive=True, target="t"
)
DRAINED = DrainRecord(phase="drained", cordoned=True, started=T0, since=T0)


def _facts(
    executor: ExecutorRecord, validator: ValidatorRecord | None = None, **kw: Any
) -> progress.NodeFacts:
    records: dict[str, Any] = {
        nodestate.SCHEDULER: SEL,
        nodestate.DRAINER: DRAINED,
        nodestate.EXECUTOR: executor,
    }
    if validator is not None:
        records[nodestate.VALIDATOR] = validator
    return progress.facts(node("n1", records=records, **kw), CR)


def _req(
    stage: str = "apply", *, attempt: int = 1, version: str = "0.9.0", cycle: str = ""
) -> PodRequest:
    """The stage pod the executor made for ``stage`` (its check is the view :func:`_pod`)."""
    return PodRequest(
        role="stage",
        package="nvidia-tuned",
        stage=stage,
        version=version,
        attempt=attempt,
        cycle=cycle,
        name=f"gpu-node-tuning-nvidia-tuned-{stage}-{attempt}",
    )


def _pod(req: PodRequest, phase: str, **kw: Any) -> PodView:
    return PodView(
        name=req.name,
        cr=CR,
        node="n1",
        role="check",
        package=req.package,
        stage=req.stage,
        version=req.version,
        attempt=req.attempt,
        cycle=req.cycle,
        phase=phase,
        deleting=False,
        created=T0,
        **kw,
    )


APPLIED = ExecutorRecord(
    packages={
        "nvidia-tuned": PackageRecord(version="0.9.0", stage="apply", state="succeeded", updated=T0)
    }
)
KEY = nodestate.check_key("nvidia-tuned", "0.9.0", "apply")


def test_the_check_in_a_succeeded_stages_pod_is_judged_and_a_pass_published() -> None:
    """Issue 15: the check runs in the stage's pod; the validator starts nothing and writes
    nothing until the check ended."""
    cr = nodewright()
    req = _req()
    for pods in ([_pod(req, "Running")], [_pod(req, "Pending")]):
        again = core.decide(cr=cr, node=_facts(APPLIED), check_pods=pods, now=T0)
        assert (again.record, again.publish) == (Keep(), ())
    d2 = core.decide(cr=cr, node=_facts(APPLIED), check_pods=[_pod(req, "Succeeded")], now=T0)
    assert written(d2.record, ValidatorRecord).checks[KEY].verdict == "passed"
    assert [e.kind for e in d2.publish] == ["stage.validated"]
    # A pod of another attempt says nothing about this one.
    other = _pod(_req(attempt=2), "Succeeded")
    d3 = core.decide(cr=cr, node=_facts(APPLIED), check_pods=[other], now=T0)
    assert isinstance(d3.record, Keep)


RUNNING = ExecutorRecord(
    packages={
        "nvidia-tuned": PackageRecord(
            version="0.9.0",
            stage="config",
            state="running",
            updated=T0,
            cycle="install",
            cycle_config=progress.desired(nodewright())["nvidia-tuned"].config_digest,
            cycle_started=T0,
        )
    }
)
"""The executor's record while the config stage's pod runs: its end is not written (issue
15), the check's verdict records it."""


def test_the_check_of_a_stage_the_record_says_runs_is_judged_from_its_pod() -> None:
    """The executor writes no stage's end: once the pod's check started (the stage exited
    0), the check is the validator's, and its verdict, naming the run's cycle, says the stage
    succeeded; the last stage's pass validates the node in the same write."""
    cr = nodewright()
    req = _req("config", cycle=T0.isoformat())
    key = nodestate.check_key("nvidia-tuned", "0.9.0", "config")
    for pods in ([], [_pod(req, "Pending")], [_pod(req, "Running")]):
        waiting = core.decide(cr=cr, node=_facts(RUNNING), check_pods=pods, now=T0)
        assert (waiting.record, waiting.publish) == (Keep(), ()), pods
    # A record from before cycles were recorded is judged once the executor wrote its end.
    legacy = ExecutorRecord(
        packages={
            "nvidia-tuned": msgspec.structs.replace(
                RUNNING.packages["nvidia-tuned"], cycle_started=None
            )
        }
    )
    old = core.decide(
        cr=cr, node=_facts(legacy), check_pods=[_pod(_req("config"), "Succeeded")], now=T0
    )
    assert isinstance(old.record, Keep)
    done = core.decide(cr=cr, node=_facts(RUNNING), check_pods=[_pod(req, "Succeeded")], now=T0)
    record = written(done.record, ValidatorRecord)
    verdict = record.checks[key]
    assert (verdict.verdict, verdict.attempt, verdict.cycle) == ("passed", 1, T0.isoformat())
    assert record.validated == progress.target_digest(cr)
    assert [e.kind for e in done.publish] == ["stage.validated", "node.validated"]
    failing = core.decide(cr=cr, node=_facts(RUNNING), check_pods=[_pod(req, "Failed")], now=T0)
    assert written(failing.record, ValidatorRecord).checks[key].cycle == T0.isoformat()
    # A verdict naming no cycle (an earlier version's) on a stage recorded as running is
    # about another run: dropped, and this run's check judged.
    old_verdict = ValidatorRecord(checks={key: CheckRecord(verdict="failed", at=T0)})
    rejudged = core.decide(
        cr=cr, node=_facts(RUNNING, old_verdict), check_pods=[_pod(req, "Succeeded")], now=T0
    )
    assert written(rejudged.record, ValidatorRecord).checks[key].verdict == "passed"


def test_a_stage_pod_gone_before_its_check_ended_fails_the_check_after_a_grace() -> None:
    """The pod watch may deliver the pod after the node watch delivered the executor's
    record; a pod still missing past the grace was deleted before its check ended."""
    cr = nodewright()
    soon = core.decide(cr=cr, node=_facts(APPLIED), check_pods=[], now=T0)
    assert isinstance(soon.record, Keep)
    assert soon.requeue_after == pytest.approx(core.POD_GONE_GRACE_S)
    late = T0 + timedelta(seconds=core.POD_GONE_GRACE_S)
    gone = core.decide(cr=cr, node=_facts(APPLIED), check_pods=[], now=late)
    verdict = written(gone.record, ValidatorRecord).checks[KEY]
    assert verdict.verdict == "failed"
    assert verdict.reason is not None
    assert verdict.reason.code == "CheckFailed"
    assert "nodewright node retry" in verdict.reason.message
    assert [e.kind for e in gone.publish] == ["stage.validation-failed"]


def test_a_failing_check_records_the_output_tail() -> None:
    cr = nodewright()
    req = _req()
    failed = _pod(req, "Failed", exit_code=2, message="sysctl vm.swappiness is 60, want 10")
    d2 = core.decide(cr=cr, node=_facts(APPLIED), check_pods=[failed], now=T0)
    verdict = written(d2.record, ValidatorRecord).checks[KEY]
    assert verdict.verdict == "failed"
    assert verdict.reason is not None
    assert verdict.reason.code == "CheckFailed"
    assert "want 10" in verdict.reason.message
    assert [e.kind for e in d2.publish] == ["stage.validation-failed"]
    assert progress.turn(cr, _facts(APPLIED, written(d2.record, ValidatorRecord))) == "failed"


def test_a_check_running_past_the_stage_timeout_fails() -> None:
    """The timeout counts from the check's start: the end of the stage before it in the pod
    (``shared.pods.parts`` dates the check view so; nothing else records the start)."""
    cr = nodewright(stageTimeoutSeconds=30)
    req = _req()
    late = dataclasses.replace(_pod(req, "Running"), created=T0 + timedelta(seconds=10))
    young = core.decide(
        cr=cr, node=_facts(APPLIED), check_pods=[late], now=T0 + timedelta(seconds=31)
    )
    assert isinstance(young.record, Keep)
    assert young.requeue_after == pytest.approx(9.0), "looked at again when it would time out"
    d2 = core.decide(cr=cr, node=_facts(APPLIED), check_pods=[late], now=T0 + timedelta(seconds=40))
    reason = written(d2.record, ValidatorRecord).checks[KEY].reason
    assert reason is not None
    assert reason.code == "CheckTimeout"
    # A "running" verdict an earlier version wrote still dates the start.
    legacy = ValidatorRecord(checks={KEY: CheckRecord(verdict="running", at=T0)})
    d3 = core.decide(
        cr=cr, node=_facts(APPLIED, legacy), check_pods=[late], now=T0 + timedelta(seconds=31)
    )
    assert written(d3.record, ValidatorRecord).checks[KEY].verdict == "failed"


def _done(cr_kwargs: dict[str, Any] | None = None) -> tuple[Any, ExecutorRecord]:
    cr = nodewright(**(cr_kwargs or {}))
    d = progress.desired(cr)["nvidia-tuned"]
    rec = ExecutorRecord(
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
    return cr, rec


def test_a_node_with_every_package_done_is_validated_once_ready() -> None:
    cr, rec = _done()
    checks = ValidatorRecord(
        checks={
            nodestate.check_key("nvidia-tuned", "0.9.0", "config"): CheckRecord(
                verdict="passed", at=T0
            )
        }
    )
    not_ready = core.decide(cr=cr, node=_facts(rec, checks, ready=False), check_pods=[], now=T0)
    waiting = written(not_ready.record, ValidatorRecord)
    assert waiting.validated == ""
    assert waiting.reason is not None
    assert waiting.reason.code == "NodeNotReady"
    ready = core.decide(cr=cr, node=_facts(rec, checks), check_pods=[], now=T0)
    assert written(ready.record, ValidatorRecord).validated == progress.target_digest(cr)
    assert [e.kind for e in ready.publish] == ["node.validated"]


def test_the_verdict_that_ends_the_last_cycle_validates_the_node_in_the_same_write() -> None:
    """Issue 15: the config check passing ends the package's cycle (the executor writes no
    step for it, ``progress.finished_cycles``), so the validator records the verdict and the
    node's validation in one Node write instead of two."""
    cr = nodewright()
    d = progress.desired(cr)["nvidia-tuned"]
    configured = ExecutorRecord(
        packages={
            "nvidia-tuned": PackageRecord(
                version="0.9.0",
                stage="config",
                state="succeeded",
                cycle_config=d.config_digest,
                updated=T0,
            )
        }
    )
    key = nodestate.check_key("nvidia-tuned", "0.9.0", "config")
    running = ValidatorRecord(checks={key: CheckRecord(verdict="running", at=T0)})
    facts = _facts(configured, running)
    assert progress.turn(cr, facts) == "executor", "the config stage's check is still running"
    req = _req("config")
    decision = core.decide(cr=cr, node=facts, check_pods=[_pod(req, "Succeeded")], now=T0)
    record = written(decision.record, ValidatorRecord)
    assert record.checks[key].verdict == "passed"
    assert record.validated == progress.target_digest(cr)
    assert [e.kind for e in decision.publish] == ["stage.validated", "node.validated"]
    assert progress.node_done(cr, _facts(configured, record))
    # Not when the node is not Ready: the verdict is written, the validation waits.
    unready = core.decide(
        cr=cr,
        node=_facts(configured, running, ready=False),
        check_pods=[_pod(req, "Succeeded")],
        now=T0,
    )
    assert written(unready.record, ValidatorRecord).validated == ""


def test_the_verdict_that_ended_a_cycle_stays_while_the_record_relies_on_it() -> None:
    """The executor's record keeps saying "config succeeded" after the check that ended its
    cycle (progress.finished_cycles): when the NodeWright moves on to a new version, a write
    of the validator for another package must keep that verdict, or the installed version the
    upgrade starts from would be forgotten."""
    pkg = {"version": "1.0.0", "image": "r/a"}
    before = nodewright(packages={"a": pkg, "b": {"version": "1.0.0", "image": "r/b"}})
    d = progress.desired(before)["a"]
    ended = PackageRecord(
        version="1.0.0", stage="config", state="succeeded", cycle_config=d.config_digest, updated=T0
    )
    b_applied = PackageRecord(version="1.0.0", stage="apply", state="succeeded", updated=T0)
    executor = ExecutorRecord(packages={"a": ended, "b": b_applied})
    a_key = nodestate.check_key("a", "1.0.0", "config")
    b_key = nodestate.check_key("b", "1.0.0", "apply")
    checks = ValidatorRecord(
        checks={
            a_key: CheckRecord(verdict="passed", at=T0),
            b_key: CheckRecord(verdict="running", at=T0),
        }
    )
    after = nodewright(
        packages={"a": {**pkg, "version": "2.0.0"}, "b": {"version": "1.0.0", "image": "r/b"}}
    )
    facts = _facts(executor, checks)
    assert facts.executor.packages["a"].installed == "1.0.0"
    b_req = PodRequest(
        role="check", package="b", stage="apply", version="1.0.0", attempt=1, name="b-check"
    )
    b_pod = _pod(b_req, "Succeeded")
    decision = core.decide(cr=after, node=facts, check_pods=[b_pod], now=T0)
    record = written(decision.record, ValidatorRecord)
    assert record.checks[b_key].verdict == "passed"
    assert a_key in record.checks
    assert _facts(executor, record).executor.packages["a"].installed == "1.0.0"


def test_with_reapply_on_reboot_validation_waits_for_the_recorded_boot() -> None:
    """reapplyOnReboot compares the node's boot ID with the one the executor recorded when the
    packages completed: validating before that write would leave a window in which a reboot
    goes unseen, so the validation waits for it (one write more, only with reapplyOnReboot)."""
    cr, rec = _done({"reapplyOnReboot": True})
    checks = ValidatorRecord(
        checks={
            nodestate.check_key("nvidia-tuned", "0.9.0", "config"): CheckRecord(
                verdict="passed", at=T0
            )
        }
    )
    before = core.decide(cr=cr, node=_facts(rec, checks, boot_id="b2"), check_pods=[], now=T0)
    assert isinstance(before.record, Keep)
    booted = msgspec.structs.replace(rec, boot_id="b2")
    after = core.decide(cr=cr, node=_facts(booted, checks, boot_id="b2"), check_pods=[], now=T0)
    assert written(after.record, ValidatorRecord).validated == progress.target_digest(cr)


def test_a_node_is_not_validated_while_its_interrupt_runs() -> None:
    cr, rec = _done()
    rec = ExecutorRecord(
        packages=rec.packages,
        interrupt=InterruptRecord(type="reboot", state="running", boot_id_before="b1", started=T0),
    )
    checks = ValidatorRecord(
        checks={
            nodestate.check_key("nvidia-tuned", "0.9.0", "config"): CheckRecord(
                verdict="passed", at=T0
            )
        }
    )
    facts = _facts(rec, checks)
    assert progress.turn(cr, facts) == "validator", "the premise: only the validation is left"
    d = core.decide(cr=cr, node=facts, check_pods=[], now=T0)
    assert isinstance(d.record, Keep), "not validated, nothing recorded"
    assert d.publish == ()
    assert d.requeue_after == 5.0, "looked at again while the interrupt runs"
    # Once the reboot is over (new boot ID, interrupt recorded done) it is validated.
    after = ExecutorRecord(packages=rec.packages)
    done = core.decide(cr=cr, node=_facts(after, checks), check_pods=[], now=T0)
    assert written(done.record, ValidatorRecord).validated == progress.target_digest(cr)


def test_the_readiness_taint_goes_only_for_runtime_required_when_all_are_done() -> None:
    cr, rec = _done({"runtimeRequired": True})
    validated = ValidatorRecord(validated=progress.target_digest(cr))
    facts = _facts(rec, validated)
    assert core.decide(
        cr=cr,
        node=facts,
        check_pods=[],
        now=T0,
        runtime_required_done=True,
        has_readiness_taint=True,
    ).remove_readiness_taint
    assert not core.decide(
        cr=cr,
        node=facts,
        check_pods=[],
        now=T0,
        runtime_required_done=False,
        has_readiness_taint=True,
    ).remove_readiness_taint
    plain, rec2 = _done()
    assert not core.decide(
        cr=plain,
        node=_facts(rec2),
        check_pods=[],
        now=T0,
        runtime_required_done=True,
        has_readiness_taint=True,
    ).remove_readiness_taint


def test_verdicts_for_versions_no_longer_wanted_are_dropped() -> None:
    cr, rec = _done()
    stale = ValidatorRecord(
        checks={"nvidia-tuned/0.8.0/apply": CheckRecord(verdict="failed", at=T0)}
    )
    d = core.decide(cr=cr, node=_facts(rec, stale), check_pods=[], now=T0)
    assert "nvidia-tuned/0.8.0/apply" not in written(d.record, ValidatorRecord).checks


def test_verdicts_no_longer_wanted_cost_no_write_of_their_own() -> None:
    """They go with the next write: the check of a finished stage is dropped when the next
    stage's check starts, not in a write between the two (issue 15)."""
    cr, rec = _done()
    validated = core.decide(cr=cr, node=_facts(rec, ValidatorRecord()), check_pods=[], now=T0)
    done = written(validated.record, ValidatorRecord)
    kept = msgspec.structs.replace(
        done,
        checks={**done.checks, "nvidia-tuned/0.8.0/apply": CheckRecord(verdict="passed", at=T0)},
    )
    d = core.decide(cr=cr, node=_facts(rec, kept), check_pods=[], now=T0)
    assert isinstance(d.record, Keep)
