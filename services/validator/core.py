"""The validator's decisions, as data: which stage checks to run, what their outcome means,
when a node is validated, and when its readiness taint may go.

For one (NodeWright, node) pair:

- every package stage is checked in its own pod, in the container after the stage's that
  runs the agent's ``<stage>-check`` mode once the stage exited 0 (``shared.pods.parts``):
  the executor records no stage's success, the verdict does
  (``shared.progress.finished_cycles``). A check that passed with a stage after it in the
  same pod (``apply`` then ``config``) is said (``stage.validated``, :attr:`Decision.announce`)
  but not written: the next stage starting in the pod records it, and the verdict on the
  pod's last check (or the first failed one) records the whole pod. The verdict is recorded
  as passed, or failed with a
  machine-readable reason carrying the check's output tail (``CheckFailed``), the image
  that cannot be pulled (``ImagePullFailed``), the timeout (``CheckTimeout``) or the pod
  that went away before its check ended (``CheckFailed``). The validator creates and
  deletes no pod;
- once every package is done, the node itself is validated: it must be Ready, and a
  reboot interrupt must have completed (the executor judges that by the boot ID). The
  validated target digest is recorded so the drainer and scheduler can release the node;
- a runtime-required node's readiness taint is lifted once every runtime-required
  NodeWright targeting it is validated there (the shell says whether that holds);
- a node that is *new* to a NodeWright with ``runtimeRequired`` and ``autoTaintNewNodes``
  gets the readiness taint (:func:`auto_taint_due`): it matches the selector, was created
  no earlier than the NodeWright, is not done with it yet, is not ignored, is not tainted
  already and was never auto-tainted before. The mark
  :data:`AUTO_TAINTED` written with the taint makes that once per node, ever; a node whose
  tainting NodeWright is gone loses the taint once no other runtime-required NodeWright
  needs it (:func:`lift_orphaned_taint`); with ``reapplyOnReboot`` too, a node that rebooted
  is tainted again, once per boot, until its packages are applied again;
- a verdict is about one attempt of a stage: once the executor runs the stage again (a
  retry or rerun), the old verdict is dropped and the new attempt gets its own check;
- recovery requests (``shared.nodestate.Request``) newer than the record's ``honoured``
  mark are honoured first (:func:`honour`): reset forgets every verdict and the node's
  validation, rerun forgets the node's validation (it is validated again afterwards),
  retry needs nothing here (the executor's new attempts make the failed verdicts stale);
  a reset also removes a record that does not decode; a reboot reset (the executor's typed
  cause ``ExecutorRecord.reset_boot``) forgets verdicts and validation once per boot;
- once the NodeWright is gone its record goes (:func:`forget`).

Pure: no I/O, ``now`` passed in. Which nodes to look at (the key mapping) and the patches
are the shell's job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Final

import msgspec

from shared import api, events, nodestate, pods, progress, reasons, recovery
from shared.decisions import Keep, RecordChange, Remove, Work, Write
from shared.events import Reason
from shared.nodestate import Request, Requests, check_key
from shared.pods import PodKey, PodView
from shared.progress import NodeFacts
from shared.records.validator import CheckRecord, ValidatorRecord

CHECKED_STAGES = progress.CHECKED_STAGES
_TAIL = 512

AUTO_TAINTED: Final = f"readiness.{nodestate.VALIDATOR}/auto-tainted"
"""Node annotation ``readiness.validator.nodewright.nvidia.com/auto-tainted: <cr>``: the
validator auto-tainted this node (for NodeWright ``<cr>``) and never does it again. Not
``validator.nodewright.nvidia.com/<name>``: every key there is read as a NodeWright's
validator record (``nodestate.crs_with``), and a NodeWright may be named ``auto-tainted``."""

READINESS_TAINT: Final[Mapping[str, str]] = MappingProxyType(
    {"key": progress.RUNTIME_REQUIRED_TAINT, "effect": "NoSchedule"}
)
"""The taint added to new nodes: keeps workloads off, NodeWright's own pods tolerate it."""

AUTO_TAINTED_BOOT: Final = f"readiness.{nodestate.VALIDATOR}/auto-tainted-boot"
"""Node annotation: the boot ID the node was in when the validator last tainted it. With
``reapplyOnReboot`` a node that rebooted is tainted again, once per boot, until its packages
are applied again (:func:`auto_taint_due`)."""

_NO_ANNOTATIONS: Final[Mapping[str, str]] = MappingProxyType({})


@dataclass(frozen=True)
class Decision:
    record: RecordChange = field(default_factory=Keep)
    publish: tuple[events.Event, ...] = ()
    remove_readiness_taint: bool = False
    add_readiness_taint: bool = False
    """Taint the node (:data:`READINESS_TAINT`) and mark it (:data:`AUTO_TAINTED`, and
    :data:`AUTO_TAINTED_BOOT` with :attr:`boot_id`)."""
    boot_id: str = ""
    """The node's boot ID when :attr:`add_readiness_taint`."""
    requeue_after: float | None = None
    problem: str = ""
    """Why nothing can be decided (for the shell to log), e.g. an undecodable record."""
    announce: Mapping[str, tuple[events.Event, ...]] = field(default_factory=dict)
    """By pod name, ``stage.validated`` of each check that passed with a stage after it in
    its pod: said from the pod, not written (``shared.decisions.NodeDecision.announce``)."""

    @property
    def changes_node(self) -> bool:
        return (
            not isinstance(self.record, Keep)
            or self.remove_readiness_taint
            or self.add_readiness_taint
        )


@dataclass(kw_only=True)
class _Work(Work):
    """The validator's pass: the check verdicts as they change."""

    checks: dict[str, CheckRecord]


POD_GONE_GRACE_S: Final = 30.0
"""How long a stage the executor recorded as succeeded may have no pod in the validator's
cache before its check is failed: the pod watch may deliver the pod after the node watch
delivered the record."""


def _gone(
    package: str, version: str, stage: str, attempt: int, cycle: str, now: datetime
) -> CheckRecord:
    return CheckRecord(
        verdict="failed",
        at=now,
        attempt=attempt,
        cycle=cycle,
        reason=Reason(
            code=reasons.CHECK_FAILED,
            message=(
                f"check {stage}-check of {package} {version}: its pod went away before the "
                "check ended (deleted?); run `nodewright node retry` to run the stage and its "
                "check again"
            ),
            details={"pod": "missing"},
        ),
    )


def _verdict_from_pod(
    pod: PodView, *, started: datetime, now: datetime, timeout: int, grace: float
) -> CheckRecord | None:
    ref = (pods.pods_kind_ref(pod),)
    if pod.phase == "Succeeded":
        return CheckRecord(verdict="passed", at=now, attempt=pod.attempt, cycle=pod.cycle)
    if pod.phase == "Failed":
        said, details = pods.agent_outcome(pod)
        return CheckRecord(
            verdict="failed",
            at=now,
            attempt=pod.attempt,
            cycle=pod.cycle,
            reason=Reason(
                code=reasons.CHECK_FAILED,
                message=(
                    f"check {pod.stage}-check of {pod.package} {pod.version} failed "
                    f"(exit code {pod.exit_code}): {said}".rstrip(": ")
                )[:_TAIL],
                objects=ref,
                details={"exitCode": str(pod.exit_code), **details},
            ),
        )
    pull = pods.start_failure(pod, now=now, grace_s=grace)
    if pull is not None:
        return CheckRecord(
            verdict="failed", at=now, reason=pull, attempt=pod.attempt, cycle=pod.cycle
        )
    if (now - started).total_seconds() >= timeout:
        return CheckRecord(
            verdict="failed",
            at=now,
            attempt=pod.attempt,
            cycle=pod.cycle,
            reason=Reason(
                code=reasons.CHECK_TIMEOUT,
                message=f"check {pod.stage}-check of {pod.package} ran longer than {timeout}s",
                objects=ref,
                details={"timeoutSeconds": str(timeout)},
            ),
        )
    return None


def _checks(w: _Work, check_pods: Mapping[PodKey, PodView], grace: float) -> set[str]:
    """Judge and record the checks of the stages the executor finished; the keys of the
    verdicts still relevant."""
    desired = progress.desired(w.cr)
    wanted: set[str] = set()
    for name, r in sorted(w.node.executor.packages.items()):
        d = desired.get(name)
        if r.stage not in CHECKED_STAGES:
            continue
        key = check_key(name, r.version, r.stage)
        if d is None or r.version != d.version:
            if progress.next_stage(r) is None and r.cycle != "uninstall":
                # Until the executor writes the record again, this verdict is what says its
                # cycle ended (progress.finished_cycles): the version it installed is the
                # one the next cycle upgrades from.
                wanted.add(key)
            continue
        wanted.add(key)
        stale = w.checks.get(key)
        if stale is not None and not progress.verdict_about(r, stale):
            del w.checks[key]  # about an earlier run of the stage (attempt or cycle)
        if r.state == "failed":
            continue
        v = w.checks.get(key)
        if v is not None and v.verdict != "running":
            continue
        cycle = progress.cycle_of(r)
        pod = check_pods.get((name, r.stage, r.version, r.attempt, cycle))
        stage = r.stage
        said: list[events.Event] = []
        while r.state == "running" and pod is not None and pod.then and pod.phase == "Succeeded":
            # A check with a stage after it in its pod: the next stage starting is its
            # record; said from the pod, not written. The pod's next check is judged next.
            said.append(_validated(w, pod))
            stage = pod.then
            key = check_key(name, r.version, stage)
            wanted.add(key)
            later = check_pods.get((name, stage, r.version, r.attempt, cycle))
            pod = later if later is not None and later.name == pod.name else None
        if r.state == "running" and (pod is None or pod.phase == "Pending" or not cycle):
            # The stage runs (its pod's check starts once it exited 0), or its pod is gone
            # and the executor makes it again: the executor's to judge. A record without a
            # cycle (an earlier version's) is written as succeeded first.
            continue
        verdict: CheckRecord | None
        if pod is None:
            # The executor saw the pod's stage end: a pod missing past the grace was deleted
            # before its check ended (kubectl delete, a drain by someone else).
            waited = (w.now - r.updated).total_seconds()
            if waited < POD_GONE_GRACE_S:
                w.later(POD_GONE_GRACE_S - waited)
                continue
            verdict = _gone(name, r.version, r.stage, r.attempt, progress.cycle_of(r), w.now)
        else:
            timeout = d.spec.stage_timeout_seconds or w.cr.spec.stage_timeout_seconds
            # A "running" verdict is an earlier version's record of the start.
            started = v.at if v is not None and stage == r.stage else pod.created or w.now
            verdict = _verdict_from_pod(
                pod, started=started, now=w.now, timeout=timeout, grace=grace
            )
            if verdict is None:
                w.later(min(30.0, max(1.0, timeout - (w.now - started).total_seconds())))
                continue
        w.checks[key] = verdict
        # What the pod said of its earlier checks goes into the outbox with the verdict that
        # records them: said from the pod only, it would be lost with a NATS outage then.
        w.out.events.extend(said)
        if verdict.verdict == "passed":
            w.out.emit(
                events.StageValidated,
                name,
                r.version,
                stage,
                r.attempt,
                "validated",
                package=name,
                version=r.version,
                stage=stage,
            )
        else:
            assert verdict.reason is not None
            w.out.emit(
                events.ValidationFailed,
                name,
                r.version,
                stage,
                r.attempt,
                "invalid",
                package=name,
                version=r.version,
                stage=stage,
                reason=verdict.reason,
            )
    return wanted


def _validated(w: _Work, pod: PodView) -> events.Event:
    """``stage.validated`` of ``pod``'s check, as the pod says it: stamped with the check's
    end, so every pass makes the same event (the one a write of its verdict would carry)."""
    event = w.out.make(
        events.StageValidated,
        pod.package,
        pod.version,
        pod.stage,
        pod.attempt,
        "validated",
        at=pod.ended or pod.created or w.now,
        package=pod.package,
        version=pod.version,
        stage=pod.stage,
    )
    w.say(pod.name, event)
    return event


def _with_checks(node: NodeFacts, checks: Mapping[str, CheckRecord]) -> NodeFacts:
    """``node`` as it reads once ``checks`` are the validator's verdicts on it."""
    raw = node.executor
    # Un-finish nothing: facts finished the cycles the old verdicts end; the new verdicts
    # can only end more of them (a verdict this pass drops is about an earlier attempt).
    return replace(
        node,
        validator=msgspec.structs.replace(node.validator, checks=dict(checks)),
        executor=progress.finished_cycles(raw, checks),
    )


def has_readiness_taint(taints: Iterable[Mapping[str, Any]]) -> bool:
    return any(t.get("key") == progress.RUNTIME_REQUIRED_TAINT for t in taints)


def _timestamp(text: str) -> datetime | None:
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def auto_taint_due(
    cr: api.NodeWright,
    *,
    labels: Mapping[str, str],
    taints: Iterable[Mapping[str, Any]],
    created: str,
    annotations: Mapping[str, str],
    boot_id: str = "",
    reset_boot: str = "",
    done: bool = False,
) -> bool:
    """The node (its labels, taints, ``creationTimestamp`` and annotations) is new to ``cr``
    and ``cr`` asks for new nodes to carry the readiness taint — or, with
    ``reapplyOnReboot`` too, it rebooted since its packages were applied.

    New means created no earlier than the NodeWright (timestamps have whole seconds, so a
    node created in the same second counts as new) and not ``done`` with it yet: the
    reference taints every node without a record, which on turning the feature on taints a
    whole fleet already running workloads. Records of other services do not count: the
    scheduler may admit a new node, and the executor start on it, before the validator gets
    to add the taint; its packages are not in place yet, so the taint is still due.

    Rebooted (``boot_id``) means the executor reset the node for this boot
    (``reset_boot``: the typed cause ``ExecutorRecord.reset_boot``), the node is not ``done``
    with its packages again yet, and it was not tainted in this boot before (the mark
    :data:`AUTO_TAINTED_BOOT`): on an ephemeral OS image the host lost NodeWright's changes,
    so workloads stay off until they are back (the reference's open issue #180).
    """
    spec = cr.spec
    if not (spec.runtime_required and spec.auto_taint_new_nodes):
        return False
    if cr.disabled or cr.metadata.deletion_timestamp is not None:
        return False
    if has_readiness_taint(taints):
        return False
    if labels.get(nodestate.IGNORE_LABEL) == "true":
        return False
    if not progress.selector_matches(spec.node_selectors, labels):
        return False
    if spec.reapply_on_reboot and boot_id and not done:
        rebooted = reset_boot == boot_id
        if rebooted and annotations.get(AUTO_TAINTED_BOOT) != boot_id:
            return True
    if AUTO_TAINTED in annotations or done:
        return False
    node_created, cr_created = _timestamp(created), cr.metadata.creation_timestamp
    if node_created is None or cr_created is None:
        return False  # cannot tell the node is new: tainting a busy node is the worse error
    return node_created >= cr_created


def lift_orphaned_taint(
    cr: str,
    *,
    annotations: Mapping[str, str],
    has_readiness_taint: bool,
    runtime_required_done: bool,
) -> bool:
    """NodeWright ``cr`` is gone, and so is the last reason for the readiness taint it had
    the validator add to this node: no other runtime-required NodeWright still needs it."""
    return has_readiness_taint and runtime_required_done and annotations.get(AUTO_TAINTED) == cr


def honour(record: ValidatorRecord, requests: Requests) -> ValidatorRecord:
    """``record`` after the recovery requests newer than its mark, marked as honoured."""

    def step(rec: ValidatorRecord, req: Request) -> ValidatorRecord:
        match req.action:
            case "reset":
                return ValidatorRecord(reset_boot=rec.reset_boot)
            case "rerun":
                return ValidatorRecord(checks=rec.checks, reset_boot=rec.reset_boot)
            case "retry":
                return rec  # the executor's new attempts make the failed verdicts stale
            case "abort":
                return rec  # the executor fails what runs; its checks are judged no more

    return recovery.honour(record, requests, step)


def forget(node: NodeFacts, cr: str) -> Decision:
    """The NodeWright is gone: its record goes (one that does not decode too)."""
    key = nodestate.key(nodestate.VALIDATOR, cr)
    if key in node.malformed or node.validator != ValidatorRecord():
        return Decision(record=Remove())
    return Decision()


def decide(
    *,
    cr: api.NodeWright,
    node: NodeFacts,
    check_pods: Sequence[PodView],
    now: datetime,
    runtime_required_done: bool = False,
    has_readiness_taint: bool = False,
    image_pull_grace_s: float = 120.0,
    source: str = "validator",
    requests: Requests | None = None,
    annotations: Mapping[str, str] = _NO_ANNOTATIONS,
) -> Decision:
    """``annotations`` are the node's: they say whether the node is new to ``cr`` and
    whether the validator auto-tainted it (see :func:`auto_taint_due`)."""
    requests = requests or node.requests
    if nodestate.key(nodestate.VALIDATOR, cr.metadata.name) in node.malformed:
        if recovery.reset_malformed(node, nodestate.VALIDATOR, cr.metadata.name):
            return Decision(record=Remove(), requeue_after=0.0)
        return Decision(problem="the validator record does not decode; reset the node")
    fresh = node.validator == ValidatorRecord(
        honoured=node.validator.honoured, reset_boot=node.validator.reset_boot
    )
    if requests.after(node.validator.honoured) and not fresh:
        return Decision(record=Write(honour(node.validator, requests)), requeue_after=0.0)
    rebooted = node.executor.reset_boot
    if rebooted and rebooted != node.validator.reset_boot:
        # The executor forgot the packages for this boot: forget what was validated too,
        # once (the typed cause, never a guess from who asked).
        forgotten = ValidatorRecord(honoured=node.validator.honoured, reset_boot=rebooted)
        return Decision(record=Write(forgotten), requeue_after=0.0)
    w = _Work(cr=cr, node=node, now=now, source=source, checks=dict(node.validator.checks))
    mine = [
        p
        for p in check_pods
        if p.cr == cr.metadata.name and p.node == node.name and p.role == "check"
    ]
    # A pod being deleted still says how its check ended (a deletion is graceful).
    by = {p.key: p for p in mine}
    turn = progress.turn(cr, node)
    wanted = _checks(w, by, image_pull_grace_s)
    if w.checks != node.validator.checks:
        # The verdicts as this pass leaves them: the one that ends the last package's cycle
        # makes the node due for validation now, in the same write (progress.finished_cycles).
        turn = progress.turn(cr, _with_checks(node, w.checks))
    record = node.validator
    validated, at, reason = record.validated, record.at, record.reason
    target = progress.target_digest(cr)
    if turn == "validator" and validated != target:
        interrupt = node.executor.interrupt
        if not node.ready:
            reason = Reason(
                code=reasons.NODE_NOT_READY,
                message="waiting for the node to be Ready after its packages",
            )
            w.later(5.0)
        elif interrupt is not None and interrupt.state == "running":
            w.later(5.0)
        elif (
            cr.spec.reapply_on_reboot
            and node.executor.packages
            and node.executor.boot_id != node.boot_id
        ):
            # The executor records the boot the packages completed in first (its write wakes
            # this key): validated without it, a reboot before it was recorded would go
            # unseen by reapplyOnReboot (shared.recovery.rebooted).
            pass
        else:
            validated, at, reason = target, now, None
            w.out.emit(events.NodeValidated, "validated", target)
    # A fresh record starts out having honoured every request: there was nothing to act on.
    honoured = requests.latest if fresh else record.honoured
    new = ValidatorRecord(
        checks=w.checks,
        validated=validated,
        at=at,
        reason=reason,
        honoured=honoured,
        reset_boot=record.reset_boot,
    )
    if fresh and new == ValidatorRecord(honoured=honoured, reset_boot=record.reset_boot):
        new = record  # nothing to write yet
    if new != record:
        # Verdicts about versions or stages no longer relevant would only grow the record:
        # they go with the next write, never in one of their own (a write per stage,
        # issue 15). Nobody reads them: every reader looks up the current stage's key.
        new = msgspec.structs.replace(
            new, checks={k: v for k, v in new.checks.items() if k in wanted}
        )
    # A taint this validator added for ``cr`` goes by the same rule even if ``cr`` stopped
    # being runtimeRequired since: nobody else would ever lift it.
    ours = annotations.get(AUTO_TAINTED) == cr.metadata.name
    taint = auto_taint_due(
        cr,
        labels=node.labels,
        taints=node.taints,
        created=node.created,
        annotations=annotations,
        boot_id=node.boot_id,
        reset_boot=node.executor.reset_boot,
        done=progress.node_done(cr, node),
    )
    return Decision(
        record=Write(new) if new != record else Keep(),
        publish=tuple(w.out.events),
        remove_readiness_taint=(cr.spec.runtime_required or ours)
        and runtime_required_done
        and has_readiness_taint,
        add_readiness_taint=taint,
        boot_id=node.boot_id if taint else "",
        requeue_after=w.requeue,
        announce=w.announcements(),
    )
