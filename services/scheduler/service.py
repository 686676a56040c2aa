"""The scheduler's async shell: caches, leader election, and writing the rollout kernel's
decisions.

One replica holds the ``nodewright-scheduler`` Lease and acts; the others stand by (a dead
holder's lease expires and another replica takes over). For each NodeWright (the work key)
it builds the kernel's :class:`shared.rollout.fleet.Fleet` from the caches (every
NodeWright, policy and node, and its own settings: the cluster budget) and asks
:func:`shared.rollout.fleet.decide`. Then, in this order, so that the budget holds at every
instant whatever write is lost:

1. it writes the releases (the node's resourceVersion as precondition) and, if any was
   written, decides again on the cache it wrote through: a lost release still holds its slot;
2. it writes the batch book on the CR (annotation ``scheduler.nodewright.nvidia.com/batches``,
   the CR's resourceVersion as precondition) with the fence of the admissions to come; a
   lost book write admits nothing;
3. it writes each admission with the resourceVersion the fence recorded, and publishes
   ``node.selected`` / ``node.completed`` for what was written.

Releases that come due are also written at once, outside any pass (a work key of their
own per NodeWright, :class:`ReleaseKey`): a release only frees a slot, so it needs no
decision over the fleet, and a pass that decided before it errs on the safe side. Then the
NodeWright's pass is queued to use the slots. The pass still releases what this fast path
missed; the two paths never write one release twice.

It also owns the NodeWright's finalizer: added before the first admission; on deletion the
same decisions admit nodes for their uninstalls, and once nothing of the CR holds a node the
finalizer goes (each service then removes its own records of the NodeWright). Decisions of
all NodeWrights are serialized by one lock, so two CRs never both take the last slot of a
shared budget. Deciding is the kernel's job.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Literal, NamedTuple

import msgspec
from prometheus_client import CollectorRegistry, Counter, Histogram

from services.scheduler import core, passing
from services.scheduler.config import Settings
from shared import (
    api,
    events,
    nodeshell,
    nodestate,
    outbox,
    progress,
    runtime,
    streaming,
    subjects,
    workqueue,
)
from shared.config import KubeSettings
from shared.controller import Controller, node_unchanged, patch_node
from shared.informer import Informer, slim_node
from shared.kube import JSON, ApiError, path_of
from shared.leader import LeaderElector
from shared.records.scheduler import Selection
from shared.rollout import book as rollout_book, fleet, kernel

NAME = "scheduler"


class ReleaseKey(NamedTuple):
    """The work key of a NodeWright's due releases (the fast path), beside its name, which
    keys its passes."""

    cr: str


LEASE_ROOM = 10
"""Requests under the service's own cap (``NODEWRIGHT_KUBE_QPS_BURST``; watches are not
counted) that admissions and releases leave free, so the leader lease and the batch book
never wait behind a batch's writes."""


def write_gate(qps_burst: int) -> int:
    """Admissions and releases in flight at once, the passes' and the release fast path's
    together: a batch of 100 opens in two round trips instead of 100 (issue 15; with 16 in
    flight a batch of 100 took 1.2-2.4 s to admit at 1,000 nodes here; 40 and 60 compared in
    docs/metrics.md, "Sixty admissions in flight")."""
    return max(1, qps_burst - LEASE_ROOM)


CONCURRENT_WRITES = write_gate(KubeSettings().qps_burst)
"""The gate's size with the default cap (60)."""
PASS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Seconds: a decision over 100 nodes takes a few milliseconds, one over 10,000 a tenth of
a second; a batch of 1,000 admissions a second or more."""
_log = logging.getLogger("nodewright.scheduler")


def pass_histogram(registry: CollectorRegistry) -> Histogram:
    """Where a pass's time goes, by phase: ``rest`` (waiting for its share of the time,
    ``decision_share``), ``decide`` (the kernel's decisions, computing), ``releases``,
    ``book`` and ``admissions`` (their writes, first sent to last answered)."""
    return Histogram(
        "nodewright_scheduler_pass_phase_seconds",
        "How long each phase of the scheduler's passes took: rest, decide, releases, book, "
        "admissions",
        ["phase"],
        buckets=PASS_BUCKETS,
        registry=registry,
    )


def release_counter(registry: CollectorRegistry) -> Counter:
    """Releases written, by the path that wrote them: ``fast`` (as soon as due) or ``pass``."""
    return Counter(
        "nodewright_scheduler_releases",
        "Admissions released, by what wrote them: fast (as soon as due) or pass",
        ["via"],
        registry=registry,
    )


NODEWRIGHTS = path_of(group=api.GROUP, version=api.VERSION, plural=api.NODEWRIGHT_PLURAL)
POLICIES = path_of(group=api.GROUP, version=api.VERSION, plural=api.DEPLOYMENT_POLICY_PLURAL)
NODES = path_of(plural="nodes")


class Scheduler:
    def __init__(self, ctx: runtime.ServiceContext) -> None:
        self.ctx = ctx
        assert isinstance(ctx.settings, Settings)
        self.settings = ctx.settings.scheduler
        self._decide = asyncio.Lock()
        self._facts = fleet.FactsCache()
        self._decode = api.Decoded(api.NodeWright)
        self._finalize_waits: dict[str, int] = {}  # NodeWright -> pending count last logged
        self._rest_until: dict[str, float] = {}
        """NodeWright -> monotonic time before which its next pass does not decide
        (``SchedulerSettings.decision_share``)."""
        self._pass_seconds = pass_histogram(ctx.registry)
        self._releases = release_counter(ctx.registry)
        self.publisher = streaming.Publisher(
            ctx.bus, source=f"{NAME}/{ctx.identity}", registry=ctx.registry
        )
        self.leader = LeaderElector(
            kube=ctx.kube,
            namespace=ctx.settings.namespace,
            name="nodewright-scheduler",
            identity=ctx.identity,
        )
        self._writes = asyncio.Semaphore(write_gate(ctx.settings.kube.qps_burst))
        """The admissions and releases in flight, the passes' and the fast path's together:
        room is left under qps_burst for the lease and the batch book."""
        self._together = functools.partial(_together, gate=self._writes)
        self._due: dict[str, set[str]] = {}
        """NodeWright -> nodes seen due for release since its fast path last ran (a hint:
        each is checked against the cache again)."""
        self._releasing: dict[tuple[str, str], asyncio.Future[bool]] = {}
        """(NodeWright, node) -> its release being written: the fast path's and a pass's
        write of one release are one write (the second waits for the first's outcome
        instead of losing a race)."""
        self.controller: Controller[str | ReleaseKey] = Controller(
            ctx=ctx,
            name=NAME,
            reconcile=self.reconcile,
            all_keys=self._resync_keys,
            # A pass holds a worker for its writes (16 s to open a batch of 1,000); the
            # releases of its NodeWright take another meanwhile.
            workers=8,
        )
        c = self.controller
        self.crs: Informer = c.watch(NODEWRIGHTS, to_keys=self._cr_keys, name="nodewrights")
        self.policies: Informer = c.watch(POLICIES, to_keys=self._policy_keys, name="policies")
        self.nodes: Informer = c.watch(
            NODES, to_keys=self._node_keys, name="nodes", transform=slim_node
        )
        self.node_port = nodeshell.KubeNodes(ctx.kube, self.nodes)
        self.bus_port = nodeshell.BusEvents(self.publisher)
        self.unflushed = nodeshell.Unflushed(nodestate.SCHEDULER, self.node_port, self.bus_port)
        c.consume(
            streaming.ConsumerSpec(
                durable=NAME,
                filter_subjects=tuple(
                    subjects.kind_filter(k)
                    for k in (
                        "node.uncordoned",
                        "node.validated",
                        "node.drain-failed",
                    )
                ),
                # Each event is handled by a pass over its NodeWright, and one pass acks
                # every event waiting for it: take as many at once as the server lets us
                # (at 16, a 10,000-node rollout left 13,000 behind, one pass a second).
                batch=128,
                concurrency=256,
            ),
            to_keys=self._event_keys,
        )

    # ---- key mapping ------------------------------------------------------------------

    def all_crs(self) -> Iterable[str]:
        return [str(o["metadata"]["name"]) for o in self.crs.values()]

    def _event_keys(self, event: events.AnyEvent) -> list[str | ReleaseKey]:
        if isinstance(event, events.NodeUncordoned) and event.node:
            # The drainer let go: the release may be due (if the cache has seen it so far;
            # else the node's change queues it).
            self._due.setdefault(event.cr, set()).add(event.node)
            return [event.cr, ReleaseKey(event.cr)]
        return [event.cr]

    def _resync_keys(self) -> Iterable[str | ReleaseKey]:
        """Every NodeWright, and every gone one whose outbox a node still holds."""
        gone = {
            cr
            for node in self.nodes.values()
            for cr in outbox.crs_with(node, nodestate.SCHEDULER)
            if self.crs.get(cr) is None
        }
        return [*self.all_crs(), *sorted(gone)]

    def _cr_keys(self, old: JSON | None, new: JSON | None) -> Iterable[str]:
        obj = new or old
        return [str(obj["metadata"]["name"])] if obj else []

    def _policy_keys(self, old: JSON | None, new: JSON | None) -> Iterable[str]:
        obj = new or old
        if not obj:
            return []
        name = obj["metadata"]["name"]
        return [
            str(cr["metadata"]["name"])
            for cr in self.crs.values()
            if (cr.get("spec") or {}).get("deploymentPolicy") == name
        ]

    def _node_keys(self, old: JSON | None, new: JSON | None) -> Iterable[str | ReleaseKey]:
        if new is None and old is not None:
            self._facts.forget(str(old["metadata"]["name"]))
        if node_unchanged(old, new):
            return []
        due: list[str | ReleaseKey] = []
        if new is not None:
            # Outboxes whose events the stream may not hold (a scheduler died between its
            # write and its publish): the next pass of their NodeWright publishes them,
            # without looking through every node on every pass.
            self.unflushed.note(new, lambda c: self.crs.get(c) is None)
            due.extend(self._releases_due(new))
        if old is not None and new is not None and old is not new:
            # A change no decision reads (a stage or check step, the status service's node
            # condition, an outbox drain) wakes nothing; the informer's replay (old is new)
            # and the resync still do.
            crs = self._decoded_crs()
            if fleet.wake_signature(crs, old, self._facts) == fleet.wake_signature(
                crs, new, self._facts
            ):
                return due
        # Any node change may free or need a slot of any NodeWright; the queue coalesces.
        gone = [
            cr
            for cr in (outbox.crs_with(new, nodestate.SCHEDULER) if new is not None else [])
            if self.crs.get(cr) is None
        ]
        return [*due, *self.all_crs(), *gone]

    def _releases_due(self, node: JSON) -> list[ReleaseKey]:
        """The fast-path keys of the NodeWrights whose admission of ``node`` is due for
        release (noting the node for each)."""
        held = nodestate.crs_with(node, nodestate.SCHEDULER)
        if not held:
            return []
        name = str(node["metadata"]["name"])
        out = []
        for cr in self._decoded_crs():
            if cr.metadata.name in held and kernel.releases(
                cr, [self._facts(node, cr.metadata.name)]
            ):
                self._due.setdefault(cr.metadata.name, set()).add(name)
                out.append(ReleaseKey(cr.metadata.name))
        return out

    # ---- reconcile ----------------------------------------------------------------------

    async def reconcile(self, key: str | ReleaseKey) -> float | None:
        if isinstance(key, ReleaseKey):
            return await self._release_now(key)
        name = key
        rest = self._rest_until.get(name, 0.0) - time.monotonic()
        if rest > 0:
            # Before reading anything: the pass decides on what the caches hold after it,
            # every change that came meanwhile included.
            await asyncio.sleep(rest)
            self._pass_seconds.labels("rest").observe(rest)
        if not self.leader.is_leader:
            return None
        raw = self.crs.get(name)
        if raw is None:
            self._finalize_waits.pop(name, None)
            self._rest_until.pop(name, None)
            return await self._tidy_outboxes(name)
        try:
            cr = self._decode(raw)
        except msgspec.ValidationError as exc:
            _log.error("Skipped invalid NodeWright", extra={"nodewright": name, "error": str(exc)})
            return None
        if progress.deleting(cr) and core.FINALIZER not in cr.metadata.finalizers:
            return None  # ours is done (or was never added): nothing left to do for it
        again = await self.unflushed.flush(name)
        if again is not None:
            self.controller.queue.add(name, after=again)
        # One decision at a time across NodeWrights: two must not take the last slot of a
        # shared budget together. (A missing policy starts nothing new; releases go on.)
        async with self._decide:
            return await self._decide_for(cr)

    async def _release_now(self, key: ReleaseKey) -> float | None:
        """The release fast path: the nodes of a NodeWright whose release is due are released
        at once, together, not by its next pass, which may be writing a batch's admissions
        for many seconds (at 10,000 nodes the release lag's p99 was 7 s, most of it waiting
        for passes; issue 15). A release only frees a slot, so it needs no decision over the
        fleet, nor the lock: a pass that decided before it counts the slot as held, which
        errs on the safe side. Once one is written, the NodeWright's pass is queued to use
        the slots. The pass releases what this path missed (the resync runs one)."""
        nodes = self._due.pop(key.cr, set())
        if not self.leader.is_leader:
            return None
        raw = self.crs.get(key.cr)
        if raw is None:
            return None  # gone: the outboxes' tidy-up handles what is left
        try:
            cr = self._decode(raw)
        except msgspec.ValidationError:
            return None  # the pass logs it
        if progress.deleting(cr) and core.FINALIZER not in cr.metadata.finalizers:
            return None  # as the pass: ours is done
        due = [
            release
            for node in sorted(nodes)
            if (cached := self.nodes.get(node)) is not None
            for release in kernel.releases(cr, [self._facts(cached, key.cr)])
        ]
        try:
            landed = await self._together(
                [functools.partial(self._release, cr, r, via="fast") for r in due]
            )
        except BaseException:
            self._due.setdefault(key.cr, set()).update(nodes)  # not done: the retry's
            raise
        if any(landed):
            self.controller.queue.add(key.cr)  # slots are free: decide
        return None

    async def _tidy_outboxes(self, cr: str) -> float | None:
        """The NodeWright is gone: its releases wrote the scheduler's last records of it, so
        no later write of the scheduler drops the outbox they left; remove it (after
        publishing what the stream may not hold)."""
        key = outbox.key(nodestate.SCHEDULER, cr)
        self.unflushed.forget(cr)  # tidied below
        again: float | None = None
        for node in [str(n["metadata"]["name"]) for n in self.nodes.values()]:
            cached = self.nodes.get(node)
            if cached is None or key not in nodestate.annotations_of(cached):
                continue
            owner, nodes, bus = nodestate.SCHEDULER, self.node_port, self.bus_port
            unpublished = await nodeshell.flush(owner=owner, cr=cr, node=node, nodes=nodes, bus=bus)
            tidied = await nodeshell.tidy(owner=owner, cr=cr, node=node, nodes=nodes, bus=bus)
            for delay in (unpublished, tidied):
                if delay is not None:
                    again = delay if again is None else min(again, delay)
        return again

    async def _flush(self, cr: str, node: str) -> None:
        again = await self.unflushed.flush(cr, node)
        if again is not None:
            self.controller.queue.add(cr, after=again)

    def _fleet(self) -> fleet.Fleet:
        """The cluster as the kernel reads it, from the caches (per-node facts memoised by
        resourceVersion)."""
        return fleet.Fleet(
            crs=self._decoded_crs(),
            policies=self._decoded_policies(),
            nodes=list(self.nodes.values()),
            settings=fleet.Settings(cluster_budget=self.settings.cluster_budget),
            facts_of=self._facts,
            nodes_seen=self.nodes.progress,
        )

    async def _decide_for(self, cr: api.NodeWright) -> float | None:
        """One pass for ``cr``: releases first, then the decision taken again on what was
        written, then the batch book with its fence, then the admissions. A release or
        admission that lost its write is not counted: a lost release keeps its slot in the
        second decision, and an admission is only written after the book that fences it."""
        name = cr.metadata.name
        # Only a deletion's finalizer reads the nodes (a pass over all of them otherwise).
        facts = [self._facts(n, name) for n in self.nodes.values()] if progress.deleting(cr) else []
        finalizer = core.finalizer(cr, facts)
        # No node is admitted before the finalizer is in place: a deletion racing the first
        # admission still uninstalls and releases. A NodeWright's first batch book is written
        # with it in one write (every admission comes after a book write), which saves the
        # first cordon a round trip and every NodeWright watcher a change (issue 15).
        with_book = (
            finalizer.action == "add"
            and rollout_book.BATCHES_ANNOTATION not in cr.metadata.annotations
        )
        if finalizer.action == "add" and not with_book:
            written = await self._add_finalizer(cr)
            if written is None:
                return None
            cr = written  # its resourceVersion is the one the book write must carry
        now = self.ctx.clock()
        writer = _PassWriter(self, cr, add_finalizer=with_book)
        decided_s = 0.0

        def decide() -> kernel.Plan:
            nonlocal decided_s
            started = time.perf_counter()
            try:
                # The reasons of the waiting nodes are the status service's to write.
                return fleet.decide(self._fleet(), cr, now, explain_waits=False)
            finally:
                decided_s += time.perf_counter() - started

        outcome = await passing.run(decide, writer, together=self._together)
        self._rest_until[name] = time.monotonic() + workqueue.rest_after(
            decided_s, self.settings.decision_share
        )
        self._pass_seconds.labels("decide").observe(decided_s)
        for phase, (began, ended) in writer.spans.items():
            self._pass_seconds.labels(phase).observe(ended - began)
        cr = writer.cr  # as the book write left it
        if with_book and core.FINALIZER not in cr.metadata.finalizers:
            if writer.book_lost:
                # Lost with the book (nothing was admitted): the next pass writes both. A
                # write of its own now would carry the same stale resourceVersion.
                self.controller.queue.add(name, after=0.5)
                return None
            # No book was written (nothing to admit): the finalizer on its own.
            written = await self._add_finalizer(cr)
            if written is None:
                return None
            cr = written
        for note in outcome.plan.events:
            _log.info("Changed batch state", extra={"nodewright": name, "change": note})
        if outcome.lost:
            self.controller.queue.add(name, after=0.5)  # lost writes: decide again soon
        if finalizer.action == "wait":
            # Once per change of what is pending, not once per pass (20 a second here).
            if self._finalize_waits.get(name) != len(finalizer.pending):
                self._finalize_waits[name] = len(finalizer.pending)
                _log.info(
                    "Waiting to finalize NodeWright",
                    extra={"nodewright": name, "pending": len(finalizer.pending)},
                )
        elif finalizer.action == "remove" and await self._set_finalizers(
            cr, [f for f in cr.metadata.finalizers if f != core.FINALIZER]
        ):
            self._finalize_waits.pop(name, None)
            _log.info("Finalized NodeWright", extra={"nodewright": name})
        elif finalizer.action == "remove":
            self.controller.queue.add(name, after=0.5)
            return None
        wake = outcome.plan.wake_at
        if wake is not None:
            # A soak ends with no change to wake the pass: decide again then.
            return min(self.ctx.settings.resync_interval_s, max(0.1, (wake - now).total_seconds()))
        return self.ctx.settings.resync_interval_s

    async def _add_finalizer(self, cr: api.NodeWright) -> api.NodeWright | None:
        """Add :data:`core.FINALIZER` on its own; the CR as written, or None if it changed
        meanwhile (the pass is queued again)."""
        written = await self._set_finalizers(cr, [*cr.metadata.finalizers, core.FINALIZER])
        if written is None:
            self.controller.queue.add(cr.metadata.name, after=0.5)
        return written

    async def _set_finalizers(
        self, cr: api.NodeWright, finalizers: list[str]
    ) -> api.NodeWright | None:
        """Write the CR's finalizers; the CR as written, or None if it changed meanwhile
        (decide again)."""
        body = {
            "metadata": {
                "resourceVersion": cr.metadata.resource_version,
                "finalizers": finalizers,
            }
        }
        try:
            written = await self.ctx.kube.patch(f"{NODEWRIGHTS}/{cr.metadata.name}", body)
        except ApiError as exc:
            if exc.conflict or exc.not_found:
                return None
            raise
        self.crs.observe(written)
        return api.from_dict(written, api.NodeWright)

    def _decoded_crs(self) -> list[api.NodeWright]:
        """Every NodeWright that decodes, each decoded once per resourceVersion."""
        out = []
        for raw in self.crs.values():
            try:
                out.append(self._decode(raw))
            except msgspec.ValidationError:
                continue
        return out

    def _decoded_policies(self) -> dict[str, api.DeploymentPolicy]:
        out = {}
        for raw in self.policies.values():
            try:
                policy = api.from_dict(raw, api.DeploymentPolicy)
            except msgspec.ValidationError:
                continue  # reads as missing: nothing new starts under it
            out[policy.metadata.name] = policy
        return out

    async def _write_book(
        self, cr: api.NodeWright, book: rollout_book.BatchBook, *, add_finalizer: bool = False
    ) -> api.NodeWright | None:
        """Persist the batch book on the CR (the first one with :data:`core.FINALIZER` when
        ``add_finalizer``); the CR as written, or None if the book or the spec changed
        meanwhile.

        A compare-and-swap of the book alone (JSON patch ``test`` of the book the pass read
        and of the generation, 422 when either moved): the status service writes the CR's
        status several times a second in a rollout, and a resourceVersion precondition
        lost to each of those (a third of the scheduler's CR writes were 409s, issue 15).
        The first book has nothing to test: that write carries the resourceVersion (and
        so may replace the finalizers' list whole)."""
        value = rollout_book.encode_batch_book(book)
        before = cr.metadata.annotations.get(rollout_book.BATCHES_ANNOTATION)
        path = f"{NODEWRIGHTS}/{cr.metadata.name}"
        if add_finalizer and before is not None:
            raise ValueError("the finalizer goes with the first batch book only")
        try:
            if before is None:
                body: JSON = {
                    "metadata": {
                        "resourceVersion": cr.metadata.resource_version,
                        "annotations": {rollout_book.BATCHES_ANNOTATION: value},
                    }
                }
                if add_finalizer:
                    body["metadata"]["finalizers"] = [*cr.metadata.finalizers, core.FINALIZER]
                written = await self.ctx.kube.patch(path, body)
            else:
                pointer = "/metadata/annotations/" + rollout_book.BATCHES_ANNOTATION.replace(
                    "~", "~0"
                ).replace("/", "~1")
                ops: list[JSON] = [
                    {"op": "test", "path": "/metadata/generation", "value": cr.metadata.generation},
                    {"op": "test", "path": pointer, "value": before},
                    {"op": "replace", "path": pointer, "value": value},
                ]
                written = await self.ctx.kube.patch(path, ops, kind="json")
        except ApiError as exc:
            if exc.conflict or exc.not_found or exc.status == 422:
                _log.info("Skipped stale batch state write", extra={"nodewright": cr.metadata.name})
                return None
            raise
        self.crs.observe(written)
        return api.from_dict(written, api.NodeWright)

    async def _write(
        self,
        cr: str,
        node: str,
        selection: Selection | None,
        *,
        version: str = "",
        event: events.Event | None = None,
    ) -> bool:
        """Write (or remove) this CR's admission on the node, preconditioned on ``version``
        (default: the cached node's), with ``event`` in the scheduler's outbox in the same
        write (published right after); False if the node changed (decide again)."""
        cached = self.nodes.get(node)
        if cached is None:
            return False
        body = nodestate.patch(
            nodestate.SCHEDULER,
            cr,
            selection,
            resource_version=version or str(cached["metadata"]["resourceVersion"]),
        )
        held = outbox.pending(cached, nodestate.SCHEDULER, cr)
        if event is not None or held:
            # Events the stream holds already go with this write (shared.nodeshell.flush).
            before = [e for e in held if not self.bus_port.delivered(e)]
            body["metadata"]["annotations"][outbox.key(nodestate.SCHEDULER, cr)] = outbox.value(
                outbox.merged(before, [event] if event is not None else [])
            )
        if await patch_node(self.ctx.kube, self.nodes, node, body):
            if event is not None:
                await self._flush(cr, node)
            return True
        self.controller.queue.add(cr, after=0.5)  # the node changed: decide again
        return False

    async def _release(
        self, cr: api.NodeWright, release: kernel.Release, *, via: Literal["fast", "pass"]
    ) -> bool:
        """Remove the admission; True once written (only then is its slot free). A release
        the other path is writing is not written twice: its outcome is this one's."""
        key = (cr.metadata.name, release.node)
        pending = self._releasing.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._releasing[key] = done
        try:
            outcome = await self._write_release(cr, release)
            if outcome == "written":
                self._releases.labels(via).inc()
            done.set_result(outcome != "lost")
            return outcome != "lost"
        finally:
            del self._releasing[key]
            if not done.done():
                done.set_result(False)  # it raised or was cancelled: not written

    async def _write_release(
        self, cr: api.NodeWright, release: kernel.Release
    ) -> Literal["written", "free", "lost"]:
        cached = self.nodes.get(release.node)
        if cached is not None and cr.metadata.name not in nodestate.crs_with(
            cached, nodestate.SCHEDULER
        ):
            return "free"  # written meanwhile by the other path (the cache has it)
        completed = (
            events.NodeCompleted(
                id=events.event_id(
                    cr.metadata.name, release.node, "completed", progress.target_digest(cr)
                ),
                at=self.ctx.clock(),
                cr=cr.metadata.name,
                generation=cr.metadata.generation,
                node=release.node,
                source=self.publisher.source,
            )
            if release.done
            else None
        )
        if not await self._write(cr.metadata.name, release.node, None, event=completed):
            return "lost"
        _log.info(
            "Released Node",
            extra={"nodewright": cr.metadata.name, "node": release.node, "done": release.done},
        )
        return "written"

    def _selected(self, cr: api.NodeWright, admit: kernel.Admit) -> events.NodeSelected:
        desired = progress.desired(cr)
        return events.NodeSelected(
            id=events.event_id(
                cr.metadata.name,
                admit.node,
                "selected",
                admit.selection.selected_at.isoformat(),
            ),
            at=self.ctx.clock(),
            cr=cr.metadata.name,
            generation=cr.metadata.generation,
            node=admit.node,
            source=self.publisher.source,
            compartment=admit.selection.compartment,
            batch=admit.selection.batch,
            disruptive=admit.selection.disruptive,
            packages=tuple(
                events.PackageRef(name=d.name, version=d.version) for d in desired.values()
            ),
        )

    async def _on_leadership(self) -> None:
        while True:
            await self.leader.became_leader.wait()
            for name in self.all_crs():
                self.controller.queue.add(name)
            await self.leader.lost_leadership.wait()


class _PassWriter:
    """:class:`services.scheduler.passing.Writer` for one pass over one NodeWright."""

    def __init__(
        self, scheduler: Scheduler, cr: api.NodeWright, *, add_finalizer: bool = False
    ) -> None:
        self.scheduler, self.cr = scheduler, cr
        self.add_finalizer = add_finalizer
        """The NodeWright's first book write carries the finalizer."""
        self.book_lost = False
        """The book write was refused (the NodeWright changed since it was read)."""
        self.spans: dict[str, tuple[float, float]] = {}
        """Phase -> (first write sent, last answered), monotonic: the concurrent writes of
        a phase take the time between (``nodewright_scheduler_pass_phase_seconds``)."""

    @contextlib.contextmanager
    def _span(self, phase: str) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            first, _ = self.spans.get(phase, (began, began))
            self.spans[phase] = (min(first, began), time.monotonic())

    def book(self) -> rollout_book.BatchBook:
        return rollout_book.read_batch_book(self.cr.metadata.annotations)

    async def write_release(self, release: kernel.Release) -> bool:
        with self._span("releases"):
            return await self.scheduler._release(self.cr, release, via="pass")

    async def write_book(self, book: rollout_book.BatchBook) -> bool:
        if not self.scheduler.leader.is_leader:
            return False  # lost the lease mid-pass: the new leader decides
        with self._span("book"):
            written = await self.scheduler._write_book(
                self.cr, book, add_finalizer=self.add_finalizer
            )
        if written is None:
            self.book_lost = True
            return False
        self.cr, self.add_finalizer = written, False
        return True

    async def write_admission(self, admit: kernel.Admit) -> bool:
        s = self.scheduler
        name = self.cr.metadata.name
        selected = s._selected(self.cr, admit)
        with self._span("admissions"):
            written = await s._write(
                name, admit.node, admit.selection, version=admit.resource_version, event=selected
            )
        if not written:
            return False
        _log.info("Admitted Node", extra={"nodewright": name, "node": admit.node})
        return True


async def _together(
    writes: Sequence[passing.Write], gate: asyncio.Semaphore | None = None
) -> list[bool]:
    """:data:`passing.Together`: every write of a pass at once, at most CONCURRENT_WRITES in
    flight (through ``gate``, shared by the calls that pass the same one); whether each
    landed, in order. A write that raises fails the pass (as before), after the others
    finished: none is left running behind it."""
    gate = gate if gate is not None else asyncio.Semaphore(CONCURRENT_WRITES)

    async def one(write: passing.Write) -> bool:
        async with gate:
            return await write()

    results = await asyncio.gather(*(one(w) for w in writes), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return [bool(r) for r in results]


async def build(ctx: runtime.ServiceContext) -> None:
    scheduler = Scheduler(ctx)
    scheduler.controller.register()
    ctx.supervisor.add("leader", scheduler.leader.run)
    ctx.supervisor.add("leadership-watch", scheduler._on_leadership)


SERVICE = runtime.Service(name=NAME, settings_type=Settings, build=build)


def main(environ: Mapping[str, str] | None = None) -> int:
    return runtime.main(
        name=NAME,
        settings_type=Settings,
        build=build,
        environ=os.environ if environ is None else environ,
    )
