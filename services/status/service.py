"""The status service's async shell: caches, writing what the core computed, and turning bus
traffic into Kubernetes Events.

For each NodeWright (the work key) it reads the cached CR, its DeploymentPolicy and every node
that is a target or carries a record of the CR, asks :mod:`services.status.core` for the node
views, the CR status and the per-node writes, then writes each node's condition (strategic
merge patch on ``nodes/<name>/status``, only when the node's state or reason changed; through
to the cache, without the node's resourceVersion as precondition, see ``_write_node``; an
earlier version's per-step status record is removed, a compare-and-swap of that annotation
alone), and finally, once per pass and only if it changed, the CR status (merge patch on
``/status``; unconditioned too: a change of the CR meanwhile starts the pass that corrects
it). When the CR is gone it removes its conditions from the nodes. Each pass also replaces the
NodeWright's Prometheus gauges (``services.status.metrics``) served on ``/metrics``; they go
with the NodeWright.

Events are nudges: the consumer of ``nw.ev.>`` queues a status pass of the CR and acks (the
pass is level-based, and the periodic resync repeats it: waiting for a whole pass per event
is what let the consumer fall behind during large rollouts). Kubernetes Events
(``services.status.kube_events``) are written for what a person acts on or audits: nodes
that failed, are blocked or recovered, batches that started or finished, a stopped
compartment, a complete rollout (each found by a status pass), and dead letters (a second,
raw consumer of ``nw.dlq.>`` reads every message, whatever its payload; it never
dead-letters anything itself); verbose mode adds one per stream event, written before the
ack. They are events.k8s.io/v1 Events, counted in a series when the same thing recurs. The
web page (``services.status.webpage``) is served on the health port. Any replica may do any
of it: the record's write is a compare-and-swap, every other write is recomputed on the next
change, and Event names are deterministic. Deciding is the core's job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any

import msgspec
from nats.aio.msg import Msg
from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily

from services.status import assessing, core, kube_events, metrics, webpage
from services.status.config import Settings
from shared import (
    api,
    events,
    nodepins,
    nodestate,
    progress,
    runtime,
    streaming,
    subjects,
    workqueue,
)
from shared.controller import Controller
from shared.informer import Informer, slim_node
from shared.kube import JSON, ApiError, path_of
from shared.records.status import reported_crs
from shared.rollout import fleet

NAME = "status"
DEAD_LETTER_CONSUMER = f"{NAME}-dead-letters"
_log = logging.getLogger("nodewright.status")

NODEWRIGHTS = path_of(group=api.GROUP, version=api.VERSION, plural=api.NODEWRIGHT_PLURAL)
POLICIES = path_of(group=api.GROUP, version=api.VERSION, plural=api.DEPLOYMENT_POLICY_PLURAL)
NODES = path_of(plural="nodes")

_RECORD_OWNERS = (nodestate.SCHEDULER, nodestate.DRAINER, nodestate.EXECUTOR, nodestate.VALIDATOR)


def _uid(obj: Mapping[str, Any] | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("uid") or "")


def _temporary(exc: ApiError) -> bool:
    """Worth retrying: no answer, throttled, or a server-side failure."""
    return exc.status in (0, 429) or exc.status >= 500


def _signature(node: Mapping[str, Any]) -> tuple[Any, ...]:
    """Everything about a node the status of a NodeWright depends on, except what this
    service writes itself: a change that leaves it equal (our own record or condition, a
    heartbeat) needs no new pass. Edits to our own writes are repaired by the resync."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    annotations = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if not k.startswith(nodestate.STATUS + "/")
    }
    ready = [c.get("status") for c in status.get("conditions") or () if c.get("type") == "Ready"]
    return (
        meta.get("labels"),
        annotations,
        bool(spec.get("unschedulable")),
        spec.get("taints"),
        ready,
        (status.get("nodeInfo") or {}).get("bootID"),
    )


class NodeWrightGauges:
    """A Prometheus collector of the NodeWright gauges (:mod:`services.status.metrics`): the
    samples of each NodeWright's latest status pass, replaced whole by the next one and
    dropped with the NodeWright, so no series outlives what it describes."""

    def __init__(self) -> None:
        self.latest: dict[str, list[metrics.Sample]] = {}
        """NodeWright name -> the samples of its latest status pass."""

    def describe(self) -> Iterator[GaugeMetricFamily]:
        for family in metrics.FAMILIES:
            yield GaugeMetricFamily(family.name, family.help, labels=family.labels)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauges = {g.name: g for g in self.describe()}
        label_names = {f.name: f.labels for f in metrics.FAMILIES}
        for name in sorted(self.latest):
            for sample in self.latest[name]:
                values = [sample.labels[k] for k in label_names[sample.metric]]
                gauges[sample.metric].add_metric(values, sample.value)
        yield from gauges.values()


class Status:
    def __init__(self, ctx: runtime.ServiceContext, settings: Settings) -> None:
        self.ctx = ctx
        self._decode_cr = api.Decoded(api.NodeWright)
        self.settings = settings.status
        self.controller: Controller[str] = Controller(
            ctx=ctx,
            name=NAME,
            reconcile=self.reconcile,
            all_keys=self.all_keys,
            workers=self.settings.workers,
        )
        c = self.controller
        self.crs: Informer = c.watch(NODEWRIGHTS, to_keys=self._cr_keys, name="nodewrights")
        self.policies: Informer = c.watch(POLICIES, to_keys=self._policy_keys, name="policies")
        self.nodes: Informer = c.watch(
            NODES, to_keys=self._node_keys, name="nodes", transform=slim_node
        )
        self._selectors: dict[str, tuple[str, api.LabelSelector | None]] = {}
        self._facts = fleet.FactsCache()
        self._observed = assessing.ObservedCache(self._facts)
        self._passed_at: dict[str, datetime] = {}
        self._rest_until: dict[str, float] = {}
        # Per NodeWright, when each node with no condition yet was first seen due for
        # admission (core.due_since); memory only: a restart gives them the grace again.
        self._due_since: dict[str, dict[str, datetime]] = {}
        """NodeWright -> monotonic time before which no pass over it starts
        (``StatusSettings.pass_share``)."""
        self._kube_events = Counter(
            "nodewright_status_kube_events",
            "Kubernetes Events written, by type and outcome: created, counted in an existing "
            "Event's series, or a duplicate (already counted)",
            ["type", "outcome"],
            registry=ctx.registry,
        )
        self._writes = Counter(
            "nodewright_status_writes",
            "Writes of node conditions, NodeWright statuses and removals of an earlier "
            "version's status records, by outcome",
            ["object", "outcome"],
            registry=ctx.registry,
        )
        self.gauges = NodeWrightGauges()
        ctx.registry.register(self.gauges)
        new_only = not self.settings.replay_history
        c.consumers.append(
            streaming.Consumer(
                bus=ctx.bus,
                spec=streaming.ConsumerSpec(
                    durable=NAME,
                    filter_subjects=(f"{subjects.EVENTS}.>",),
                    deliver_new_only=new_only,
                    batch=64,
                    concurrency=64,
                ),
                handler=self._on_event,
                service=ctx.name,
                stopping=ctx.supervisor.stopping,
                registry=ctx.registry,
            )
        )
        self.dead_letters = streaming.RawConsumer(
            bus=ctx.bus,
            spec=streaming.ConsumerSpec(
                durable=DEAD_LETTER_CONSUMER,
                filter_subjects=(f"{subjects.DEAD_LETTERS}.>",),
                deliver_new_only=new_only,
                concurrency=1,
            ),
            report=self._on_dead_letter,
            stopping=ctx.supervisor.stopping,
        )

    def register(self) -> None:
        self.controller.register()
        self.ctx.supervisor.add(
            f"consumer:{DEAD_LETTER_CONSUMER}", self.dead_letters.run, graceful=True
        )
        if self.settings.ui:
            webpage.WebPage(
                access=webpage.Access(kube=self.ctx.kube),
                feed=webpage.Feed(bus=self.ctx.bus),
                crs=self.crs.values,
                nodes=self.nodes.values,
                stopping=self.ctx.supervisor.stopping,
            ).register(self.ctx.pages)

    # ---- key mapping ------------------------------------------------------------------

    def all_keys(self) -> Iterable[str]:
        """Every NodeWright, and every name whose node conditions (or an earlier version's
        status records) outlived the NodeWright."""
        names = {str(o["metadata"]["name"]) for o in self.crs.values()}
        for node in self.nodes.values():
            names.update(nodestate.crs_with(node, nodestate.STATUS))
            names.update(reported_crs(node))
        return sorted(names)

    def _cr_keys(self, old: JSON | None, new: JSON | None) -> Iterable[str]:
        obj = new or old
        if not obj:
            return []
        name = str(obj["metadata"]["name"])
        if new is None:
            self._selectors.pop(name, None)
        return [name]

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

    def _selector(self, raw: JSON) -> api.LabelSelector | None:
        """A NodeWright's node selector, decoded once per generation (status writes do not
        change it)."""
        meta = raw.get("metadata") or {}
        name, generation = str(meta.get("name")), str(meta.get("generation") or "")
        memo = self._selectors.get(name)
        if memo is not None and memo[0] == generation:
            return memo[1]
        try:
            selector: api.LabelSelector | None = api.from_dict(
                (raw.get("spec") or {}).get("nodeSelectors") or {}, api.LabelSelector
            )
        except msgspec.ValidationError:
            selector = None
        self._selectors[name] = (generation, selector)
        return selector

    def _node_keys(self, old: JSON | None, new: JSON | None) -> Iterable[str]:
        if new is None and old is not None:
            self._facts.forget(str(old["metadata"]["name"]))
            self._observed.forget(str(old["metadata"]["name"]))
        if old is not None and new is not None and _signature(old) == _signature(new):
            return []
        keys: set[str] = set()
        for obj in (old, new):
            if obj is None:
                continue
            for owner in (*_RECORD_OWNERS, nodestate.STATUS):
                keys.update(nodestate.crs_with(obj, owner))
            keys.update(reported_crs(obj))
            labels = (obj.get("metadata") or {}).get("labels") or {}
            for raw in self.crs.values():
                selector = self._selector(raw)
                if selector is not None and progress.selector_matches(selector, labels):
                    keys.add(str(raw["metadata"]["name"]))
        return sorted(keys)

    # ---- reconcile ----------------------------------------------------------------------

    async def reconcile(self, name: str) -> float | None:
        raw = self.crs.get(name)
        if raw is None:
            self.gauges.latest.pop(name, None)
            self._passed_at.pop(name, None)
            self._rest_until.pop(name, None)
            self._due_since.pop(name, None)
            return None if await self._clean_up(name) else 0.5
        try:
            cr = self._decode_cr(raw)
        except msgspec.ValidationError as exc:
            self.gauges.latest.pop(name, None)
            _log.error("Skipped invalid NodeWright", extra={"nodewright": name, "error": str(exc)})
            return None
        # Within the interval the changes wait for one pass together: each pass reads every
        # node of the NodeWright, and a rollout changes some of them many times a second.
        due = self._due(name, self.ctx.clock())
        if due > 0:
            return due
        self._passed_at[name] = self.ctx.clock()
        computing = time.perf_counter()
        policy = self._policy(cr)
        selector = cr.spec.node_selectors
        observed = [
            self._observed(n, name)
            for n in self.nodes.values()
            if assessing.involves(n, name, selector)
        ]
        now = self.ctx.clock()
        crs: list[api.NodeWright] = []
        for other in self.crs.values():
            with contextlib.suppress(msgspec.ValidationError):
                crs.append(self._decode_cr(other))
        policies = {} if policy is None else {policy.metadata.name: policy}
        # The scheduler's own decision, taken on this replica's caches: the reasons shown
        # are the ones it acts on (the cluster budget as the scheduler recorded it).
        world = fleet.Fleet(
            crs=crs,
            policies=policies,
            nodes=list(self.nodes.values()),
            settings=fleet.recorded_settings(crs),
            facts_of=self._facts,
        )
        plan = fleet.decide(world, cr, now)
        views = assessing.assess(cr, observed, now, plan)
        status = core.summarize(cr, policy, views, now, plan)
        admitting = core.due_since(views, observed, self._due_since.get(name, {}), now)
        self._due_since[name] = admitting
        updates, later = core.this_pass(
            core.node_updates(name, views, observed, now, admitting),
            self.settings.waiting_writes_per_pass,
        )
        concurrency = core.write_concurrency(
            sum(1 for v in views if v.target), self.settings.node_writes
        )
        self._rest_until[name] = time.monotonic() + workqueue.rest_after(
            time.perf_counter() - computing, self.settings.pass_share
        )
        nodes_ok = status_ok = False
        try:
            nodes_ok = await self._write_nodes(name, updates, concurrency)
        finally:
            # The status is written once per pass, whatever happened to the node writes.
            status_ok = await self._write_status(name, raw, cr, status)
        self.gauges.latest[name] = metrics.samples(cr, policy, status, views)
        await self._compartment_events(cr, status, views, observed, status_written=status_ok)
        await self._rollout_events(cr, status, views, observed, status_written=status_ok)
        if not (nodes_ok and status_ok):
            return 0.5
        if later:
            return 0.0  # the rest in the next pass (after the pass interval)
        report = core.admitting_report_due(admitting, now)
        if report is not None:
            # Nothing else may change by then (a scheduler that is down).
            return min(self.ctx.settings.resync_interval_s, report)
        return self.ctx.settings.resync_interval_s

    def _due(self, name: str, now: datetime) -> float:
        """Seconds until the next pass over the NodeWright may start (0: now)."""
        resting = self._rest_until.get(name, 0.0) - time.monotonic()
        last = self._passed_at.get(name)
        if last is None:
            return resting
        return max(self.settings.pass_interval_s - (now - last).total_seconds(), resting)

    def _policy(self, cr: api.NodeWright) -> api.DeploymentPolicy | None:
        if not cr.spec.deployment_policy:
            return None
        raw = self.policies.get(cr.spec.deployment_policy)
        if raw is None:
            return None
        try:
            return api.from_dict(raw, api.DeploymentPolicy)
        except msgspec.ValidationError as exc:
            _log.error(
                "Skipped invalid DeploymentPolicy",
                extra={"policy": cr.spec.deployment_policy, "error": str(exc)},
            )
            return None

    async def _clean_up(self, name: str) -> bool:
        """The NodeWright is gone: remove its node conditions (and an earlier version's status
        records); False if a node changed meanwhile."""
        observed = [
            self._observed(n, name)
            for n in self.nodes.values()
            if assessing.involves(n, name, None)
        ]
        return await self._write_nodes(
            name, core.node_updates(name, [], observed, self.ctx.clock())
        )

    async def _write_nodes(
        self, cr: str, updates: list[core.NodeUpdate], concurrency: int | None = None
    ) -> bool:
        """Apply the node updates, ``concurrency`` at a time (default: the most,
        ``node_writes``); False if any node had changed meanwhile."""
        if not updates:
            return True
        sem = asyncio.Semaphore(concurrency or self.settings.node_writes)

        async def one(update: core.NodeUpdate) -> bool:
            async with sem:
                return await self._write_node(cr, update)

        results = await asyncio.gather(*(one(u) for u in updates), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        _log.info("Updated Node status", extra={"nodewright": cr, "nodes": len(updates)})
        return all(results)

    async def _write_node(self, cr: str, update: core.NodeUpdate) -> bool:
        """Remove an earlier version's status record, then write the node condition; False if
        the node is gone or changed meanwhile.

        The condition's write carries no resourceVersion: the status service is its only
        writer, and it is recomputed from the node on every change of it. A write made on a
        view that another service's write overtook is corrected by the pass that write
        starts; with a precondition, each such race cost a refused write and a pass over every
        node (about a third of the status service's Node writes were 409s, issue 15)."""
        if self.nodes.get(update.node) is None:
            return True  # the node is gone, and its status with it
        if update.remove_record is not None:
            try:
                written = await self.ctx.kube.patch(
                    path_of(plural="nodes", name=update.node),
                    nodepins.encode(core.record_removal(cr, update)),
                    kind="json",
                )
            except ApiError as exc:
                if exc.not_found or exc.patch_not_applicable:
                    # Gone, or its record is no longer the one this pass read (422: the
                    # JSON patch's test failed): the pass runs again on fresh data.
                    return self._stale(cr, update.node, "record")
                raise
            self.nodes.observe(written)
            self._writes.labels("record", "removed").inc()
        if update.write_condition:
            entry = update.condition or {"type": assessing.condition_type(cr), "$patch": "delete"}
            try:
                written = await self.ctx.kube.patch(
                    path_of(plural="nodes", name=update.node, subresource="status"),
                    {"status": {"conditions": [entry]}},
                    kind="strategic",
                )
            except ApiError as exc:
                if exc.not_found:
                    return self._stale(cr, update.node, "condition")
                raise
            self.nodes.observe(written)
            self._writes.labels("condition", "written").inc()
        return True

    def _stale(self, cr: str, node: str, what: str) -> bool:
        self._writes.labels(what, "stale").inc()
        _log.info("Skipped stale Node write", extra={"nodewright": cr, "node": node, "part": what})
        return False

    async def _write_status(
        self, name: str, raw: JSON, cr: api.NodeWright, status: api.NodeWrightStatus
    ) -> bool:
        """Patch the CR status if it changed.

        No resourceVersion precondition: the scheduler's batch-book writes move the CR's
        resourceVersion several times a second in a rollout, and each of them refused the
        status write and cost a pass over every node (issue 15). The status is computed from
        what the pass read; when the CR moved meanwhile, that change starts the next pass,
        which writes the status again if it differs (also after another replica's write)."""
        if status == cr.status:
            return True
        body = {"status": core.merge_patch(raw.get("status") or {}, api.to_dict(status))}
        path = path_of(
            group=api.GROUP,
            version=api.VERSION,
            plural=api.NODEWRIGHT_PLURAL,
            name=name,
            subresource="status",
        )
        try:
            written = await self.ctx.kube.patch(path, body)
        except ApiError as exc:
            if exc.not_found:
                return True  # deleted meanwhile: the next pass cleans up
            if exc.conflict:
                self._writes.labels("nodewright", "stale").inc()
                _log.info("Skipped stale NodeWright status write", extra={"nodewright": name})
                return False
            raise
        self.crs.observe(written)
        self._writes.labels("nodewright", "written").inc()
        _log.info(
            "Updated NodeWright status",
            extra={"nodewright": name, "state": status.state, "complete": status.complete_nodes},
        )
        return True

    # ---- Kubernetes Events ----------------------------------------------------------------

    async def _record(self, occ: kube_events.Occurrence) -> None:
        """Write one Event: create it, or count the occurrence in the series of the Event that
        exists (re-read and retried on a conflict); one already counted changes nothing."""
        body = kube_events.body(occ, instance=self.ctx.identity)
        path = kube_events.EVENTS_PATH.format(namespace=body["metadata"]["namespace"])
        if await self.ctx.kube.create_if_absent(path, body) is not None:
            self._kube_events.labels(occ.type_, "created").inc()
            return
        named = f"{path}/{body['metadata']['name']}"
        for _ in range(3):
            try:
                existing = await self.ctx.kube.get(named)
            except ApiError as exc:
                if not exc.not_found:
                    raise
                # Expired (the API server keeps Events an hour) since we tried: start again.
                if await self.ctx.kube.create_if_absent(path, body) is not None:
                    self._kube_events.labels(occ.type_, "created").inc()
                    return
                continue
            patch = kube_events.series_patch(existing, occ)
            if patch is None:
                self._kube_events.labels(occ.type_, "duplicate").inc()
                return
            try:
                await self.ctx.kube.patch(named, patch)
            except ApiError as exc:
                if exc.conflict:
                    continue  # another replica counted something meanwhile: look again
                raise
            self._kube_events.labels(occ.type_, "aggregated").inc()
            return
        self._kube_events.labels(occ.type_, "duplicate").inc()

    async def _create_events(
        self, occurrences: list[kube_events.Occurrence], what: str
    ) -> streaming.Outcome | None:
        """Write the Events; an outcome other than None says to stop there."""
        try:
            for occ in occurrences:
                await self._record(occ)
        except ApiError as exc:
            if _temporary(exc):
                return streaming.Retry(why=f"creating the Event: {exc}", delay_s=5.0)
            # Refused for good (RBAC, validation): the Event is lost, the status is not.
            _log.error(
                "Failed to create Event",
                extra={"about": what, "status": exc.status, "error": exc.message},
            )
        return None

    async def _rollout_events(
        self,
        cr: api.NodeWright,
        status: api.NodeWrightStatus,
        views: list[assessing.NodeView],
        observed: list[assessing.Observed],
        *,
        status_written: bool,
    ) -> None:
        """The nodes that failed, are blocked or recovered in this pass, and the rollout's
        completion (only once the status saying so is written: a stale pass sees it again)."""
        now = self.ctx.clock()
        occurrences = kube_events.node_changes(cr, views, observed, at=now)
        if status_written:
            occurrences += kube_events.rollout_change(cr, status, at=now)
        if not occurrences:
            return
        if await self._create_events(occurrences, "rollout") is not None:
            _log.warning(
                "Lost rollout Events",
                extra={"nodewright": cr.metadata.name, "events": len(occurrences)},
            )
            return
        _log.info(
            "Reported rollout changes",
            extra={
                "nodewright": cr.metadata.name,
                "reasons": sorted({o.reason for o in occurrences}),
            },
        )

    async def _compartment_events(
        self,
        cr: api.NodeWright,
        status: api.NodeWrightStatus,
        views: list[assessing.NodeView],
        observed: list[assessing.Observed],
        *,
        status_written: bool,
    ) -> None:
        """Raise the per-compartment Events of this pass, once its writes are done: the
        transitions from what the CR status and the nodes' conditions said before this
        pass to what it wrote. A failure loses Events, never status: the next pass compares
        against what this one wrote."""
        changes = kube_events.compartment_changes(cr, status.compartments, views, observed)
        verbose = self.settings.verbose_events
        changes = [c for c in changes if kube_events.raised(c, verbose=verbose)]
        if not status_written:
            # The CR changed meanwhile: its previous status may be stale, and the re-run sees
            # the same batch transitions again. The node records were written, though, so the
            # re-run would not see a changed wait again; a wait's Event name does not depend
            # on the previous status, so raising it now cannot duplicate it.
            changes = [c for c in changes if c.reason == kube_events.COMPARTMENT_WAITING]
        if not changes:
            return
        bodies = kube_events.for_compartment_changes(cr, changes, at=self.ctx.clock())
        if await self._create_events(bodies, "compartment") is not None:
            _log.warning(
                "Lost compartment Events",
                extra={"nodewright": cr.metadata.name, "events": len(bodies)},
            )
            return
        _log.info(
            "Reported compartment changes",
            extra={
                "nodewright": cr.metadata.name,
                "reasons": sorted({c.reason for c in changes}),
            },
        )

    async def _on_event(
        self, event: events.AnyEvent, delivery: streaming.Delivery
    ) -> streaming.Outcome:
        if self.settings.verbose_events:
            occ = kube_events.for_event(
                event,
                cr_uid=_uid(self.crs.get(event.cr)),
                node_uid=_uid(self.nodes.get(event.node)) if event.node else "",
            )
            stop = await self._create_events([occ], event.kind)
            if stop is not None:
                return stop
        # The status is level-based (every pass reads the nodes), so a queued pass is enough.
        # Waiting for a whole pass of the CR per event let the consumer fall behind by
        # thousands of events during a large rollout (a pass reads every node of the CR).
        self.controller.queue.add(event.cr)
        return streaming.Ack()

    async def _on_dead_letter(self, msg: Msg) -> streaming.Outcome:
        headers = msg.headers or {}
        letter = kube_events.DeadLetter(
            subject=msg.subject,
            original_subject=headers.get(streaming.HEADER_SUBJECT, ""),
            error=headers.get(streaming.HEADER_ERROR, ""),
            deliveries=headers.get(streaming.HEADER_DELIVERIES, ""),
            size=len(msg.data or b""),
        )
        original = letter.original
        cr_raw = self.crs.get(original.cr) if original is not None else None
        meta = msg.metadata
        body = kube_events.for_dead_letter(
            letter,
            # Unique per stored message, the same on every redelivery of it.
            key=f"{meta.stream}/{meta.sequence.stream}/{meta.timestamp.isoformat()}",
            cr_uid=_uid(cr_raw) if cr_raw is not None else None,
            fallback_namespace=self.ctx.settings.namespace,
            at=meta.timestamp,
        )
        stop = await self._create_events([body], "dead letter")
        if stop is not None:
            return stop
        _log.warning(
            "Reported dead-lettered message",
            extra={
                "subject": msg.subject,
                "original_subject": letter.original_subject,
                "why": letter.error,
            },
        )
        return streaming.Ack()


async def build(ctx: runtime.ServiceContext) -> None:
    """Register the service's root tasks with the supervisor."""
    assert isinstance(ctx.settings, Settings)
    Status(ctx, ctx.settings).register()


SERVICE = runtime.Service(name=NAME, settings_type=Settings, build=build)


def main(environ: Mapping[str, str] | None = None) -> int:
    return runtime.main(
        name=NAME,
        settings_type=Settings,
        build=build,
        environ=os.environ if environ is None else environ,
    )
