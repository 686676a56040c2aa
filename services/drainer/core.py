"""The drainer's decisions, as data: cordon, wait for protected pods, drain, release.

For one (NodeWright, node) pair it reads the CR, the node's facts, the other NodeWrights'
drainer records on the node and the node's pods (small frozen views), and returns a
:class:`Decision`: the node write (this CR's record and, in the same merge patch,
``spec.unschedulable``), the pods to evict or delete, the events to publish and when to look
again. Rules:

- **Cordon** when it is the drainer's turn (``progress.turn``): record the cordon together
  with it, and whether the node was already cordoned by someone else (``preexisting``, never
  uncordoned by us).
- **Wait** while pods matching ``spec.podNonInterruptLabels`` run (``ProtectedPodRunning``),
  as long as they run unless ``spec.drain.protectedPodsTimeoutSeconds`` is set: past it the
  node fails (``ProtectedPodTimeout``, naming the pods). Nothing is evicted meanwhile.
- **Drain** like ``kubectl drain`` with ``spec.drain``: ``filters.classify`` says, per pod, evict,
  delete, skip, block, or await (already terminating). Any blocking pod stops the drain
  before anything is evicted (``blocked``); eviction refusals come back through
  :func:`settle` (a PDB at zero: ``PodDisruptionBudgetBlocking`` naming it). The node is
  ``drained`` only once no pod in scope is left, terminating ones included. The drain timeout
  counts from the start of draining (after the protected-pod wait); it fails the node
  (``DrainTimeout``) and leaves it cordoned.
- **Release** when the node is done, no longer admitted or targeted, or the CR is gone:
  remove the record; uncordon only if this CR holds the cordon, it was not preexisting, and
  no other NodeWright holds one.
- **Recovery requests** (``shared.nodestate.Request``, from ``nodewright node retry|reset``)
  newer than the record's ``honoured`` mark are honoured first: a retry restarts a failed
  drain (fresh timeout), a reset restarts any drain; cordon ownership is a fact about the
  node, not progress, so it is kept. The newest request number is recorded either way.
- An **ignored** node (label ``nodewright.nvidia.com/ignore=true``) already admitted goes on
  with the drain it was admitted for: stopping half-way would hold it cordoned and keep its
  budget slot for as long as the label stays. The scheduler admits no ignored node.

Pure: no I/O, ``now`` passed in. Performing the eviction calls, the node patch and the
publishing is the shell's job (``services.drainer.service``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import msgspec
from msgspec.structs import replace

from services.drainer import filters
from services.drainer.filters import EvictionResult, PdbInfo, PodInfo
from shared import api, events, nodestate, pods as own_pods, progress, reasons, recovery
from shared.decisions import Keep, NodeDecision, RecordChange, Remove, Write
from shared.events import ObjectRef, Reason
from shared.progress import NodeFacts
from shared.records.drainer import DrainPhase, DrainRecord

MAX_LISTED: Final = 10
"""Objects named in one reason; the rest are counted."""

_ACTIVE: Final[frozenset[DrainPhase]] = frozenset({"cordoned", "waiting", "draining", "blocked"})
_MAX_MESSAGE: Final = 1024

# When several kinds of pods block, the reason's code is the first of these present.
_BLOCK_ORDER: Final = (reasons.UNMANAGED_POD, reasons.EMPTY_DIR_DATA, reasons.DAEMON_SET_POD)


def drain_records(node: Mapping[str, Any], *, besides: str) -> dict[str, DrainRecord | None]:
    """Every other NodeWright's drainer record on the node; None for one that does not decode
    (counted as holding a preexisting cordon, the safe reading)."""
    out: dict[str, DrainRecord | None] = {}
    for cr in nodestate.crs_with(node, nodestate.DRAINER):
        if cr == besides:
            continue
        try:
            out[cr] = nodestate.read(node, nodestate.DRAINER, cr, DrainRecord)
        except (msgspec.ValidationError, msgspec.DecodeError):
            out[cr] = None
    return out


# ---- decisions --------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeWrite:
    """One merge patch of the node: this CR's record and, optionally, the cordon."""

    record: RecordChange
    unschedulable: bool | None = None
    """Set spec.unschedulable in the same patch; None leaves it alone."""

    @property
    def after(self) -> DrainRecord | None:
        """The record as it is once written (None: removed)."""
        match self.record:
            case Write(record=DrainRecord() as rec):
                return rec
            case _:
                return None


@dataclass(frozen=True)
class Pending:
    """A drain step waiting for its eviction results (see :func:`settle`)."""

    cr: str
    generation: int
    node: str
    source: str
    previous: DrainRecord
    started: datetime
    """When draining began (now, if this step begins it)."""
    awaited: tuple[PodInfo, ...]
    evicted_before: int
    remaining_s: float | None
    eviction_retry_s: float
    deletion_poll_s: float


@dataclass(frozen=True)
class Decision:
    """What the shell does for one key, in order: evict/delete (then :func:`settle`), write,
    publish, and look again after ``requeue_after`` seconds (None: when something changes)."""

    write: NodeWrite | None = None
    evict: tuple[PodInfo, ...] = ()
    delete: tuple[PodInfo, ...] = ()
    grace_period_s: int | None = None
    publish: tuple[events.Event, ...] = ()
    requeue_after: float | None = None
    pending: Pending | None = None
    """Set with evict/delete: pass the results to :func:`settle` for the write and events."""
    problem: str = ""
    """Why nothing can be decided (for the shell to log), e.g. an undecodable record."""

    @property
    def declares_drained(self) -> bool:
        """Carrying it out records the node as drained: the one decision a pod missing from
        the pods it was given would make wrong (the pod would run through the package's
        apply). The shell makes it only on pods read after the cordon."""
        after = self.write.after if self.write is not None else None
        return after is not None and after.phase == "drained"


def node_decision(cr: str, node: str, decision: Decision) -> NodeDecision:
    """What the shared per-node shell carries out for ``decision`` (after :func:`settle`):
    the record and the cordon in one patch, then the events."""
    write = decision.write
    spec: dict[str, Any] = {}
    if write is not None and write.unschedulable is not None:
        spec["unschedulable"] = write.unschedulable
    return NodeDecision(
        owner=nodestate.DRAINER,
        cr=cr,
        node=node,
        record=write.record if write is not None else Keep(),
        spec=spec,
        events=decision.publish,
        requeue_after=decision.requeue_after,
    )


@dataclass(frozen=True)
class _Ctx:
    cr: str
    generation: int
    node: str
    source: str
    now: datetime

    def event(self, cls: type[events.Event], *facts: object, **fields: Any) -> events.Event:
        out = events.Emitter(
            cr=self.cr, generation=self.generation, node=self.node, now=self.now, source=self.source
        )
        out.emit(cls, *facts, **fields)
        return out.events[0]


def _digest(reason: Reason) -> str:
    return hashlib.sha256(msgspec.json.encode(reason)).hexdigest()[:12]


def _moved(prev: DrainRecord, phase: DrainPhase, now: datetime, **changes: Any) -> DrainRecord:
    """``prev`` in ``phase``; ``since`` restarts only when the phase changes."""
    since = prev.since if prev.phase == phase else now
    return replace(prev, phase=phase, since=since, **changes)


def _listed(refs: Sequence[ObjectRef]) -> tuple[ObjectRef, ...]:
    return tuple(refs[:MAX_LISTED])


def _names(items: Sequence[str]) -> str:
    shown = ", ".join(items[:MAX_LISTED])
    more = len(items) - MAX_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def _evicted_so_far(rec: DrainRecord) -> int:
    if rec.phase not in ("draining", "blocked") or rec.reason is None:
        return 0
    try:
        return int(rec.reason.details.get("evicted", "0"))
    except ValueError:
        return 0


def _remaining(rec: DrainRecord, timeout_s: int, now: datetime) -> float | None:
    if timeout_s == 0:
        return None
    return timeout_s - (now - rec.started).total_seconds()


def _soonest(*delays: float | None) -> float | None:
    real = [max(d, 0.0) for d in delays if d is not None]
    return min(real) if real else None


def must_release(cr: api.NodeWright | None, node: NodeFacts) -> bool:
    """This CR's drainer record must go: its work is over (``progress.release_due``, the
    rule the scheduler releases the admission by, after this), the node is no longer
    admitted or targeted, or the CR is gone. A CR being deleted keeps its cordons while its
    finalizer's uninstalls run; its nodes are done (and released) once those finished."""
    if node.drain is None:
        return False
    if cr is None:
        return True
    if node.selection is None:
        return True
    if not progress.selector_matches(cr.spec.node_selectors, node.labels):
        return True
    return progress.release_due(cr, node)


def decide(
    *,
    cr_name: str,
    cr: api.NodeWright | None,
    node: NodeFacts,
    others: Mapping[str, DrainRecord | None],
    pods: Sequence[PodInfo],
    now: datetime,
    eviction_retry_s: float = 5.0,
    deletion_poll_s: float = 5.0,
    image_pull_grace_s: float = 120.0,
    source: str = "drainer",
    requests: nodestate.Requests | None = None,
) -> Decision:
    """What to do for ``cr_name`` on ``node`` now. ``cr`` is None when the CR is gone;
    ``others`` are the other NodeWrights' drainer records on the node (:func:`drain_records`);
    ``requests`` the recovery requests for ``cr_name`` on the node."""
    if nodestate.key(nodestate.DRAINER, cr_name) in node.malformed:
        if recovery.reset_malformed(node, nodestate.DRAINER, cr_name):
            # Forgotten like any reset drain; whose cordon it was cannot be read any more, so
            # a cordon on the node is kept (the next cordon records it as someone else's).
            return Decision(write=NodeWrite(record=Remove()), requeue_after=0.0)
        return Decision(problem="the drainer record does not decode; fix or reset the node")
    generation = (
        cr.metadata.generation
        if cr is not None
        else (node.selection.generation if node.selection else 0)
    )
    ctx = _Ctx(cr=cr_name, generation=generation, node=node.name, source=source, now=now)
    rec = node.drain
    if rec is not None and must_release(cr, node):
        return _release(ctx, rec, node, others)
    requests = requests or node.requests
    if rec is not None and requests.after(rec.honoured):
        return Decision(
            write=NodeWrite(record=Write(honour(rec, requests, ctx.now))), requeue_after=0.0
        )
    if cr is None or progress.turn(cr, node) != "drainer":
        return Decision()
    if cr.paused or cr.disabled:
        return Decision()  # started drains resume when the CR is let go again
    if rec is None:
        return _cordon(ctx, node, others, honoured=requests.latest)
    if progress.stale_pull_failure(cr, node):
        # The images that did not pull are no longer the spec's: a fix. The drain starts over
        # (nothing was evicted) and pulls the new ones first.
        restarted = replace(rec, phase="cordoned", started=ctx.now, since=ctx.now, reason=None)
        return Decision(write=NodeWrite(record=Write(restarted)), requeue_after=0.0)
    if rec.phase not in _ACTIVE:
        return Decision()
    if not node.unschedulable:
        # Uncordoned behind our back mid-drain: pods could land again; cordon again first.
        return Decision(write=NodeWrite(record=Keep(), unschedulable=True), requeue_after=0.0)
    protected = filters.protected_pods(pods, cr.spec.pod_non_interrupt_labels)
    if protected:
        return _wait(ctx, rec, protected, cr.spec.drain.protected_pods_timeout_seconds)
    if rec.phase in ("cordoned", "waiting"):
        pulling = _pull_gate(ctx, rec, cr, node, pods, image_pull_grace_s, requests.latest + 1)
        if pulling is not None:
            return pulling
    return _drain(
        ctx,
        rec,
        cr.spec.drain,
        pods,
        eviction_retry_s=eviction_retry_s,
        deletion_poll_s=deletion_poll_s,
    )


def honour(rec: DrainRecord, requests: nodestate.Requests, now: datetime) -> DrainRecord:
    """``rec`` after the recovery requests newer than its mark: a reset restarts the drain,
    a retry restarts a failed one (with a fresh timeout); the cordon and its ownership stay.
    A rerun is the executor's business: only the mark moves."""

    def step(r: DrainRecord, req: nodestate.Request) -> DrainRecord:
        if req.action == "reset" or (req.action == "retry" and r.phase == "failed"):
            return replace(r, phase="cordoned", started=now, since=now, reason=None)
        return r

    return recovery.honour(rec, requests, step)


def _cordon(
    ctx: _Ctx, node: NodeFacts, others: Mapping[str, DrainRecord | None], *, honoured: int
) -> Decision:
    holders = [o for o in others.values() if o is None or o.cordoned]
    # Already cordoned, and not by another NodeWright (or by one that found it cordoned):
    # someone else's cordon, which must outlive ours.
    preexisting = node.unschedulable and (
        not holders or any(o is None or o.preexisting for o in holders)
    )
    rec = DrainRecord(
        phase="cordoned",
        cordoned=True,
        preexisting=preexisting,
        started=ctx.now,
        since=ctx.now,
        honoured=honoured,  # a fresh record: requests made before it have nothing to act on
    )
    return Decision(
        write=NodeWrite(record=Write(rec), unschedulable=True),
        publish=(
            ctx.event(
                events.NodeCordoned, "cordoned", ctx.now.isoformat(), preexisting=preexisting
            ),
        ),
        requeue_after=0.0,
    )


def _wait(
    ctx: _Ctx, rec: DrainRecord, protected: Sequence[PodInfo], timeout_s: int | None
) -> Decision:
    waited_since = rec.since if rec.phase == "waiting" else ctx.now
    remaining = None if timeout_s is None else timeout_s - (ctx.now - waited_since).total_seconds()
    if remaining is not None and remaining <= 0:
        assert timeout_s is not None
        return _protected_timeout(ctx, rec, protected, timeout_s)
    reason = Reason(
        code=reasons.PROTECTED_POD_RUNNING,
        message=_clip(
            f"waiting for {len(protected)} pod(s) matching podNonInterruptLabels to finish: "
            + _names([p.key for p in protected])
        ),
        objects=_listed([p.ref for p in protected]),
        details={"pods": str(len(protected))},
    )
    # Pod changes on the node re-queue the key; the timer only enforces a deadline if set.
    return _waiting(ctx, rec, reason, remaining)


def _waiting(ctx: _Ctx, rec: DrainRecord, reason: Reason, again: float | None) -> Decision:
    """``rec`` waiting for ``reason``: written and said (``node.waiting``) when the reason
    is new, nothing when it is the same; look again after ``again`` seconds."""
    new = _moved(rec, "waiting", ctx.now, reason=reason)
    if new == rec:
        return Decision(requeue_after=again)
    publish: tuple[events.Event, ...] = ()
    if rec.phase != "waiting" or rec.reason != reason:
        publish = (ctx.event(events.NodeWaiting, "waiting", _digest(reason), reason=reason),)
    return Decision(write=NodeWrite(record=Write(new)), publish=publish, requeue_after=again)


def _protected_timeout(
    ctx: _Ctx, rec: DrainRecord, protected: Sequence[PodInfo], timeout_s: int
) -> Decision:
    protected = sorted(protected, key=lambda p: p.key)
    reason = Reason(
        code=reasons.PROTECTED_POD_TIMEOUT,
        message=_clip(
            f"{len(protected)} pod(s) matching podNonInterruptLabels still running after "
            f"{timeout_s}s: " + _names([p.key for p in protected])
        ),
        objects=_listed([p.ref for p in protected]),
        details={"timeoutSeconds": str(timeout_s), "pods": str(len(protected))},
    )
    failed = _moved(rec, "failed", ctx.now, reason=reason)
    return Decision(
        write=NodeWrite(record=Write(failed)),
        publish=(
            ctx.event(
                events.DrainFailed, "protected-timeout", rec.since.isoformat(), reason=reason
            ),
        ),
    )


def _pull_gate(
    ctx: _Ctx,
    rec: DrainRecord,
    cr: api.NodeWright,
    node: NodeFacts,
    pods: Sequence[PodInfo],
    grace_s: float,
    attempt: int,
) -> Decision | None:
    """With ``spec.drain.prePullImages``, before anything is evicted: wait (ImagesPulling)
    until the executor's pod has pulled the package images onto the node; fail the drain
    with the pod's own reason (ImagePullFailed naming the image, ImageVolumeUnsupported,
    ContainerCreateFailed) when one does not come within ``grace_s``. None: drain now."""
    pulls = progress.pull_images(cr, node)
    if not pulls:
        return None
    images = sorted({image for _, image in pulls})
    name = own_pods.pull_pod_name(cr=ctx.cr, node=ctx.node, images=images, attempt=attempt)
    pod = next(
        (p.pull for p in pods if p.pull is not None and p.name == name and not p.terminating),
        None,
    )
    if pod is not None and pod.phase == "Succeeded":
        return None
    failure: Reason | None = None
    again: float | None = None
    if pod is not None:
        # The grace counts from this drain's start too: a drain reset or retried (which
        # restarts it) gives the pull its whole grace again.
        since = max(pod.created or rec.started, rec.started)
        pod = dataclasses.replace(pod, created=since)
        failure = own_pods.start_failure(pod, now=ctx.now, grace_s=grace_s)
        if failure is not None and failure.code == reasons.IMAGE_PULL_FAILED:
            # Its own way out: nothing ran, and the drain (not a stage) is what failed.
            failure = replace(
                failure,
                message=_clip(
                    f"cannot pull image {pod.image} onto the node before its drain "
                    f"({pod.waiting_reason}: {pod.waiting_message}); nothing was evicted: "
                    "correct the image in the package's spec (the drain starts over by "
                    "itself) or, for a missing image or pull secret, run `nodewright node "
                    "retry` once it is fixed"
                ),
            )
        if failure is None and pod.phase == "Failed":
            failure = Reason(
                code=reasons.IMAGE_PULL_FAILED,
                message=_clip(f"pod {name} pulling {_names(images)} failed: {pod.message}"),
                objects=(ObjectRef(kind="Pod", name=name),),
                details={"pod": name},
            )
        if failure is not None:
            pulled = {progress.PULL_IMAGES_DETAIL: own_pods.pull_version(images)}
            failure = replace(failure, details={**failure.details, **pulled})
        if failure is None and (pod.image_pull_failed or pod.waiting_reason):
            # Nothing changes on a pod backing off: look again when its grace is over.
            again = max(grace_s - (ctx.now - since).total_seconds(), 0.0)
    if failure is not None:
        failed = _moved(rec, "failed", ctx.now, reason=failure)
        return Decision(
            write=NodeWrite(record=Write(failed)),
            publish=(
                ctx.event(
                    events.DrainFailed,
                    "pull-failed",
                    rec.started.isoformat(),
                    _digest(failure),
                    reason=failure,
                ),
            ),
        )
    reason = Reason(
        code=reasons.IMAGES_PULLING,
        message=_clip(
            f"waiting for pod {name} to pull {len(images)} package image(s) onto the node "
            "before the drain: " + _names(images)
        ),
        objects=(ObjectRef(kind="Pod", name=name),),
        details={"pod": name, "images": str(len(images))},
    )
    # The pod's changes (it appears, pulls, ends) re-queue the key.
    return _waiting(ctx, rec, reason, again)


def _blocking_reason(blocking: Sequence[tuple[PodInfo, str]], evicted: int) -> Reason:
    codes = {code for _, code in blocking}
    code = next(c for c in _BLOCK_ORDER if c in codes)
    return Reason(
        code=code,
        message=_clip(
            f"{len(blocking)} pod(s) block the drain under spec.drain: "
            + _names([f"{p.key} ({c})" for p, c in blocking])
        ),
        objects=_listed([p.ref for p, _ in blocking]),
        details={"pods": str(len(blocking)), "evicted": str(evicted)},
    )


def _draining_reason(awaited: Sequence[PodInfo], evicted: int) -> Reason:
    return Reason(
        code=reasons.DRAINING,
        message=_clip(
            f"waiting for {len(awaited)} evicted pod(s) to be gone: "
            + _names([p.key for p in awaited])
        ),
        objects=_listed([p.ref for p in awaited]),
        details={"pods": str(len(awaited)), "evicted": str(evicted)},
    )


def _drain(
    ctx: _Ctx,
    rec: DrainRecord,
    options: api.DrainOptions,
    pods: Sequence[PodInfo],
    *,
    eviction_retry_s: float,
    deletion_poll_s: float,
) -> Decision:
    entering = rec.phase in ("cordoned", "waiting")
    base = replace(rec, started=ctx.now) if entering else rec
    evicted_before = 0 if entering else _evicted_so_far(rec)
    verdicts = sorted(((p, filters.classify(p, options)) for p in pods), key=lambda pv: pv[0].key)
    blocking = [(p, v.code) for p, v in verdicts if v.action == "block"]
    evict = tuple(p for p, v in verdicts if v.action == "evict")
    delete = tuple(p for p, v in verdicts if v.action == "delete")
    awaited = tuple(p for p, v in verdicts if v.action == "await")

    if not (blocking or evict or delete or awaited):
        done = _moved(base, "drained", ctx.now, reason=None)
        return Decision(
            write=NodeWrite(record=Write(done)),
            publish=(
                ctx.event(
                    events.NodeDrained,
                    "drained",
                    base.started.isoformat(),
                    evicted=evicted_before,
                ),
            ),
        )

    remaining = _remaining(base, options.timeout_seconds, ctx.now)
    if remaining is not None and remaining <= 0:
        left = [p for p, _ in blocking] + list(evict) + list(delete) + list(awaited)
        return _timed_out(ctx, base, options.timeout_seconds, left)

    if blocking:
        reason = _blocking_reason(blocking, evicted_before)
        new = _moved(base, "blocked", ctx.now, reason=reason)
        publish: tuple[events.Event, ...] = ()
        if rec.phase != "blocked" or _new_blocker(rec.reason, reason):
            publish = (
                ctx.event(
                    events.DrainBlocked,
                    "drain-blocked",
                    base.started.isoformat(),
                    _digest(reason),
                    reason=reason,
                ),
            )
        return Decision(
            write=NodeWrite(record=Write(new)) if new != rec else None,
            publish=publish,
            # Pod and CR changes re-queue the key; the timer only enforces the timeout.
            requeue_after=remaining,
        )

    if evict or delete:
        return Decision(
            evict=evict,
            delete=delete,
            grace_period_s=options.grace_period_seconds,
            pending=Pending(
                cr=ctx.cr,
                generation=ctx.generation,
                node=ctx.node,
                source=ctx.source,
                previous=rec,
                started=base.started,
                awaited=awaited,
                evicted_before=evicted_before,
                remaining_s=remaining,
                eviction_retry_s=eviction_retry_s,
                deletion_poll_s=deletion_poll_s,
            ),
        )
    # Only terminating pods are left: wait until they are gone (pod deletions re-queue too).
    new = _moved(base, "draining", ctx.now, reason=_draining_reason(awaited, evicted_before))
    return Decision(
        write=NodeWrite(record=Write(new)) if new != rec else None,
        requeue_after=_soonest(deletion_poll_s, remaining),
    )


def _timed_out(ctx: _Ctx, rec: DrainRecord, timeout_s: int, left: Sequence[PodInfo]) -> Decision:
    last = rec.reason
    budgets = [o for o in (last.objects if last else ()) if o.kind == "PodDisruptionBudget"]
    left = sorted(left, key=lambda p: p.key)
    what = last.message if last is not None else f"{len(left)} pod(s) left"
    details = {"timeoutSeconds": str(timeout_s), "pods": str(len(left))}
    if last is not None:
        details["lastReason"] = last.code
    reason = Reason(
        code=reasons.DRAIN_TIMEOUT,
        message=_clip(f"drain did not finish within {timeout_s}s: {what}"),
        objects=_listed([*budgets, *(p.ref for p in left)]),
        details=details,
    )
    failed = _moved(rec, "failed", ctx.now, reason=reason)
    return Decision(
        write=NodeWrite(record=Write(failed)),
        publish=(
            ctx.event(events.DrainFailed, "drain-failed", rec.started.isoformat(), reason=reason),
        ),
    )


# ---- eviction results -------------------------------------------------------------------------


def _pdb_text(b: PdbInfo) -> str:
    return f"{b.namespace}/{b.name} ({b.disruptions_allowed} disruptions allowed)"


def _refusal_reason(
    refused: Sequence[EvictionResult], pdbs: Sequence[PdbInfo], evicted: int
) -> Reason:
    refs: dict[tuple[str, str], ObjectRef] = {}
    blocking: list[tuple[str, str]] = []
    known = {(b.namespace, b.name): b for b in pdbs}
    parts: list[str] = []
    codes: set[str] = set()
    for r in sorted(refused, key=lambda r: r.pod.key):
        matched = [b for b in pdbs if b.matches(r.pod)]
        for b in matched:
            refs[(b.namespace, b.name)] = b.ref
        if r.outcome == "refused" and (matched or r.budget):
            codes.add(reasons.PDB_BLOCKING)
            if not matched:
                # Not in the cache (yet): the API server's DisruptionBudget cause names it.
                key = (r.pod.namespace, r.budget)
                refs[key] = ObjectRef(kind="PodDisruptionBudget", namespace=key[0], name=key[1])
            keys = [(b.namespace, b.name) for b in matched] or [(r.pod.namespace, r.budget)]
            blocking += [k for k in keys if k not in blocking]
            named = ", ".join(_pdb_text(b) for b in matched) or f"{r.pod.namespace}/{r.budget}"
            parts.append(f"{r.pod.key} by PodDisruptionBudget {named}")
        else:
            codes.add(
                reasons.MULTIPLE_PDBS if r.outcome == "multiple-pdbs" else reasons.EVICTION_REFUSED
            )
            parts.append(f"{r.pod.key}: {r.message}")
    code = next(
        c
        for c in (reasons.PDB_BLOCKING, reasons.MULTIPLE_PDBS, reasons.EVICTION_REFUSED)
        if c in codes
    )
    details = {"pods": str(len(refused)), "evicted": str(evicted)}
    if blocking:
        first = blocking[0]
        details["podDisruptionBudget"] = f"{first[0]}/{first[1]}"
        info = known.get(first)
        if info is not None:
            details["allowedDisruptions"] = str(info.disruptions_allowed)
            details["currentHealthy"] = str(info.current_healthy)
            details["desiredHealthy"] = str(info.desired_healthy)
            details["expectedPods"] = str(info.expected_pods)
    return Reason(
        code=code,
        message=_clip(f"eviction refused for {len(refused)} pod(s): " + "; ".join(parts)),
        objects=_listed([*(refs[k] for k in sorted(refs)), *(r.pod.ref for r in refused)]),
        details=details,
    )


def settle(
    pending: Pending,
    results: Sequence[EvictionResult],
    *,
    pdbs: Sequence[PdbInfo],
    now: datetime,
) -> Decision:
    """Fold the eviction results of a drain step into the record and events.

    Refusals (a PDB at zero, several PDBs, a terminating namespace) make the node
    ``blocked`` and are retried after ``eviction_retry_s``; accepted evictions leave it
    ``draining`` until the pods are gone.
    """
    ctx = _Ctx(
        cr=pending.cr,
        generation=pending.generation,
        node=pending.node,
        source=pending.source,
        now=now,
    )
    accepted = [r for r in results if r.outcome in ("evicted", "deleted")]
    refused = [r for r in results if r.outcome in ("refused", "multiple-pdbs", "retry")]
    evicted = pending.evicted_before + len(accepted)
    prev = pending.previous
    if refused:
        reason = _refusal_reason(refused, pdbs, evicted)
        new = _moved(
            prev, "blocked", now, started=_episode_start(prev, pending.started), reason=reason
        )
        publish: tuple[events.Event, ...] = ()
        if prev.phase != "blocked" or _new_blocker(prev.reason, reason):
            publish = (
                ctx.event(
                    events.DrainBlocked,
                    "drain-blocked",
                    new.started.isoformat(),
                    _digest(reason),
                    reason=reason,
                ),
            )
        return Decision(
            write=NodeWrite(record=Write(new)) if new != prev else None,
            publish=publish,
            requeue_after=_soonest(pending.eviction_retry_s, pending.remaining_s),
        )
    awaited = sorted([*pending.awaited, *(r.pod for r in accepted)], key=lambda p: p.key)
    new = _moved(
        prev,
        "draining",
        now,
        started=_episode_start(prev, pending.started),
        reason=_draining_reason(awaited, evicted),
    )
    return Decision(
        write=NodeWrite(record=Write(new)) if new != prev else None,
        requeue_after=_soonest(pending.deletion_poll_s, pending.remaining_s),
    )


def _episode_start(prev: DrainRecord, mine: datetime) -> datetime:
    """When this drain began. Another replica may have entered draining first and written its
    own start; keeping it keeps the drain timeout and the drained event's id the same for
    every replica (a second start would publish node.drained twice)."""
    return prev.started if prev.phase in ("draining", "blocked") else mine


def _new_blocker(old: Reason | None, new: Reason) -> bool:
    """``new`` names other blockers than ``old`` (worth an event; changed counts are not)."""
    return old is None or (old.code, old.objects) != (new.code, new.objects)


# ---- release ----------------------------------------------------------------------------------


def _release(
    ctx: _Ctx, rec: DrainRecord, node: NodeFacts, others: Mapping[str, DrainRecord | None]
) -> Decision:
    holders = sorted(cr for cr, o in others.items() if o is None or o.cordoned)
    uncordon = rec.cordoned and not rec.preexisting and not holders and node.unschedulable
    publish: tuple[events.Event, ...] = ()
    if rec.cordoned:
        publish = (
            ctx.event(
                events.NodeUncordoned,
                "uncordoned",
                rec.started.isoformat(),
                still_cordoned_by=tuple(holders),
            ),
        )
    return Decision(
        write=NodeWrite(record=Remove(), unschedulable=False if uncordon else None),
        publish=publish,
    )
