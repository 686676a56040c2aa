"""The reconcile runtime every service shell is built from.

A :class:`Controller` owns one keyed work queue and feeds it from three directions, so a
lost, duplicated or reordered event can never leave work undone:

- informers (list+watch caches of Nodes, NodeWrights, pods ...) map each change to keys;
- JetStream consumers map each event to keys and ack only after a reconcile of those keys
  that started after the event arrived has finished (the side effect happened);
- a periodic resync enqueues every key the service is responsible for, in the queue's low
  lane: it recovers what was missed without delaying what just changed. The informers'
  periodic replays of their caches go in the low lane too. A key the queue holds settled
  (its last reconcile asked for nothing, and nothing queued it since) is resynced only every
  :data:`SETTLED_RESYNCS` intervals.

The service supplies ``reconcile(key) -> requeue_after | None`` (the thin shell around its
pure core) and the key mappings. Keys are ``(cr, node)`` pairs for per-node work.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

from shared import events, pods, streaming
from shared.informer import (
    Informer,
    OnChange,
    Transform,
    key_of,
    strip_managed_fields,
    wait_synced,
)
from shared.kube import JSON, ApiError, Kube, path_of
from shared.rollout.approvals import APPROVALS_ANNOTATION
from shared.rollout.book import BATCHES_ANNOTATION
from shared.runtime import ServiceContext
from shared.workqueue import QueueMetrics, WorkQueue

K = TypeVar("K", bound=Hashable)

_log = logging.getLogger("nodewright.controller")

NodeKey = tuple[str, str]
"""(NodeWright name, node name)."""


SETTLED_RESYNCS: Final = 10
"""A settled key is looked at again by the resync every this many resync intervals (every
10 minutes by default), not every interval: its caches have not changed for it since its
last reconcile, so each resync decided the same again, 10,000 times a minute per service for
a fleet of 10,000 nodes at rest (issue 15)."""


@dataclass
class Controller(Generic[K]):
    ctx: ServiceContext
    name: str
    reconcile: Callable[[K], Awaitable[float | None]]
    all_keys: Callable[[], Iterable[K]]
    """Every key this service is responsible for now (used by the periodic resync)."""
    workers: int = 8
    queue: WorkQueue[K] = field(init=False)
    informers: list[Informer] = field(default_factory=list)
    consumers: list[streaming.Consumer] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.queue = WorkQueue(
            self.name,
            metrics=QueueMetrics.make(self.ctx.registry),
            settled_s=self.ctx.settings.resync_interval_s * SETTLED_RESYNCS,
        )

    def watch(
        self,
        path: str,
        *,
        to_keys: Callable[[JSON | None, JSON | None], Iterable[K]],
        label_selector: str = "",
        field_selector: str = "",
        name: str = "",
        also: OnChange | None = None,
        transform: Transform | None = strip_managed_fields,
    ) -> Informer:
        """Keep a cache of ``path`` and enqueue the keys each change maps to."""

        def on_change(old: JSON | None, new: JSON | None) -> None:
            if also is not None:
                also(old, new)
            # The informer's periodic replay of its cache (the same object as old and new) is
            # a resync too: its keys wait behind fresh work, like the controller's own. In
            # the normal lane, each replay put every node of a 10,000-node fleet ahead of the
            # nodes that had just changed (issue 15).
            replay = old is not None and old is new
            for key in to_keys(old, new):
                self.queue.add(key, low=replay)

        informer = Informer(
            kube=self.ctx.kube,
            path=path,
            on_change=on_change,
            label_selector=label_selector,
            field_selector=field_selector,
            resync_s=self.ctx.settings.resync_interval_s * 5,
            name=name or path,
            transform=transform,
        )
        # Services sharing a process share the list and watch of what they all cache.
        self.ctx.informers.attach(informer)
        self.informers.append(informer)
        return informer

    def consume(
        self,
        spec: streaming.ConsumerSpec,
        to_keys: Callable[[events.AnyEvent], Iterable[K]],
    ) -> None:
        """Reconcile the keys named by each event on ``spec``'s subjects; ack afterwards."""

        async def handle(event: events.AnyEvent, _: streaming.Delivery) -> streaming.Outcome:
            keys = list(to_keys(event))
            if not keys:
                return streaming.Ack()
            results = await asyncio.gather(*(self.queue.reconcile_now(k) for k in keys))
            if all(results):
                return streaming.Ack()
            return streaming.Retry(why="reconcile failed; it is retried with backoff", delay_s=5.0)

        self.consumers.append(
            streaming.Consumer(
                bus=self.ctx.bus,
                spec=spec,
                handler=handle,
                service=self.ctx.name,
                stopping=self.ctx.supervisor.stopping,
                registry=self.ctx.registry,
            )
        )

    def register(self) -> None:
        """Add the controller's root tasks to the service's supervisor."""
        sup = self.ctx.supervisor
        for informer in self.informers:
            sup.add(f"informer:{informer.name}", informer.run)
        sup.add(f"queue:{self.name}", self._run_queue, graceful=True)
        sup.add(f"resync:{self.name}", self._resync)
        for consumer in self.consumers:
            sup.add(f"consumer:{consumer.spec.durable}", consumer.run, graceful=True)

    async def synced(self) -> None:
        await wait_synced(*self.informers, timeout_s=3600)

    async def _run_queue(self) -> None:
        # Reconciling from a half-filled cache would take wrong decisions (e.g. budgets).
        if not await self._synced_unless_stopping():
            self.queue.close()  # stopped before the caches filled: nothing will run
            return
        await self.queue.run(
            self.reconcile, workers=self.workers, stopping=self.ctx.supervisor.stopping
        )

    async def _synced_unless_stopping(self) -> bool:
        """Wait for the caches to fill; False if the service stops first (an API server
        that does not answer must not hold the stop for the whole grace period)."""
        filled = asyncio.create_task(self.synced(), name=f"{self.name}-synced")
        stopped = asyncio.create_task(self.ctx.supervisor.stopping.wait())
        try:
            done, _ = await asyncio.wait((filled, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (filled, stopped):
                task.cancel()
            await asyncio.gather(filled, stopped, return_exceptions=True)
        if filled in done:
            filled.result()  # a cache that never filled is the service's failure
            return True
        return False

    async def _resync(self) -> None:
        await self.synced()
        interval = self.ctx.settings.resync_interval_s
        while True:
            keys = set(self.all_keys())
            self.queue.retain(keys)
            for key in keys:
                self.queue.add(key, low=True)
            # Jittered: replicas started together (a rollout of the Deployment) must not
            # resync in lockstep.
            await asyncio.sleep(interval * random.uniform(0.9, 1.1))


class PodIndex:
    """NodeWright pods by (cr, node), kept up to date from a pod informer's changes, and
    what each runs (:func:`shared.pods.parts`), read once per version of the pod."""

    def __init__(self) -> None:
        self._by_key: dict[NodeKey, set[str]] = {}
        # Informer key -> (resourceVersion, parts). A node's pods were parsed again on every
        # reconcile of the node, about a quarter of the executor's and the validator's CPU at
        # 1,000 nodes (issue 15); the pod's resourceVersion says when a reading is stale.
        self._parts: dict[str, tuple[str, tuple[pods.PodView, ...]]] = {}

    def keys(self) -> set[NodeKey]:
        return set(self._by_key)

    def names(self, key: NodeKey) -> list[str]:
        """Informer keys (namespace/name) of the pods of ``key``, sorted."""
        return sorted(self._by_key.get(key, ()))

    def parts(self, key: NodeKey, get: Callable[[str], JSON | None]) -> list[pods.PodView]:
        """The parts of the pods of ``key`` as ``get`` (the pod informer's) has them, in the
        order of :meth:`names`."""
        out: list[pods.PodView] = []
        for name in self.names(key):
            pod = get(name)
            if pod is None:
                continue
            version = str((pod.get("metadata") or {}).get("resourceVersion") or "")
            known = self._parts.get(name)
            if known is not None and version and known[0] == version:
                out.extend(known[1])
                continue
            read = pods.parts(pod)
            if version:
                self._parts[name] = (version, read)
            out.extend(read)
        return out

    @staticmethod
    def key_of_pod(obj: JSON) -> NodeKey | None:
        view = pods.view(obj)
        return (view.cr, view.node) if view.cr and view.node else None

    def to_keys(self, old: JSON | None, new: JSON | None) -> list[NodeKey]:
        key = self.key_of_pod(new or old or {})
        return [key] if key else []

    def on_change(self, old: JSON | None, new: JSON | None) -> None:
        obj = new or old
        key = self.key_of_pod(obj) if obj else None
        if obj is None or key is None:
            return
        if new is None:
            self._parts.pop(key_of(obj), None)
            names = self._by_key.get(key, set())
            names.discard(key_of(obj))
            if not names:
                self._by_key.pop(key, None)
        else:
            self._by_key.setdefault(key, set()).add(key_of(obj))


def status_only(old: JSON | None, new: JSON | None) -> bool:
    """A NodeWright change that no per-node decision reads: its status (written by the
    status service on every change of a rollout) or its finalizers. What the drainer, the
    executor and the validator decide from is its spec (the generation), its annotations
    (pause, disable) and whether it is being deleted; waking every node of the
    NodeWright for the rest cost each of them a pass over all its nodes (issue 15)."""
    if old is None or new is None:
        return False
    a, b = old.get("metadata") or {}, new.get("metadata") or {}
    if any(a.get(k) != b.get(k) for k in ("generation", "deletionTimestamp")):
        return False
    return _read_annotations(a) == _read_annotations(b)


_SCHEDULERS_ONLY: Final = frozenset({BATCHES_ANNOTATION, APPROVALS_ANNOTATION})


def _read_annotations(meta: JSON) -> dict[str, Any]:
    """A NodeWright's annotations but the scheduler's batch book and the approvals between
    batches, which only the scheduler, the status service and the CLI read: the book,
    written on every batch and admission, woke each node of the NodeWright in the three
    per-node services (issue 15)."""
    notes = meta.get("annotations") or {}
    return {k: v for k, v in notes.items() if k not in _SCHEDULERS_ONLY}


def node_unchanged(old: JSON | None, new: JSON | None) -> bool:
    """A node change that no decision of the scheduler, the drainer, the executor or the
    validator reads: a condition's heartbeat, or the status service's node condition (its
    report, written once per state of each node). They decide from the node's metadata, its
    spec, whether it is Ready and its boot ID; waking each of them for the rest cost a pass
    per node on each write of the status service and on every kubelet heartbeat (issue 15).
    The change is still cached: the next decision reads it, with its resourceVersion."""
    if old is None or new is None or old is new:
        return False  # an add, a delete, or the informer's periodic replay of its cache
    return _decided_from(old) == _decided_from(new)


def _decided_from(node: JSON) -> tuple[Any, ...]:
    meta = {k: v for k, v in (node.get("metadata") or {}).items() if k != "resourceVersion"}
    status = node.get("status") or {}
    ready = [c.get("status") for c in status.get("conditions") or () if c.get("type") == "Ready"]
    return (meta, node.get("spec"), ready, (status.get("nodeInfo") or {}).get("bootID"))


async def patch_node(kube: Kube, nodes: Informer, name: str, body: JSON) -> bool:
    """Merge-patch a node (``body`` normally carries a resourceVersion precondition) and
    write the result through to the cache. False when the node changed or is gone: the
    caller re-decides on fresh data."""
    try:
        updated = await kube.patch(path_of(plural="nodes", name=name), body)
    except ApiError as exc:
        if exc.conflict or exc.not_found:
            return False
        raise
    nodes.observe(updated)
    return True
