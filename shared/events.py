"""The wire contract: every event NodeWright services publish on NATS JetStream.

Events are frozen msgspec Structs tagged by ``kind`` (``node.selected``, ``stage.failed`` ...)
and carry a contract version ``v``. Evolution is additive: a new field gets a default, a new
kind gets a new tag, a field never changes type; decoders ignore unknown fields, so old and
new services interoperate. Each event has a deterministic ``id`` (used as ``Nats-Msg-Id``)
so a re-published event is stored once.

Events are nudges, not state: Kubernetes holds the truth, and a consumer that gets an event
re-reads the objects it names. The payload says enough for operators and for the status
service's Kubernetes Events. Publishing and consuming live in ``shared.streaming``; the subject
of an event comes from ``shared.subjects``. This module does no I/O.
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Annotated, Any, Final, TypeVar

import msgspec

from shared import subjects

VERSION: Final = 1
"""The contract version this code writes."""

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=253)]


class ObjectRef(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A Kubernetes object an event or reason points at (a PDB, a stage pod)."""

    kind: str
    name: str
    namespace: str = ""


class Reason(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Why a node waits or failed, machine-readable first.

    ``code`` is a stable CamelCase identifier (``PodDisruptionBudgetBlocking``,
    ``ProtectedPodRunning``, ``DrainTimeout``, ``ImagePullFailed``, ``CheckFailed`` ...);
    ``message`` is for humans; ``objects`` names what is in the way.
    """

    code: str
    message: str
    objects: tuple[ObjectRef, ...] = ()
    details: dict[str, str] = {}


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    """Fields every event has."""

    v: int = VERSION
    id: str
    """Deterministic identity: the same fact published twice has the same id."""
    at: datetime
    cr: Name
    """The NodeWright the event is about."""
    generation: int
    """The CR's metadata.generation the emitter acted on."""
    node: str | None = None
    source: str = ""
    """The emitting service and replica, for operators."""

    @property
    def kind(self) -> str:
        return _tag_of(type(self))

    @property
    def subject(self) -> str:
        return subjects.event(cr=self.cr, node=self.node, kind=self.kind)


@functools.cache
def _tag_of(cls: type[Event]) -> str:
    # msgspec.inspect builds a whole type description; once per class is enough (issue 15).
    return str(msgspec.inspect.type_info(cls).tag)  # type: ignore[attr-defined]


class PackageRef(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    version: str


class NodeSelected(Event, frozen=True, kw_only=True, tag="node.selected"):
    """The scheduler admitted the node into a batch; its work may start."""

    compartment: str
    batch: int
    disruptive: bool
    """Whether the node will be cordoned and drained before its packages run."""
    packages: tuple[PackageRef, ...] = ()


class NodeCordoned(Event, frozen=True, kw_only=True, tag="node.cordoned"):
    """The drainer cordoned the node for this CR (or found it already cordoned)."""

    preexisting: bool = False


class NodeWaiting(Event, frozen=True, kw_only=True, tag="node.waiting"):
    """The node waits for something outside NodeWright (protected pods, a window ...)."""

    reason: Reason


class DrainBlocked(Event, frozen=True, kw_only=True, tag="node.drain-blocked"):
    """Evictions are refused (a PDB at zero, an unmanaged pod ...); the drainer keeps trying."""

    reason: Reason


class NodeDrained(Event, frozen=True, kw_only=True, tag="node.drained"):
    """Every pod that had to leave is gone; package work may begin."""

    evicted: int = 0


class DrainFailed(Event, frozen=True, kw_only=True, tag="node.drain-failed"):
    """The drain gave up (timeout, policy); the node is failed for this CR."""

    reason: Reason


class StageStarted(Event, frozen=True, kw_only=True, tag="stage.started"):
    package: str
    version: str
    stage: str
    pod: str
    attempt: int = 1


class StageSucceeded(Event, frozen=True, kw_only=True, tag="stage.succeeded"):
    package: str
    version: str
    stage: str
    attempt: int = 1
    started: datetime | None = None
    """When the stage started (its pod was made, or the container before it in its pod
    exited 0); None from versions before it was said."""


class StageFailed(Event, frozen=True, kw_only=True, tag="stage.failed"):
    package: str
    version: str
    stage: str
    reason: Reason
    attempt: int = 1
    started: datetime | None = None
    """When the stage started (see :class:`StageSucceeded`); None for an interrupt."""


class StageValidated(Event, frozen=True, kw_only=True, tag="stage.validated"):
    package: str
    version: str
    stage: str


class ValidationFailed(Event, frozen=True, kw_only=True, tag="stage.validation-failed"):
    package: str
    version: str
    stage: str
    reason: Reason


class NodeValidated(Event, frozen=True, kw_only=True, tag="node.validated"):
    """Every package is installed and checked, and the node itself is healthy."""


class NodeUncordoned(Event, frozen=True, kw_only=True, tag="node.uncordoned"):
    """The drainer released this CR's cordon (the node may stay cordoned for others)."""

    still_cordoned_by: tuple[str, ...] = ()


class NodeCompleted(Event, frozen=True, kw_only=True, tag="node.completed"):
    """The node runs every package of the CR at the desired version."""


class NodeRebooted(Event, frozen=True, kw_only=True, tag="node.rebooted"):
    """The node rebooted since its packages completed, outside NodeWright's interrupts, and
    the CR re-applies on reboot: the node starts over (a reset request)."""

    boot_id_before: str
    boot_id: str


AnyEvent = (
    NodeSelected
    | NodeCordoned
    | NodeWaiting
    | DrainBlocked
    | NodeDrained
    | DrainFailed
    | StageStarted
    | StageSucceeded
    | StageFailed
    | StageValidated
    | ValidationFailed
    | NodeValidated
    | NodeUncordoned
    | NodeCompleted
    | NodeRebooted
)

KINDS: Final = tuple(
    str(msgspec.inspect.type_info(t).tag)  # type: ignore[attr-defined]
    for t in AnyEvent.__args__
)

_decoder: msgspec.json.Decoder[AnyEvent] = msgspec.json.Decoder(AnyEvent)
_encoder = msgspec.json.Encoder()


def decode(data: bytes) -> AnyEvent:
    """Decode one event; raises msgspec.DecodeError / ValidationError on bad input."""
    return _decoder.decode(data)


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


def event_id(*parts: object) -> str:
    """A deterministic event id from the facts that identify it."""
    return "/".join(str(p) for p in parts)


E = TypeVar("E", bound=Event)


class Emitter:
    """Collects events a pure core decides to publish about one (CR, node) pair."""

    def __init__(
        self, *, cr: str, generation: int, node: str | None, now: datetime, source: str
    ) -> None:
        self.cr, self.generation, self.node, self.now, self.source = (
            cr,
            generation,
            node,
            now,
            source,
        )
        self.events: list[Event] = []

    def emit(
        self, cls: type[Event], *facts: object, at: datetime | None = None, **fields: Any
    ) -> None:
        """Queue an event of ``cls``; ``facts`` identify it (they make its deterministic id).
        ``at``: when the fact happened, if not now (an event made again must be the same)."""
        self.events.append(self.make(cls, *facts, at=at, **fields))

    def make(self, cls: type[E], *facts: object, at: datetime | None = None, **fields: Any) -> E:
        """The event :meth:`emit` would queue, for a caller that keeps it elsewhere."""
        return cls(
            id=event_id(self.cr, self.node, *facts),
            at=self.now if at is None else at,
            cr=self.cr,
            generation=self.generation,
            node=self.node,
            source=self.source,
            **fields,
        )
