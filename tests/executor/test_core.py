"""The executor core walks each package through its stages, gated by the validator's
checks, merges interrupts, and turns pod outcomes into reasons."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import msgspec
import pytest

from services.executor import core
from shared import events, nodestate, pods, podspec, progress
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


def _facts(
    executor: ExecutorRecord | None = None, checks: dict[str, str] | None = None, **kw: Any
) -> progress.NodeFacts:
    records: dict[str, Any] = {nodestate.SCHEDULER: SEL, nodestate.DRAINER: DRAINED}
    if executor is not None:
        records[nodestate.EXECUTOR] = executor
    if checks:
        records[nodestate.VALIDATOR] = ValidatorRecord(
            checks={
                k: CheckRecord(verdict=v, at=T0, cycle=_cycle_of(executor, k))  # type: ignore[arg-type]
                for k, v in checks.items()
            }
        )
    return progress.facts(node("n1", records=records, **kw), CR)


def _cycle_of(executor: ExecutorRecord | None, key: str) -> str:
    """The cycle of the run a verdict under ``key`` is about: the record's, when it is at
    that stage (a check judged from the stage's pod names it)."""
    name, version, stage = key.split("/", 2)
    r = executor.packages.get(name) if executor is not None else None
    if r is None or (r.version, r.stage) != (version, stage):
        return ""
    return progress.cycle_of(r)


def _pod(req: PodRequest, phase: str, **kw: Any) -> PodView:
    """The stage part of a stage pod (its check runs after it in the same pod)."""
    kw.setdefault("checked", req.role == "stage")
    kw.setdefault("ended", T0 if phase == "Succeeded" else None)
    return PodView(
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
        **kw,
    )


def _rec(d: core.Decision) -> ExecutorRecord:
    return written(d.record, ExecutorRecord)


def test_a_fresh_node_starts_apply_then_config_after_each_check_passes() -> None:
    cr = nodewright()
    d1 = core.decide(cr=cr, node=_facts(), node_pods=[], now=T0)
    (req,) = d1.create
    assert (req.package, req.stage, req.version, req.image) == (
        "nvidia-tuned",
        "apply",
        "0.9.0",
        "ghcr.io/nvidia/nodewright-packages/nvidia-tuned:0.9.0",
    )
    assert _rec(d1).packages["nvidia-tuned"].state == "running"
    assert [e.kind for e in d1.publish] == ["stage.started"]
    # One pod runs apply, its check, config and its check (tests/shared/test_segments.py);
    # here the pod is read as one stage, as a pod of an earlier version would be, whose
    # check's verdict moves the record on to config's pod.
    assert req.segment == ("apply", "config")

    # The stage exited 0 and its check runs in the same pod: no write (issue 15: the
    # check's verdict records that the stage succeeded), the event said from the pod, stamped
    # with the stage's end; config waits for the verdict.
    d2 = core.decide(cr=cr, node=_facts(_rec(d1)), node_pods=[_pod(req, "Succeeded")], now=T0)
    assert isinstance(d2.record, Keep)
    assert (d2.create, d2.delete, d2.publish) == ((), (), ()), "the check runs in the stage's pod"
    ((pod_name, (said,)),) = d2.announce.items()
    assert isinstance(said, events.StageSucceeded)
    assert pod_name == req.name
    assert (said.kind, said.stage, said.attempt, said.at) == ("stage.succeeded", "apply", 1, T0)
    # The id the executor's outbox gave it when it wrote the stage's end: one event either way.
    assert said.id == "gpu-node-tuning/n1/nvidia-tuned/0.9.0/apply/1/ok"

    # Check passed: the apply pod goes (said first), config starts.
    checks = {nodestate.check_key("nvidia-tuned", "0.9.0", "apply"): "passed"}
    d4 = core.decide(
        cr=cr, node=_facts(_rec(d1), checks), node_pods=[_pod(req, "Succeeded")], now=T0
    )
    assert [r.stage for r in d4.create] == ["config"]
    assert d4.delete == (req.name,)
    assert {p: [e.id for e in es] for p, es in d4.announce.items()} == {req.name: [said.id]}
    assert [e.kind for e in d4.publish] == ["stage.started"]

    # Config done and checked: the package is installed.
    cfg = d4.create[0]
    d5 = core.decide(
        cr=cr, node=_facts(_rec(d4), checks), node_pods=[_pod(cfg, "Succeeded")], now=T0
    )
    assert isinstance(d5.record, Keep)
    checks[nodestate.check_key("nvidia-tuned", "0.9.0", "config")] = "passed"
    # The verdict ends the cycle for every reader: the package is installed as the facts
    # read it, and the executor has nothing to write for it (issue 15).
    checked = _facts(_rec(d4), checks)
    final = checked.executor.packages["nvidia-tuned"]
    assert (final.installed, final.previous, final.cycle_config) == ("0.9.0", "", "")
    assert progress.package_done(progress.desired(cr)["nvidia-tuned"], final)
    d6 = core.decide(cr=cr, node=checked, node_pods=[_pod(cfg, "Succeeded")], now=T0)
    assert isinstance(d6.record, Keep)
    assert d6.create == ()


def test_a_stage_pod_the_record_moved_past_is_deleted_without_a_fence() -> None:
    """Issue 15: a finished stage pod whose outcome the record the decision read already
    holds is needed by no later record (a new attempt or cycle gets a new name), so its
    delete asks for no fence write; a pod the record does not know yet is fenced."""
    cr = nodewright()
    d1 = core.decide(cr=cr, node=_facts(), node_pods=[], now=T0)
    (req,) = d1.create
    apply_pod = _pod(req, "Succeeded")
    d2 = core.decide(cr=cr, node=_facts(_rec(d1)), node_pods=[apply_pod], now=T0)
    assert d2.delete == ()
    assert isinstance(d2.record, Keep)
    checks = {nodestate.check_key("nvidia-tuned", "0.9.0", "apply"): "passed"}
    d3 = core.decide(cr=cr, node=_facts(_rec(d1), checks), node_pods=[apply_pod], now=T0)
    assert (d3.delete, d3.settled) == ((req.name,), frozenset({req.name})), "outcome folded in"
    cfg = d3.create[0]
    d4 = core.decide(cr=cr, node=_facts(_rec(d3), checks), node_pods=[apply_pod], now=T0)
    assert d4.settled == frozenset({req.name}), "config runs: apply is behind the record"
    # Decided on the record from before the apply pod was started: it may still be wanted.
    d0 = core.decide(cr=cr, node=_facts(), node_pods=[_pod(cfg, "Succeeded")], now=T0)
    assert d0.delete == (cfg.name,)
    assert d0.settled == frozenset()
    # A running pod the record does not keep is stopped after the fence, always.
    d5 = core.decide(cr=cr, node=_facts(_rec(d3), checks), node_pods=[_pod(req, "Running")], now=T0)
    assert d5.delete == (req.name,)
    assert d5.settled == frozenset()


def test_a_stage_pod_stays_while_its_check_runs_and_after_it_failed() -> None:
    """Issue 15: the pod runs the stage, then its check; the executor judges the stage and
    deletes the pod only once the validator's verdict passed (a failed one keeps it for
    its logs until a retry)."""
    cr = nodewright()
    d1 = core.decide(cr=cr, node=_facts(), node_pods=[], now=T0)
    (req,) = d1.create
    stage_done = _pod(req, "Succeeded")  # the stage part: its check may still run
    d2 = core.decide(cr=cr, node=_facts(_rec(d1)), node_pods=[stage_done], now=T0)
    assert isinstance(d2.record, Keep)
    assert d2.delete == ()
    key = nodestate.check_key("nvidia-tuned", "0.9.0", "apply")
    for verdict in ("running", "failed"):
        kept = core.decide(
            cr=cr, node=_facts(_rec(d1), {key: verdict}), node_pods=[stage_done], now=T0
        )
        assert kept.delete == (), verdict
    passed = core.decide(
        cr=cr, node=_facts(_rec(d1), {key: "passed"}), node_pods=[stage_done], now=T0
    )
    assert passed.delete == (req.name,)


def test_a_stage_whose_check_runs_is_not_timed_out_nor_restarted_and_a_lost_pod_is_made_again() -> (
    None
):
    """The stage's clock stops when the stage exits 0 (its check has its own, the
    validator's); a pod that goes before the check's verdict is made again under the same
    name (the record still says the stage runs: nothing recorded it ended)."""
    cr = nodewright(stageTimeoutSeconds=60)
    d1 = core.decide(cr=cr, node=_facts(), node_pods=[], now=T0)
    (req,) = d1.create
    late = T0 + timedelta(seconds=600)
    checking = core.decide(
        cr=cr, node=_facts(_rec(d1)), node_pods=[_pod(req, "Succeeded")], now=late
    )
    assert isinstance(checking.record, Keep)
    assert (checking.create, checking.delete) == ((), ())
    gone = core.decide(cr=cr, node=_facts(_rec(d1)), node_pods=[], now=T0 + timedelta(seconds=5))
    assert [r.name for r in gone.create] == [req.name]
    # The same start, said again: the same event (id and time), which the stream is looked
    # up for once the first is older than its deduplication window (never stored twice).
    assert [(e.kind, e.id, e.at) for e in gone.publish] == [
        (e.kind, e.id, e.at) for e in d1.publish
    ]


def test_a_stage_pod_of_an_earlier_version_without_a_check_records_the_stage_end() -> None:
    """A pod made before stage pods ran their check (no check container): its end is written
    as before, and the validator fails its check as a pod that went away."""
    cr = nodewright()
    d1 = core.decide(cr=cr, node=_facts(), node_pods=[], now=T0)
    (req,) = d1.create
    d2 = core.decide(
        cr=cr, node=_facts(_rec(d1)), node_pods=[_pod(req, "Succeeded", checked=False)], now=T0
    )
    assert _rec(d2).packages["nvidia-tuned"].state == "succeeded"
    assert [e.kind for e in d2.publish] == ["stage.succeeded"]
    assert d2.announce == {}


def test_a_failed_pod_fails_the_package_with_exit_code_and_keeps_the_pod() -> None:
    cr = nodewright()
    d1 = core.decide(cr=cr, node=_facts(), node_pods=[], now=T0)
    req = d1.create[0]
    d2 = core.decide(
        cr=cr,
        node=_facts(_rec(d1)),
        node_pods=[_pod(req, "Failed", exit_code=3, message="boom")],
        now=T0,
    )
    rec = _rec(d2).packages["nvidia-tuned"]
    assert rec.state == "failed"
    assert rec.reason is not None
    assert rec.reason.code == "StageFailed"
    assert "code 3" in rec.reason.message
    assert rec.reason.details["exitCode"] == "3"
    assert d2.delete == ()
    assert [e.kind for e in d2.publish] == ["stage.failed"]


def test_an_unpullable_image_fails_after_the_grace_period_naming_the_image() -> None:
    cr = nodewright()
    d1 = core.decide(cr=cr, node=_facts(), node_pods=[], now=T0)
    req = d1.create[0]
    pod = _pod(
        req,
        "Pending",
        waiting_reason="ImagePullBackOff",
        waiting_message="not found",
        image="ghcr.io/x:0.9.0",
    )
    early = core.decide(
        cr=cr,
        node=_facts(_rec(d1)),
        node_pods=[pod],
        now=T0 + timedelta(seconds=5),
        image_pull_grace_s=30,
    )
    assert isinstance(early.record, Keep)
    assert early.requeue_after is not None
    assert early.requeue_after <= 25
    late = core.decide(
        cr=cr,
        node=_facts(_rec(d1)),
        node_pods=[pod],
        now=T0 + timedelta(seconds=31),
        image_pull_grace_s=30,
    )
    reason = _rec(late).packages["nvidia-tuned"].reason
    assert reason is not None
    assert reason.code == "ImagePullFailed"
    assert "ghcr.io/x:0.9.0" in reason.message


def test_a_stage_running_past_its_timeout_fails_and_its_pod_is_stopped_and_kept() -> None:
    cr = nodewright(stageTimeoutSeconds=60)
    d1 = core.decide(cr=cr, node=_facts(), node_pods=[], now=T0)
    req = d1.create[0]
    d2 = core.decide(
        cr=cr,
        node=_facts(_rec(d1)),
        node_pods=[_pod(req, "Running")],
        now=T0 + timedelta(seconds=61),
    )
    reason = _rec(d2).packages["nvidia-tuned"].reason
    assert reason is not None
    assert reason.code == "StageTimeout"
    # Stopped, not deleted: its steps end with it, and what it printed stays readable.
    assert (d2.stop, d2.delete) == ((req.name,), ())

    def later(pod: PodView) -> core.Decision:
        return core.decide(
            cr=cr, node=_facts(_rec(d2)), node_pods=[pod], now=T0 + timedelta(seconds=70)
        )

    # The pod outlived that pass (the stop met a newer version of it): stopped again.
    assert (later(_pod(req, "Running")).stop, later(_pod(req, "Running")).delete) == (
        (req.name,),
        (),
    )
    stopping = later(_pod(req, "Running", stopping=True))
    assert (stopping.stop, stopping.delete) == ((), ()), "asked once; the kubelet ends it"
    ended = later(_pod(req, "Failed", stopping=True, over=True, exit_code=143))
    assert (ended.stop, ended.delete, ended.record) == ((), (), Keep()), "kept for its logs"


def test_a_stage_running_in_a_pod_of_a_replaced_image_starts_over_with_the_new_one() -> None:
    """A step hangs, and the package's image is fixed under the same version: the running
    pod is stopped and the stage starts over as attempt 2 with the fixed image, instead of
    hanging until its timeout. Only what the pod runs counts (image, env, resources)."""
    pkg = {"version": "0.9.0", "image": "registry.example/tuned"}
    cr = nodewright(packages={"nvidia-tuned": pkg})
    d1 = core.decide(cr=cr, node=_facts(), node_pods=[], now=T0)
    (req,) = d1.create
    assert req.desired is not None
    running = _pod(req, "Running", spec=req.desired.pod_digest)
    later = T0 + timedelta(seconds=30)

    def after(cr: Any, pod: PodView) -> core.Decision:
        return core.decide(cr=cr, node=_facts(_rec(d1)), node_pods=[pod], now=later)

    unchanged = after(cr, running)
    assert (unchanged.create, unchanged.delete) == ((), ())
    config_only = after(
        nodewright(packages={"nvidia-tuned": {**pkg, "configMap": {"a": "1"}}}), running
    )
    assert (config_only.create, config_only.delete) == ((), ()), "a config cycle follows instead"

    fixed = nodewright(packages={"nvidia-tuned": {**pkg, "image": "registry.example/tuned-fixed"}})
    d2 = after(fixed, running)
    assert d2.delete == (req.name,), "the pod of the old image goes, its steps with it"
    (new,) = d2.create
    assert (new.stage, new.attempt, new.image) == ("apply", 2, "registry.example/tuned-fixed:0.9.0")
    assert new.name != req.name
    rec = _rec(d2).packages["nvidia-tuned"]
    assert (rec.state, rec.attempt, rec.reason) == ("running", 2, None)
    with_env = nodewright(packages={"nvidia-tuned": {**pkg, "env": [{"name": "A", "value": "1"}]}})
    assert after(with_env, running).delete == (req.name,)
    # A pod that does not say what it runs (made before pods said so) is left to finish.
    assert after(fixed, _pod(req, "Running")).delete == ()


def test_a_stage_whose_pod_never_appears_fails_at_its_timeout_with_a_reason() -> None:
    """Never stuck silently: the API server refused every create (a quota, an admission
    policy on privileged pods). Until the timeout the pod is asked for again; then the stage
    fails saying so, instead of showing "running" for ever."""
    cr = nodewright(stageTimeoutSeconds=60)
    d1 = core.decide(cr=cr, node=_facts(), node_pods=[], now=T0)
    req = d1.create[0]
    early = core.decide(cr=cr, node=_facts(_rec(d1)), node_pods=[], now=T0 + timedelta(seconds=30))
    assert [r.name for r in early.create] == [req.name], "asked for again, same name"
    assert early.requeue_after is not None
    assert early.requeue_after <= 30
    late = core.decide(cr=cr, node=_facts(_rec(d1)), node_pods=[], now=T0 + timedelta(seconds=61))
    assert late.create == ()
    record = _rec(late).packages["nvidia-tuned"]
    assert record.state == "failed"
    assert record.reason is not None
    assert record.reason.code == "StageTimeout"
    assert "had no pod after 60s" in record.reason.message
    assert [e.kind for e in late.publish] == ["stage.failed"]


def test_depends_on_orders_packages_and_independent_ones_run_in_parallel() -> None:
    cr = nodewright(
        packages={
            "base": {"version": "1.0.0", "image": "r/base"},
            "driver": {"version": "2.0.0", "image": "r/driver", "dependsOn": {"base": "1.0.0"}},
            "other": {"version": "1.0.0", "image": "r/other"},
        }
    )
    d1 = core.decide(cr=cr, node=_facts(), node_pods=[], now=T0)
    assert sorted(r.package for r in d1.create) == ["base", "other"]


def _installed(
    cr_kwargs: dict[str, Any], name: str, version: str, config: dict[str, str] | None = None
) -> PackageRecord:
    d = progress.Desired  # for type only
    del d
    digest = progress.desired(nodewright(**cr_kwargs))[name].config_digest if config is None else ""
    return PackageRecord(
        version=version,
        stage="config",
        state="succeeded",
        installed=version,
        config=digest,
        config_keys=progress.config_key_digests(config or {}),
        updated=T0,
    )


def test_a_version_bump_runs_upgrade_from_the_installed_version() -> None:
    old = nodewright()
    rec = ExecutorRecord(packages={"nvidia-tuned": _installed({}, "nvidia-tuned", "0.9.0")})
    assert progress.package_done(
        progress.desired(old)["nvidia-tuned"], rec.packages["nvidia-tuned"]
    )
    new = nodewright(
        packages={
            "nvidia-tuned": {
                "version": "1.0.0",
                "image": "ghcr.io/nvidia/nodewright-packages/nvidia-tuned",
            }
        }
    )
    d = core.decide(cr=new, node=_facts(rec), node_pods=[], now=T0)
    (req,) = d.create
    assert (req.stage, req.previous) == ("upgrade", "0.9.0")
    assert _rec(d).packages["nvidia-tuned"].cycle == "upgrade"


def test_a_config_change_reruns_config_with_an_interrupt_only_for_matching_keys() -> None:
    pkg = {
        "version": "1.0.0",
        "image": "r/k",
        "configMap": {"a.conf": "1", "b.conf": "1"},
        "configInterrupts": {"b*": {"type": "service", "services": ["kubelet"]}},
    }
    before = nodewright(packages={"k": pkg})
    d0 = progress.desired(before)["k"]
    rec = PackageRecord(
        version="1.0.0",
        stage="config",
        state="succeeded",
        installed="1.0.0",
        config=d0.config_digest,
        config_keys=progress.config_key_digests(d0.config),
        updated=T0,
    )
    change_a = nodewright(packages={"k": {**pkg, "configMap": {"a.conf": "2", "b.conf": "1"}}})
    da = core.decide(
        cr=change_a, node=_facts(ExecutorRecord(packages={"k": rec})), node_pods=[], now=T0
    )
    assert [r.stage for r in da.create] == ["config"]
    assert _rec(da).packages["k"].interrupt == ""
    change_b = nodewright(packages={"k": {**pkg, "configMap": {"a.conf": "1", "b.conf": "2"}}})
    db = core.decide(
        cr=change_b, node=_facts(ExecutorRecord(packages={"k": rec})), node_pods=[], now=T0
    )
    assert _rec(db).packages["k"].interrupt == "service"
    assert _rec(db).packages["k"].interrupt_services == ("kubelet",)


def _at_interrupt(version: str, kind: str, services: tuple[str, ...] = ()) -> PackageRecord:
    return PackageRecord(
        version=version,
        stage="interrupt",
        state="running",
        interrupt=kind,
        interrupt_services=services,
        updated=T0,
    )


def test_interrupts_merge_into_one_reboot_that_is_judged_by_the_boot_id() -> None:
    cr = nodewright(
        packages={
            "a": {
                "version": "1.0.0",
                "image": "r/a",
                "interrupt": {"type": "service", "services": ["x"]},
            },
            "b": {"version": "1.0.0", "image": "r/b", "interrupt": {"type": "reboot"}},
        }
    )
    rec = ExecutorRecord(
        packages={
            "a": _at_interrupt("1.0.0", "service", ("x",)),
            "b": _at_interrupt("1.0.0", "reboot"),
        }
    )
    d1 = core.decide(cr=cr, node=_facts(rec, boot_id="boot-1"), node_pods=[], now=T0)
    (req,) = d1.create
    assert req.role == "interrupt"
    assert req.interrupt is not None
    assert req.interrupt.type == "reboot"
    intr = _rec(d1).interrupt
    assert intr is not None
    assert intr.boot_id_before == "boot-1"
    assert intr.packages == ("a", "b")

    # The interrupt container exits 0 but the boot ID is unchanged: not done.
    same_boot = core.decide(
        cr=cr, node=_facts(_rec(d1), boot_id="boot-1"), node_pods=[_pod(req, "Succeeded")], now=T0
    )
    assert isinstance(same_boot.record, Keep)
    # The container dies with the reboot (exit 143): still not a failure.
    killed = core.decide(
        cr=cr,
        node=_facts(_rec(d1), boot_id="boot-1"),
        node_pods=[_pod(req, "Failed", exit_code=143)],
        now=T0,
    )
    assert isinstance(killed.record, Keep)
    # New boot ID but the node is not Ready yet: not done.
    not_ready = core.decide(
        cr=cr, node=_facts(_rec(d1), boot_id="boot-2", ready=False), node_pods=[], now=T0
    )
    assert isinstance(not_ready.record, Keep)
    # New boot ID and Ready: post-interrupt for both packages.
    done = core.decide(
        cr=cr,
        node=_facts(_rec(d1), boot_id="boot-2"),
        node_pods=[_pod(req, "Failed", exit_code=143)],
        now=T0,
    )
    assert sorted((r.package, r.stage) for r in done.create) == [
        ("a", "post-interrupt"),
        ("b", "post-interrupt"),
    ]
    assert done.delete == (req.name,)


def test_an_interrupt_waits_for_packages_still_heading_for_one() -> None:
    cr = nodewright(
        packages={
            "a": {"version": "1.0.0", "image": "r/a", "interrupt": {"type": "reboot"}},
            "b": {"version": "1.0.0", "image": "r/b", "interrupt": {"type": "reboot"}},
        }
    )
    b_config = PackageRecord(
        version="1.0.0", stage="config", state="running", interrupt="reboot", updated=T0
    )
    rec = ExecutorRecord(packages={"a": _at_interrupt("1.0.0", "reboot"), "b": b_config})
    d = core.decide(cr=cr, node=_facts(rec), node_pods=[], now=T0)
    assert all(r.role != "interrupt" for r in d.create), "one reboot for both, after b's config"


def test_nothing_starts_before_the_drain_finished() -> None:
    facts = progress.facts(
        node(
            "n1",
            records={
                nodestate.SCHEDULER: SEL,
                nodestate.DRAINER: DrainRecord(
                    phase="draining", cordoned=True, started=T0, since=T0
                ),
            },
        ),
        CR,
    )
    assert core.decide(cr=nodewright(), node=facts, node_pods=[], now=T0).create == ()


def test_pod_names_are_deterministic_and_valid() -> None:
    a = pods.pod_name(
        cr=CR,
        node="n1.example.com",
        role="stage",
        package="nvidia-tuned",
        stage="post-interrupt",
        version="1.0.0",
        attempt=1,
    )
    b = pods.pod_name(
        cr=CR,
        node="n1.example.com",
        role="stage",
        package="nvidia-tuned",
        stage="post-interrupt",
        version="1.0.0",
        attempt=1,
    )
    c = pods.pod_name(
        cr=CR,
        node="n1.example.com",
        role="stage",
        package="nvidia-tuned",
        stage="post-interrupt",
        version="1.0.0",
        attempt=2,
    )
    assert a == b
    assert a != c
    assert len(a) <= 63


def test_a_config_change_cycle_waits_for_its_own_check_and_then_finishes() -> None:
    """Regression: the config stage of a config-change cycle succeeded and waiting for its
    check must not restart the cycle, and the previous cycle's passed ``config`` verdict (same
    package, version and stage) must not count for the new run."""
    pkg = {"version": "1.0.0", "image": "r/k", "configMap": {"a.conf": "1"}}
    before = nodewright(packages={"k": pkg})
    old = progress.desired(before)["k"]
    rec = ExecutorRecord(
        packages={
            "k": PackageRecord(
                version="1.0.0",
                stage="config",
                state="succeeded",
                installed="1.0.0",
                config=old.config_digest,
                config_keys=progress.config_key_digests(old.config),
                updated=T0,
            )
        }
    )
    stale = {nodestate.check_key("k", "1.0.0", "config"): "passed"}  # attempt 1, old cycle
    after = nodewright(packages={"k": {**pkg, "configMap": {"a.conf": "2"}}})
    d1 = core.decide(cr=after, node=_facts(rec, stale), node_pods=[], now=T0)
    (cfg,) = d1.create
    assert (cfg.stage, cfg.attempt) == ("config", 2)
    started = _rec(d1).packages["k"]
    assert (started.cycle, started.previous) == ("config", "1.0.0")

    # The config pod's stage succeeded; the stale verdict is about attempt 1: wait for the
    # check, do not restart.
    d2 = core.decide(
        cr=after, node=_facts(_rec(d1), stale), node_pods=[_pod(cfg, "Succeeded")], now=T0
    )
    assert isinstance(d2.record, Keep)
    assert d2.create == ()
    waiting = _facts(_rec(d1), stale).executor.packages["k"]
    assert (waiting.state, waiting.attempt) == ("running", 2)

    # Its own check (attempt 2, this cycle) passed: the new configuration is installed.
    records: dict[str, Any] = {
        nodestate.SCHEDULER: SEL,
        nodestate.DRAINER: DRAINED,
        nodestate.EXECUTOR: _rec(d1),
        nodestate.VALIDATOR: ValidatorRecord(
            checks={
                nodestate.check_key("k", "1.0.0", "config"): CheckRecord(
                    verdict="passed", at=T0, attempt=2, cycle=progress.cycle_of(started)
                )
            }
        ),
    }
    checked = progress.facts(node("n1", records=records), CR)
    done = checked.executor.packages["k"]
    assert done.previous == ""
    assert progress.package_done(progress.desired(after)["k"], done)
    d4 = core.decide(cr=after, node=checked, node_pods=[_pod(cfg, "Succeeded")], now=T0)
    assert isinstance(d4.record, Keep)
    assert d4.create == ()


def test_a_config_change_during_a_cycle_is_not_taken_as_applied_and_runs_its_own_cycle() -> None:
    """The configMap changes while an install runs: the install ends recording the digest it
    started for, so the change is still pending and runs a config cycle with the interrupt
    its changed key asks for."""
    pkg = {
        "version": "1.0.0",
        "image": "r/k",
        "configMap": {"a.conf": "1", "b.conf": "1"},
        "configInterrupts": {"b.conf": {"type": "service", "services": ["kubelet"]}},
    }
    before = nodewright(packages={"k": pkg})
    after = nodewright(packages={"k": {**pkg, "configMap": {"a.conf": "1", "b.conf": "2"}}})
    d1 = core.decide(cr=before, node=_facts(), node_pods=[], now=T0)
    (apply,) = d1.create
    checks = {nodestate.check_key("k", "1.0.0", "apply"): "passed"}
    # The change lands while apply runs; config then runs (with the new content).
    d3 = core.decide(
        cr=after, node=_facts(_rec(d1), checks), node_pods=[_pod(apply, "Succeeded")], now=T0
    )
    (cfg,) = d3.create
    assert cfg.stage == "config"
    checks[nodestate.check_key("k", "1.0.0", "config")] = "passed"
    checked = _facts(_rec(d3), checks)
    ended = checked.executor.packages["k"]
    assert ended.installed == "1.0.0"
    assert ended.config == progress.desired(before)["k"].config_digest
    assert (ended.cycle_config, ended.cycle_keys) == ("", {})
    assert not progress.package_done(progress.desired(after)["k"], ended)

    # The ended install is read from the verdict; the config cycle starts in the same pass.
    d5 = core.decide(cr=after, node=checked, node_pods=[_pod(cfg, "Succeeded")], now=T0)
    (again,) = d5.create
    assert (again.stage, again.attempt) == ("config", 2)
    started = _rec(d5).packages["k"]
    assert (started.installed, started.previous) == ("1.0.0", "1.0.0")
    assert (started.cycle, started.interrupt, started.interrupt_services) == (
        "config",
        "service",
        ("kubelet",),
    )


@pytest.mark.parametrize(
    ("order", "env"),
    [
        pytest.param(0, "0", id="the-first-node"),
        pytest.param(7, "7", id="the-eighth-node"),
        pytest.param(None, None, id="unknown-is-not-passed"),
    ],
)
def test_stage_pods_get_the_node_order_of_the_admission(order: int | None, env: str | None) -> None:
    cr = nodewright()
    sel = msgspec.structs.replace(SEL, order=order)
    facts = progress.facts(
        node("n1", records={nodestate.SCHEDULER: sel, nodestate.DRAINER: DRAINED}), CR
    )
    (req,) = core.decide(cr=cr, node=facts, node_pods=[], now=T0).create
    assert req.node_order == order
    pod = podspec.stage_pod(
        req,
        cr=cr,
        node="n1",
        node_annotations={},
        settings=podspec.PodSettings(namespace="nw", agent_image="registry.example/agent:1"),
        node_metadata="{}",
    )
    values = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert values.get("NODEWRIGHT_NODE_ORDER") == env
    assert values["NODEWRIGHT_TO_VERSION"] == "0.9.0"
