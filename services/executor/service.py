"""The executor's async shell: caches, and carrying out the core's decisions on a node.

For each (NodeWright, node) key it reads the cached CR, node and NodeWright pods on that
node, asks :func:`services.executor.core.decide` what to do, then in this order writes the
node's executor record (with the node's resourceVersion as precondition), creates the
package ConfigMap and pods (AlreadyExists is success: names are deterministic), deletes
finished pods, and publishes the stage events. Any replica may handle any key; the
precondition and deterministic names make a double run harmless.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping

import msgspec

from services.executor import core
from services.executor.config import Settings
from shared import (
    api,
    nodestate,
    pods,
    podspec as manifests,
    progress,
    runtime,
    streaming,
    subjects,
)
from shared.controller import Controller, NodeKey, PodIndex, patch_node
from shared.informer import Informer
from shared.kube import JSON, path_of

NAME = "executor"
_log = logging.getLogger("nodewright.executor")

NODEWRIGHTS = path_of(group=api.GROUP, version=api.VERSION, plural=api.NODEWRIGHT_PLURAL)
NODES = path_of(plural="nodes")
_KEYED_BY = (nodestate.SCHEDULER, nodestate.REQUESTS)
"""A node is looked at for a CR when admitted, or when it carries recovery requests (a rerun
on a finished, released node starts there)."""


class Executor:
    def __init__(self, ctx: runtime.ServiceContext, settings: Settings) -> None:
        self.ctx = ctx
        self.settings = settings.pods
        self.pod_settings = manifests.PodSettings(
            namespace=ctx.settings.namespace,
            agent_image=self.settings.agent_image,
            simulate=self.settings.simulate,
            sim_stage_duration=self.settings.sim_stage_duration,
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
            label_selector=pods.selector("stage", "interrupt"),
            to_keys=self.pod_index.to_keys,
            also=self.pod_index.on_change,
            name="pods",
        )
        c.consume(
            streaming.ConsumerSpec(
                durable=NAME,
                filter_subjects=tuple(
                    subjects.kind_filter(k)
                    for k in ("node.selected", "node.drained", "stage.validated")
                ),
            ),
            to_keys=lambda e: [(e.cr, e.node)] if e.node else [],
        )

    # ---- key mapping ------------------------------------------------------------------

    def all_keys(self) -> Iterable[NodeKey]:
        keys: set[NodeKey] = self.pod_index.keys()
        for node in self.nodes.values():
            for owner in _KEYED_BY:
                for cr in nodestate.crs_with(node, owner):
                    keys.add((cr, node["metadata"]["name"]))
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
        crs = {
            cr
            for o in (old, new)
            if o
            for owner in _KEYED_BY
            for cr in nodestate.crs_with(o, owner)
        }
        return [(cr, name) for cr in crs]

    # ---- reconcile ----------------------------------------------------------------------

    async def reconcile(self, key: NodeKey) -> float | None:
        cr_name, node_name = key
        raw_cr, raw_node = self.crs.get(cr_name), self.nodes.get(node_name)
        if raw_cr is None or raw_node is None:
            return None  # pods are garbage-collected with their owner
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
        decision = core.decide(
            cr=cr,
            node=facts,
            node_pods=node_pods,
            now=self.ctx.clock(),
            image_pull_grace_s=self.settings.image_pull_grace_s,
            source=self.publisher.source,
            requests=nodestate.read_requests(raw_node, cr_name),
        )
        if decision.record is not None and decision.record.honoured != facts.executor.honoured:
            _log.info(
                "Honoured recovery requests",
                extra={
                    "nodewright": cr_name,
                    "node": node_name,
                    "request": decision.record.honoured,
                },
            )
        if decision.record is not None and not await self._write_record(
            cr_name, node_name, decision.record
        ):
            return 0.5
        annotations = nodestate.annotations_of(raw_node)
        for req in decision.create:
            await self._create(cr, node_name, annotations, req)
        for name in decision.delete:
            await self._delete(name)
        for event in decision.publish:
            await self.publisher.publish(event)
        return decision.requeue_after

    async def _write_record(self, cr: str, node: str, record: nodestate.ExecutorRecord) -> bool:
        cached = self.nodes.get(node)
        if cached is None:
            return False
        body = nodestate.patch(
            nodestate.EXECUTOR, cr, record, resource_version=cached["metadata"]["resourceVersion"]
        )
        return await patch_node(self.ctx.kube, self.nodes, node, body)

    async def _create(
        self,
        cr: api.NodeWright,
        node: str,
        annotations: Mapping[str, str],
        req: manifests.PodRequest,
    ) -> None:
        ns = self.ctx.settings.namespace
        if req.role == "interrupt":
            body = manifests.interrupt_pod(
                req, cr=cr, node=node, node_annotations=annotations, settings=self.pod_settings
            )
        else:
            d = req.desired
            assert d is not None
            if d.config:
                cm = manifests.config_map(cr, d.name, d.config_digest, d.config, ns)
                await self.ctx.kube.create_if_absent(path_of(plural="configmaps", namespace=ns), cm)
            body = manifests.stage_pod(
                req, cr=cr, node=node, node_annotations=annotations, settings=self.pod_settings
            )
        created = await self.ctx.kube.create_if_absent(path_of(plural="pods", namespace=ns), body)
        if created is not None:
            self.pods.observe(created)
            self.pod_index.on_change(None, created)
            _log.info(
                "Created Pod",
                extra={
                    "pod": req.name,
                    "nodewright": cr.metadata.name,
                    "node": node,
                    "package": req.package,
                    "stage": req.stage,
                },
            )

    async def _delete(self, name: str) -> None:
        ns = self.ctx.settings.namespace
        await self.ctx.kube.delete_if_present(path_of(plural="pods", namespace=ns, name=name))


def main(environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ

    async def build(ctx: runtime.ServiceContext) -> None:
        assert isinstance(ctx.settings, Settings)
        Executor(ctx, ctx.settings).controller.register()

    return runtime.main(name=NAME, settings_type=Settings, build=build, environ=env)
