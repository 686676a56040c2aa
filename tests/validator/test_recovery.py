"""The validator's part of recovery: a verdict counts only for the stage attempt it is
about, reset forgets every verdict and the node's validation, rerun forgets the node's
validation, and each request is honoured once."""

from __future__ import annotations

import pytest

from services.validator import core
from shared import nodestate, progress
from shared.decisions import Keep
from shared.events import Reason
from shared.nodestate import Request, Requests
from shared.records.executor import ExecutorRecord, PackageRecord
from shared.records.validator import CheckRecord, ValidatorRecord
from tests.helpers.facts import T0, nodewright, written
from tests.validator.test_core import _facts, _pod, _req

PKG = "nvidia-tuned"
KEY = nodestate.check_key(PKG, "0.9.0", "apply")
BAD = Reason(code="CheckFailed", message="check apply-check failed (exit code 2)")
FAILED = ValidatorRecord(checks={KEY: CheckRecord(verdict="failed", at=T0, reason=BAD)})


def _applied(state: str, attempt: int) -> ExecutorRecord:
    return ExecutorRecord(
        packages={
            PKG: PackageRecord(
                version="0.9.0",
                stage="apply",
                state=state,  # type: ignore[arg-type]
                attempt=attempt,
                updated=T0,
            )
        }
    )


def _requests(*actions: str) -> Requests:
    out: Requests | None = None
    for action in actions:
        out = nodestate.add_request(out, Request(seq=0, action=action, at=T0))  # type: ignore[arg-type]
    assert out is not None
    return out


def test_a_retried_stage_drops_the_old_verdict_and_gets_a_check_of_its_own() -> None:
    cr = nodewright()
    old_req = _req(attempt=1)
    old_pod = _pod(old_req, "Failed", exit_code=2)
    # The executor runs apply again as attempt 2: the failed verdict is about attempt 1.
    running = core.decide(
        cr=cr, node=_facts(_applied("running", 2), FAILED), check_pods=[old_pod], now=T0
    )
    assert written(running.record, ValidatorRecord).checks == {}
    assert (
        progress.turn(cr, _facts(_applied("running", 2), written(running.record, ValidatorRecord)))
        == "executor"
    )
    # Attempt 2 succeeded: the check in its own pod, under a new name; the old pod's failed
    # check says nothing about it.
    req = _req(attempt=2)
    checked = core.decide(
        cr=cr,
        node=_facts(_applied("succeeded", 2), written(running.record, ValidatorRecord)),
        check_pods=[old_pod, _pod(req, "Running")],
        now=T0,
    )
    assert isinstance(checked.record, Keep), "a check that runs is not written down"
    passed = core.decide(
        cr=cr,
        node=_facts(_applied("succeeded", 2), written(running.record, ValidatorRecord)),
        check_pods=[old_pod, _pod(req, "Succeeded")],
        now=T0,
    )
    assert (
        written(passed.record, ValidatorRecord).checks[KEY].verdict,
        written(passed.record, ValidatorRecord).checks[KEY].attempt,
    ) == ("passed", 2)


VALIDATED = ValidatorRecord(
    checks={KEY: CheckRecord(verdict="passed", at=T0)}, validated="digest", at=T0
)


@pytest.mark.parametrize(
    ("actions", "expected"),
    [
        pytest.param(("retry",), VALIDATED, id="retry-needs-nothing-here"),
        pytest.param(("reset",), ValidatorRecord(), id="reset-forgets-everything"),
        pytest.param(
            ("rerun",), ValidatorRecord(checks=VALIDATED.checks), id="rerun-forgets-validation"
        ),
        pytest.param(("reset", "retry"), ValidatorRecord(), id="in-order"),
    ],
)
def test_honour(actions: tuple[str, ...], expected: ValidatorRecord) -> None:
    got = core.honour(VALIDATED, _requests(*actions))
    assert got == ValidatorRecord(
        checks=expected.checks,
        validated=expected.validated,
        at=expected.at,
        reason=expected.reason,
        honoured=len(actions),
    )


def test_decide_honours_new_requests_first_and_once() -> None:
    cr = nodewright()
    reqs = _requests("reset")
    d = core.decide(
        cr=cr, node=_facts(_applied("succeeded", 1), FAILED), check_pods=[], now=T0, requests=reqs
    )
    assert written(d.record, ValidatorRecord) == ValidatorRecord(honoured=1)
    assert d.requeue_after == 0.0
    again = core.decide(
        cr=cr,
        node=_facts(_applied("succeeded", 1), written(d.record, ValidatorRecord)),
        check_pods=[],
        now=T0,
        requests=reqs,
    )
    assert isinstance(again.record, Keep), "the request is honoured; the check runs in its pod"


def test_a_fresh_record_starts_having_honoured_every_request() -> None:
    cr = nodewright()
    req = _req()
    d = core.decide(
        cr=cr,
        node=_facts(_applied("succeeded", 1)),
        check_pods=[_pod(req, "Succeeded")],
        now=T0,
        requests=_requests("retry", "rerun"),
    )
    assert written(d.record, ValidatorRecord).honoured == 2
