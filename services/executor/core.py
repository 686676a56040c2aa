"""The executor's decisions, as data: which package stage pods to start, what their
outcome means, and when the node's interrupt runs.

For one (NodeWright, node) pair it reads the desired packages, the node's facts (its
executor record, the validator's check verdicts, its boot ID) and the NodeWright pods on the
node, and returns the new executor record, the pods to create and delete, and the events to
publish. Rules:

- A package runs a *cycle* of stages: install ``apply -> config``, upgrade
  ``upgrade -> config`` (from the installed version), or re-configure ``config``; each
  followed by ``interrupt -> post-interrupt`` when the cycle needs an interrupt; or
  uninstall ``uninstall`` (then the package's interrupt, no post-interrupt) when requested,
  after which the package's record is removed. An uninstall cancelled while its
  ``uninstall`` stage is current installs the package again from ``apply``. A stage's next
  one starts only after the validator passed the stage's check. The check of a cycle's last
  stage ends the cycle by itself: every service reads the package as installed from that
  verdict (``shared.progress.finished_cycles``), so the executor writes no step for it.
- A NodeWright being deleted wants its uninstall-enabled packages uninstalled and nothing
  else (``shared.progress.desired``): the same uninstall cycles run; the scheduler owns the
  finalizer and removes it once they finished everywhere.
- ``dependsOn`` is a DAG: a package starts once its dependencies are done on the node;
  independent packages run in parallel.
- Interrupts of all packages due on the node merge into one (reboot > restartAllServices >
  union of services > noop) and run once, after no other stage is running. A reboot is done
  only when the node's boot ID changed and the node is Ready again — never because a
  container exited.
- A stage's pod runs the stage, then the stage's check (``shared.pods.parts``): the
  executor judges the stage and keeps the pod until the validator's verdict on its check
  (a failed one: until a retry, for its logs). A stage that exited 0 is not written: the
  check's verdict records it (``shared.progress.finished_cycles``), and the executor says
  ``stage.succeeded`` from the pod (:attr:`Decision.announce`), before the pod goes. A pod
  lost while its check runs is made again (the record still says the stage runs). A stage
  that fails, cannot pull its image for ``image_pull_grace_s``, or exceeds the stage
  timeout fails the package with a machine-readable reason naming the image, exit code or
  timeout.
- Recovery requests (``shared.nodestate.Request``) newer than the record's ``honoured`` mark
  are honoured before anything else (:func:`honour`): retry turns every failed stage, stage
  whose check failed, or failed interrupt into a new attempt (pod names include the attempt;
  a verdict counts only for the attempt it is about); reset forgets the record; rerun
  restarts one package's cycle, or one stage of it. New work waits until the drainer and
  the validator have honoured the same requests, so a reset never runs stages on a node
  about to be drained again, nor finishes before its validation was forgotten.

- With ``spec.drain.prePullImages`` a node the drainer has gets a pod that pulls the images
  of its packages with work left (:func:`_pull`); the drainer waits for it before it evicts
  anything, and it goes once the drain is over.

- Package ConfigMaps (one per configuration of a package, named by its digest) that no
  NodeWright wants any more and no pod mounts are deleted (:func:`sweep_config_maps`), once
  they were so at two sweeps in a row; a deleted NodeWright's go with it (owner reference).

Pure: no I/O, ``now`` passed in. The shell writes the record before creating pods, so a
crash in between recreates the same deterministic pod instead of losing track of it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

import msgspec
from msgspec.structs import replace as update

from shared import api, events, nodestate, pods, progress, reasons, recovery
from shared.decisions import Keep, RecordChange, Remove, Work, Write
from shared.events import Reason
from shared.nodestate import Request, Requests, check_key
from shared.pods import PodKey, PodView
from shared.podspec import PodRequest, config_map_name
from shared.progress import Desired, NodeFacts
from shared.records.executor import Cycle, ExecutorRecord, InterruptRecord, PackageRecord

INTERRUPT_STAGE = progress.INTERRUPT_STAGE
POST_INTERRUPT = progress.POST_INTERRUPT
_FIRST_STAGE: dict[Cycle, str] = {
    "install": "apply",
    "upgrade": "upgrade",
    "config": "config",
    "uninstall": "uninstall",
}
# Stages whose pod is still meaningful to look at after they are recorded.
_MESSAGE_TAIL = 512
_FIX_HINT = (
    "; fix the package spec (a change to it starts the stage over by itself) or run "
    "`nodewright node retry`"
)


@dataclass(frozen=True)
class Decision:
    record: RecordChange = field(default_factory=Keep)
    create: tuple[PodRequest, ...] = ()
    delete: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()
    """Pods to stop and keep, for their logs (:attr:`shared.decisions.NodeDecision.stop`)."""
    settled: frozenset[str] = frozenset()
    """Among :attr:`delete`: the pods the record already moved past (:func:`_settled`)."""
    publish: tuple[events.Event, ...] = ()
    announce: Mapping[str, tuple[events.Event, ...]] = field(default_factory=dict)
    """By pod name, what the pod says, published without a write (:func:`_announce`):
    ``stage.succeeded`` of each stage of a pod that runs its check, ``stage.started`` of
    each stage after the first. The shell deletes such a pod only once the stream holds its
    events."""
    requeue_after: float | None = None
    problem: str = ""
    """Why nothing can be decided (for the shell to log), e.g. an undecodable record."""


@dataclass(kw_only=True)
class _Work(Work):
    """The executor's pass: the package and interrupt records as they change."""

    packages: dict[str, PackageRecord]
    interrupt: InterruptRecord | None
    parts: dict[str, list[PodView]] = field(default_factory=dict)
    """By pod name, the stage parts of each pod on the node, in the order they run."""
    stop: set[str] = field(default_factory=set)
    """Pods to stop and keep for their logs (a stage that timed out or was aborted, a check
    that timed out): :attr:`Decision.stop` once they run."""

    def halt(self, pod: str) -> None:
        """Stop ``pod`` (if it still runs) and keep it."""
        self.keep.add(pod)
        self.stop.add(pod)


def pod_name(cr: str, node: str, req: PodRequest) -> str:
    return pods.pod_name(
        cr=cr,
        node=node,
        role=req.role,
        package=req.package,
        stage=req.stage,
        version=req.version,
        attempt=req.attempt,
        cycle=req.cycle,
    )


def _first_stage(d: Desired, r: PackageRecord | None) -> tuple[str, Cycle]:
    """(stage, cycle) that starts the work ``d`` needs on top of ``r``."""
    if r is None or not r.installed:
        return "apply", "install"
    if r.installed != d.version:
        newer = api.parse_version(d.version) > api.parse_version(r.installed)
        return ("upgrade", "upgrade") if newer else ("apply", "install")
    return "config", "config"


def _cycle_finished(r: PackageRecord) -> bool:
    """The record's last cycle ran all its stages. A cycle on an installed package starts
    with ``previous`` = the installed version and :func:`_advance` clears it at the end; a
    succeeded stage waiting for its check is mid-cycle."""
    return r.state == "succeeded" and r.installed == r.version and not r.previous


def _needs_new_cycle(d: Desired, r: PackageRecord) -> bool:
    if r.version != d.version:
        return True
    # Same version, finished, but the configuration changed since.
    return _cycle_finished(r) and r.config != d.config_digest


def _start_cycle(w: _Work, d: Desired, r: PackageRecord | None) -> PackageRecord:
    stage, cycle = _first_stage(d, r)
    intr = progress.cycle_interrupt(d, r)
    # The last cycle's final stage keeps its check verdict (and its pod name) for this
    # version: a new cycle starting with the same stage runs as the next attempt, so neither
    # the old verdict nor the old pod is taken for the new run's.
    same = r is not None and r.version == d.version and r.stage == stage
    return PackageRecord(
        version=d.version,
        stage=stage,
        state="running",
        attempt=r.attempt + 1 if same and r is not None else 1,
        installed=r.installed if r else "",
        config=r.config if r else "",
        config_keys=dict(r.config_keys) if r else {},
        previous=r.installed if r else "",
        cycle=cycle,
        interrupt=intr.type if intr else "",
        interrupt_services=tuple(intr.services) if intr else (),
        cycle_config=d.config_digest,
        cycle_keys=progress.config_key_digests(d.config),
        updated=w.now,
        spec=d.spec_digest,
        cycle_started=w.now,
    )


def _start_uninstall(w: _Work, d: Desired, r: PackageRecord) -> PackageRecord:
    """The uninstall cycle of an installed package: ``uninstall``, then the package's
    interrupt if it declares one; the record is dropped once it finished."""
    return PackageRecord(
        version=d.version,
        stage="uninstall",
        state="running",
        attempt=1,
        installed=r.installed,
        config=r.config,
        config_keys=dict(r.config_keys),
        previous=r.installed,
        cycle="uninstall",
        interrupt=d.interrupt.type if d.interrupt else "",
        interrupt_services=tuple(d.interrupt.services) if d.interrupt else (),
        updated=w.now,
        spec=d.spec_digest,
        cycle_started=w.now,
    )


def _cancel_uninstall(w: _Work, d: Desired, r: PackageRecord) -> PackageRecord:
    """An uninstall cancelled before its interrupt: the package is installed again from
    ``apply`` (the uninstall steps may have removed part of it)."""
    return PackageRecord(
        version=d.version,
        stage="apply",
        state="running",
        attempt=1,
        installed=r.installed,
        config=r.config,
        config_keys=dict(r.config_keys),
        previous=r.installed,
        cycle="install",
        interrupt=d.interrupt.type if d.interrupt else "",
        interrupt_services=tuple(d.interrupt.services) if d.interrupt else (),
        cycle_config=d.config_digest,
        cycle_keys=progress.config_key_digests(d.config),
        updated=w.now,
        spec=d.spec_digest,
        cycle_started=w.now,
    )


def _uninstall(
    w: _Work,
    desired: Mapping[str, Desired],
    d: Desired,
    r: PackageRecord | None,
    may_start: bool,
) -> bool:
    """Uninstall requests and their cancellation; True when ``d`` needs nothing else now.

    Requested: a package not mid-stage starts its uninstall cycle once every package that
    depends on it and is being uninstalled too is gone. Cancelled while the uninstall stage
    is the current one (before the interrupt): once its pod finished, the package is
    installed again. Later than that, the uninstall runs to its end.
    """
    if r is None:
        return False
    if d.uninstall_requested and r.cycle != "uninstall":
        if r.state == "running":
            return False  # let the stage (or interrupt) in flight finish first
        dependents_gone = all(
            progress.package_done(o, w.packages.get(o.name))
            for o in desired.values()
            if d.name in o.depends_on and o.uninstall_requested
        )
        if may_start and dependents_gone and r.state == "succeeded":
            new = _start_uninstall(w, d, r)
            w.packages[d.name] = new
            _request_stage(w, d, new)
        return True
    if not d.uninstall_requested and r.cycle == "uninstall" and r.stage == "uninstall":
        if r.state == "running":
            return False  # the uninstall pod finishes first, then the package is reinstalled
        if may_start:
            new = _cancel_uninstall(w, d, r)
            w.packages[d.name] = new
            _request_stage(w, d, new)
        return True
    return False


def _uninstalled(w: _Work, d: Desired) -> None:
    """The uninstall cycle finished (its stage checked, its interrupt done): the package is
    absent from the node, so its record goes."""
    w.packages.pop(d.name, None)


def _stage_timeout(cr: api.NodeWright, d: Desired) -> int:
    return d.spec.stage_timeout_seconds or cr.spec.stage_timeout_seconds


def _request_stage(w: _Work, d: Desired, r: PackageRecord) -> None:
    req = PodRequest(
        role="stage",
        package=d.name,
        stage=r.stage,
        version=r.version,
        attempt=r.attempt,
        image=d.image,
        previous=r.previous,
        desired=d,
        node_order=w.node.selection.order if w.node.selection is not None else None,
        cycle=progress.cycle_of(r),
        # A record of an earlier version (no cycle) runs one stage per pod, as it did.
        stages=progress.segment(r) if r.cycle_started is not None else (),
    )
    req = replace(req, name=pod_name(w.cr.metadata.name, w.node.name, req))
    w.start(req)
    # Stamped with when the record says the run started: a pod made again (lost, or never
    # made) says the same event, which the stream is looked up for once the first one is
    # older than its deduplication window, instead of a new one it would store a second time.
    w.out.events.append(_started(w, d.name, r.version, r.stage, r.attempt, req.name, r.updated))


def _started(
    w: _Work, package: str, version: str, stage: str, attempt: int, pod: str, at: datetime
) -> events.StageStarted:
    """``stage.started`` of a run of ``stage`` in ``pod``, started ``at``."""
    return w.out.make(
        events.StageStarted,
        package,
        version,
        stage,
        attempt,
        "started",
        at=at,
        package=package,
        version=version,
        stage=stage,
        pod=pod,
        attempt=attempt,
    )


def _failed(
    w: _Work, d: Desired, r: PackageRecord, reason: Reason, started: datetime | None = None
) -> PackageRecord:
    """``r`` with its stage failed for ``reason`` (``started``: when the stage started, if
    not when the record says)."""
    w.out.emit(
        events.StageFailed,
        d.name,
        r.version,
        r.stage,
        r.attempt,
        "failed",
        package=d.name,
        version=r.version,
        stage=r.stage,
        reason=reason,
        attempt=r.attempt,
        started=started or r.updated,
    )
    return update(r, state="failed", reason=reason, updated=w.now)


def _pod_failure(pod: PodView, *, now: datetime, image_pull_grace_s: float) -> Reason | None:
    ref = (pods.pods_kind_ref(pod),)
    if pod.phase == "Failed":
        said, details = pods.agent_outcome(pod)
        text = f"pod {pod.name} exited with code {pod.exit_code}: {said}".rstrip(": ")
        return Reason(
            code=reasons.STAGE_FAILED,
            message=text[: _MESSAGE_TAIL - len(_FIX_HINT)] + _FIX_HINT,
            objects=ref,
            details={"exitCode": str(pod.exit_code), **details},
        )
    return pods.start_failure(pod, now=now, grace_s=image_pull_grace_s)


def _pod_missing_too_long(w: _Work, d: Desired, r: PackageRecord) -> bool:
    """A running stage has had no pod for its whole timeout: every create was refused (a
    ResourceQuota, an admission policy that forbids privileged pods, an invalid spec)."""
    elapsed = (w.now - r.updated).total_seconds()
    timeout = _stage_timeout(w.cr, d)
    if elapsed < timeout:
        w.later(max(1.0, timeout - elapsed))
        return False
    return True


def _no_pod(w: _Work, d: Desired, r: PackageRecord) -> Reason:
    timeout = _stage_timeout(w.cr, d)
    return Reason(
        code=reasons.STAGE_TIMEOUT,
        message=(
            f"stage {r.stage} of {d.name} {r.version} had no pod after {timeout}s: "
            "the API server refused to create it (a ResourceQuota or an admission policy on "
            "privileged pods in NodeWright's namespace?; the executor's log says why), or it "
            "was deleted while its check ran; run `nodewright node retry` once the cause is gone"
        ),
        details={"timeoutSeconds": str(timeout), "pod": "missing"},
    )


def _announce(w: _Work, pod: str) -> None:
    """What ``pod`` says of its stages, as it says it: ``stage.started`` of each stage after
    the first that started (the first's start is recorded, with its event, by the write that
    made the pod) and ``stage.succeeded`` of each stage that exited 0, each stamped with
    when it happened in the pod, so every pass (of any replica, after any restart) makes the
    same events, and the stream keeps one of each (deterministic ids; an old one is looked
    up before it is sent again)."""
    views = w.parts.get(pod, ())
    for i, part in enumerate(views):
        if not part.checked or (i > 0 and part.created is None):
            return  # a pod without checks is recorded by writes; a stage not reached
        facts = (part.package, part.version, part.stage, part.attempt)
        if i > 0 and part.created is not None:
            w.say(pod, _started(w, *facts, part.name, part.created))
        if part.phase != "Succeeded":
            return
        w.say(
            pod,
            w.out.make(
                events.StageSucceeded,
                *facts,
                "ok",
                at=part.ended or part.created or w.now,
                package=part.package,
                version=part.version,
                stage=part.stage,
                attempt=part.attempt,
                started=part.created,
            ),
        )


def _observe_stage(
    w: _Work,
    d: Desired,
    r: PackageRecord,
    pod: PodView | None,
    pods_by: Mapping[PodKey, PodView],
    grace: float,
) -> PackageRecord:
    """Fold a running stage's pod into the record: ``pod`` is its view of the record's
    stage. In a pod that runs checks the stages that follow one another in it are judged
    in turn, each from its own start; what succeeds is said from the pod (:func:`_announce`),
    not written: the validator's verdict on the last check records it
    (``progress.finished_cycles``). A stage that fails is recorded as the record's stage."""
    if pod is None:
        return r
    w.keep.add(pod.name)
    if not (pod.checked and progress.cycle_of(r)):
        return _observe_unchecked(w, d, r, pod, grace)
    _announce(w, pod.name)
    part = pod
    while part.phase == "Succeeded":
        # Its check runs now, in this pod, then the pod's next stage if it has one.
        nxt = pods_by.get((d.name, part.then, r.version, r.attempt, progress.cycle_of(r)))
        if not part.then or nxt is None or nxt.name != pod.name or nxt.created is None:
            return r  # the check runs, or ended: the validator's to record
        part = nxt
    first = part is pod
    at = r if first else update(r, stage=part.stage)
    started = r.updated if first else (part.created or r.updated)
    return _judged(w, d, at, part, started, grace) or r


def _judged(
    w: _Work, d: Desired, r: PackageRecord, part: PodView, started: datetime, grace: float
) -> PackageRecord | None:
    """``r`` with its stage failed when ``part`` (the stage's part of its pod, started at
    ``started``) failed, cannot start, or ran past the stage's timeout; None while it runs."""
    failure = _pod_failure(part, now=w.now, image_pull_grace_s=grace)
    if failure is not None:
        return _failed(w, d, r, failure, started=started)
    timeout = _stage_timeout(w.cr, d)
    elapsed = (w.now - started).total_seconds()
    if elapsed >= timeout:
        # Stopped, not deleted: a timed-out stage must not finish later unseen, and what it
        # printed is what tells why it hung (`nodewright package logs`).
        w.halt(part.name)
        return _failed(
            w,
            d,
            r,
            Reason(
                code=reasons.STAGE_TIMEOUT,
                message=f"stage {r.stage} of {d.name} {r.version} ran longer than {timeout}s",
                objects=(pods.pods_kind_ref(part),),
                details={"timeoutSeconds": str(timeout)},
            ),
            started=started,
        )
    if part.image_pull_failed:
        w.later(max(0.5, grace - ((w.now - part.created).total_seconds() if part.created else 0)))
    w.later(max(1.0, timeout - elapsed))
    return None


def _observe_unchecked(
    w: _Work, d: Desired, r: PackageRecord, pod: PodView, grace: float
) -> PackageRecord:
    """A pod without a check container, or a record without a cycle (both of an earlier
    version): its stage's end is recorded here; the validator judges the check of a
    succeeded stage (a pod without one fails it as a pod that went away)."""
    if pod.phase == "Succeeded":
        w.out.emit(
            events.StageSucceeded,
            d.name,
            r.version,
            r.stage,
            r.attempt,
            "ok",
            package=d.name,
            version=r.version,
            stage=r.stage,
            attempt=r.attempt,
            started=r.updated,
        )
        return update(r, state="succeeded", reason=None, updated=w.now)
    return _judged(w, d, r, pod, r.updated, grace) or r


def _advance(w: _Work, d: Desired, r: PackageRecord) -> PackageRecord:
    """A stage succeeded and its check passed: move to the next stage, or finish."""
    nxt = progress.next_stage(r)
    if nxt is None:
        # What the cycle started for counts as applied, not what the CR says now: a
        # configMap changed mid-cycle then differs and runs its own config cycle. The
        # services reach this only with records from before cycle_config existed
        # (progress.finished_cycles ends the others as they are read); those fall back to
        # the current configMap.
        started_for = bool(r.cycle_config)
        return update(
            progress.finish_cycle(
                r,
                config=r.cycle_config if started_for else d.config_digest,
                config_keys=r.cycle_keys if started_for else progress.config_key_digests(d.config),
            ),
            updated=w.now,
        )
    if nxt == INTERRUPT_STAGE:
        return update(
            r, stage=INTERRUPT_STAGE, state="running", attempt=1, updated=w.now, spec=d.spec_digest
        )
    new = update(r, stage=nxt, state="running", attempt=1, updated=w.now, spec=d.spec_digest)
    _request_stage(w, d, new)
    return new


def _settled(records: Mapping[str, PackageRecord], pod: PodView) -> bool:
    """``pod`` (a stage part of a pod, :func:`shared.pods.parts`) is a finished stage whose
    outcome its package's record folded in, or whose stage or attempt that record moved
    past: no later record needs its pod (when one of a pod's parts is such, the pod is), so
    deleting it needs no fence. Anything else (a pod of another cycle, a running one) goes
    after the fence write."""
    r = records.get(pod.package)
    if pod.role != "stage" or pod.phase not in ("Succeeded", "Failed") or r is None:
        return False
    folded = pod.stage == r.stage and pod.attempt == r.attempt and r.state != "running"
    same_cycle = bool(pod.cycle) and pod.cycle == progress.cycle_of(r) and pod.version == r.version
    return (same_cycle and folded) or progress.stage_passed(
        r, stage=pod.stage, version=pod.version, attempt=pod.attempt, cycle=pod.cycle
    )


def _stopped(r: PackageRecord) -> bool:
    """``r`` failed while its pod still ran: it timed out, or someone aborted it."""
    return r.reason is not None and r.reason.code in (reasons.STAGE_TIMEOUT, reasons.STAGE_ABORTED)


def _key(r: PackageRecord, name: str) -> PodKey:
    return progress.pod_key(name, r)


def _spec_changed(w: _Work, d: Desired, r: PackageRecord) -> bool:
    """The package failed (its stage, or its check, for this attempt) with a spec the CR
    no longer has: the fix is in, the stage starts over by itself as a new attempt."""
    if not progress.stale_failure(d, r) or r.version != d.version:
        return False
    if r.state == "failed":
        return True
    verdict = w.node.validator.checks.get(check_key(d.name, r.version, r.stage))
    return (
        r.state == "succeeded"
        and verdict is not None
        and verdict.verdict == "failed"
        and progress.verdict_about(r, verdict)
    )


def _packages(
    w: _Work,
    desired: Mapping[str, Desired],
    pods_by: Mapping[PodKey, PodView],
    grace: float,
    may_start: bool,
) -> None:
    for name, d in desired.items():
        r = w.packages.get(name)
        if progress.package_done(d, r):
            continue
        deps_done = all(
            progress.package_done(desired[dep], w.packages.get(dep))
            for dep in d.depends_on
            if dep in desired
        )
        if _uninstall(w, desired, d, r, may_start):
            continue
        if r is None or _needs_new_cycle(d, r):
            if may_start and deps_done:
                r = _start_cycle(w, d, r)
                w.packages[name] = r
                _request_stage(w, d, r)
            continue
        if _spec_changed(w, d, r):
            if may_start:
                again = _again(r, w.now, spec=d.spec_digest)
                w.packages[name] = again
                if again.stage == INTERRUPT_STAGE:
                    w.interrupt = None  # its failed run was about the old spec
                else:
                    _request_stage(w, d, again)
            continue
        if r.state == "failed" or r.stage == INTERRUPT_STAGE:
            if r.state == "failed":
                pod = pods_by.get(_key(r, name))
                # Failed pods stay for their logs until a retry; but a stage that timed out
                # or was aborted may still run: its pod is stopped (the step's processes on
                # the host with it) and kept, in a later pass if the one that failed it
                # could not stop it yet.
                if pod is not None:
                    w.keep.add(pod.name)
                    if _stopped(r):
                        w.halt(pod.name)
            continue
        if r.state == "running":
            pod = pods_by.get(_key(r, name))
            if pod is not None and pod.spec and pod.spec != d.pod_digest and may_start:
                # The package's image, environment or resources changed under its running
                # stage (a fixed image for a step that hangs, say): the pod runs what was
                # replaced. It goes (not kept: deleted, its steps with it) and the stage
                # starts over as a new attempt, rather than finish, or hang until its
                # timeout, on the old one.
                again = _again(r, w.now, spec=d.spec_digest)
                w.packages[name] = again
                _request_stage(w, d, again)
                continue
            if pod is None and may_start:
                if _pod_missing_too_long(w, d, r):
                    w.packages[name] = _failed(w, d, r, _no_pod(w, d, r))
                    continue
                _request_stage(w, d, r)  # lost or never created: same deterministic name
                continue
            w.packages[name] = _observe_stage(w, d, r, pod, pods_by, grace)
            continue
        # succeeded: the check runs in the stage's pod; wait for the validator's verdict on
        # this attempt's check
        verdict = w.node.validator.checks.get(check_key(name, r.version, r.stage))
        if verdict is None or verdict.verdict != "passed" or not progress.verdict_about(r, verdict):
            pod = pods_by.get(_key(r, name))
            timed_out = (
                verdict is not None
                and verdict.reason is not None
                and verdict.reason.code == reasons.CHECK_TIMEOUT
                and progress.verdict_about(r, verdict)
            )
            if pod is not None:
                w.keep.add(pod.name)  # its check runs, or failed: kept for its logs
                if timed_out:
                    # A check that timed out is stopped: neither it nor a stage after it in
                    # its pod may go on unseen.
                    w.halt(pod.name)
                _announce(w, pod.name)
            continue
        if may_start:
            if r.cycle == "uninstall" and progress.next_stage(r) is None:
                _uninstalled(w, d)
                continue
            w.packages[name] = _advance(w, d, r)


def _interrupt_of(r: PackageRecord) -> api.Interrupt:
    return msgspec.convert(
        {"type": r.interrupt, "services": list(r.interrupt_services)}, api.Interrupt
    )


def _interrupt_id(packages: Sequence[str], records: Mapping[str, PackageRecord]) -> str:
    text = ",".join(f"{n}={records[n].version}/{records[n].cycle}" for n in sorted(packages))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _interrupt(
    w: _Work,
    desired: Mapping[str, Desired],
    pods_by: Mapping[PodKey, PodView],
    grace: float,
    may_start: bool,
) -> None:
    due = sorted(
        n
        for n, r in w.packages.items()
        if n in desired and r.stage == INTERRUPT_STAGE and r.state == "running"
    )
    intr = w.interrupt
    if intr is not None and intr.state == "running":
        _observe_interrupt(w, intr, pods_by, grace)
        return
    if not due or not may_start:
        return
    # Merge: wait while any other package is mid-stage or still heading for an interrupt.
    for n, r in w.packages.items():
        if n in due or n not in desired:
            continue
        if r.state == "running" or (
            r.interrupt
            and r.stage in ("apply", "upgrade", "config", "uninstall")
            and r.state != "failed"
        ):
            return
    merged = progress.merge_interrupts([_interrupt_of(w.packages[n]) for n in due])
    assert merged is not None
    iid = _interrupt_id(due, w.packages)
    # A retried interrupt runs as a new attempt: its packages' attempts were raised.
    attempt = max(w.packages[n].attempt for n in due)
    record = InterruptRecord(
        type=merged.type,
        services=tuple(merged.services),
        state="running",
        boot_id_before=w.node.boot_id,
        packages=tuple(due),
        started=w.now,
        attempt=attempt,
    )
    w.interrupt = record
    req = PodRequest(
        role="interrupt",
        package="",
        stage=INTERRUPT_STAGE,
        version=iid,
        attempt=attempt,
        interrupt=merged,
        cycle=record.started.isoformat(),
    )
    req = replace(req, name=pod_name(w.cr.metadata.name, w.node.name, req))
    w.start(req)
    w.out.emit(
        events.StageStarted,
        "interrupt",
        iid,
        "started",
        package=",".join(due),
        version=iid,
        stage=INTERRUPT_STAGE,
        pod=req.name,
    )


def _observe_interrupt(
    w: _Work,
    intr: InterruptRecord,
    pods_by: Mapping[PodKey, PodView],
    grace: float,
) -> None:
    iid = (
        _interrupt_id(intr.packages, w.packages)
        if all(p in w.packages for p in intr.packages)
        else ""
    )
    pod = pods_by.get(("", INTERRUPT_STAGE, iid, intr.attempt, intr.started.isoformat()))
    if pod is None:
        # An interrupt started by a version that did not name its pods by their start.
        pod = pods_by.get(("", INTERRUPT_STAGE, iid, intr.attempt, ""))
    if pod is not None:
        w.keep.add(pod.name)
    timeout = max(
        (_stage_timeout(w.cr, d) for d in progress.desired(w.cr).values()),
        default=w.cr.spec.stage_timeout_seconds,
    )
    elapsed = (w.now - intr.started).total_seconds()
    done = False
    if intr.type == "reboot":
        # Judged by the node, never by the container: it may die with the reboot.
        done = bool(intr.boot_id_before) and w.node.boot_id != intr.boot_id_before and w.node.ready
    elif pod is not None and pod.phase == "Succeeded":
        done = w.node.ready
    failure: Reason | None = None
    if not done and pod is not None:
        failure = _pod_failure(pod, now=w.now, image_pull_grace_s=grace)
        if failure is not None and intr.type == "reboot" and failure.code == reasons.STAGE_FAILED:
            failure = None  # a reboot kills its own pod; only the boot ID counts
    if not done and failure is None and elapsed >= timeout:
        failure = Reason(
            code=reasons.REBOOT_TIMEOUT if intr.type == "reboot" else reasons.INTERRUPT_TIMEOUT,
            message=f"{intr.type} interrupt not complete after {timeout}s"
            + (" (boot ID unchanged or node not Ready)" if intr.type == "reboot" else ""),
            details={"timeoutSeconds": str(timeout), "bootIdBefore": intr.boot_id_before},
        )
    if failure is not None:
        w.interrupt = update(intr, state="failed", reason=failure)
        for n in intr.packages:
            if n in w.packages:
                w.packages[n] = update(w.packages[n], state="failed", reason=failure, updated=w.now)
        w.out.emit(
            events.StageFailed,
            "interrupt",
            iid,
            "failed",
            package=",".join(intr.packages),
            version=iid,
            stage=INTERRUPT_STAGE,
            reason=failure,
        )
        return
    if not done:
        w.later(min(5.0, max(1.0, timeout - elapsed)))
        return
    w.interrupt = update(intr, state="succeeded")
    if pod is not None:
        w.keep.discard(pod.name)
    w.out.emit(
        events.StageSucceeded,
        "interrupt",
        iid,
        "ok",
        package=",".join(intr.packages),
        version=iid,
        stage=INTERRUPT_STAGE,
    )
    desired = progress.desired(w.cr)
    for n in intr.packages:
        r = w.packages.get(n)
        d = desired.get(n)
        if r is None or d is None or r.stage != INTERRUPT_STAGE:
            continue
        if r.cycle == "uninstall":
            _uninstalled(w, d)  # an uninstall has no post-interrupt stage
            continue
        new = update(
            r, stage=POST_INTERRUPT, state="running", attempt=1, updated=w.now, spec=d.spec_digest
        )
        w.packages[n] = new
        _request_stage(w, d, new)


# ---- recovery requests ----------------------------------------------------------------


def _again(r: PackageRecord, now: datetime, **changes: object) -> PackageRecord:
    """``r`` running again as a new attempt (new pod names), without its old reason."""
    return update(r, state="running", attempt=r.attempt + 1, reason=None, updated=now, **changes)


def _retry(
    record: ExecutorRecord, desired: Mapping[str, Desired], checks: progress.Verdicts, now: datetime
) -> ExecutorRecord:
    packages = dict(record.packages)
    interrupt = record.interrupt
    for name, r in record.packages.items():
        d = desired.get(name)
        if d is None or d.version != r.version:
            continue  # failures of versions no longer wanted do not count anyway
        verdict = checks.get(check_key(name, r.version, r.stage))
        check_failed = (
            r.state == "succeeded"
            and verdict is not None
            and verdict.verdict == "failed"
            and progress.verdict_about(r, verdict)
        )
        if r.state == "failed" or check_failed:
            packages[name] = _again(r, now, spec=d.spec_digest)
    if interrupt is not None and interrupt.state == "failed":
        interrupt = None  # its packages, failed with it, start a new one as a new attempt
    return update(record, packages=packages, interrupt=interrupt)


def _rerun(
    record: ExecutorRecord, desired: Mapping[str, Desired], req: Request, now: datetime
) -> ExecutorRecord:
    r = record.packages.get(req.package)
    d = desired.get(req.package)
    if r is None or d is None or r.version != d.version or d.uninstall_requested:
        return record  # nothing of it here yet, or a new cycle is due anyway
    # A rerun is a run of its own (cycle_started): its stages' attempts follow the
    # current stage's, and a verdict the validator still holds on the same stage and attempt
    # of this cycle (a stage passed before a later one failed) must not count for it.
    if req.stage:
        if req.stage not in nodestate.RERUN_STAGES:
            return record
        new = _again(r, now, stage=req.stage, previous=r.previous or r.installed, cycle_started=now)
    elif _cycle_finished(r):
        # Finished: run its install again, with the interrupt the package declares.
        new = _again(
            r,
            now,
            stage="apply",
            cycle="install",
            previous=r.installed,
            interrupt=d.interrupt.type if d.interrupt else "",
            interrupt_services=tuple(d.interrupt.services) if d.interrupt else (),
            cycle_config=d.config_digest,
            cycle_keys=progress.config_key_digests(d.config),
            cycle_started=now,
        )
    else:
        new = _again(r, now, stage=_FIRST_STAGE[r.cycle], cycle_started=now)
    return update(record, packages={**record.packages, req.package: new})


def honour(
    record: ExecutorRecord,
    requests: Requests,
    *,
    desired: Mapping[str, Desired],
    checks: progress.Verdicts,
    now: datetime,
    reached: Mapping[str, str] | None = None,
) -> ExecutorRecord:
    """``record`` after the recovery requests newer than its mark, marked as honoured.
    ``reached``: by package, the stage its running pod has reached, when past the record's
    (a segment pod's later stages are not written when they start): what an abort fails."""

    def step(rec: ExecutorRecord, req: Request) -> ExecutorRecord:
        match req.action:
            case "retry":
                return _retry(rec, desired, checks, now)
            case "reset":
                return ExecutorRecord(reset_boot=rec.reset_boot)
            case "rerun":
                return _rerun(rec, desired, req, now)
            case "abort":
                return _abort(rec, req, now, reached or {})

    return recovery.honour(record, requests, step)


def _abort(
    record: ExecutorRecord, req: Request, now: datetime, reached: Mapping[str, str]
) -> ExecutorRecord:
    """``record`` with what runs now failed, reason StageAborted: the running stage of
    ``req.package`` (of every package when it names none; the stage its pod has
    ``reached``, as a failure there would be recorded), and the running interrupt of
    those packages (with every package it was merged for, as its timeout would). Their
    pods are stopped and kept by the passes after (:func:`_stopped`); what a stage already
    did on the host stays done, and a reboot already asked for happens anyway."""
    who = req.by or "a user"

    def reason(what: str) -> Reason:
        return Reason(
            code=reasons.STAGE_ABORTED,
            message=(
                f"{what} stopped by {who} (`nodewright node abort`, request {req.seq}); its "
                "pod is kept for its logs; `nodewright node retry` runs it again"
            ),
            details={"request": str(req.seq), "by": who},
        )

    def chosen(name: str) -> bool:
        return not req.package or name == req.package

    packages = dict(record.packages)
    interrupt = record.interrupt
    if (
        interrupt is not None
        and interrupt.state == "running"
        and any(chosen(n) for n in interrupt.packages)
    ):
        why = reason(f"the {interrupt.type} interrupt of {', '.join(interrupt.packages)}")
        interrupt = update(interrupt, state="failed", reason=why)
        for n in interrupt.packages:
            if n in packages:
                packages[n] = update(packages[n], state="failed", reason=why, updated=now)
    for name, r in record.packages.items():
        if chosen(name) and packages[name].state == "running":
            stage = reached.get(name, r.stage)
            why = reason(f"stage {stage} of {name} {r.version}")
            packages[name] = update(r, stage=stage, state="failed", reason=why, updated=now)
    return update(record, packages=packages, interrupt=interrupt)


def _aborted(before: ExecutorRecord, after: ExecutorRecord, out: events.Emitter) -> None:
    """Say ``stage.failed`` of each stage :func:`_abort` failed between the two records."""
    for name, r in sorted(after.packages.items()):
        was = before.packages.get(name)
        if r.reason is None or r.reason.code != reasons.STAGE_ABORTED or was == r:
            continue
        out.emit(
            events.StageFailed,
            name,
            r.version,
            r.stage,
            r.attempt,
            "failed",
            package=name,
            version=r.version,
            stage=r.stage,
            reason=r.reason,
            attempt=r.attempt,
            started=was.updated if was is not None else r.updated,
        )


def forget(node: NodeFacts, cr: str) -> Decision:
    """The NodeWright is gone: its record goes, unless it still tracks installed packages
    (those without uninstall steps stay tracked, so a NodeWright of the same name created
    later does not install them again); an undecodable one goes too."""
    key = nodestate.key(nodestate.EXECUTOR, cr)
    if key in node.malformed:
        return Decision(record=Remove())
    record = node.executor
    if record == ExecutorRecord() or any(p.installed for p in record.packages.values()):
        return Decision()
    return Decision(record=Remove())


def _pull(w: _Work, mine: Sequence[PodView], *, attempt: int) -> None:
    """With ``spec.drain.prePullImages``, the pod pulling the package images onto a node
    the drainer has (admitted, not drained yet; the drainer waits for it before it evicts
    anything): made once per recovery request (``attempt``), kept while the drain lasts,
    then deleted like any pod nothing keeps (a failed one too: a retry makes a new one)."""
    pulls = progress.pull_images(w.cr, w.node)
    if not pulls:
        return
    images = [image for _, image in pulls]
    name = pods.pull_pod_name(
        cr=w.cr.metadata.name, node=w.node.name, images=images, attempt=attempt
    )
    w.keep.add(name)
    if any(p.name == name for p in mine) or w.cr.paused or w.cr.disabled:
        return  # one being deleted is made again once it is gone (its delete wakes the key)
    w.start(
        PodRequest(
            role="pull",
            package="",
            stage=pods.PULL_STAGE,
            version=pods.pull_version(images),
            attempt=attempt,
            name=name,
            pulls=pulls,
        )
    )


def _reached(cr: api.NodeWright, node: NodeFacts, node_pods: Sequence[PodView]) -> dict[str, str]:
    """By running package, the stage its pod has reached past the record's stage (a
    segment pod runs the stages after its first without a write)."""
    mine = [p for p in node_pods if p.cr == cr.metadata.name and p.node == node.name]
    out: dict[str, str] = {}
    for name, r in node.executor.packages.items():
        if r.state != "running":
            continue
        part = pods.past_first(mine, progress.pod_key(name, r))
        if part is not None:
            out[name] = part.stage
    return out


def _emitter(cr: api.NodeWright, node: NodeFacts, now: datetime, source: str) -> events.Emitter:
    """The events of a decision taken outside a pass's :class:`_Work` (which has its own)."""
    return events.Emitter(
        cr=cr.metadata.name,
        generation=cr.metadata.generation,
        node=node.name,
        now=now,
        source=source,
    )


def _rebooted(cr: api.NodeWright, node: NodeFacts, now: datetime, source: str) -> Decision | None:
    """With ``spec.reapplyOnReboot``, a node that rebooted outside NodeWright since its
    packages completed starts over, like after ``nodewright node reset``: the record keeps
    only its mark and the typed cause (``reset_boot``), and ``node.rebooted`` says so."""
    boot = recovery.rebooted(cr, node)
    if not boot:
        return None
    out = _emitter(cr, node, now, source)
    out.emit(
        events.NodeRebooted,
        "rebooted",
        boot,
        boot_id_before=node.executor.boot_id,
        boot_id=boot,
    )
    record = ExecutorRecord(honoured=node.executor.honoured, reset_boot=boot)
    return Decision(record=Write(record), publish=tuple(out.events), requeue_after=0.0)


def decide(
    *,
    cr: api.NodeWright,
    node: NodeFacts,
    node_pods: Sequence[PodView],
    now: datetime,
    image_pull_grace_s: float = 60.0,
    source: str = "executor",
    requests: Requests | None = None,
) -> Decision:
    requests = requests or node.requests
    if nodestate.key(nodestate.EXECUTOR, cr.metadata.name) in node.malformed:
        if recovery.reset_malformed(node, nodestate.EXECUTOR, cr.metadata.name):
            return Decision(record=Remove(), requeue_after=0.0)
        return Decision(problem="the executor record does not decode; reset the node")
    fresh = not node.executor.packages and node.executor.interrupt is None
    if requests.after(node.executor.honoured) and not fresh:
        honoured = honour(
            node.executor,
            requests,
            desired=progress.desired(cr),
            checks=node.validator.checks,
            now=now,
            reached=_reached(cr, node, node_pods),
        )
        out = _emitter(cr, node, now, source)
        _aborted(node.executor, honoured, out)
        # Written alone; the next pass (at once) starts the new attempts, drops old pods and
        # stops aborted ones.
        return Decision(record=Write(honoured), publish=tuple(out.events), requeue_after=0.0)
    rebooted = _rebooted(cr, node, now, source)
    if rebooted is not None:
        return rebooted
    turn = progress.turn(cr, node)
    w = _Work(
        cr=cr,
        node=node,
        now=now,
        source=source,
        packages=dict(node.executor.packages),
        interrupt=node.executor.interrupt,
    )
    mine = [p for p in node_pods if p.cr == cr.metadata.name and p.node == node.name]
    pods_by = {p.key: p for p in mine if not p.deleting}
    for p in mine:
        w.parts.setdefault(p.name, []).append(p)
    desired = progress.desired(cr)
    # The drainer and validator must have seen the same requests first: a reset restarts
    # the drain and forgets the node's validation.
    validator_empty = progress.validation_blank(node)
    behind = (
        (node.drain is not None and node.drain.honoured < requests.latest)
        or (not validator_empty and node.validator.honoured < requests.latest)
        # After a reboot reset the validator must have forgotten that boot's validation.
        or (
            bool(node.executor.reset_boot)
            and not validator_empty
            and node.validator.reset_boot != node.executor.reset_boot
        )
    )
    may_start = turn == "executor" and not cr.paused and not cr.disabled and not behind
    if turn in ("executor", "failed"):
        _packages(w, desired, pods_by, image_pull_grace_s, may_start)
        _interrupt(w, desired, pods_by, image_pull_grace_s, may_start)
    elif turn == "drainer":
        _pull(w, mine, attempt=requests.latest + 1)
    gone = [p for p in mine if p.name not in w.keep and not p.deleting]
    for name in {p.name for p in gone}:
        # Said before the pod goes (the shell holds the delete until the stream holds
        # it): once the pod is gone, nothing says its stages ran any more.
        _announce(w, name)
    delete = tuple(sorted({p.name for p in gone}))
    stop = tuple(
        sorted(
            {p.name for p in mine if p.name in w.stop and not (p.stopping or p.over or p.deleting)}
        )
    )
    settled = frozenset(p.name for p in gone if _settled(node.executor.packages, p))
    # A fresh record starts out having honoured every request: there was nothing to act on.
    mark = requests.latest if fresh else node.executor.honoured
    boot_id = node.executor.boot_id
    if (
        cr.spec.reapply_on_reboot
        and w.packages
        and all(progress.package_done(d, w.packages.get(n)) for n, d in desired.items())
    ):
        # The boot the packages are complete in (after our own reboot: the new one, since
        # post-interrupt ran in it); reapplyOnReboot compares the node's with it. Recorded
        # only where reapplyOnReboot reads it: it costs a Node write per node once the
        # packages are complete (their end is otherwise not written, progress.finished_cycles).
        boot_id = node.boot_id
    new_record = ExecutorRecord(
        packages=w.packages,
        interrupt=w.interrupt,
        honoured=mark,
        boot_id=boot_id,
        reset_boot=node.executor.reset_boot,
    )
    if fresh and not new_record.packages and new_record.interrupt is None:
        new_record = node.executor  # nothing to write yet
    changed = new_record != node.executor
    return Decision(
        record=Write(new_record) if changed else Keep(),
        create=tuple(w.create),
        delete=delete,
        stop=stop,
        settled=settled,
        publish=tuple(w.out.events),
        announce=w.announcements(),
        requeue_after=w.requeue,
    )


# ---- package ConfigMaps ---------------------------------------------------------------------


@dataclass(frozen=True)
class PackageConfigMap:
    """What the sweep reads of a package ConfigMap: its name and whose it is (its labels)."""

    name: str
    cr: str
    package: str


@dataclass(frozen=True)
class ConfigMapSweep:
    """What one sweep decided: the ConfigMaps to delete, and since when each other unwanted
    one has been seen so (the next sweep's ``seen``)."""

    delete: tuple[str, ...] = ()
    unwanted: Mapping[str, datetime] = field(default_factory=dict)


def sweep_config_maps(
    config_maps: Sequence[PackageConfigMap],
    *,
    crs: Mapping[str, api.NodeWright],
    mounted: set[str],
    seen: Mapping[str, datetime],
    now: datetime,
    grace_s: float,
) -> ConfigMapSweep:
    """The package ConfigMaps to delete now: of a NodeWright in ``crs`` that is not being
    deleted (a deleted one takes its own with it), for a package whose configuration it no
    longer has (another configuration, no configuration, or no such package), mounted by no
    pod in ``mounted``, and seen so for ``grace_s`` already (``seen``: the last sweep's
    :attr:`ConfigMapSweep.unwanted`). The grace covers a decision taken on the old
    configuration just before it changed, whose pod is about to be created with it."""
    wanted: set[str] = set()
    for cr in crs.values():
        if progress.deleting(cr):
            continue
        for d in progress.desired(cr).values():
            if d.config:
                wanted.add(config_map_name(cr.metadata.name, d.name, d.config_digest))
    delete: list[str] = []
    unwanted: dict[str, datetime] = {}
    for cm in config_maps:
        owner = crs.get(cm.cr)
        if owner is None or progress.deleting(owner) or cm.name in wanted or cm.name in mounted:
            continue
        since = seen.get(cm.name, now)
        if (now - since).total_seconds() >= grace_s:
            delete.append(cm.name)
        else:
            unwanted[cm.name] = since
    return ConfigMapSweep(delete=tuple(sorted(delete)), unwanted=unwanted)
