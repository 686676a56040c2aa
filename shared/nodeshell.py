"""The one per-node shell of the drainer, the executor and the validator: it carries out a
:class:`shared.decisions.NodeDecision` through two ports.

:func:`apply` does, in this order, what every such service did by hand before:

1. patch the node once (the owner's record written, kept or removed, the ``spec`` fields and
   the owner's other annotations of the decision), with what the decision read of the node
   it was taken on (:attr:`NodeDecision.observed`, :mod:`shared.nodepins`; else that node's
   resourceVersion) as precondition: a decision taken on a stale node is refused (the key
   is looked at again at once, on fresh data), a status write since does not refuse it.
   With :attr:`NodeDecision.fence`, when nothing is written, the node is read from the API
   server instead and compared the same way (:meth:`NodePort.confirm`) before any
   pod is created or deleted (see there), unless the only pods to delete are
   :attr:`NodeDecision.settled` ones (finished, and moved past by the record decided on: no
   record can still want them);
2. create the ConfigMaps and pods (one that exists already is success: names are
   deterministic), at most :data:`CREATE_WITHIN_S` after that write; delete the pods, each
   with its UID and resourceVersion as preconditions and only once it is
   :data:`MIN_POD_AGE_S` old;
3. publish the events, which step 1 wrote into the owner's outbox on the node in the same
   patch as the transition they describe (``shared.outbox``; the events of the previous
   transition the stream holds leave the outbox in that same patch: no write clears it).
   An outbox left by a writer that died before it published is published by the next pass
   of the key, whoever makes it (:func:`flush`).

Why both bounds: a replica may decide to create a pod it has not seen yet in its cache
(another replica just created it); its create then meets the pod (AlreadyExists) as long as
nobody deleted it meanwhile. Nobody deletes a pod younger than :data:`MIN_POD_AGE_S`, and
a create comes at most :data:`CREATE_WITHIN_S` after the write that proved the record still
wanted it, so a stage never runs twice under one name.

The ports are Protocols: :class:`NodePort` (the node cache and its preconditioned patch),
:class:`ObjectPort` (pods and ConfigMaps in the services' namespace) and :class:`EventPort`
(the bus). :class:`KubeNodes`, :class:`KubeObjects` and :class:`BusEvents` are the real
ones; ``tests/fakes`` has in-memory ones, so the shell is tested in milliseconds. Deciding
is the cores' job; what a service reads before deciding is its own shell's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol

import nats.errors
import nats.js.errors

from shared import events, nodepins, nodestate, outbox
from shared.controller import Controller
from shared.decisions import JSON, Keep, NodeDecision, PodRef, Remove, Write
from shared.informer import Informer
from shared.kube import ApiError, Kube, path_of
from shared.pods import LABEL_CR, LABEL_MANAGED, LABEL_PACKAGE, MANAGED_BY
from shared.streaming import TooLate

_log = logging.getLogger("nodewright.nodeshell")

STALE_RETRY_S: Final = 0.5
"""When a key whose node write was refused (the node changed) is looked at again."""

CREATE_WITHIN_S: Final = 5.0
"""A pod is created at most this long after the node write that proved the decision
current; later (a slow API server), the key is decided again instead."""

KNOWN_PER_NODE: Final = 8
"""Event ids :class:`BusEvents` remembers per NodeWright and node: more than an outbox holds
(a transition's events, plus those of earlier ones while NATS was away)."""

DEDUPE_MARGIN_S: Final = 10.0
"""An event this much younger than JetStream's deduplication window is re-published without
looking: JetStream still drops it. The margin covers a copy nats-py held while reconnecting
(the publisher sends no attempt after the event's cutoff: ``send_by``)."""

STOP_DEADLINE_S: Final = 1
"""The ``activeDeadlineSeconds`` that stops a pod: any pod the executor stops has run
longer, so the kubelet ends it at once (SIGTERM, then SIGKILL after the pod's grace), and
the pod stays, Failed with reason DeadlineExceeded, with its containers' logs."""

MIN_POD_AGE_S: Final = 20.0
"""No pod younger than this is deleted: longer than :data:`CREATE_WITHIN_S` plus how far a
replica's pod cache may lag its node cache, so no replica can still be about to create it."""


class NodePort(Protocol):
    """The nodes a service sees, and the one way it writes one."""

    def get(self, name: str) -> JSON | None:
        """The node as last seen (None: gone)."""
        ...

    async def patch(self, name: str, body: JSON, pins: nodepins.Pins | None = None) -> bool:
        """Merge-patch the node; False when the node changed or is gone. The precondition
        is ``pins`` (what the decision read is unchanged) when given, else the
        resourceVersion ``body`` carries. What was written is seen by :meth:`get` at once."""
        ...

    async def confirm(self, name: str, version: str, pins: nodepins.Pins | None = None) -> bool:
        """Whether the API server's node (a quorum read) still holds ``pins`` when given,
        else is still at resourceVersion ``version``; False when it changed or is gone."""
        ...


class ObjectPort(Protocol):
    """Pods and ConfigMaps in the services' namespace."""

    async def create(self, body: JSON) -> bool:
        """Create ``body`` (a Pod or ConfigMap); False when it exists already."""
        ...

    async def delete_pod(self, pod: PodRef) -> bool:
        """Delete the pod if it is still the object ``pod`` names, unchanged (UID and
        resourceVersion as preconditions); True when it is gone, False when it changed."""
        ...

    async def stop_pod(self, pod: PodRef) -> bool:
        """Have the kubelet end the pod and the API server keep it (for its logs): its
        ``activeDeadlineSeconds`` set to :data:`STOP_DEADLINE_S`, if it is still the object
        ``pod`` names (its UID); True when it is stopping or gone, False when it changed."""
        ...


class EventPort(Protocol):
    def delivered(self, event: events.Event) -> bool:
        """Whether this process knows the stream holds ``event`` (it published it, JetStream
        called it a duplicate, or it found it there). Memory only: no I/O."""
        ...

    async def settle(self, todo: Sequence[events.Event]) -> None:
        """Put on the stream, in order, each of ``todo`` it does not hold yet, each once.
        Raises :class:`Unpublished` when the bus cannot take them now."""
        ...


class Unpublished(Exception):
    """The bus did not take an event (NATS down or partitioned): it stays in the outbox."""


UNPUBLISHED_RETRY_S: Final = 2.0
"""When a key whose events could not be published is looked at again."""


def node_patch(
    decision: NodeDecision,
    resource_version: str,
    unpublished: tuple[events.Event, ...] = (),
    *,
    had_outbox: bool = False,
) -> JSON:
    """The merge patch of ``decision`` for the node at ``resource_version``; its events go
    into the owner's outbox, after the ``unpublished`` ones already there. ``had_outbox``:
    the node holds an outbox of the owner (delivered events are dropped from it)."""
    annotations: dict[str, str | None] = dict(decision.annotations)
    if decision.events or had_outbox:
        # The events on the stream already go with this write; only those not known to be
        # there stay, before the new ones (no events left: the annotation goes).
        annotations[outbox.key(decision.owner, decision.cr)] = outbox.value(
            outbox.merged(unpublished, decision.events)
        )
    match decision.record:
        case Write(record=record):
            body = nodestate.patch(decision.owner, decision.cr, record)
            annotations.update(body["metadata"]["annotations"])
        case Remove():
            annotations[nodestate.key(decision.owner, decision.cr)] = None
        case Keep():
            pass
    meta: JSON = {"resourceVersion": resource_version}
    if annotations:
        meta["annotations"] = annotations
    patch: JSON = {"metadata": meta}
    if decision.spec:
        patch["spec"] = dict(decision.spec)
    return patch


async def apply(
    decision: NodeDecision,
    *,
    nodes: NodePort,
    bus: EventPort,
    objects: ObjectPort | None = None,
    written: Callable[[], None] | None = None,
    announced: Callable[[Sequence[events.Event]], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> float | None:
    """Carry out ``decision``; return when to look at the key again (None: when something
    changes). ``written`` is called once the node write landed (what it
    recorded happened, once: a stale write of another replica does not land), ``announced``
    with the announcements this pass published (:attr:`NodeDecision.announce`); a pod whose
    announcement the bus did not take is not deleted in this pass. ``clock``
    times the create window, ``now`` pods' ages."""
    where = {"nodewright": decision.cr, "node": decision.node}
    # Pods too young to delete are left for a later pass, and do not ask for the fence
    # write on their own: a finished pod waits MIN_POD_AGE_S, and every change of the node
    # meanwhile (dozens) otherwise cost a precondition-only PATCH each (issue 15).
    at = now()
    young = [p for p in decision.delete if _age_s(p, at) < MIN_POD_AGE_S]
    again_young = min((MIN_POD_AGE_S - _age_s(p, at) for p in young), default=None)
    if young:
        decision = replace(decision, delete=tuple(p for p in decision.delete if p not in young))
    fenced = clock()
    cached = nodes.get(decision.node)
    if cached is None:
        return None  # gone: its pods and records go with it
    unsaid = await _announce(decision, bus, announced)
    if unsaid:
        # The stream does not hold what these pods say yet: they stay until it does.
        kept = tuple(p for p in decision.delete if p.name not in unsaid)
        decision = replace(decision, delete=kept)
        again_young = _sooner(again_young, UNPUBLISHED_RETRY_S)
    held = outbox.pending(cached, decision.owner, decision.cr)
    unpublished = tuple(e for e in held if not bus.delivered(e))
    current = str(cached["metadata"]["resourceVersion"])
    pins = None
    version = current
    if decision.observed is not None:
        pins = nodepins.of(decision.observed, status=decision.reads_status)
        version = str(decision.observed["metadata"]["resourceVersion"])
    if decision.patches_node:
        # A node that changed since the decision (the cache moved on while the shell read or
        # waited) is not sent the write the API server would refuse: decided again at once.
        stale = not pins.holds(cached) if pins is not None else version != current
        body = node_patch(decision, version, unpublished, had_outbox=bool(held))
        if stale or not await nodes.patch(decision.node, body, pins):
            _log.info("Skipped stale Node write", extra=where)
            return STALE_RETRY_S
        fenced = clock()
        if written is not None:
            written()
    elif decision.needs_fence:
        # A read proves what a precondition-only PATCH proved, without a write that every
        # node watcher is sent (issue 15: the validator starts each check this way).
        if not await nodes.confirm(decision.node, version, pins):
            _log.info("Skipped pods of a stale decision", extra=where)
            return STALE_RETRY_S
        fenced = clock()
    again = decision.requeue_after
    if again_young is not None:
        again = _sooner(again, again_young)
    if decision.config_maps or decision.create or decision.delete or decision.stop:
        if objects is None:
            raise ValueError("a decision with pods or ConfigMaps needs an object port")
        again = await _objects(decision, objects, fenced=fenced, clock=clock, again=again)
    flushed = await flush(
        owner=decision.owner, cr=decision.cr, node=decision.node, nodes=nodes, bus=bus
    )
    if flushed is not None:
        again = _sooner(again, flushed)
    return again


async def _announce(
    decision: NodeDecision,
    bus: EventPort,
    announced: Callable[[Sequence[events.Event]], None] | None,
) -> set[str]:
    """Publish the decision's announcements the stream is not known to hold, oldest first;
    the pods whose announcement it did not take."""
    said: list[events.Event] = []
    unsaid: set[str] = set()
    said_by = [(pod, e) for pod, evs in decision.announce.items() for e in evs]
    # Stable: what one pod says at one instant (kwok ends init containers together) keeps
    # the pod's order (a stage's end, then the next stage's start).
    for pod, event in sorted(said_by, key=lambda kv: kv[1].at):
        if bus.delivered(event):
            continue
        # One at a time: a node's announcements share a subject, and the order they were
        # first published in is not this one, which looking up a batch of old events on a
        # subject assumes (it takes the events before the last one stored as stored too).
        if unsaid or not await _settled(bus, [event]):
            unsaid.add(pod)
        else:
            said.append(event)
    if unsaid:
        # NATS is away (the bus logs that once); the pods wait with their events.
        _log.debug(
            "Held pod deletes until the stream takes their events",
            extra={"nodewright": decision.cr, "node": decision.node, "pods": len(unsaid)},
        )
    if said and announced is not None:
        announced(said)
    return unsaid


async def _settled(bus: EventPort, todo: Sequence[events.Event]) -> bool:
    """Whether the stream holds ``todo`` once the bus had them (nothing to do: yes)."""
    if not todo:
        return True
    try:
        await bus.settle(todo)
    except Unpublished:
        return False
    return True


async def _objects(
    decision: NodeDecision,
    objects: ObjectPort,
    *,
    fenced: float,
    clock: Callable[[], float],
    again: float | None,
) -> float | None:
    """Create the decision's ConfigMaps and pods within :data:`CREATE_WITHIN_S` of the
    fence, then delete its pods; when to look at the key again."""
    where = {"nodewright": decision.cr, "node": decision.node}
    for body in (*decision.config_maps, *decision.create):
        if decision.fence and clock() - fenced > CREATE_WITHIN_S:
            # The write that proved the decision current is too old to rely on.
            _log.info("Skipped late create", extra={**where, "within_s": CREATE_WITHIN_S})
            again = STALE_RETRY_S
            break
        if await objects.create(body) and body.get("kind") == "Pod":
            meta = body["metadata"]
            labels = meta.get("labels") or {}
            _log.info(
                "Created Pod",
                extra={
                    **where,
                    "pod": meta["name"],
                    "role": labels.get("nodewright.nvidia.com/role"),
                },
            )
    for pod in decision.delete:
        if not await objects.delete_pod(pod):
            again = STALE_RETRY_S  # it changed since the decision: decide again
    for pod in decision.stop:
        if await objects.stop_pod(pod):
            _log.info("Stopped Pod", extra={**where, "pod": pod.name})
        else:
            again = STALE_RETRY_S
    return again


def _age_s(pod: PodRef, at: datetime) -> float:
    """How old ``pod`` is at ``at``; old enough to delete when its creation is unknown."""
    return (at - pod.created).total_seconds() if pod.created is not None else MIN_POD_AGE_S


async def flush_then(
    *,
    owner: str,
    key: tuple[str, str],
    nodes: NodePort,
    bus: EventPort,
    work: Callable[[tuple[str, str]], Awaitable[float | None]],
    gone: Callable[[str], bool] | None = None,
) -> float | None:
    """A service's reconcile of (cr, node): first the events a writer (this replica or
    another, maybe dead) left in ``owner``'s outbox, then ``work`` whether or not NATS took
    them, then, when ``gone`` says the NodeWright is, :func:`tidy`; the sooner of the retry
    delays (None: none asks for one)."""
    unpublished = await flush(owner=owner, cr=key[0], node=key[1], nodes=nodes, bus=bus)
    again = await work(key)
    if gone is not None and gone(key[0]):
        tidied = await tidy(owner=owner, cr=key[0], node=key[1], nodes=nodes, bus=bus)
        if tidied is not None:
            again = _sooner(again, tidied)
    if unpublished is None:
        return again
    return unpublished if again is None else min(again, unpublished)


def outboxes_to_look_at(
    node: JSON, owner: str, bus: EventPort, gone: Callable[[str], bool]
) -> list[str]:
    """The CRs whose outbox of ``owner`` on ``node`` needs a pass: events the stream may not
    hold, or a NodeWright that is gone (:func:`tidy`). An outbox of published events, which
    every node keeps after its owner's last transition, gives no work."""
    return [
        cr
        for cr in outbox.crs_with(node, owner)
        if gone(cr) or any(not bus.delivered(e) for e in outbox.pending(node, owner, cr))
    ]


async def tidy(*, owner: str, cr: str, node: str, nodes: NodePort, bus: EventPort) -> float | None:
    """The NodeWright is gone: remove ``owner``'s outbox about it from ``node`` once the
    stream holds every event there (an outbox that does not decode goes too). The owner's
    last write there (the record's removal) dropped it already, unless the owner had no
    record left to remove: then this is the one write. None when done, else when to try
    again."""
    cached = nodes.get(node)
    key = outbox.key(owner, cr)
    if cached is None or key not in nodestate.annotations_of(cached):
        return None
    if any(not bus.delivered(e) for e in outbox.pending(cached, owner, cr)):
        return UNPUBLISHED_RETRY_S  # the flush before did not get them out: later
    body = {
        "metadata": {
            "resourceVersion": str(cached["metadata"]["resourceVersion"]),
            "annotations": {key: None},
        }
    }
    if not await nodes.patch(node, body):
        return STALE_RETRY_S
    return None


async def flush(*, owner: str, cr: str, node: str, nodes: NodePort, bus: EventPort) -> float | None:
    """Put on the stream what ``owner``'s outbox about ``cr`` on ``node`` holds and the
    stream does not; None when nothing is left to publish, else when to try again.

    Nothing is written: the outbox keeps events the stream holds until the owner's next
    write of the node drops them (see :func:`apply`). A separate write clearing it after
    each publish was a quarter of the services' Node writes (issue 15); what is left on a
    node is its owner's last events, published."""
    todo = [e for e in outbox.pending(nodes.get(node), owner, cr) if not bus.delivered(e)]
    if not await _settled(bus, todo):
        # NATS is away (the bus logs that once); the events wait in the outbox.
        _log.debug("Kept events in the outbox", extra={"nodewright": cr, "node": node})
        return UNPUBLISHED_RETRY_S
    return None


@dataclass
class Unflushed:
    """The outboxes of ``owner`` that may hold events the stream does not, for a service
    whose passes are per NodeWright, not per node (the scheduler): noted from the node
    watch, flushed by the NodeWright's next pass, and kept until a flush gets them all out.

    A key dropped before its flush succeeded was never looked at again once its node stopped
    changing: 20 released nodes of a rollout never had their ``node.completed`` on the
    stream when NATS was killed during their release (issue 15's fault run)."""

    owner: str
    nodes: NodePort
    bus: EventPort
    keys: set[tuple[str, str]] = field(default_factory=set)

    def note(self, node: JSON, gone: Callable[[str], bool]) -> None:
        name = str(node["metadata"]["name"])
        for cr in outboxes_to_look_at(node, self.owner, self.bus, gone):
            self.keys.add((cr, name))

    def forget(self, cr: str) -> None:
        self.keys = {k for k in self.keys if k[0] != cr}

    async def flush(self, cr: str, node: str | None = None) -> float | None:
        """Publish what the outboxes of ``cr`` (on ``node`` only, when given) hold and the
        stream does not; None when all went out, else when to try again (the keys stay)."""
        again: float | None = None
        keys = [(cr, node)] if node is not None else sorted(k for k in self.keys if k[0] == cr)
        for key in keys:
            self.keys.discard(key)
            delay = await flush(
                owner=self.owner, cr=key[0], node=key[1], nodes=self.nodes, bus=self.bus
            )
            if delay is not None:
                self.keys.add(key)
                again = _sooner(again, delay)
        return again


def pod_refs(pods: Informer, namespace: str, names: Iterable[str]) -> tuple[PodRef, ...]:
    """The pods a core decided to delete, as the cache holds them (their UID and
    resourceVersion become the delete's preconditions)."""
    out = []
    for name in names:
        cached = pods.get(f"{namespace}/{name}")
        out.append(PodRef.of(cached) if cached is not None else PodRef(name=name))
    return tuple(out)


def _sooner(a: float | None, b: float) -> float:
    return b if a is None else min(a, b)


# ---- the real ports -------------------------------------------------------------------------


@dataclass
class KubeNodes:
    """:class:`NodePort` over the API server and a node informer (written through)."""

    kube: Kube
    informer: Informer

    _unpinned: dict[str, str] = field(default_factory=dict)
    """Node -> the resourceVersion of a node whose pinned write the API server refused.
    A refusal the cache then shows no change for (a string the API server compares
    otherwise than :func:`shared.nodepins.encode` writes it, an API server of another
    JSON Patch dialect) would be refused again forever: the next write of a decision
    taken on that same node carries the resourceVersion instead."""

    def get(self, name: str) -> JSON | None:
        return self.informer.get(name)

    async def patch(self, name: str, body: JSON, pins: nodepins.Pins | None = None) -> bool:
        path = path_of(plural="nodes", name=name)
        decided = pins.resource_version if pins is not None else ""
        pinned = None
        if pins is not None and self._unpinned.get(name) != decided:
            pinned = pins.json_patch(body)
        try:
            if pinned is not None:
                updated = await self.kube.patch(path, pinned, kind="json")
            else:
                updated = await self.kube.patch(path, body)
        except ApiError as exc:
            if pinned is not None and exc.patch_not_applicable:
                self._unpinned[name] = decided
                return False
            if exc.conflict or exc.not_found:
                return False
            raise
        self._unpinned.pop(name, None)
        self.informer.observe(updated)
        return True

    async def confirm(self, name: str, version: str, pins: nodepins.Pins | None = None) -> bool:
        try:
            node = await self.kube.get(path_of(plural="nodes", name=name))
        except ApiError as exc:
            if exc.not_found:
                return False
            raise
        # Not written through to the cache: a node someone else changed is the watch's to
        # deliver, as the change every key it concerns is woken by.
        if pins is not None:
            return pins.holds(node)
        return str(node["metadata"]["resourceVersion"]) == version


@dataclass
class KubeObjects:
    """:class:`ObjectPort` over the API server; created pods are written through to the
    pod informer (and ``on_pod``) so the next pass does not create them again.

    With ``config_maps`` (:func:`package_config_maps`), a package ConfigMap the cache holds
    is not created again: a package with a ``configMap`` otherwise cost a POST answered 409
    for every stage pod on every node after the first (issue 15). One the cache
    does not hold yet (just made by another replica or service) is still only an
    AlreadyExists; one someone deleted leaves the cache, and the next pod recreates it."""

    kube: Kube
    namespace: str
    pods: Informer | None = None
    on_pod: Callable[[JSON | None, JSON | None], None] | None = None
    config_maps: Informer | None = None

    async def create(self, body: JSON) -> bool:
        plural = "pods" if body.get("kind") == "Pod" else "configmaps"
        cache = self.config_maps if plural == "configmaps" else None
        if cache is not None and cache.get(f"{self.namespace}/{body['metadata']['name']}"):
            return False
        created: Any = await self.kube.create_if_absent(
            path_of(plural=plural, namespace=self.namespace), body
        )
        if created is None:
            return False
        if cache is not None:
            cache.observe(created)
        if plural == "pods":
            if self.pods is not None:
                self.pods.observe(created)
            if self.on_pod is not None:
                self.on_pod(None, created)
        return True

    async def delete_pod(self, pod: PodRef) -> bool:
        preconditions = {"uid": pod.uid} if pod.uid else {}
        if pod.resource_version:
            preconditions["resourceVersion"] = pod.resource_version
        path = path_of(plural="pods", namespace=self.namespace, name=pod.name)
        try:
            await self.kube.delete(
                path, {"preconditions": preconditions} if preconditions else None
            )
        except ApiError as exc:
            if exc.not_found:
                return True
            if exc.conflict:
                return False  # another object of that name, or changed since: decide again
            raise
        return True

    async def stop_pod(self, pod: PodRef) -> bool:
        path = path_of(plural="pods", namespace=self.namespace, name=pod.name)
        ops: list[JSON] = [
            {"op": "add", "path": "/spec/activeDeadlineSeconds", "value": STOP_DEADLINE_S}
        ]
        if pod.uid:
            ops.insert(0, {"op": "test", "path": "/metadata/uid", "value": pod.uid})
        try:
            updated = await self.kube.patch(path, ops, kind="json")
        except ApiError as exc:
            if exc.not_found:
                return True
            if exc.conflict or exc.patch_not_applicable:
                return False  # another pod of that name: decide again
            raise
        # Written through: the next pass sees it stopping and does not stop it again.
        if self.pods is not None:
            self.pods.observe(updated)
        if self.on_pod is not None:
            self.on_pod(None, updated)
        return True


PACKAGE_CONFIG_MAPS: Final = f"{LABEL_MANAGED}={MANAGED_BY},{LABEL_PACKAGE}"
"""Label selector of the package ConfigMaps the executor and the validator create."""


def presence_only(obj: JSON) -> JSON:
    """What the package ConfigMap cache keeps of one: its metadata, not its files (up to
    1 MiB each, and only their existence and whose they are are asked about)."""
    meta = obj.get("metadata") or {}
    kept = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta}
    labels = meta.get("labels") or {}
    kept["labels"] = {k: labels[k] for k in (LABEL_CR, LABEL_PACKAGE) if k in labels}
    return {"metadata": kept}


def package_config_maps(controller: Controller[Any], namespace: str) -> Informer:
    """The cache of package ConfigMaps for :class:`KubeObjects` (no key is woken by them)."""
    return controller.watch(
        path_of(plural="configmaps", namespace=namespace),
        label_selector=PACKAGE_CONFIG_MAPS,
        to_keys=lambda old, new: (),
        transform=presence_only,
        name="package-configmaps",
    )


class Stream(Protocol):
    """What :class:`BusEvents` needs of the publisher (:class:`shared.streaming.Publisher`)."""

    @property
    def duplicate_window_s(self) -> float: ...

    async def publish(self, event: events.Event, *, send_by: datetime | None = None) -> bool: ...

    async def last_id(self, subject: str) -> str | None: ...

    async def ids_on(self, subject: str) -> set[str]: ...


@dataclass
class BusEvents:
    """:class:`EventPort` over the JetStream publisher.

    It remembers, per NodeWright and node, the ids of the last events it knows the stream
    holds (:data:`KNOWN_PER_NODE`), so a pass over an outbox already published costs nothing.
    An event older than JetStream's deduplication window (less a margin) that this process
    does not know about (it restarted, or another replica published it long ago) is looked
    up first: the last message on its subject, and, when that is another event, every
    message on the subject (another replica may have carried it forward and published it
    with later ones). Re-published blindly, it would be stored twice. A blind publish that
    NATS held back until the event crossed that age is given up (:class:`Unpublished`): the
    next pass looks it up."""

    publisher: Stream
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    _known: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)

    def delivered(self, event: events.Event) -> bool:
        return event.id in self._known.get((event.cr, event.node or ""), ())

    def _remember(self, event: events.Event) -> None:
        key = (event.cr, event.node or "")
        self._known[key] = (*self._known.get(key, ())[-(KNOWN_PER_NODE - 1) :], event.id)

    async def settle(self, todo: Sequence[events.Event]) -> None:
        todo = [e for e in todo if not self.delivered(e)]
        if not todo:
            return
        cutoff = timedelta(seconds=self.publisher.duplicate_window_s - DEDUPE_MARGIN_S)
        try:
            held, looked_up = await self._on_stream(todo)
            for event in todo:
                if event.id in looked_up:
                    if event.id not in held:
                        await self.publisher.publish(event)  # the stream does not hold it
                else:
                    # Sent blind, it must reach JetStream while the window still covers any
                    # earlier copy: one sent later is stored twice (a NATS outage held the
                    # attempts of a restarted replica past it, issue 15).
                    await self.publisher.publish(event, send_by=event.at + cutoff)
                self._remember(event)
        except TooLate as exc:
            raise Unpublished("older than the deduplication window now: look it up") from exc
        except (nats.errors.Error, TimeoutError, OSError) as exc:
            raise Unpublished(repr(exc)) from exc

    async def _on_stream(self, todo: Sequence[events.Event]) -> tuple[set[str], set[str]]:
        """The ids among the old events of ``todo`` the stream holds, and the ids looked up.
        By subject: when the last message there is one of them, it and every event of
        ``todo`` before it on that subject (published in order); when it is another, the
        ids of the subject's messages. That other may be an earlier event (then these were
        not published) or a later one: a replica that did not know these published carried
        them into its own write, published them and then its own events (CI, issue 15)."""
        cutoff = self.publisher.duplicate_window_s - DEDUPE_MARGIN_S
        at = self.now()
        by_subject: dict[str, list[str]] = {}
        for event in todo:
            if (at - event.at).total_seconds() > cutoff:
                by_subject.setdefault(event.subject, []).append(event.id)
        held: set[str] = set()
        for subject, ids in by_subject.items():
            last = await self.publisher.last_id(subject)
            if last in ids:
                held.update(ids[: ids.index(last) + 1])
            elif last is not None:
                stored = await self.publisher.ids_on(subject)
                held.update(i for i in ids if i in stored)
        return held, {i for ids in by_subject.values() for i in ids}
