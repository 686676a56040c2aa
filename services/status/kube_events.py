"""Kubernetes Events for what happened on the bus, as request bodies: built here, created by
the status shell.

- Every JetStream event becomes a core/v1 Event on its NodeWright and, for an event about a
  node, a second one on the Node, so ``kubectl describe`` shows it on both. The reason is
  the CamelCase of the kind (``StageFailed``, ``Cordoned``, ``NodeCompleted`` ...), the type
  Warning for failures and blocked drains; the message names the NodeWright, node, package,
  stage and the event's reason.
- Every dead-lettered message becomes a Warning ``DeadLetteredEvent``: on the NodeWright its
  original subject names, or, when that is unknown, on NodeWright's own namespace. The
  payload may be garbage; only the headers and the subject are read.

Names are deterministic (a hash of what identifies the message and the object) so a
redelivered message creates nothing new: the API server answers 409. Messages are bounded.
Events about cluster-scoped objects must live in namespace ``default``: without eventTime the
API server accepts them nowhere else. Pure: no I/O; creating the Events is the shell's job.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal, assert_never

from shared import api, events, nodestate, subjects

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
) -> dict[str, Any]:
    """A core/v1 Event (the classic form: first/lastTimestamp and count, no eventTime)."""
    stamp = _timestamp(at)
    meta: dict[str, Any] = {"name": event_name(involved, key), "namespace": namespace}
    if cr:
        meta["labels"] = {LABEL_NODEWRIGHT: cr}
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
