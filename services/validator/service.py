"""The validator's async shell: caches, check pods, node validation records and the
readiness taint, carried out as :func:`services.validator.core.decide` says.

For each (NodeWright, node) key it writes the validator record (with the node's
resourceVersion as precondition), creates check pods (AlreadyExists is success), deletes
finished ones, lifts the runtime-required taint when the core says so, and publishes
``stage.validated`` / ``stage.validation-failed`` / ``node.validated``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable, Mapping

import msgspec

from services.validator import core, webhook
from services.validator.config import Settings
from shared import api, nodestate, pods, podspec, progress, runtime, streaming, subjects
from shared.controller import Controller, NodeKey, PodIndex, patch_node
from shared.informer import Informer
from shared.kube import JSON, path_of

NAME = "validator"
_log = logging.getLogger("nodewright.validator")

NODEWRIGHTS = path_of(group=api.GROUP, version=api.VERSION, plural=api.NODEWRIGHT_PLURAL)
NODES = path_of(plural="nodes")
_KEYED_BY = (nodestate.SCHEDULER, nodestate.EXECUTOR, nodestate.REQUESTS)


class Validator:
    def __init__(self, ctx: runtime.ServiceContext, settings: Settings) -> None:
        self.ctx = ctx
        self.settings = settings
        self.pod_settings = podspec.PodSettings(
            namespace=ctx.settings.namespace,
            agent_image=settings.pods.agent_image,
            simulate=settings.pods.simulate,
            sim_stage_duration=settings.pods.sim_stage_duration,
        )
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
        self.nodes: Informer = c.watch(NODES, to_keys=self._node_keys, name="nodes")
        self.pods: Informer = c.watch(
            path_of(plural="pods", namespace=ctx.settings.namespace),
            label_selector=pods.selector("check"),
            to_keys=self.pod_index.to_keys,
            also=self.pod_index.on_change,
            name="pods",
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

    # ---- key mapping ------------------------------------------------------------------

    def all_keys(self) -> Iterable[NodeKey]:
        keys: set[NodeKey] = self.pod_index.keys()
        for node in self.nodes.values():
            name = node["metadata"]["name"]
            for owner in _KEYED_BY:
                keys.update((cr, name) for cr in nodestate.crs_with(node, owner))
        return keys

    def _cr_keys(self, old: JSON | None, new: JSON | None) -> Iterable[NodeKey]:
        obj = new or old
        if not obj:
            return []
        cr = obj["metadata"]["name"]
        return [k for k in self.all_keys() if k[0] == cr]

    def _node_keys(self, old: JSON | None, new: JSON | None) -> Iterable[NodeKey]:
        obj = new or old
        if not obj:
            return []
        name = obj["metadata"]["name"]
        crs: set[str] = set()
        for o in (old, new):
            if o:
                for owner in _KEYED_BY:
                    crs.update(nodestate.crs_with(o, owner))
        return [(cr, name) for cr in crs]

    # ---- reconcile ----------------------------------------------------------------------

    def _runtime_required_done(self, node: JSON) -> bool:
        """Every runtimeRequired NodeWright targeting the node is done on it."""
        labels = (node.get("metadata") or {}).get("labels") or {}
        for raw in self.crs.values():
            try:
                cr = api.from_dict(raw, api.NodeWright)
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
        cr_name, node_name = key
        raw_cr, raw_node = self.crs.get(cr_name), self.nodes.get(node_name)
        if raw_cr is None or raw_node is None:
            return None
        try:
            cr = api.from_dict(raw_cr, api.NodeWright)
        except msgspec.ValidationError as exc:
            _log.error(
                "Skipped invalid NodeWright", extra={"nodewright": cr_name, "error": str(exc)}
            )
            return None
        facts = progress.facts(raw_node, cr_name)
        node_pods = [
            pods.view(p)
            for p in (self.pods.get(k) for k in self.pod_index.names(key))
            if p is not None
        ]
        has_taint = any(t.get("key") == progress.RUNTIME_REQUIRED_TAINT for t in facts.taints)
        decision = core.decide(
            cr=cr,
            node=facts,
            check_pods=node_pods,
            now=self.ctx.clock(),
            runtime_required_done=has_taint and self._runtime_required_done(raw_node),
            has_readiness_taint=has_taint,
            image_pull_grace_s=self.settings.pods.image_pull_grace_s,
            source=self.publisher.source,
            requests=nodestate.read_requests(raw_node, cr_name),
        )
        if decision.record is not None and decision.record.honoured != facts.validator.honoured:
            _log.info(
                "Honoured recovery requests",
                extra={
                    "nodewright": cr_name,
                    "node": node_name,
                    "request": decision.record.honoured,
                },
            )
        changes = decision.record is not None or decision.remove_readiness_taint
        if changes and not await self._write(cr_name, raw_node, decision):
            return 0.5
        annotations = nodestate.annotations_of(raw_node)
        for req in decision.create:
            await self._create(cr, node_name, annotations, req)
        for name in decision.delete:
            await self._delete(name)
        for event in decision.publish:
            await self.publisher.publish(event)
        return decision.requeue_after

    async def _write(self, cr: str, node: JSON, decision: core.Decision) -> bool:
        name = node["metadata"]["name"]
        body = nodestate.patch(
            nodestate.VALIDATOR,
            cr,
            decision.record,
            resource_version=node["metadata"]["resourceVersion"],
        )
        if decision.record is None:
            del body["metadata"]["annotations"]
        if decision.remove_readiness_taint:
            taints = (node.get("spec") or {}).get("taints") or []
            body["spec"] = {
                "taints": [t for t in taints if t.get("key") != progress.RUNTIME_REQUIRED_TAINT]
            }
        if not await patch_node(self.ctx.kube, self.nodes, name, body):
            return False
        if decision.remove_readiness_taint:
            _log.info("Removed readiness taint from Node", extra={"node": name, "nodewright": cr})
        return True

    async def _create(
        self,
        cr: api.NodeWright,
        node: str,
        annotations: Mapping[str, str],
        req: podspec.PodRequest,
    ) -> None:
        ns = self.ctx.settings.namespace
        d = req.desired
        assert d is not None
        if d.config:
            cm = podspec.config_map(cr, d.name, d.config_digest, d.config, ns)
            await self.ctx.kube.create_if_absent(path_of(plural="configmaps", namespace=ns), cm)
        body = podspec.stage_pod(
            req, cr=cr, node=node, node_annotations=annotations, settings=self.pod_settings
        )
        created = await self.ctx.kube.create_if_absent(path_of(plural="pods", namespace=ns), body)
        if created is not None:
            self.pods.observe(created)
            self.pod_index.on_change(None, created)

    async def _delete(self, name: str) -> None:
        ns = self.ctx.settings.namespace
        await self.ctx.kube.delete_if_present(path_of(plural="pods", namespace=ns, name=name))


def main(environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ

    async def build(ctx: runtime.ServiceContext) -> None:
        assert isinstance(ctx.settings, Settings)
        settings = ctx.settings
        Validator(ctx, settings).controller.register()
        if settings.webhook_enabled:

            async def serve_admission() -> None:
                async with webhook.serve_webhook(ctx.kube, settings.webhook):
                    await asyncio.Event().wait()  # serves until the stop cancels this task

            ctx.supervisor.add("webhook", serve_admission)

    return runtime.main(name=NAME, settings_type=Settings, build=build, environ=env)
