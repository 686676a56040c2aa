"""Kubernetes Events for what happened on the bus and in each compartment's rollout, as
request bodies: built here, created by the status shell.

- Every JetStream event becomes a core/v1 Event on its NodeWright and, for an event about a
  node, a second one on the Node, so ``kubectl describe`` shows it on both. The reason is
  the CamelCase of the kind (``StageFailed``, ``Cordoned``, ``NodeCompleted`` ...), the type
  Warning for failures and blocked drains; the message names the NodeWright, node, package,
  stage and the event's reason.
- Every dead-lettered message becomes a Warning ``DeadLetteredEvent``: on the NodeWright its
  original subject names, or, when that is unknown, on NodeWright's own namespace. The
  payload may be garbage; only the headers and the subject are read.
- Every transition of a compartment's rollout (:func:`compartment_changes`: BatchStarted,
  BatchFinished, CompartmentStopped, CompartmentWaiting, CompartmentCompleted) becomes an
  Event on the NodeWright, found by comparing the compartments and node reasons a status
  pass is about to write with the ones the previous pass wrote; annotations on the Event
  carry the compartment, batch and counts for tools.

Names are deterministic (a hash of what identifies the message, or the transition, and the
object) so a redelivered message or a transition seen again creates nothing new: the API
server answers 409. Messages are bounded.
Events about cluster-scoped objects must live in namespace ``default``: without eventTime the
API server accepts them nowhere else. Pure: no I/O; creating the Events is the shell's job.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal, assert_never

from services.status import assessing
from shared import api, events, nodestate, progress, subjects
from shared.nodestate import StatusRecord

EVENT_NAMESPACE: Final = "default"
"""Where Events about cluster-scoped objects (NodeWrights, Nodes) are created."""
COMPONENT: Final = "nodewright-status"
LABEL_NODEWRIGHT: Final = f"{nodestate.DOMAIN}/nodewright"
"""Label on every Event this service creates about a NodeWright (its name)."""
DEAD_LETTERED: Final = "DeadLetteredEvent"
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
"""The Event reason of each event kind."""

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


def _timestamp(at: datetime) -> str:
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_name(involved: Involved, key: str) -> str:
    """A valid, deterministic Event name: the object's name and a hash of ``key``."""
    digest = hashlib.sha256(
        f"{involved.kind}\0{involved.name}\0{key}".encode(errors="replace")
    ).hexdigest()[:16]
    prefix = involved.name[:200].rstrip(".-").lower()
    return f"{prefix}.{digest}" if prefix else digest


def body(
    *,
    key: str,
    involved: Involved,
    namespace: str,
    reason: str,
    type_: EventType,
    message: str,
    at: datetime,
    instance: str,
    cr: str = "",
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A core/v1 Event (the classic form: first/lastTimestamp and count, no eventTime)."""
    stamp = _timestamp(at)
    meta: dict[str, Any] = {"name": event_name(involved, key), "namespace": namespace}
    if cr:
        meta["labels"] = {LABEL_NODEWRIGHT: cr}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": meta,
        "involvedObject": involved.ref(),
        "reason": reason,
        "message": _truncate(message),
        "type": type_,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance[:128],
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def for_event(
    event: events.AnyEvent, *, cr_uid: str = "", node_uid: str = "", instance: str
) -> list[dict[str, Any]]:
    """The Events one JetStream event raises: on its NodeWright, and on its Node if any."""
    kind = event.kind
    # `at` joins the id: the same fact re-published after the dedupe window is a new message.
    key = f"{kind}\0{event.id}\0{event.at.isoformat()}"
    targets = [nodewright_ref(event.cr, cr_uid)]
    if event.node:
        targets.append(node_ref(event.node, node_uid))
    message = describe(event)
    return [
        body(
            key=key,
            involved=target,
            namespace=EVENT_NAMESPACE,
            reason=reason_of(kind),
            type_=type_of(kind),
            message=message,
            at=event.at,
            instance=instance,
            cr=event.cr,
        )
        for target in targets
    ]


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
    instance: str,
) -> dict[str, Any]:
    """The Warning Event of a dead letter: on the NodeWright its original subject names when
    that NodeWright exists (``cr_uid`` not None), else on ``fallback_namespace``."""
    original = letter.original
    if original is not None and cr_uid is not None:
        involved, namespace, cr = nodewright_ref(original.cr, cr_uid), EVENT_NAMESPACE, original.cr
    else:
        involved, namespace, cr = namespace_ref(fallback_namespace), fallback_namespace, ""
    return body(
        key=key,
        involved=involved,
        namespace=namespace,
        reason=DEAD_LETTERED,
        type_="Warning",
        message=describe_dead_letter(letter),
        at=at,
        instance=instance,
        cr=cr,
    )


# ---- per-compartment Events ------------------------------------------------------------------
#
# The batch state is the scheduler's (its batch book on the CR); status.compartments shows it.
# These Events tell its story. They come from comparing the compartments the status service is
# about to write with the ones the CR carries (written by the previous pass), and each node's
# reason with the status record it carries (also the previous pass's). Level-based: a pass that
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


def _epoch(cr: api.NodeWright, book: progress.BatchBook) -> str:
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
    records give (``observed``, the previous pass's) and ``views``:

    - BatchStarted: a batch opened (number, size, nodes);
    - BatchFinished: batches finished (successes, failures, verdict; Warning when the last one
      was below the success threshold), including the last one of a rollout whose batch state
      was reset on completion;
    - CompartmentStopped (Warning): the failure threshold was reached;
    - CompartmentWaiting: the reason the compartment starts nothing changed to one of
      ``assessing.COMPARTMENT_WAIT_REASONS`` (no Event when the wait ends: the next
      BatchStarted says so);
    - CompartmentCompleted: every node of the compartment is complete.

    Pure; ordered by compartment, then as :data:`COMPARTMENT_REASONS`."""
    name = cr.metadata.name
    book = progress.read_batch_book(cr.metadata.annotations)
    epoch = _epoch(cr, book)
    previous = {c.name: c for c in cr.status.compartments}
    records = {o.name: o.record for o in observed}
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
    entry: progress.CompartmentBatch | None,
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
    entry: progress.CompartmentBatch | None,
    records: Mapping[str, StatusRecord | None],
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
            if rec is not None and rec.phase == "Waiting" and rec.reason is not None:
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
    cr: api.NodeWright, changes: Sequence[CompartmentChange], *, at: datetime, instance: str
) -> list[dict[str, Any]]:
    """The Events of the changes, on the NodeWright."""
    involved = nodewright_ref(cr.metadata.name, cr.metadata.uid)
    return [
        body(
            key=change.key,
            involved=involved,
            namespace=EVENT_NAMESPACE,
            reason=change.reason,
            type_=change.type_,
            message=change.message,
            at=at,
            instance=instance,
            cr=cr.metadata.name,
            annotations=change.annotations,
        )
        for change in changes
    ]
