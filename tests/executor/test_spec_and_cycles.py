"""Issue 12, cases 6 and 7, on the executor's core: fixing a failing package's spec starts it
over by itself, and pod names never repeat across install cycles."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from services.executor import core
from shared import nodestate, progress
from shared.pods import PodView
from shared.podspec import PodRequest
from shared.records.drainer import DrainRecord
from shared.records.executor import ExecutorRecord, PackageRecord
from shared.records.validator import CheckRecord, ValidatorRecord
from tests.helpers.facts import T0, node, nodewright, selection, written

CR = "gpu-node-tuning"
SEL = selection("t")
DRAINED = DrainRecord(phase="drained", cordoned=True, started=T0, since=T0)


def _cr(image: str = "registry.example/tuned", **pkg: Any) -> Any:
    return nodewright(packages={"tuned": {"version": "1.0.0", "image": image, **pkg}})


def _facts(executor: ExecutorRecord, validator: ValidatorRecord | None = None) -> Any:
    records: dict[str, Any] = {
        nodestate.SCHEDULER: SEL,
        nodestate.DRAINER: DRAINED,
        nodestate.EXECUTOR: executor,
    }
    if validator is not None:
        records[nodestate.VALIDATOR] = validator
    return progress.facts(node("n1", records=records), CR)


def _pod(req: PodRequest, phase: str, **kw: Any) -> PodView:
    """The stage part of a stage pod (its check runs after it in the same pod)."""
    kw.setdefault("checked", req.role == "stage")
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
        **kw,
    )


def test_a_corrected_image_starts_a_stage_that_could_not_pull_over_by_itself() -> None:
    bad = _cr("registry.example/tuned-typo")
    first = core.decide(cr=bad, node=_facts(ExecutorRecord()), node_pods=[], now=T0)
    (req,) = first.create
    started = written(first.record, ExecutorRecord)
    stuck = _pod(req, "Pending", waiting_reason="ImagePullBackOff", waiting_message="not found")
    late = T0 + timedelta(minutes=5)
    failed = core.decide(
        cr=bad, node=_facts(started), node_pods=[stuck], now=late, image_pull_grace_s=60
    )
    record = written(failed.record, ExecutorRecord)
    reason = record.packages["tuned"].reason
    assert reason is not None
    assert reason.code == "ImagePullFailed"
    assert "correct the image in the package's spec" in reason.message
    assert progress.failed(bad, _facts(record)), "failed while the spec is the same"
    assert core.decide(cr=bad, node=_facts(record), node_pods=[stuck], now=late).create == ()

    # The image is fixed in the CR: the failure is about the old spec, and the stage runs
    # again as a new attempt, with a new pod, without `nodewright node retry`.
    fixed = _cr("registry.example/tuned")
    assert not progress.failed(fixed, _facts(record))
    assert progress.turn(fixed, _facts(record)) == "executor"
    again = core.decide(cr=fixed, node=_facts(record), node_pods=[stuck], now=late)
    (retry,) = again.create
    assert (retry.stage, retry.attempt) == ("apply", 2)
    assert retry.image == "registry.example/tuned:1.0.0"
    assert retry.name != req.name
    new = written(again.record, ExecutorRecord).packages["tuned"]
    assert (new.state, new.spec) == ("running", progress.desired(fixed)["tuned"].spec_digest)
    assert again.delete == (req.name,), "the failed pod goes once its attempt is over"


def test_a_check_that_failed_runs_again_after_the_spec_changed() -> None:
    old = _cr(env=[{"name": "MODE", "value": "a"}])
    d = progress.desired(old)["tuned"]
    rec = ExecutorRecord(
        packages={
            "tuned": PackageRecord(
                version="1.0.0",
                stage="apply",
                state="succeeded",
                updated=T0,
                spec=d.spec_digest,
                cycle_started=T0,
            )
        }
    )
    verdict = ValidatorRecord(
        checks={"tuned/1.0.0/apply": CheckRecord(verdict="failed", at=T0, attempt=1)}
    )
    assert progress.failed(old, _facts(rec, verdict))
    new = _cr(env=[{"name": "MODE", "value": "b"}])
    assert not progress.failed(new, _facts(rec, verdict))
    again = core.decide(cr=new, node=_facts(rec, verdict), node_pods=[], now=T0)
    assert [(r.stage, r.attempt) for r in again.create] == [("apply", 2)]


def test_a_failure_of_a_record_without_a_spec_still_needs_a_retry() -> None:
    """Records written before the spec was kept cannot tell: nothing starts by itself."""
    rec = ExecutorRecord(
        packages={
            "tuned": PackageRecord(version="1.0.0", stage="apply", state="failed", updated=T0)
        }
    )
    assert progress.failed(_cr("registry.example/other"), _facts(rec))


def test_a_reinstall_after_an_uninstall_never_reuses_the_first_installs_pod_names() -> None:
    cr = _cr()
    t1, t2 = T0, T0 + timedelta(hours=1)
    first = core.decide(cr=cr, node=_facts(ExecutorRecord()), node_pods=[], now=t1)
    # The uninstall cycle ran to its end and dropped the record; later the package is
    # wanted again: a new install cycle, starting at attempt 1 like the first one.
    second = core.decide(cr=cr, node=_facts(ExecutorRecord()), node_pods=[], now=t2)
    (a,), (b,) = first.create, second.create
    assert (a.stage, a.attempt) == (b.stage, b.attempt) == ("apply", 1)
    assert a.name != b.name
    assert a.cycle == t1.isoformat()
    # A replica deciding the same cycle again names the same pod (deterministic), within
    # the stage's timeout (after it, a stage that never got its pod fails).
    rec = written(first.record, ExecutorRecord)
    lost = core.decide(cr=cr, node=_facts(rec), node_pods=[], now=t1 + timedelta(seconds=5))
    assert [r.name for r in lost.create] == [a.name]
