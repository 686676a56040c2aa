"""What a per-node decision is made of, as data: the values the drainer's, executor's and
validator's cores return and :mod:`shared.nodeshell` carries out.

- :data:`RecordChange`: what happens to the service's own record on the node: :class:`Keep`
  it, :class:`Write` a new one, or :class:`Remove` it (three things ``None`` used to mean);
- :class:`NodeDecision`: one (NodeWright, node) pass of a service: the record change, what
  else goes into the same node patch (``spec.unschedulable``, taints, the owner's other
  annotations), whether pods may only be created after a resourceVersion-checked write
  (:attr:`NodeDecision.fence`), the ConfigMaps and pods to create, the pods to delete, the
  events to publish and when to look again;
- :class:`Work`: the accumulator a core fills while it decides (pod requests, the pods to
  keep, events, the soonest requeue).

Pure: no I/O. Building pod manifests is ``shared.podspec``'s; carrying a decision out is
``shared.nodeshell``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

import msgspec

from shared import api, events
from shared.events import Event
from shared.podspec import PodRequest
from shared.progress import NodeFacts

R = TypeVar("R", bound=msgspec.Struct)


@dataclass(frozen=True)
class Keep:
    """Leave the record as it is."""


@dataclass(frozen=True)
class Write(Generic[R]):
    """Write ``record`` (a new record, or a changed one)."""

    record: R


@dataclass(frozen=True)
class Remove:
    """Delete the record: the work it tracked is over, or a reset asked to forget it."""


RecordChange = Keep | Write[Any] | Remove

JSON = dict[str, Any]


@dataclass(frozen=True)
class PodRef:
    """One pod as a decision saw it: deleted only if it is still that object, unchanged."""

    name: str
    uid: str = ""
    resource_version: str = ""
    created: datetime | None = None
    """Its creationTimestamp: a pod younger than ``shared.nodeshell.MIN_POD_AGE_S`` is not
    deleted yet (a replica that has not seen it yet may be about to create it)."""

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> PodRef:
        meta = pod.get("metadata") or {}
        stamp = meta.get("creationTimestamp")
        return cls(
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            resource_version=str(meta.get("resourceVersion") or ""),
            created=datetime.fromisoformat(stamp.replace("Z", "+00:00")) if stamp else None,
        )


@dataclass(frozen=True)
class NodeDecision:
    """One pass of one service for one (NodeWright, node), for :func:`shared.nodeshell.apply`.

    The node is patched once (preconditioned on what the decision read of the node, see
    :attr:`observed`, so a decision taken on a stale node is refused and taken again) when
    anything of it changes, or when :attr:`fence` asks for the check before pods are
    created. Then the ConfigMaps and pods are created (an existing one is success: names are
    deterministic), the pods deleted, the events published.
    """

    owner: str
    """The annotation owner (``shared.nodestate.DRAINER`` ...) of the record."""
    cr: str
    node: str
    record: RecordChange = field(default_factory=Keep)
    spec: Mapping[str, Any] = field(default_factory=dict)
    """Node ``spec`` fields set in the same patch (``unschedulable``, ``taints``)."""
    annotations: Mapping[str, str | None] = field(default_factory=dict)
    """More annotations of the owner's own set in the same patch (None removes one)."""
    fence: bool = False
    """Create and delete pods only once the node is proved unchanged since the decision: by
    the decision's own write, or, when nothing else changes, by reading the node's
    resourceVersion from the API server (:meth:`shared.nodeshell.NodePort.confirm`). A
    replica whose cache has not seen another one record a result and delete its pod must
    not run it again, and a replica whose node is behind its pod cache must not delete a pod
    the current record still runs (another replica would create it a second time)."""
    config_maps: tuple[JSON, ...] = ()
    create: tuple[JSON, ...] = ()
    delete: tuple[PodRef, ...] = ()
    """Pods to delete, in the services' namespace: exactly the ones decided on (their UID
    and resourceVersion are the delete's preconditions)."""
    stop: tuple[PodRef, ...] = ()
    """Pods to stop and keep (for their logs): the kubelet ends them (``activeDeadlineSeconds``
    set past their start) and the API server keeps them, unlike a delete. Asks for no
    fence: only a record that already says the stage failed stops its pod, and a stopped
    pod is never started again."""
    settled: frozenset[str] = frozenset()
    """Names among :attr:`delete` whose outcome the owner's record the decision was taken
    on already holds (a finished pod of a stage or check the record has moved past). A
    record only moves forward and a later attempt or cycle gets a new pod name, so the
    current record cannot still need such a pod, however stale the cache: deleting it asks
    for no fence write (1.5 precondition-only Node PATCHes per node per service, issue 15)."""
    events: tuple[events.Event, ...] = ()
    announce: Mapping[str, tuple[Event, ...]] = field(default_factory=dict)
    """By pod name, the events of what that pod says, published before the node write and
    without one (the executor's ``stage.started`` of a stage after the first in its pod and
    ``stage.succeeded``, the validator's ``stage.validated`` of a check with a stage after
    it in its pod): deterministic, so any pass may send them again; the pod, if among
    :attr:`delete`, is deleted only once the stream holds them (the pod is what says them)."""
    requeue_after: float | None = None
    observed: JSON | None = None
    """The node the decision was taken on, as the cache held it: the write's precondition
    is what the decision read of it (``shared.nodepins``: its labels, annotations and spec,
    and with :attr:`reads_status` whether it is Ready and its boot ID), not its
    resourceVersion, which every status write moves; a node that cannot be pinned gives its
    resourceVersion. Not the cache's node when the write is made: the cache may have moved
    on while the shell awaited something (the executor's metadata ConfigMap, the drainer's
    evictions), and a decision taken on the old node would land on the new one (two
    executor replicas each started the same stage under a name of its own). None: the
    cache's node at the write (for decisions that read nothing of the node)."""
    reads_status: bool = True
    """The decision read the node's Ready condition or boot ID (see :attr:`observed`)."""

    @property
    def patches_node(self) -> bool:
        """The decision writes the node (which also fences its pods)."""
        return (
            not isinstance(self.record, Keep)
            or bool(self.spec)
            or bool(self.annotations)
            or bool(self.events)  # they go into the outbox with the transition
        )

    @property
    def needs_fence(self) -> bool:
        """Pods are created or deleted that only a node unchanged since the decision may
        create or delete (everything but :attr:`settled` deletes)."""
        return self.fence and (
            bool(self.create) or any(p.name not in self.settled for p in self.delete)
        )


@dataclass
class Work:
    """What a core has decided so far in one pass: pods to create, pods to keep (every other
    NodeWright pod of the pair is deleted), events, the soonest time to look again."""

    cr: api.NodeWright
    node: NodeFacts
    now: datetime
    source: str
    create: list[PodRequest] = field(default_factory=list)
    keep: set[str] = field(default_factory=set)
    out: events.Emitter = field(init=False)
    requeue: float | None = None
    said: dict[str, dict[str, events.Event]] = field(default_factory=dict)
    """By pod name and event id, what the pass says from each pod, in the order said
    (:meth:`say`, :attr:`NodeDecision.announce`)."""

    def __post_init__(self) -> None:
        self.out = events.Emitter(
            cr=self.cr.metadata.name,
            generation=self.cr.metadata.generation,
            node=self.node.name,
            now=self.now,
            source=self.source,
        )

    def later(self, seconds: float) -> None:
        """Look again within ``seconds`` (the soonest of every such wish)."""
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)

    def say(self, pod: str, event: events.Event) -> None:
        """Publish ``event`` from ``pod``, without a write (once per id)."""
        self.said.setdefault(pod, {})[event.id] = event

    def announcements(self) -> dict[str, tuple[events.Event, ...]]:
        """What :meth:`say` collected, as :attr:`NodeDecision.announce` takes it."""
        return {pod: tuple(by_id.values()) for pod, by_id in self.said.items() if by_id}

    def start(self, req: PodRequest) -> None:
        """Create ``req``'s pod (and keep it)."""
        self.create.append(req)
        self.keep.add(req.name)
