"""Kubernetes Events for what a person acts on or audits, as request bodies: built here,
written by the status shell.

The step-by-step trail of a rollout is the event stream (docs/events.md); Kubernetes Events
are kept for what someone looks at ``kubectl describe`` or ``kubectl get events`` for:

- a node that **failed** (``NodeFailed``, Warning), is **blocked** (``NodeBlocked``, Warning)
  or **recovered** from either (``NodeRecovered``): :func:`node_changes`, from the state the
  node's condition had (the previous pass) to the one this pass computed; each on the
  Node (``kubectl describe node``) and on the NodeWright;
- a batch that **started** or **finished**, a compartment that **stopped** at its failure
  gate (:func:`compartment_changes`), and the **rollout complete** (:func:`rollout_change`),
  on the NodeWright;
- every **dead letter** (``DeadLetteredEvent``, Warning), on the NodeWright its original
  subject names, else on NodeWright's own namespace.

A healthy rollout thus writes no Event about a node, and a few per batch. Verbose mode
(``NODEWRIGHT_STATUS_VERBOSE_EVENTS=true``) adds one Event per stream event on the NodeWright
(:func:`for_event`) and the compartment's waits and completions, for debugging.

Events are ``events.k8s.io/v1`` Events, aggregated as that API intends: a recurrence of the
same thing (the same node failing again, the same consumer dead-lettering again) is one
Event whose ``series`` counts it (:func:`series_patch`), not a new one. Each Event's name is
a hash of what it is a series of; the annotation :data:`ANNOTATION_OCCURRENCE` identifies the
latest occurrence, so a redelivered message, a repeated pass or another replica seeing the
same occurrence changes nothing. Events about cluster-scoped objects live in namespace
``default`` (the API server accepts no other but kube-system). Pure: no I/O; writing is the
shell's job.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal, assert_never

from services.status import assessing
from shared import api, events, nodestate, progress, reasons, subjects
from shared.records.status import Reported
from shared.rollout import book as batch_book

EVENT_NAMESPACE: Final = "default"
"""Where Events about cluster-scoped objects (NodeWrights, Nodes) are created."""
EVENTS_PATH: Final = "/apis/events.k8s.io/v1/namespaces/{namespace}/events"
CONTROLLER: Final = "nodewright.nvidia.com/status"
"""reportingController of every Event (a qualified name, as events.k8s.io/v1 requires)."""
COMPONENT: Final = "nodewright-status"
"""What the core/v1 view of an Event shows as its source component (older Events)."""
LABEL_NODEWRIGHT: Final = f"{nodestate.DOMAIN}/nodewright"
"""Label on every Event this service creates about a NodeWright (its name)."""
ANNOTATION_OCCURRENCE: Final = f"{nodestate.DOMAIN}/occurrence"
"""The latest occurrence an Event counts (a hash): seen again, nothing changes."""
DEAD_LETTERED: Final = "DeadLetteredEvent"
NODE_FAILED: Final = "NodeFailed"
NODE_BLOCKED: Final = "NodeBlocked"
NODE_RECOVERED: Final = "NodeRecovered"
ROLLOUT_COMPLETE: Final = "RolloutComplete"
MESSAGE_MAX: Final = 1024

EventType = Literal["Normal", "Warning"]

REASONS: Final[Mapping[str, str]] = {
    "node.selected": "NodeSelected",
    "node.cordoned": "Cordoned",
    "node.waiting": "NodeWaiting",
    "node.drain-blocked": "DrainBlocked",
    "node.drained": "Drained",
    "node.drain-failed": "DrainFailed",
    "stage.started": "StageStarted",
    "stage.succeeded": "StageSucceeded",
    "stage.failed": "StageFailed",
    "stage.validated": "StageValidated",
    "stage.validation-failed": "ValidationFailed",
    "node.validated": "NodeValidated",
    "node.uncordoned": "Uncordoned",
    "node.completed": "NodeCompleted",
    "node.rebooted": "NodeRebooted",
    "node.failed": "NodeFailed",
}
"""The Event reason of each event kind (verbose mode)."""

WARNINGS: Final = frozenset(
    {
        "node.drain-blocked",
        "node.drain-failed",
        "stage.failed",
        "stage.validation-failed",
        "node.failed",
    }
)
"""Kinds that raise Warning Events; the others are Normal."""


@dataclass(frozen=True)
class Involved:
    """The object an Event is about."""

    kind: str
    name: str
    api_version: str
    uid: str = ""
    namespace: str = ""

    def ref(self) -> dict[str, str]:
        out = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.uid:
            out["uid"] = self.uid
        if self.namespace:
            out["namespace"] = self.namespace
        return out


def nodewright_ref(name: str, uid: str = "") -> Involved:
    return Involved(kind="NodeWright", name=name, api_version=api.API_VERSION, uid=uid)


def node_ref(name: str, uid: str = "") -> Involved:
    return Involved(kind="Node", name=name, api_version="v1", uid=uid)


def namespace_ref(namespace: str) -> Involved:
    # Naming the namespace as the object's own namespace is what lets the Event live there.
    return Involved(kind="Namespace", name=namespace, api_version="v1", namespace=namespace)


def reason_of(kind: str) -> str:
    """The Event reason of an event kind (CamelCase of the kind when not in the table)."""
    known = REASONS.get(kind)
    if known is not None:
        return known
    words = kind.replace("-", ".").split(".")
    return "".join(w[:1].upper() + w[1:] for w in words if w) or "Event"


def type_of(kind: str) -> EventType:
    return "Warning" if kind in WARNINGS else "Normal"


def _truncate(text: str, limit: int = MESSAGE_MAX) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _reason(reason: events.Reason) -> str:
    text = f"{reason.code}: {reason.message}" if reason.message else reason.code
    if reason.objects:
        names = ", ".join(
            f"{o.kind} {o.namespace + '/' if o.namespace else ''}{o.name}"
            for o in reason.objects[:5]
        )
        text += f" ({names})"
    return text


def describe(event: events.AnyEvent) -> str:
    """A human sentence naming the NodeWright, node, package, stage and reason."""
    on = f"Node {event.node}" if event.node else "every node"
    match event:
        case events.NodeSelected():
            text = f"Selected {on} into batch {event.batch} of compartment {event.compartment}"
            if event.disruptive:
                text += "; it is cordoned and drained first"
            if event.packages:
                text += "; packages " + ", ".join(f"{p.name}:{p.version}" for p in event.packages)
        case events.NodeCordoned():
            text = f"Cordoned {on}" + (" (it was already cordoned)" if event.preexisting else "")
        case events.NodeWaiting():
            text = f"{on} waits: {_reason(event.reason)}"
        case events.DrainBlocked():
            text = f"Drain of {on} is blocked: {_reason(event.reason)}"
        case events.NodeDrained():
            text = f"Drained {on} ({event.evicted} pods evicted)"
        case events.DrainFailed():
            text = f"Drain of {on} failed: {_reason(event.reason)}"
        case events.StageStarted():
            text = (
                f"Started stage {event.stage} of package {event.package} {event.version} on "
                f"{on} (pod {event.pod}, attempt {event.attempt})"
            )
        case events.StageSucceeded():
            text = (
                f"Stage {event.stage} of package {event.package} {event.version} succeeded on "
                f"{on} (attempt {event.attempt})"
            )
        case events.StageFailed():
            text = (
                f"Stage {event.stage} of package {event.package} {event.version} failed on {on} "
                f"(attempt {event.attempt}): {_reason(event.reason)}"
            )
        case events.StageValidated():
            text = (
                f"Check of stage {event.stage} of package {event.package} {event.version} "
                f"passed on {on}"
            )
        case events.ValidationFailed():
            text = (
                f"Check of stage {event.stage} of package {event.package} {event.version} "
                f"failed on {on}: {_reason(event.reason)}"
            )
        case events.NodeValidated():
            text = f"Validated {on}: every package is installed and checked"
        case events.NodeUncordoned():
            text = f"Uncordoned {on}"
            if event.still_cordoned_by:
                text += "; still cordoned by " + ", ".join(event.still_cordoned_by)
        case events.NodeCompleted():
            text = f"Completed {on}: every package is at its desired version"
        case events.NodeRebooted():
            text = (
                f"{on} rebooted (boot ID {event.boot_id_before} -> {event.boot_id}) since its "
                "packages completed; reapplyOnReboot: it starts over"
            )
        case _:
            assert_never(event)
    return _truncate(f"NodeWright {event.cr}: {text}")


def micro_time(at: datetime) -> str:
    """An events.k8s.io MicroTime: RFC 3339 in UTC with microseconds."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode(errors="replace")).hexdigest()[:16]


def event_name(involved: Involved, key: str) -> str:
    """A valid, deterministic Event name: the object's name and a hash of ``key``. The
    object's UID is part of the hash: an object deleted and created again with the same name
    is another object, and ``kubectl describe`` shows only the Events of its UID."""
    digest = _digest(involved.kind, involved.name, involved.uid, key)
    prefix = involved.name[:200].rstrip(".-").lower()
    return f"{prefix}.{digest}" if prefix else digest


@dataclass(frozen=True)
class Occurrence:
    """One thing that happened, to become (or to count in) one Event."""

    regarding: Involved
    reason: str
    type_: EventType
    action: str
    """What NodeWright was doing (events.k8s.io ``action``)."""
    note: str
    series: str
    """What it is one more of: the same ``series`` on the same object is one Event."""
    occurrence: str
    """Identifies this occurrence: seen again (a retry, a restart, another replica), it is
    not counted again."""
    at: datetime
    namespace: str = EVENT_NAMESPACE
    related: Involved | None = None
    cr: str = ""
    annotations: Mapping[str, str] = field(default_factory=dict)


def body(occ: Occurrence, *, instance: str) -> dict[str, Any]:
    """The events.k8s.io/v1 Event that first records ``occ``."""
    meta: dict[str, Any] = {
        "name": event_name(occ.regarding, occ.series),
        "namespace": occ.namespace,
        "annotations": {**occ.annotations, ANNOTATION_OCCURRENCE: _digest(occ.occurrence)},
    }
    if occ.cr:
        meta["labels"] = {LABEL_NODEWRIGHT: occ.cr}
    out: dict[str, Any] = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": meta,
        "eventTime": micro_time(occ.at),
        "reportingController": CONTROLLER,
        "reportingInstance": instance[:128],
        "action": occ.action[:128],
        "reason": occ.reason[:128],
        "type": occ.type_,
        "regarding": occ.regarding.ref(),
        "note": _truncate(occ.note),
    }
    if occ.related is not None:
        out["related"] = occ.related.ref()
    return out


def series_patch(existing: Mapping[str, Any], occ: Occurrence) -> dict[str, Any] | None:
    """The merge patch that counts ``occ`` in the Event ``existing`` (its series and latest
    occurrence), preconditioned on its resourceVersion; None when ``existing`` already
    counts this occurrence."""
    meta = existing.get("metadata") or {}
    mark = _digest(occ.occurrence)
    if (meta.get("annotations") or {}).get(ANNOTATION_OCCURRENCE) == mark:
        return None
    count = int(((existing.get("series") or {}).get("count")) or 1)
    return {
        "metadata": {
            "resourceVersion": meta.get("resourceVersion"),
            "annotations": {ANNOTATION_OCCURRENCE: mark},
        },
        # The note is immutable once created (the API server refuses a change): it tells
        # the first occurrence, the series how many followed and when the last one was.
        "series": {"count": count + 1, "lastObservedTime": micro_time(occ.at)},
    }


def for_event(event: events.AnyEvent, *, cr_uid: str = "", node_uid: str = "") -> Occurrence:
    """Verbose mode: the Event one stream event raises, on its NodeWright (the node as
    ``related``); one series per kind and node, so a node's stages count in one Event."""
    return Occurrence(
        regarding=nodewright_ref(event.cr, cr_uid),
        related=node_ref(event.node, node_uid) if event.node else None,
        reason=reason_of(event.kind),
        type_=type_of(event.kind),
        action=event.kind,
        note=describe(event),
        series=f"{event.kind}\0{event.node or ''}",
        # `at` joins the id: the same fact re-published after the dedupe window is new.
        occurrence=f"{event.kind}\0{event.id}\0{event.at.isoformat()}",
        at=event.at,
        cr=event.cr,
    )


@dataclass(frozen=True)
class DeadLetter:
    """What a dead-lettered message says about itself: its subjects and the headers the
    dead-lettering consumer set (the payload may be garbage and is never decoded)."""

    subject: str
    """The dead-letter subject, ``nw.dlq.<service>``."""
    original_subject: str = ""
    error: str = ""
    deliveries: str = ""
    size: int = 0
    """Payload size in bytes."""

    @property
    def original(self) -> subjects.Address | None:
        return subjects.parse(self.original_subject) if self.original_subject else None

    @property
    def service(self) -> str:
        prefix = subjects.DEAD_LETTERS + "."
        token = self.subject[len(prefix) :] if self.subject.startswith(prefix) else ""
        try:
            return subjects.decode(token) if token else "unknown"
        except ValueError:
            return token


def describe_dead_letter(letter: DeadLetter) -> str:
    original = letter.original
    what = f"a {original.kind} event" if original else "a message"
    about = ""
    if original:
        about = f" of NodeWright {original.cr}"
        if original.node:
            about += f" about Node {original.node}"
    return _truncate(
        f"Service {letter.service} dead-lettered {what}{about} after "
        f"{letter.deliveries or '?'} deliveries: {letter.error or 'no reason given'} "
        f"(subject {letter.original_subject or 'unknown'}, {letter.size} bytes)"
    )


def for_dead_letter(
    letter: DeadLetter,
    *,
    key: str,
    cr_uid: str | None,
    fallback_namespace: str,
    at: datetime,
) -> Occurrence:
    """The Warning Event of a dead letter: on the NodeWright its original subject names when
    that NodeWright exists (``cr_uid`` not None), else on ``fallback_namespace``. Dead letters
    of one service about one kind count in one Event."""
    original = letter.original
    if original is not None and cr_uid is not None:
        involved, namespace, cr = nodewright_ref(original.cr, cr_uid), EVENT_NAMESPACE, original.cr
    else:
        involved, namespace, cr = namespace_ref(fallback_namespace), fallback_namespace, ""
    kind = original.kind if original is not None else "message"
    return Occurrence(
        regarding=involved,
        reason=DEAD_LETTERED,
        type_="Warning",
        action="HandleEvent",
        note=describe_dead_letter(letter),
        series=f"{letter.service}\0{kind}",
        occurrence=key,
        at=at,
        namespace=namespace,
        cr=cr,
    )


# ---- nodes that failed, are blocked, or recovered -------------------------------------------

TROUBLE: Final = frozenset({"Failed", "Blocked"})


def node_changes(
    cr: api.NodeWright,
    views: Sequence[assessing.NodeView],
    observed: Sequence[assessing.Observed],
    *,
    at: datetime,
) -> list[Occurrence]:
    """The target nodes that failed, became blocked or recovered from either since the
    previous pass (the state of their node conditions, ``observed``), as Events on the Node
    and on the NodeWright. Pure; ordered by node."""
    name = cr.metadata.name
    records: Mapping[str, Reported | None] = {o.name: o.reported for o in observed}
    target = progress.target_digest(cr)
    out: list[Occurrence] = []
    for v in sorted(views, key=lambda v: v.name):
        if not v.target:
            continue
        before = records.get(v.name)
        was = before.state if before is not None else None
        type_: EventType
        # A new failure while the last one is still reported (a retry the passes did not see
        # running) is news too: its record gives a time after the condition was written.
        again = before is not None and was == v.phase and v.since > before.since
        if v.phase in TROUBLE and (was != v.phase or again):
            reason, type_ = (NODE_FAILED if v.phase == "Failed" else NODE_BLOCKED), "Warning"
            what = "failed" if v.phase == "Failed" else "is blocked"
            note = f"NodeWright {name}: node {v.name} {what}: {_reason(v.reason)}"
            if v.phase == "Failed":
                note += f" (`nodewright node retry {v.name}` runs it again once fixed)"
            ident = f"{v.phase}\0{v.reason.code}\0{v.since.isoformat()}"
        elif was in TROUBLE and v.phase not in TROUBLE:
            assert before is not None
            reason, type_ = NODE_RECOVERED, "Normal"
            note = (
                f"NodeWright {name}: node {v.name} recovered: it was {was} "
                f"({before.reason.code if before.reason else was}), now {v.phase} "
                f"({v.reason.code})"
            )
            ident = f"recovered\0{was}\0{before.since.isoformat()}"
        else:
            continue
        uid = cr.metadata.uid
        for regarding, related in (
            (node_ref(v.name), nodewright_ref(name, uid)),
            (nodewright_ref(name, uid), node_ref(v.name)),
        ):
            out.append(
                Occurrence(
                    regarding=regarding,
                    related=related,
                    reason=reason,
                    type_=type_,
                    action="RolloutNode",
                    note=note,
                    series=f"{name}\0{v.name}\0{reason}",
                    occurrence=f"{uid}\0{target}\0{v.name}\0{ident}",
                    at=at,
                    cr=name,
                )
            )
    return out


def rollout_change(
    cr: api.NodeWright, status: api.NodeWrightStatus, *, at: datetime
) -> list[Occurrence]:
    """RolloutComplete when this pass found every target node complete and the previous one
    did not; once per target (spec) and fleet size."""
    if status.state != "Complete" or cr.status.state == "Complete":
        return []
    name = cr.metadata.name
    counts = status.node_counts
    return [
        Occurrence(
            regarding=nodewright_ref(name, cr.metadata.uid),
            reason=ROLLOUT_COMPLETE,
            type_="Normal",
            action="Rollout",
            note=_truncate(
                f"NodeWright {name}: rollout complete: all {counts.target} target nodes run "
                f"{status.package_list or 'its packages'}"
            ),
            series=f"complete\0{progress.target_digest(cr)}",
            occurrence=f"{cr.metadata.uid}\0{progress.target_digest(cr)}\0{counts.target}",
            at=at,
            cr=name,
        )
    ]


# ---- per-compartment Events ------------------------------------------------------------------
#
# The batch state is the scheduler's (its batch book on the CR); status.compartments shows it.
# These Events tell its story. They come from comparing the compartments the status service is
# about to write with the ones the CR carries (written by the previous pass), and each node's
# reason with the node condition it carries (also the previous pass's). Level-based: a pass that
# is missed (a crash between the status write and the Events) only makes the story coarser,
# e.g. one BatchFinished for two batches; it never invents a transition.

BATCH_STARTED: Final = "BatchStarted"
BATCH_FINISHED: Final = "BatchFinished"
COMPARTMENT_STOPPED: Final = "CompartmentStopped"
COMPARTMENT_COMPLETED: Final = "CompartmentCompleted"
COMPARTMENT_WAITING: Final = "CompartmentWaiting"
COMPARTMENT_REASONS: Final = (
    BATCH_FINISHED,
    COMPARTMENT_STOPPED,
    BATCH_STARTED,
    COMPARTMENT_WAITING,
    COMPARTMENT_COMPLETED,
)
"""The reasons of per-compartment Events, in the order one pass raises them."""
VERBOSE_ONLY: Final = frozenset({COMPARTMENT_WAITING, COMPARTMENT_COMPLETED})
"""Compartment transitions raised only in verbose mode: a wait is shown by the status (and
the node reasons), a compartment's completion by the rollout's. Except a wait only a person
ends (:data:`WAITS_FOR_A_PERSON`)."""
WAITS_FOR_A_PERSON: Final = frozenset({reasons.BATCH_AWAITING_APPROVAL})
"""Compartment waits that end only when someone acts: their CompartmentWaiting Event is
raised in every mode, so whoever watches Events (or alerts on them) learns of it."""


def raised(change: CompartmentChange, *, verbose: bool) -> bool:
    """Whether a compartment change becomes an Event in this mode."""
    if verbose or change.reason not in VERBOSE_ONLY:
        return True
    return change.annotations.get(ANNOTATION_WAITING) in WAITS_FOR_A_PERSON


ANNOTATION_COMPARTMENT: Final = f"{nodestate.DOMAIN}/compartment"
"""Annotation on every per-compartment Event: the compartment (an annotation, because
``__default__`` is no valid label value)."""
ANNOTATION_BATCH: Final = f"{nodestate.DOMAIN}/batch"
"""The batch an Event is about (BatchFinished: the last batch it covers)."""
ANNOTATION_BATCH_SIZE: Final = f"{nodestate.DOMAIN}/batch-size"
ANNOTATION_SUCCEEDED: Final = f"{nodestate.DOMAIN}/succeeded"
ANNOTATION_FAILED: Final = f"{nodestate.DOMAIN}/failed"
ANNOTATION_WAITING: Final = f"{nodestate.DOMAIN}/waiting-reason"

_NAMED_NODES: Final = 5
"""Nodes a BatchStarted Event names; the others are counted."""


@dataclass(frozen=True)
class CompartmentChange:
    """One transition of one compartment, to become a Normal or Warning Event on the
    NodeWright."""

    compartment: str
    reason: str
    """One of :data:`COMPARTMENT_REASONS`."""
    type_: EventType
    message: str
    key: str
    """Identifies the transition and is hashed into the Event name: seen again (a retry, a
    restart, another replica), it names the same Event, which then exists already."""
    annotations: Mapping[str, str]


def _epoch(cr: api.NodeWright, book: batch_book.BatchBook) -> str:
    """What a batch number is unique within: the NodeWright object, the target its nodes move
    to, and the last batch-state reset by command (the other resets come with a new target,
    or after completion)."""
    return (
        f"{cr.metadata.uid or cr.metadata.name}\0{progress.target_digest(cr)}\0{book.reset_token}"
    )


def _node_names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_NAMED_NODES])
    if len(names) > _NAMED_NODES:
        shown += f" and {len(names) - _NAMED_NODES} more"
    return shown


def _complete(c: api.CompartmentStatus) -> bool:
    return c.matched_nodes > 0 and c.complete_nodes == c.matched_nodes


def compartment_changes(
    cr: api.NodeWright,
    current: Sequence[api.CompartmentStatus],
    views: Sequence[assessing.NodeView],
    observed: Sequence[assessing.Observed],
) -> list[CompartmentChange]:
    """The transitions between the compartments ``cr.status`` shows (the previous pass's) and
    ``current`` (this pass's, from ``views``), and between the reasons the nodes' status
    conditions give (``observed``, the previous pass's) and ``views``:

    - BatchStarted: a batch opened (number, size, nodes);
    - BatchFinished: batches finished (successes, failures, verdict; Warning when the last one
      was below the success threshold), including the last one of a rollout whose batch state
      was reset on completion;
    - CompartmentStopped (Warning): the failure threshold was reached;
    - CompartmentWaiting: the reason the compartment starts nothing changed to one of
      ``shared.reasons.COMPARTMENT_WAITS`` (no Event when the wait ends: the next
      BatchStarted says so);
    - CompartmentCompleted: every node of the compartment is complete.

    Pure; ordered by compartment, then as :data:`COMPARTMENT_REASONS`."""
    name = cr.metadata.name
    book = batch_book.read_batch_book(cr.metadata.annotations)
    epoch = _epoch(cr, book)
    previous = {c.name: c for c in cr.status.compartments}
    records = {o.name: o.reported for o in observed}
    members: dict[str, list[assessing.NodeView]] = {}
    for v in views:
        if v.target:
            members.setdefault(v.compartment, []).append(v)
    out: list[CompartmentChange] = []
    for cur in sorted(current, key=lambda c: c.name):
        prev = previous.get(cur.name) or api.CompartmentStatus(name=cur.name)
        mine = members.get(cur.name, [])
        entry = book.compartments.get(cur.name)
        out.extend(_batch_changes(name, epoch, prev, cur, mine, entry, cr))
        out.extend(_waiting_changes(name, epoch, prev, cur, mine, entry, records))
        if _complete(cur) and not _complete(prev):
            out.append(
                CompartmentChange(
                    compartment=cur.name,
                    reason=COMPARTMENT_COMPLETED,
                    type_="Normal",
                    message=_truncate(
                        f"NodeWright {name}: compartment {cur.name} completed: "
                        f"{cur.complete_nodes} of {cur.matched_nodes} nodes complete"
                    ),
                    key=f"{epoch}\0{cur.name}\0completed\0{cur.matched_nodes}",
                    annotations={ANNOTATION_COMPARTMENT: cur.name},
                )
            )
    order = {r: i for i, r in enumerate(COMPARTMENT_REASONS)}
    return sorted(out, key=lambda c: (c.compartment, order[c.reason]))


def _batch_changes(
    name: str,
    epoch: str,
    prev: api.CompartmentStatus,
    cur: api.CompartmentStatus,
    members: Sequence[assessing.NodeView],
    entry: batch_book.CompartmentBatch | None,
    cr: api.NodeWright,
) -> list[CompartmentChange]:
    p, c = prev.batch, cur.batch
    comp = cur.name
    out: list[CompartmentChange] = []
    reset = (
        c.current_batch < p.current_batch
        or c.total_succeeded_nodes < p.total_succeeded_nodes
        or c.total_failed_nodes < p.total_failed_nodes
    )
    # (first batch, last batch, successes, failures, what identifies the end of the last
    # batch without the previous status: a stale previous status only coarsens the message)
    finished: tuple[int, int, int, int, str] | None = None
    if not reset and c.current_batch > p.current_batch:
        finished = (
            p.current_batch,
            c.current_batch - 1,
            c.total_succeeded_nodes - p.total_succeeded_nodes,
            c.total_failed_nodes - p.total_failed_nodes,
            f"{c.total_succeeded_nodes}\0{c.total_failed_nodes}",
        )
    elif (
        p.batch_size > 0
        and c.batch_size == 0
        and c.current_batch <= p.current_batch
        and members
        and all(progress.node_done(cr, v.facts) for v in members)
    ):
        # The last batch of a rollout: the scheduler resets the batch state on completion
        # instead of closing the batch, so its end shows as every node being done.
        finished = (p.current_batch, p.current_batch, p.batch_size, 0, "on completion")
    if finished is not None:
        first, last, success, failure, ident = finished
        failed_batch = success + failure > 0 and c.last_batch_failed and not reset
        if success + failure == 0:
            verdict = "no node judged"
        elif failed_batch:
            verdict = (
                f"below the success threshold ({c.consecutive_failed_batches} "
                "consecutive failed batches)"
            )
        else:
            verdict = "passed"
        which = f"batch {last}" if first == last else f"batches {first} to {last}"
        out.append(
            CompartmentChange(
                compartment=comp,
                reason=BATCH_FINISHED,
                type_="Warning" if failed_batch else "Normal",
                message=_truncate(
                    f"NodeWright {name}: compartment {comp} finished {which}: "
                    f"{success} succeeded, {failure} failed; {verdict}"
                ),
                key=f"{epoch}\0{comp}\0finished\0{last}\0{ident}",
                annotations={
                    ANNOTATION_COMPARTMENT: comp,
                    ANNOTATION_BATCH: str(last),
                    ANNOTATION_SUCCEEDED: str(success),
                    ANNOTATION_FAILED: str(failure),
                },
            )
        )
    if c.stopped and not p.stopped:
        out.append(
            CompartmentChange(
                compartment=comp,
                reason=COMPARTMENT_STOPPED,
                type_="Warning",
                message=_truncate(
                    f"NodeWright {name}: compartment {comp} stopped before batch "
                    f"{c.current_batch}: {c.stop_reason or 'Stopped'}: "
                    f"{c.stop_message or 'it starts no new node until its batch state is reset'}"
                ),
                key=f"{epoch}\0{comp}\0stopped\0{c.current_batch}\0{c.total_failed_nodes}",
                annotations={ANNOTATION_COMPARTMENT: comp, ANNOTATION_BATCH: str(c.current_batch)},
            )
        )
    if c.batch_size > 0 and (p.batch_size == 0 or c.current_batch != p.current_batch or reset):
        nodes = list(entry.nodes) if entry is not None else []
        planned = entry.planned if entry is not None else 0
        named = f": {_node_names(nodes)}" if nodes else ""
        nominal = f" (nominal size {planned})" if planned and planned != c.batch_size else ""
        out.append(
            CompartmentChange(
                compartment=comp,
                reason=BATCH_STARTED,
                type_="Normal",
                message=_truncate(
                    f"NodeWright {name}: compartment {comp} started batch {c.current_batch} "
                    f"with {c.batch_size} nodes{nominal}, budget {cur.budget_nodes}{named}"
                ),
                key=f"{epoch}\0{comp}\0started\0{c.current_batch}\0" + ",".join(sorted(nodes)),
                annotations={
                    ANNOTATION_COMPARTMENT: comp,
                    ANNOTATION_BATCH: str(c.current_batch),
                    ANNOTATION_BATCH_SIZE: str(c.batch_size),
                },
            )
        )
    return out


def _waiting_changes(
    name: str,
    epoch: str,
    prev: api.CompartmentStatus,
    cur: api.CompartmentStatus,
    members: Sequence[assessing.NodeView],
    entry: batch_book.CompartmentBatch | None,
    records: Mapping[str, Reported | None],
) -> list[CompartmentChange]:
    comp = cur.name
    c = cur.batch
    batch_nodes = assessing.batch_in_flight(entry)
    in_flight = batch_nodes is not None
    waiting = assessing.waiting_to_start(members)
    now = assessing.wait_of(members, entry)
    if now is None:
        return []
    # The reason the previous pass gave, judged the same way when it was about the same batch
    # (otherwise unknown: the Event name keeps a repeat from doing anything).
    before: assessing.CompartmentWait | None = None
    if prev.batch.current_batch == c.current_batch and (prev.batch.batch_size > 0) == in_flight:
        earlier = []
        for v in waiting:
            rec = records.get(v.name)
            if rec is not None and rec.state == "Waiting" and rec.reason is not None:
                earlier.append(assessing.PendingWait(v.name, rec.reason.code, rec.reason.message))
        before = assessing.compartment_wait(earlier, batch_nodes)
    if before is not None and before.code == now.code:
        return []
    when = f"batch {c.current_batch} in flight" if in_flight else f"before batch {c.current_batch}"
    return [
        CompartmentChange(
            compartment=comp,
            reason=COMPARTMENT_WAITING,
            type_="Normal",
            message=_truncate(
                f"NodeWright {name}: compartment {comp} waits ({when}): {now.code}: "
                f"{now.message} ({now.nodes} nodes, e.g. {now.example})"
            ),
            key=f"{epoch}\0{comp}\0waiting\0{c.current_batch}\0{in_flight}\0{now.code}",
            annotations={
                ANNOTATION_COMPARTMENT: comp,
                ANNOTATION_BATCH: str(c.current_batch),
                ANNOTATION_WAITING: now.code,
            },
        )
    ]


def for_compartment_changes(
    cr: api.NodeWright, changes: Sequence[CompartmentChange], *, at: datetime
) -> list[Occurrence]:
    """The Events of the changes, on the NodeWright; each transition is its own series."""
    involved = nodewright_ref(cr.metadata.name, cr.metadata.uid)
    return [
        Occurrence(
            regarding=involved,
            reason=change.reason,
            type_=change.type_,
            action="RunBatch" if change.reason in (BATCH_STARTED, BATCH_FINISHED) else "Rollout",
            note=change.message,
            series=change.key,
            occurrence=change.key,
            at=at,
            cr=cr.metadata.name,
            annotations=change.annotations,
        )
        for change in changes
    ]
