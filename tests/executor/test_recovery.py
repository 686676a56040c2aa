"""Recovery requests as the executor honours them: retry, reset and rerun turn into new
attempts (new pod names), forgotten records or restarted cycles, and the request numbers
are recorded so each request is honoured once."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from services.executor import core
from shared import nodestate, progress
from shared.decisions import Keep
from shared.events import Reason
from shared.nodestate import Request, Requests
from shared.pods import PodView
from shared.podspec import PodRequest
from shared.records.drainer import DrainRecord
from shared.records.executor import ExecutorRecord, InterruptRecord, PackageRecord
from shared.records.scheduler import Selection
from shared.records.validator import CheckRecord, ValidatorRecord
from tests.helpers.facts import T0, node, nodewright, written

CR = "gpu-node-tuning"
PKG = "nvidia-tuned"
NOW = T0 + timedelta(minutes=10)
SEL = Selection(
    generation=1, compartment="default", batch=1, selected_at=T0, disruptive=True, target="t"
)
BOOM = Reason(code="StageFailed", message="pod exited with code 3")


def _drained(honoured: int = 0) -> DrainRecord:
    return DrainRecord(phase="drained", cordoned=True, started=T0, since=T0, honoured=honoured)


def _facts(
    executor: ExecutorRecord | None = None,
    validator: ValidatorRecord | None = None,
    *,
    drain: DrainRecord | None = None,
    selected: bool = True,
) -> progress.NodeFacts:
    records: dict[str, Any] = {nodestate.DRAINER: drain or _drained(99)}
    if selected:
        records[nodestate.SCHEDULER] = SEL
    if executor is not None:
        records[nodestate.EXECUTOR] = executor
    if validator is not None:
        records[nodestate.VALIDATOR] = validator
    return progress.facts(node("n1", records=records), CR)


def _requests(*actions: tuple[str, str, str]) -> Requests:
    out: Requests | None = None
    for action, package, stage in actions:
        out = nodestate.add_request(
            out,
            Request(seq=0, action=action, package=package, stage=stage, at=T0),  # type: ignore[arg-type]
        )
    assert out is not None
    return out


def _pkg(**kw: Any) -> PackageRecord:
    fields: dict[str, Any] = {
        "version": "0.9.0",
        "stage": "apply",
        "state": "failed",
        "reason": BOOM,
        "updated": T0,
        **kw,
    }
    return PackageRecord(**fields)


SPEC = progress.desired(nodewright())[PKG].spec_digest
"""The package spec a retried attempt records it runs with."""


def _view(req: PodRequest, phase: str) -> PodView:
    return PodView(
        name=req.name,
        cr=CR,
        node="n1",
        role=req.role,
        package=req.package,
        stage=req.stage,
        version=req.version,
        attempt=req.attempt,
        phase=phase,
        deleting=False,
        created=T0,
        cycle=req.cycle,
    )


def _rec(d: core.Decision) -> ExecutorRecord:
    return written(d.record, ExecutorRecord)


def test_requests_are_numbered_in_order_and_only_the_last_ones_are_kept() -> None:
    reqs = _requests(*[("retry", "", "")] * (nodestate.MAX_REQUESTS + 2))
    assert [r.seq for r in reqs.requests] == list(range(3, nodestate.MAX_REQUESTS + 3))
    assert reqs.latest == nodestate.MAX_REQUESTS + 2
    assert [r.seq for r in reqs.after(reqs.latest - 2)] == [reqs.latest - 1, reqs.latest]
    assert reqs.after(reqs.latest) == ()
    assert Requests().latest == 0


def test_an_undecodable_requests_annotation_reads_as_none() -> None:
    obj = node("n1")
    obj["metadata"]["annotations"][nodestate.key(nodestate.REQUESTS, CR)] = "{not json"
    assert nodestate.read_requests(obj, CR) == Requests()


@pytest.mark.parametrize(
    ("before", "checks", "after"),
    [
        pytest.param(
            _pkg(),
            {},
            _pkg(state="running", attempt=2, reason=None, updated=NOW, spec=SPEC),
            id="failed-stage-runs-again",
        ),
        pytest.param(
            _pkg(stage="config", state="succeeded", reason=None, attempt=2),
            {"config": CheckRecord(verdict="failed", at=T0, reason=BOOM, attempt=2)},
            _pkg(stage="config", state="running", reason=None, attempt=3, updated=NOW, spec=SPEC),
            id="stage-whose-check-failed-runs-again",
        ),
        pytest.param(
            _pkg(stage="config", state="succeeded", reason=None),
            {"config": CheckRecord(verdict="passed", at=T0)},
            _pkg(stage="config", state="succeeded", reason=None),
            id="passed-stays",
        ),
        pytest.param(
            _pkg(stage="config", state="running", reason=None),
            {},
            _pkg(stage="config", state="running", reason=None),
            id="running-stays",
        ),
        pytest.param(
            _pkg(version="0.8.0"),
            {},
            _pkg(version="0.8.0"),
            id="failure-of-an-unwanted-version-stays",
        ),
    ],
)
def test_retry_turns_what_failed_into_a_new_attempt(
    before: PackageRecord, checks: dict[str, CheckRecord], after: PackageRecord
) -> None:
    validator = ValidatorRecord(
        checks={nodestate.check_key(PKG, before.version, s): v for s, v in checks.items()}
    )
    got = core.honour(
        ExecutorRecord(packages={PKG: before}, honoured=2),
        _requests(("retry", "", ""), ("retry", "", ""), ("retry", "", "")),
        desired=progress.desired(nodewright()),
        checks=validator.checks,
        now=NOW,
    )
    # Requests 1 and 2 were honoured before: only request 3 acts (attempt + 1, not + 2).
    assert got == ExecutorRecord(packages={PKG: after}, honoured=3)


def test_a_retried_stage_runs_under_a_new_pod_name_and_the_failed_pod_goes() -> None:
    cr = nodewright()
    first = core.decide(cr=cr, node=_facts(), node_pods=[], now=T0)
    (req1,) = first.create
    failed = core.decide(cr=cr, node=_facts(_rec(first)), node_pods=[_view(req1, "Failed")], now=T0)
    assert _rec(failed).packages[PKG].state == "failed"
    assert progress.turn(cr, _facts(_rec(failed))) == "failed"
    reqs = _requests(("retry", "", ""))
    pods = [_view(req1, "Failed")]

    honoured = core.decide(
        cr=cr,
        node=_facts(_rec(failed), drain=_drained(1)),
        node_pods=pods,
        now=NOW,
        requests=reqs,
    )
    assert (honoured.create, honoured.delete, honoured.requeue_after) == ((), (), 0.0)
    rec = _rec(honoured)
    assert rec.honoured == 1
    assert (rec.packages[PKG].state, rec.packages[PKG].attempt) == ("running", 2)

    again = core.decide(
        cr=cr, node=_facts(rec, drain=_drained(1)), node_pods=pods, now=NOW, requests=reqs
    )
    (req2,) = again.create
    assert (req2.stage, req2.attempt) == ("apply", 2)
    assert req2.name != req1.name
    assert again.delete == (req1.name,)
    assert [(e.kind, getattr(e, "attempt", None)) for e in again.publish] == [("stage.started", 2)]


def test_new_attempts_wait_until_the_drainer_and_validator_have_seen_the_requests() -> None:
    cr = nodewright()
    reqs = _requests(("retry", "", ""))
    rec = ExecutorRecord(packages={PKG: _pkg(state="running", attempt=2)}, honoured=1)
    behind = core.decide(
        cr=cr, node=_facts(rec, drain=_drained(0)), node_pods=[], now=NOW, requests=reqs
    )
    assert behind.create == ()
    validator_behind = core.decide(
        cr=cr,
        node=_facts(rec, ValidatorRecord(validated="x"), drain=_drained(1)),
        node_pods=[],
        now=NOW,
        requests=reqs,
    )
    assert validator_behind.create == ()
    caught_up = core.decide(
        cr=cr,
        node=_facts(rec, ValidatorRecord(validated="x", honoured=1), drain=_drained(1)),
        node_pods=[],
        now=NOW,
        requests=reqs,
    )
    assert [r.attempt for r in caught_up.create] == [2]


def test_a_stale_passed_verdict_does_not_advance_a_new_attempt() -> None:
    cr = nodewright()
    rec = ExecutorRecord(packages={PKG: _pkg(state="succeeded", reason=None, attempt=2)})
    old = ValidatorRecord(
        checks={nodestate.check_key(PKG, "0.9.0", "apply"): CheckRecord(verdict="passed", at=T0)}
    )
    assert isinstance(core.decide(cr=cr, node=_facts(rec, old), node_pods=[], now=NOW).record, Keep)
    new = ValidatorRecord(
        checks={
            nodestate.check_key(PKG, "0.9.0", "apply"): CheckRecord(
                verdict="passed", at=T0, attempt=2
            )
        }
    )
    advanced = core.decide(cr=cr, node=_facts(rec, new), node_pods=[], now=NOW)
    assert [(r.stage, r.attempt) for r in advanced.create] == [("config", 1)]


def test_a_rerun_stage_runs_though_a_verdict_of_its_attempt_in_the_old_run_is_held() -> None:
    """apply passed its check at attempt 2, then config failed at its stage (no validator
    write since, so apply's verdict is still held); a rerun of apply runs at attempt 2 again
    (config's attempt + 1). The old verdict must not read as this run's: apply runs."""
    cr = nodewright()
    cycle = T0
    rec = ExecutorRecord(
        packages={PKG: _pkg(stage="config", attempt=1, cycle="install", cycle_started=cycle)}
    )
    held = ValidatorRecord(
        checks={
            nodestate.check_key(PKG, "0.9.0", "apply"): CheckRecord(
                verdict="passed", at=T0, attempt=2, cycle=cycle.isoformat()
            )
        }
    )
    rerun = core.honour(
        rec, _requests(("rerun", PKG, "apply")), desired=progress.desired(cr), checks={}, now=NOW
    )
    read = _facts(rerun, held).executor.packages[PKG]
    assert (read.stage, read.attempt, read.state) == ("apply", 2, "running")
    started = core.decide(cr=cr, node=_facts(rerun, held), node_pods=[], now=NOW)
    assert [(r.stage, r.attempt) for r in started.create] == [("apply", 2)]


def test_a_failed_interrupt_is_retried_as_a_new_attempt_with_a_new_pod() -> None:
    cr = nodewright(
        packages={PKG: {"version": "0.9.0", "image": "r/t", "interrupt": {"type": "reboot"}}}
    )
    at_interrupt = _pkg(stage="interrupt", interrupt="reboot")
    failed = ExecutorRecord(
        packages={PKG: at_interrupt},
        interrupt=InterruptRecord(
            type="reboot", state="failed", packages=(PKG,), started=T0, reason=BOOM
        ),
    )
    reqs = _requests(("retry", "", ""))
    honoured = core.decide(cr=cr, node=_facts(failed), node_pods=[], now=NOW, requests=reqs)
    rec = _rec(honoured)
    assert rec.interrupt is None
    assert (rec.packages[PKG].stage, rec.packages[PKG].state) == ("interrupt", "running")
    assert progress.turn(cr, _facts(rec)) == "executor"
    started = core.decide(cr=cr, node=_facts(rec), node_pods=[], now=NOW, requests=reqs)
    (req,) = started.create
    assert (req.role, req.attempt) == ("interrupt", 2)
    intr = _rec(started).interrupt
    assert intr is not None
    assert (intr.state, intr.attempt) == ("running", 2)
    # The new attempt's pod is the one observed.
    pod = _view(req, "Running")
    watching = core.decide(
        cr=cr, node=_facts(_rec(started)), node_pods=[pod], now=NOW, requests=reqs
    )
    assert watching.delete == ()


def test_abort_fails_the_running_stage_says_so_and_stops_its_pod_then_retry_runs_it() -> None:
    cr = nodewright()
    first = core.decide(cr=cr, node=_facts(), node_pods=[], now=T0)
    (req1,) = first.create
    running = [_view(req1, "Running")]
    reqs = _requests(("abort", "", ""))

    honoured = core.decide(
        cr=cr,
        node=_facts(_rec(first), drain=_drained(1)),
        node_pods=running,
        now=NOW,
        requests=reqs,
    )
    rec = _rec(honoured)
    r = rec.packages[PKG]
    assert (rec.honoured, r.state, r.attempt) == (1, "failed", 1)
    assert r.reason is not None
    assert r.reason.code == "StageAborted"
    assert "nodewright node retry" in r.reason.message
    (said,) = honoured.publish
    assert (said.kind, getattr(said, "stage", None)) == ("stage.failed", "apply")
    assert progress.turn(cr, _facts(rec)) == "failed"
    assert (honoured.create, honoured.delete, honoured.stop) == ((), (), ())

    after = core.decide(
        cr=cr, node=_facts(rec, drain=_drained(1)), node_pods=running, now=NOW, requests=reqs
    )
    assert (after.create, after.delete, after.stop) == ((), (), (req1.name,))
    assert after.record == Keep()
    # A second abort finds nothing running: it only moves the mark.
    again = _requests(("abort", "", ""), ("abort", "", ""))
    twice = core.decide(
        cr=cr, node=_facts(rec, drain=_drained(2)), node_pods=running, now=NOW, requests=again
    )
    assert _rec(twice).packages == rec.packages
    assert twice.publish == ()

    retried = _requests(("abort", "", ""), ("retry", "", ""))
    honoured = core.decide(
        cr=cr, node=_facts(rec, drain=_drained(2)), node_pods=running, now=NOW, requests=retried
    )
    rec2 = _rec(honoured)
    assert (rec2.packages[PKG].state, rec2.packages[PKG].attempt) == ("running", 2)
    stopped = [replace(running[0], phase="Failed", stopping=True, over=True)]
    again2 = core.decide(
        cr=cr, node=_facts(rec2, drain=_drained(2)), node_pods=stopped, now=NOW, requests=retried
    )
    (req2,) = again2.create
    assert req2.attempt == 2
    assert again2.delete == (req1.name,), "the retry drops the aborted attempt's pod"


def test_abort_of_one_package_leaves_the_others_running() -> None:
    other = _pkg(state="running", reason=None)
    rec = ExecutorRecord(packages={PKG: _pkg(state="running", reason=None), "other": other})
    reqs = _requests(("abort", "other", ""))
    cr = nodewright(
        packages={
            PKG: {"version": "0.9.0", "image": "r/t"},
            "other": {"version": "0.9.0", "image": "r/o"},
        }
    )
    honoured = _rec(
        core.decide(
            cr=cr, node=_facts(rec, drain=_drained(1)), node_pods=[], now=NOW, requests=reqs
        )
    )
    assert honoured.packages[PKG].state == "running"
    assert honoured.packages["other"].state == "failed"


def test_abort_fails_a_running_interrupt_with_every_package_it_was_merged_for() -> None:
    cr = nodewright(
        packages={
            PKG: {"version": "0.9.0", "image": "r/t", "interrupt": {"type": "reboot"}},
            "other": {"version": "0.9.0", "image": "r/o", "interrupt": {"type": "reboot"}},
        }
    )
    at = _pkg(stage="interrupt", state="running", reason=None, interrupt="reboot")
    rec = ExecutorRecord(
        packages={PKG: at, "other": at},
        interrupt=InterruptRecord(
            type="reboot", state="running", packages=(PKG, "other"), started=T0
        ),
    )
    reqs = _requests(("abort", PKG, ""))
    out = core.decide(
        cr=cr, node=_facts(rec, drain=_drained(1)), node_pods=[], now=NOW, requests=reqs
    )
    honoured = _rec(out)
    assert honoured.interrupt is not None
    assert honoured.interrupt.state == "failed"
    assert {n: r.state for n, r in honoured.packages.items()} == {PKG: "failed", "other": "failed"}
    assert sorted(getattr(e, "package", "") for e in out.publish) == [PKG, "other"]
    # A retry runs the interrupt again as a new attempt (its reboot had been asked for).
    retried = _requests(("abort", PKG, ""), ("retry", "", ""))
    again = _rec(core.decide(cr=cr, node=_facts(honoured), node_pods=[], now=NOW, requests=retried))
    assert again.interrupt is None
    assert {r.state for r in again.packages.values()} == {"running"}


def test_reset_forgets_the_record_and_the_next_pass_starts_over() -> None:
    cr = nodewright()
    rec = ExecutorRecord(packages={PKG: _pkg(stage="config", installed="0.8.0", previous="0.8.0")})
    reqs = _requests(("reset", "", ""))
    honoured = core.decide(cr=cr, node=_facts(rec), node_pods=[], now=NOW, requests=reqs)
    assert _rec(honoured) == ExecutorRecord(honoured=1)
    fresh = core.decide(cr=cr, node=_facts(_rec(honoured)), node_pods=[], now=NOW, requests=reqs)
    (req,) = fresh.create
    assert (req.stage, req.attempt) == ("apply", 1)
    assert _rec(fresh).honoured == 1


@pytest.mark.parametrize(
    ("before", "stage", "expected"),
    [
        pytest.param(
            _pkg(stage="config", state="succeeded", reason=None, installed="0.9.0", cycle="config"),
            "",
            ("apply", "install", 2),
            id="finished-runs-its-install-again",
        ),
        pytest.param(
            _pkg(stage="config", state="running", reason=None, cycle="upgrade", previous="0.8.0"),
            "",
            ("upgrade", "upgrade", 2),
            id="unfinished-restarts-its-cycle",
        ),
        pytest.param(
            _pkg(stage="config", state="succeeded", reason=None, installed="0.9.0", attempt=3),
            "config",
            ("config", "install", 4),
            id="one-stage",
        ),
    ],
)
def test_rerun_restarts_a_package_cycle_or_stage(
    before: PackageRecord, stage: str, expected: tuple[str, str, int]
) -> None:
    got = core.honour(
        ExecutorRecord(packages={PKG: before, "other": _pkg(stage="config")}),
        _requests(("rerun", PKG, stage)),
        desired=progress.desired(nodewright()),
        checks={},
        now=NOW,
    )
    new = got.packages[PKG]
    assert (new.stage, new.cycle, new.attempt, new.state) == (*expected, "running")
    assert new.cycle_started == NOW, "a run of its own: no verdict of the old run counts"
    assert new.installed == before.installed, "what is installed on the host is a fact"
    assert got.packages["other"] == _pkg(stage="config"), "other packages are untouched"
    assert got.honoured == 1


@pytest.mark.parametrize(
    ("package", "stage"),
    [("unknown", ""), (PKG, "interrupt"), (PKG, "nonsense")],
)
def test_a_rerun_of_nothing_known_only_moves_the_mark(package: str, stage: str) -> None:
    rec = ExecutorRecord(packages={PKG: _pkg(state="succeeded", reason=None)})
    got = core.honour(
        rec,
        _requests(("rerun", package, stage)),
        desired=progress.desired(nodewright()),
        checks={},
        now=NOW,
    )
    assert got == ExecutorRecord(packages=rec.packages, honoured=1)


def test_a_rerun_on_a_released_node_sends_it_back_to_the_scheduler() -> None:
    cr = nodewright()
    d = progress.desired(cr)[PKG]
    done = ExecutorRecord(
        packages={
            PKG: _pkg(
                stage="config",
                state="succeeded",
                reason=None,
                installed="0.9.0",
                config=d.config_digest,
            )
        }
    )
    validated = ValidatorRecord(validated=progress.target_digest(cr))
    facts = progress.facts(
        node("n1", records={nodestate.EXECUTOR: done, nodestate.VALIDATOR: validated}), CR
    )
    assert progress.turn(cr, facts) == "done"
    reqs = _requests(("rerun", PKG, ""))
    got = core.decide(cr=cr, node=facts, node_pods=[], now=NOW, requests=reqs)
    after = progress.facts(
        node("n1", records={nodestate.EXECUTOR: _rec(got), nodestate.VALIDATOR: validated}), CR
    )
    assert progress.turn(cr, after) == "scheduler"


def test_a_fresh_record_starts_having_honoured_every_request() -> None:
    reqs = _requests(("retry", "", ""), ("reset", "", ""))
    d = core.decide(
        cr=nodewright(), node=_facts(drain=_drained(2)), node_pods=[], now=NOW, requests=reqs
    )
    assert _rec(d).honoured == 2
    assert [r.attempt for r in d.create] == [1]
