"""The drainer's async shell: caches, and carrying out the core's decisions on a node.

For each (NodeWright, node) key it reads the cached CR, node, the pods bound to the node and
the PodDisruptionBudgets of their namespaces, asks :func:`services.drainer.core.decide` what
to do, sends the evictions (POST ``pods/<name>/eviction``) or deletions it asks for, folds
their answers in with :func:`services.drainer.core.settle`, then hands the decision to the
shared per-node shell (:func:`shared.nodeshell.apply`), which writes this CR's drainer
record and the cordon in one patch whose precondition is what the decision read of the node
(its metadata and spec, :mod:`shared.nodepins`) and publishes the events. Long waits
(protected pods, PDBs, terminating pods) are requeues, never a blocked worker, so one stuck
node does not hold up others.

No leader election: the precondition turns a second replica's stale decision into a refusal,
evictions carry the pod's UID as a precondition, and evicting a pod twice is harmless (the
second answer is 200 for a terminating pod, 404 or 409 for a gone one). Deciding is the
core's job.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import msgspec

from services.drainer import core, filters
from services.drainer.config import DrainerSettings, Settings
from shared import (
    api,
    durations,
    nodeshell,
    nodestate,
    progress,
    runtime,
    streaming,
    subjects,
)
from shared.controller import Controller, NodeKey, node_unchanged, status_only
from shared.decisions import Keep
from shared.informer import Informer, key_of, slim_node
from shared.kube import JSON, ApiError, path_of
from shared.records.drainer import DrainRecord

NAME = "drainer"
_log = logging.getLogger("nodewright.drainer")

NODEWRIGHTS = path_of(group=api.GROUP, version=api.VERSION, plural=api.NODEWRIGHT_PLURAL)
NODES = path_of(plural="nodes")
PODS = path_of(plural="pods")
PDBS = path_of(group="policy", plural="poddisruptionbudgets")

_OWNERS = (nodestate.SCHEDULER, nodestate.DRAINER)
"""Keys come from admissions, drain records and the drainer's unpublished events."""


class Drainer:
    """The caches, key mappings and reconcile of one drainer replica."""

    def __init__(self, ctx: runtime.ServiceContext, settings: Settings) -> None:
        self.ctx = ctx
        self._decode_cr = api.Decoded(api.NodeWright)
        self.settings: DrainerSettings = settings.drainer
        self.publisher = streaming.Publisher(
            ctx.bus, source=f"{NAME}/{ctx.identity}", registry=ctx.registry
        )
        self._drain_seconds = durations.drain_histogram(ctx.registry)
        self.controller: Controller[NodeKey] = Controller(
            ctx=ctx,
            name=NAME,
            reconcile=self.reconcile,
            all_keys=self.all_keys,
            workers=self.settings.workers,
        )
        self._pods_on: dict[str, set[str]] = defaultdict(set)
        """Field index: node name -> keys of the pods bound to it."""
        self._blocked_by: dict[NodeKey, frozenset[str]] = {}
        """Keys whose drain a PDB refused, by the PDBs named: a PDB change re-queues them."""
        c = self.controller
        self.crs: Informer = c.watch(NODEWRIGHTS, to_keys=self._cr_keys, name="nodewrights")
        self.nodes: Informer = c.watch(
            NODES, to_keys=self._node_keys, name="nodes", transform=slim_node
        )
        self.pods: Informer = c.watch(
            PODS,
            # Unbound pods cannot be on a node being drained; leaving them out saves memory.
            field_selector="spec.nodeName!=",
            to_keys=self._pod_keys,
            also=self._index_pod,
            name="pods",
            # Every bound pod of the cluster is cached: keep only what the decisions read.
            transform=filters.slim_pod,
        )
        self.pdbs: Informer = c.watch(PDBS, to_keys=self._pdb_keys, name="pdbs")
        c.consume(
            streaming.ConsumerSpec(
                durable=NAME,
                filter_subjects=tuple(
                    subjects.kind_filter(k) for k in ("node.selected", "node.validated")
                ),
            ),
            to_keys=lambda e: [(e.cr, e.node)] if e.node else [],
        )
        self.node_port = nodeshell.KubeNodes(ctx.kube, self.nodes)
        self.object_port = nodeshell.KubeObjects(ctx.kube, ctx.settings.namespace)
        self.bus_port = nodeshell.BusEvents(self.publisher)

    # ---- key mapping ------------------------------------------------------------------

    def _crs_on(self, node: JSON | None) -> set[str]:
        if not node:
            return set()
        crs = {cr for owner in _OWNERS for cr in nodestate.crs_with(node, owner)}
        # And its outboxes that still need a pass (shared.outbox).
        crs.update(
            nodeshell.outboxes_to_look_at(node, nodestate.DRAINER, self.bus_port, self._gone)
        )
        return crs

    def _gone(self, cr: str) -> bool:
        return self.crs.get(cr) is None

    def all_keys(self) -> Iterable[NodeKey]:
        return [
            (cr, str(node["metadata"]["name"]))
            for node in self.nodes.values()
            for cr in self._crs_on(node)
        ]

    def _cr_keys(self, old: JSON | None, new: JSON | None) -> Iterable[NodeKey]:
        obj = new or old
        if not obj:
            return []
        if status_only(old, new):
            return []  # a status update (frequent during a rollout) changes no decision
        name = str(obj["metadata"]["name"])
        # On delete too: every node carrying this CR's records is released.
        return [k for k in self.all_keys() if k[0] == name]

    def _node_keys(self, old: JSON | None, new: JSON | None) -> Iterable[NodeKey]:
        if node_unchanged(old, new):
            return []
        obj = new or old
        if not obj:
            return []
        name = str(obj["metadata"]["name"])
        return [(cr, name) for cr in self._crs_on(old) | self._crs_on(new)]

    def _pod_keys(self, old: JSON | None, new: JSON | None) -> Iterable[NodeKey]:
        nodes = {_node_of(o) for o in (old, new) if o}
        return [(cr, n) for n in nodes if n for cr in self._crs_on(self.nodes.get(n))]

    def _index_pod(self, old: JSON | None, new: JSON | None) -> None:
        if old is not None:
            node = _node_of(old)
            self._pods_on[node].discard(key_of(old))
            if not self._pods_on[node]:
                del self._pods_on[node]
        if new is not None:
            self._pods_on[_node_of(new)].add(key_of(new))

    def _pdb_keys(self, old: JSON | None, new: JSON | None) -> Iterable[NodeKey]:
        obj = new or old
        if not obj:
            return []
        pdb = key_of(obj)
        return [k for k, blockers in self._blocked_by.items() if pdb in blockers]

    # ---- reconcile ----------------------------------------------------------------------

    async def reconcile(self, key: NodeKey) -> float | None:
        return await nodeshell.flush_then(
            owner=nodestate.DRAINER,
            key=key,
            nodes=self.node_port,
            bus=self.bus_port,
            work=self._reconcile,
            gone=self._gone,
        )

    async def _reconcile(self, key: NodeKey) -> float | None:
        cr_name, node_name = key
        raw_node = self.nodes.get(node_name)
        if raw_node is None:
            self._blocked_by.pop(key, None)
            return None
        cr: api.NodeWright | None = None
        raw_cr = self.crs.get(cr_name)
        if raw_cr is not None:
            try:
                cr = self._decode_cr(raw_cr)
            except msgspec.ValidationError as exc:
                _log.error(
                    "Skipped invalid NodeWright", extra={"nodewright": cr_name, "error": str(exc)}
                )
                return None
        facts = progress.facts(raw_node, cr_name)

        def decide(pods: Sequence[filters.PodInfo]) -> core.Decision:
            return core.decide(
                cr_name=cr_name,
                cr=cr,
                node=facts,
                others=core.drain_records(raw_node, besides=cr_name),
                pods=pods,
                now=self.ctx.clock(),
                eviction_retry_s=self.settings.eviction_retry_s,
                image_pull_grace_s=self.settings.image_pull_grace_s,
                deletion_poll_s=self.settings.deletion_poll_s,
                source=self.publisher.source,
            )

        node_pods = self._node_pods(node_name)
        decision = decide(node_pods)
        node_rv = str(raw_node["metadata"].get("resourceVersion") or "")
        if decision.declares_drained and not self.pods.covers(node_rv):
            # The pod cache is behind the node, so behind the cordon the node carries: a pod
            # bound just before the cordon may be missing from it, and would run through the
            # package's apply. Ask the API server for the node's pods as of the node read.
            node_pods = await self._listed_pods(node_name, at_least=node_rv)
            decision = decide(node_pods)
        if decision.problem:
            _log.error(
                "Cannot drain Node",
                extra={"nodewright": cr_name, "node": node_name, "problem": decision.problem},
            )
        if decision.pending is not None:
            results = await self._evict_all(node_name, decision)
            decision = core.settle(
                decision.pending,
                results,
                pdbs=self._pdbs_for(node_pods),
                now=self.ctx.clock(),
            )
        write = decision.write

        def observe() -> None:
            # Once per drain: the write recording its end landed.
            for event in decision.publish:
                took = durations.drain_seconds(event, facts)
                if took is not None:
                    self._drain_seconds.labels(took[0]).observe(took[1])

        retry = await nodeshell.apply(
            replace(
                core.node_decision(cr_name, node_name, decision),
                # The node decided on: evictions took a while, the cache may be newer. No
                # decision of the drainer reads the node's status: a status write between
                # the decision and its write does not refuse it (shared.nodepins).
                observed=raw_node,
                reads_status=False,
            ),
            nodes=self.node_port,
            objects=self.object_port,
            bus=self.bus_port,
            written=observe,
        )
        if retry == nodeshell.STALE_RETRY_S and write is not None:
            return retry
        if write is not None:
            self._log_write(cr_name, node_name, facts.drain, write)
        self._track_blockers(key, write.after if write is not None else facts.drain)
        return retry

    def _node_pods(self, node: str) -> list[filters.PodInfo]:
        found = (self.pods.get(k) for k in sorted(self._pods_on.get(node, ())))
        return [filters.pod_info(p) for p in found if p is not None]

    async def _listed_pods(self, node: str, *, at_least: str) -> list[filters.PodInfo]:
        """The node's pods from the API server, at ``at_least`` or newer: served from its
        watch cache once that has caught up, so no read of etcd."""
        query: dict[str, str] = {"fieldSelector": f"spec.nodeName={node}"}
        if at_least:
            query |= {"resourceVersion": at_least, "resourceVersionMatch": "NotOlderThan"}
        listed = await self.ctx.kube.get(PODS, **query)
        found = [filters.pod_info(filters.slim_pod(p)) for p in listed.get("items") or ()]
        return sorted(found, key=lambda p: p.key)

    def _pdbs_for(self, node_pods: Sequence[filters.PodInfo]) -> list[filters.PdbInfo]:
        namespaces = {p.namespace for p in node_pods}
        return [
            filters.pdb_info(o)
            for o in self.pdbs.values()
            if (o.get("metadata") or {}).get("namespace") in namespaces
        ]

    def _track_blockers(self, key: NodeKey, record: DrainRecord | None) -> None:
        if record is None or record.phase != "blocked" or record.reason is None:
            self._blocked_by.pop(key, None)
            return
        budgets = frozenset(
            f"{o.namespace}/{o.name}"
            for o in record.reason.objects
            if o.kind == "PodDisruptionBudget"
        )
        if budgets:
            self._blocked_by[key] = budgets
        else:
            self._blocked_by.pop(key, None)

    def _log_write(
        self,
        cr: str,
        node: str,
        before: DrainRecord | None,
        write: core.NodeWrite,
    ) -> None:
        extra: dict[str, Any] = {"nodewright": cr, "node": node}
        after = write.after
        if after is None:
            if isinstance(write.record, Keep):
                _log.info("Cordoned Node again", extra=extra)
                return
            extra["uncordoned"] = write.unschedulable is False
            _log.info("Released Node", extra=extra)
            return
        if before is not None and after.honoured != before.honoured:
            _log.info(
                "Honoured recovery requests",
                extra={**extra, "request": after.honoured, "phase": after.phase},
            )
            return
        if before is not None and (before.phase, _code(before)) == (after.phase, _code(after)):
            return
        extra["phase"] = after.phase
        if after.reason is not None:
            extra["reason"] = after.reason.code
            extra["reason_message"] = after.reason.message
        match after.phase:
            case "cordoned":
                _log.info("Cordoned Node", extra={**extra, "preexisting": after.preexisting})
            case "waiting":
                _log.info("Waiting for protected Pods on Node", extra=extra)
            case "draining":
                _log.info("Draining Node", extra=extra)
            case "blocked":
                _log.info("Drain of Node is blocked", extra=extra)
            case "drained":
                _log.info("Drained Node", extra=extra)
            case "failed":
                _log.warning("Failed to drain Node", extra=extra)

    # ---- evictions ----------------------------------------------------------------------

    async def _evict_all(self, node: str, decision: core.Decision) -> list[filters.EvictionResult]:
        sem = asyncio.Semaphore(self.settings.max_parallel_evictions)

        async def one(pod: filters.PodInfo, delete: bool) -> filters.EvictionResult:
            async with sem:
                result = await self._evict(pod, delete=delete, grace=decision.grace_period_s)
            extra = {"node": node, "namespace": pod.namespace, "pod": pod.name}
            match result.outcome:
                case "evicted":
                    _log.info("Evicted Pod", extra=extra)
                case "deleted":
                    _log.info("Deleted Pod", extra=extra)
                case "gone":
                    _log.debug("Skipped gone Pod", extra=extra)
                case _:
                    # Retried every few seconds; the node's reason and event say it once.
                    _log.debug(
                        "Failed to evict Pod",
                        extra={**extra, "outcome": result.outcome, "error": result.message},
                    )
            return result

        return list(
            await asyncio.gather(
                *(one(p, False) for p in decision.evict),
                *(one(p, True) for p in decision.delete),
            )
        )

    async def _evict(
        self, pod: filters.PodInfo, *, delete: bool, grace: int | None
    ) -> filters.EvictionResult:
        path = path_of(plural="pods", namespace=pod.namespace, name=pod.name)
        # The UID precondition: never evict a newer pod that took the name meanwhile.
        options: dict[str, Any] = {"preconditions": {"uid": pod.uid}}
        if grace is not None:
            options["gracePeriodSeconds"] = grace
        try:
            if delete:
                await self.ctx.kube.delete(path, {"kind": "DeleteOptions", **options})
                return filters.EvictionResult(pod=pod, outcome="deleted")
            await self.ctx.kube.create(
                f"{path}/eviction",
                {
                    "apiVersion": "policy/v1",
                    "kind": "Eviction",
                    "metadata": {"name": pod.name, "namespace": pod.namespace},
                    "deleteOptions": options,
                },
            )
            return filters.EvictionResult(pod=pod, outcome="evicted")
        except ApiError as exc:
            return filters.refusal(pod, status=exc.status, message=exc.message, body=exc.body)


def _code(record: DrainRecord) -> str:
    return record.reason.code if record.reason is not None else ""


def _node_of(pod: JSON) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


async def build(ctx: runtime.ServiceContext) -> None:
    """Register the drainer's informers, consumer, queue and resync with the supervisor."""
    assert isinstance(ctx.settings, Settings)
    Drainer(ctx, ctx.settings).controller.register()


SERVICE = runtime.Service(name=NAME, settings_type=Settings, build=build)


def main(environ: Mapping[str, str] | None = None) -> int:
    return runtime.main(
        name=NAME,
        settings_type=Settings,
        build=build,
        environ=os.environ if environ is None else environ,
    )
