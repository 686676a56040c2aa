"""The validator's async shell: caches, check verdicts, node validation records and the
readiness taint, carried out as :func:`services.validator.core.decide` says.

For each (NodeWright, node) key it hands the core's decision to the shared per-node shell
(:func:`shared.nodeshell.apply`), which writes the validator record (with what the decision
read of the node as precondition, :mod:`shared.nodepins`), adds the runtime-required taint
to new nodes and lifts it when the core says so (in the same patch), and publishes
``stage.validated`` / ``stage.validation-failed`` / ``node.validated``. Once the NodeWright
is gone it removes its own record. It reads the executor's stage pods, whose main container
runs the stage's check (``shared.pods.parts``), and creates or deletes no pod: its role only
reads pods.

Keys are the (NodeWright, node) pairs with a scheduler, executor, validator or requests
record, plus two kinds of pairs without one: a node new to an ``autoTaintNewNodes``
NodeWright (it has no record yet, and must be tainted before the scheduler ever looks at
it), and a node the validator auto-tainted that still carries the taint (so the taint is
lifted even when its NodeWright is gone). Whether a pair is one of those is the core's
rule; the node watch and the periodic resync find them, so a missed event is recovered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any

import msgspec

from services.validator import core, webhook
from services.validator.config import Settings
from shared import (
    api,
    health,
    nodeshell,
    nodestate,
    pods,
    progress,
    runtime,
    streaming,
    subjects,
)
from shared.controller import Controller, NodeKey, PodIndex, node_unchanged, status_only
from shared.decisions import NodeDecision, Remove, Write
from shared.informer import Informer, slim_node
from shared.kube import JSON, path_of
from shared.records.validator import ValidatorRecord

NAME = "validator"
_log = logging.getLogger("nodewright.validator")

NODEWRIGHTS = path_of(group=api.GROUP, version=api.VERSION, plural=api.NODEWRIGHT_PLURAL)
NODES = path_of(plural="nodes")
_KEYED_BY = (
    nodestate.SCHEDULER,
    nodestate.EXECUTOR,
    nodestate.VALIDATOR,
    nodestate.REQUESTS,
)


class Validator:
    def __init__(self, ctx: runtime.ServiceContext, settings: Settings) -> None:
        self.ctx = ctx
        self._decode_cr = api.Decoded(api.NodeWright)
        self.settings = settings
        self.publisher = streaming.Publisher(
            ctx.bus, source=f"{NAME}/{ctx.identity}", registry=ctx.registry
        )
        self.controller: Controller[NodeKey] = Controller(
            ctx=ctx,
            name=NAME,
            reconcile=self.reconcile,
            all_keys=self.all_keys,
            workers=settings.workers,
        )
        self.pod_index = PodIndex()
        c = self.controller
        self.crs: Informer = c.watch(NODEWRIGHTS, to_keys=self._cr_keys, name="nodewrights")
        self.nodes: Informer = c.watch(
            NODES, to_keys=self._node_keys, name="nodes", transform=slim_node
        )
        self.pods: Informer = c.watch(
            path_of(plural="pods", namespace=ctx.settings.namespace),
            label_selector=pods.selector("stage"),
            to_keys=self.pod_index.to_keys,
            also=self.pod_index.on_change,
            name="pods",
            transform=pods.slim,
        )
        c.consume(
            streaming.ConsumerSpec(
                durable=NAME,
                filter_subjects=tuple(
                    subjects.kind_filter(k) for k in ("stage.succeeded", "node.uncordoned")
                ),
            ),
            to_keys=lambda e: [(e.cr, e.node)] if e.node else [],
        )
        self.node_port = nodeshell.KubeNodes(ctx.kube, self.nodes)
        self.bus_port = nodeshell.BusEvents(self.publisher)

    # ---- key mapping ------------------------------------------------------------------

    def all_keys(self) -> Iterable[NodeKey]:
        keys: set[NodeKey] = self.pod_index.keys()
        auto_taint = self._auto_taint_crs()
        for node in self.nodes.values():
            name = node["metadata"]["name"]
            keys.update((cr, name) for cr in self._crs_on(node))
            keys.update(self._readiness_keys(node, auto_taint))
        return keys

    def _crs_on(self, node: JSON) -> set[str]:
        """The CRs the node is looked at for: its records, and its outboxes that still need
        a pass (``shared.outbox``)."""
        crs = {cr for owner in _KEYED_BY for cr in nodestate.crs_with(node, owner)}
        crs.update(
            nodeshell.outboxes_to_look_at(node, nodestate.VALIDATOR, self.bus_port, self._cr_gone)
        )
        return crs

    def _cr_gone(self, cr: str) -> bool:
        return self.crs.get(cr) is None

    def _auto_taint_crs(self) -> list[api.NodeWright]:
        """The NodeWrights that ask for new nodes to be tainted, each decoded once per
        resourceVersion (node events are frequent; such NodeWrights few)."""
        out = []
        for raw in self.crs.values():
            spec = raw.get("spec") or {}
            if not (spec.get("autoTaintNewNodes") and spec.get("runtimeRequired")):
                continue
            try:
                out.append(self._decode_cr(raw))
            except msgspec.ValidationError:
                continue  # logged when its keys are reconciled
        return out

    @staticmethod
    def _readiness_keys(node: JSON, auto_taint: Iterable[api.NodeWright]) -> list[NodeKey]:
        """The pairs that have no record but may need the readiness taint added or lifted."""
        meta = node.get("metadata") or {}
        name = str(meta["name"])
        annotations = nodestate.annotations_of(node)
        taints = (node.get("spec") or {}).get("taints") or ()
        tainted_for = annotations.get(core.AUTO_TAINTED)
        if tainted_for is not None:
            return [(tainted_for, name)] if core.has_readiness_taint(taints) else []
        labels = meta.get("labels") or {}
        created = str(meta.get("creationTimestamp") or "")
        return [
            (cr.metadata.name, name)
            for cr in auto_taint
            if core.auto_taint_due(
                cr, labels=labels, taints=taints, created=created, annotations=annotations
            )
        ]

    def _cr_keys(self, old: JSON | None, new: JSON | None) -> Iterable[NodeKey]:
        obj = new or old
        if not obj:
            return []
        if status_only(old, new):
            return []  # a status update (frequent during a rollout) changes no decision
        cr = obj["metadata"]["name"]
        return [k for k in self.all_keys() if k[0] == cr]

    def _node_keys(self, old: JSON | None, new: JSON | None) -> Iterable[NodeKey]:
        if node_unchanged(old, new):
            return []
        obj = new or old
        if not obj:
            return []
        name = obj["metadata"]["name"]
        crs: set[str] = set()
        for o in (old, new):
            if o:
                crs.update(self._crs_on(o))
        keys = {(cr, name) for cr in crs}
        if new:
            keys.update(self._readiness_keys(new, self._auto_taint_crs()))
        return keys

    # ---- reconcile ----------------------------------------------------------------------

    def _runtime_required_done(self, node: JSON) -> bool:
        """Every runtimeRequired NodeWright targeting the node is done on it."""
        labels = (node.get("metadata") or {}).get("labels") or {}
        for raw in self.crs.values():
            try:
                cr = self._decode_cr(raw)
            except msgspec.ValidationError:
                continue
            if not cr.spec.runtime_required or cr.disabled:
                continue
            if not progress.selector_matches(cr.spec.node_selectors, labels):
                continue
            if not progress.node_done(cr, progress.facts(node, cr.metadata.name)):
                return False
        return True

    async def reconcile(self, key: NodeKey) -> float | None:
        return await nodeshell.flush_then(
            owner=nodestate.VALIDATOR,
            key=key,
            nodes=self.node_port,
            bus=self.bus_port,
            work=self._reconcile,
            gone=self._cr_gone,
        )

    async def _reconcile(self, key: NodeKey) -> float | None:
        cr_name, node_name = key
        raw_cr, raw_node = self.crs.get(cr_name), self.nodes.get(node_name)
        if raw_node is None:
            return None
        if raw_cr is None:
            return await self._gone(cr_name, raw_node)
        try:
            cr = self._decode_cr(raw_cr)
        except msgspec.ValidationError as exc:
            _log.error(
                "Skipped invalid NodeWright", extra={"nodewright": cr_name, "error": str(exc)}
            )
            return None
        facts = progress.facts(raw_node, cr_name)
        node_pods = [
            part for part in self.pod_index.parts(key, self.pods.get) if part.role == "check"
        ]
        has_taint = core.has_readiness_taint(facts.taints)
        annotations = nodestate.annotations_of(raw_node)
        decision = core.decide(
            cr=cr,
            node=facts,
            check_pods=node_pods,
            now=self.ctx.clock(),
            runtime_required_done=has_taint and self._runtime_required_done(raw_node),
            has_readiness_taint=has_taint,
            image_pull_grace_s=self.settings.pods.image_pull_grace_s,
            source=self.publisher.source,
            annotations=annotations,
        )
        where = {"nodewright": cr_name, "node": node_name}
        if decision.problem:
            _log.error("Cannot validate Node", extra={**where, "problem": decision.problem})
        match decision.record:
            case Write(record=ValidatorRecord() as after):
                if after.honoured != facts.validator.honoured:
                    _log.info(
                        "Honoured recovery requests", extra={**where, "request": after.honoured}
                    )
            case Remove():
                _log.info("Removed validator record from Node", extra=where)
            case _:
                pass
        return await self._apply(cr_name, raw_node, decision)

    async def _gone(self, cr: str, node: JSON) -> float | None:
        """The key's NodeWright is gone: remove the validator's record and lift the
        readiness taint it had added, if due."""
        taints = (node.get("spec") or {}).get("taints") or ()
        has_taint = core.has_readiness_taint(taints)
        lift = core.lift_orphaned_taint(
            cr,
            annotations=nodestate.annotations_of(node),
            has_readiness_taint=has_taint,
            runtime_required_done=has_taint and self._runtime_required_done(node),
        )
        forgotten = core.forget(progress.facts(node, cr), cr)
        decision = core.Decision(record=forgotten.record, remove_readiness_taint=lift)
        if not decision.changes_node:
            return None
        retry = await self._apply(cr, node, decision)
        return retry if retry == nodeshell.STALE_RETRY_S else None

    async def _apply(
        self,
        cr: str,
        node: JSON,
        decision: core.Decision,
    ) -> float | None:
        """Carry out the core's decision through the shared per-node shell: the record,
        the readiness taint and its marks in one patch."""
        name = str(node["metadata"]["name"])
        annotations: dict[str, str | None] = {}
        spec: dict[str, object] = {}
        taints = list((node.get("spec") or {}).get("taints") or [])
        if decision.add_readiness_taint:
            # The mark goes with the taint, in the same write: a node is never tainted twice.
            annotations[core.AUTO_TAINTED] = cr
            if decision.boot_id:
                annotations[core.AUTO_TAINTED_BOOT] = decision.boot_id
            spec["taints"] = [*taints, dict(core.READINESS_TAINT)]
        elif decision.remove_readiness_taint:
            spec["taints"] = [t for t in taints if t.get("key") != progress.RUNTIME_REQUIRED_TAINT]
        retry = await nodeshell.apply(
            NodeDecision(
                owner=nodestate.VALIDATOR,
                cr=cr,
                node=name,
                observed=node,
                record=decision.record,
                spec=spec,
                annotations=annotations,
                events=decision.publish,
                announce=decision.announce,
                requeue_after=decision.requeue_after,
            ),
            nodes=self.node_port,
            bus=self.bus_port,
        )
        if retry != nodeshell.STALE_RETRY_S:
            if decision.add_readiness_taint:
                _log.info(
                    "Tainted new Node until it is validated", extra={"node": name, "nodewright": cr}
                )
            elif decision.remove_readiness_taint:
                _log.info(
                    "Removed readiness taint from Node", extra={"node": name, "nodewright": cr}
                )
        return retry


async def build(ctx: runtime.ServiceContext) -> None:
    """Register the validator's controller and, when enabled, its admission webhook."""
    assert isinstance(ctx.settings, Settings)
    settings = ctx.settings
    Validator(ctx, settings).controller.register()
    if settings.webhook_enabled:
        ctx.supervisor.add(
            "webhook",
            admission(ctx.probes, lambda: webhook.serve_webhook(ctx.kube, settings.webhook)),
        )


def admission(
    probes: health.Probes,
    serve: Callable[[], contextlib.AbstractAsyncContextManager[webhook.Webhook]],
) -> Callable[[], Coroutine[Any, Any, None]]:
    """The task serving the admission webhook, and its readiness check: the process is not
    ready until the webhook is served and its configuration registered (a Service sends
    admission requests to ready pods only; with failurePolicy Fail, a request sent to a
    replica not serving yet refuses the change it was about)."""
    serving: list[webhook.Webhook] = []

    async def ready() -> bool:
        return bool(serving) and await serving[0].ready()

    probes.add("webhook", ready)

    async def serve_admission() -> None:
        async with serve() as hook:
            serving.append(hook)
            try:
                await asyncio.Event().wait()  # serves until the stop cancels this task
            finally:
                serving.clear()

    return serve_admission


SERVICE = runtime.Service(name=NAME, settings_type=Settings, build=build)


def main(environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    return runtime.main(name=NAME, settings_type=Settings, build=build, environ=env)
