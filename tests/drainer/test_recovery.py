"""The drainer's part of recovery and of waiting well: retry and reset restart a drain
without touching cordon ownership, an ignored node already admitted finishes its drain, and
the optional deadline on podNonInterruptLabels pods fails the node naming them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from services.drainer import core
from services.drainer.filters import PodInfo
from shared import nodestate, progress, reasons
from shared.decisions import Remove
from shared.events import Reason
from shared.nodestate import Request, Requests
from shared.records.drainer import DrainRecord
from tests.drainer.test_core import CR, NOW, _cr, _decide, _done_records, _node, _pod, _record
from tests.helpers.facts import T0, written

TIMEOUT = Reason(code="DrainTimeout", message="drain did not finish within 60s")


def _requests(*actions: str) -> Requests:
    out: Requests | None = None
    for action in actions:
        out = nodestate.add_request(out, Request(seq=0, action=action, at=T0))  # type: ignore[arg-type]
    assert out is not None
    return out


def _with_requests(obj: dict[str, Any], reqs: Requests) -> core.Decision:
    cr = _cr()
    return core.decide(
        cr_name=CR,
        cr=cr,
        node=progress.facts(obj, CR),
        others=core.drain_records(obj, besides=CR),
        pods=[],
        now=NOW,
        requests=reqs,
    )


RESTARTED = {"phase": "cordoned", "started": NOW, "since": NOW, "reason": None}


@pytest.mark.parametrize(
    ("before", "actions", "changes"),
    [
        pytest.param(
            _record("failed", reason=TIMEOUT), ("retry",), RESTARTED, id="retry-restarts-failed"
        ),
        pytest.param(
            _record("failed", reason=TIMEOUT, preexisting=True),
            ("retry",),
            RESTARTED,
            id="retry-keeps-a-preexisting-cordon-preexisting",
        ),
        pytest.param(
            _record("drained"), ("retry",), {}, id="retry-leaves-a-drain-that-did-not-fail"
        ),
        pytest.param(_record("blocked", reason=TIMEOUT), ("retry",), {}, id="retry-leaves-blocked"),
        pytest.param(_record("drained"), ("reset",), RESTARTED, id="reset-restarts-any-drain"),
        pytest.param(_record("failed", reason=TIMEOUT), ("rerun",), {}, id="rerun-is-not-ours"),
        pytest.param(
            _record("failed", reason=TIMEOUT),
            ("rerun", "retry"),
            RESTARTED,
            id="every-new-request-is-honoured-in-order",
        ),
    ],
)
def test_requests_restart_the_drain_and_keep_cordon_ownership(
    before: DrainRecord, actions: tuple[str, ...], changes: dict[str, Any]
) -> None:
    reqs = _requests(*actions)
    got = core.honour(before, reqs, NOW)
    expected: dict[str, Any] = {
        "phase": before.phase,
        "started": before.started,
        "since": before.since,
        "reason": before.reason,
        **changes,
    }
    assert (got.phase, got.started, got.since, got.reason) == tuple(expected.values())
    assert (got.cordoned, got.preexisting) == (before.cordoned, before.preexisting)
    assert got.honoured == len(actions)


def test_decide_honours_new_requests_first_and_once() -> None:
    cr = _cr()
    failed = _record("failed", reason=TIMEOUT)
    obj = _node(cr, drain=failed, unschedulable=True)
    d = _with_requests(obj, _requests("retry"))
    assert d.write is not None
    assert written(d.write.record, DrainRecord) == core.honour(failed, _requests("retry"), NOW)
    assert d.write.unschedulable is None, "the cordon is left as it is"
    assert d.requeue_after == 0.0
    # Honoured: the failed drain of a second look (mark at 1) is not restarted again.
    marked = _record("failed", reason=TIMEOUT, honoured=1)
    assert _with_requests(_node(cr, drain=marked, unschedulable=True), _requests("retry")) == (
        core.Decision()
    )


def test_a_release_wins_over_requests() -> None:
    cr = _cr()
    obj = _node(cr, drain=_record("drained"), unschedulable=True, extra=_done_records(cr))
    d = _with_requests(obj, _requests("retry"))
    assert d.write is not None
    assert isinstance(d.write.record, Remove)
    assert d.write.unschedulable is False


def test_a_fresh_cordon_starts_having_honoured_every_request() -> None:
    cr = _cr()
    d = _with_requests(_node(cr), _requests("reset", "retry"))
    assert d.write is not None
    assert written(d.write.record, DrainRecord) is not None
    assert (
        written(d.write.record, DrainRecord).phase,
        written(d.write.record, DrainRecord).honoured,
    ) == ("cordoned", 2)


def test_an_ignored_node_already_admitted_finishes_its_drain() -> None:
    cr = _cr()
    labels = {nodestate.IGNORE_LABEL: "true"}
    cordon = _decide(cr, _node(cr, labels=labels))
    assert cordon.write is not None
    assert cordon.write.unschedulable is True
    drain = _decide(cr, _node(cr, drain=_record(), unschedulable=True, labels=labels), [_pod("w")])
    assert [p.name for p in drain.evict] == ["w"]


def _protected(name: str) -> PodInfo:
    return _pod(name, labels={"workload": "training"})


@pytest.mark.parametrize(
    ("timeout", "waited_s", "outcome"),
    [
        pytest.param(None, 86400 * 30, "waiting", id="unset-waits-forever"),
        pytest.param(600, 599, "waiting", id="before-the-deadline"),
        pytest.param(600, 600, "failed", id="at-the-deadline"),
    ],
)
def test_the_protected_pod_deadline(timeout: int | None, waited_s: int, outcome: str) -> None:
    drain: dict[str, Any] = {}
    if timeout is not None:
        drain["protectedPodsTimeoutSeconds"] = timeout
    cr = _cr(podNonInterruptLabels={"matchLabels": {"workload": "training"}}, drain=drain)
    start = NOW - timedelta(seconds=waited_s)
    rec = _record(
        "waiting",
        since=start,
        reason=Reason(
            code=reasons.PROTECTED_POD_RUNNING,
            message="waiting for 2 pod(s) matching podNonInterruptLabels to finish: apps/a, apps/b",
            objects=(_protected("a").ref, _protected("b").ref),
            details={"pods": "2"},
        ),
    )
    pods = [_protected("b"), _protected("a"), _pod("web")]
    d = _decide(cr, _node(cr, drain=rec, unschedulable=True), pods)
    if outcome == "waiting":
        assert d.write is None
        assert d.evict == ()
        expected = None if timeout is None else float(timeout - waited_s)
        assert d.requeue_after == expected
        return
    assert d.write is not None
    failed = written(d.write.record, DrainRecord)
    assert failed is not None
    assert failed.phase == "failed"
    assert failed.reason is not None
    assert failed.reason.code == reasons.PROTECTED_POD_TIMEOUT
    assert "apps/a, apps/b" in failed.reason.message
    assert [o.name for o in failed.reason.objects] == ["a", "b"]
    assert failed.reason.details["timeoutSeconds"] == "600"
    assert [e.kind for e in d.publish] == ["node.drain-failed"]
    assert d.evict == (), "nothing is evicted: the protected pods are left alone"
    assert progress.turn(cr, progress.facts(_node(cr, drain=failed), CR)) == "failed"


def test_entering_the_wait_arms_the_deadline() -> None:
    cr = _cr(
        podNonInterruptLabels={"matchLabels": {"workload": "training"}},
        drain={"protectedPodsTimeoutSeconds": 30},
    )
    d = _decide(cr, _node(cr, drain=_record(), unschedulable=True), [_protected("a")])
    assert d.write is not None
    assert written(d.write.record, DrainRecord) is not None
    assert written(d.write.record, DrainRecord).phase == "waiting"
    assert d.requeue_after == 30.0
