"""The executor's async shell: caches, and carrying out the core's decisions on a node.

For each (NodeWright, node) key it reads the cached CR, node and NodeWright pods on that
node, asks :func:`services.executor.core.decide` what to do, then in this order writes the
node's executor record (with the node's resourceVersion as precondition), brings the node's
metadata ConfigMap up to date (:mod:`services.executor.metadata`: created before the first
stage pod, rewritten whenever its content differs, deleted once the NodeWright is gone; the
garbage collector deletes it with the Node), creates the package ConfigMap and pods
(AlreadyExists is success: names are deterministic), deletes finished pods, and publishes
the stage events. Any replica may handle any key; the precondition and deterministic names
make a double run harmless.

Keys that only have a metadata ConfigMap (a node done and released) keep it current and
nothing else: the core decides only for nodes the executor is responsible for (admitted,
carrying recovery requests, or running NodeWright pods).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping

import msgspec

from services.executor import core, metadata
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
from shared.kube import JSON, ApiError, path_of

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
        self.metadata_index = MetadataIndex()
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
        self.config_maps: Informer = c.watch(
            path_of(plural="configmaps", namespace=ctx.settings.namespace),
            label_selector=manifests.NODE_METADATA_SELECTOR,
            to_keys=self.metadata_index.to_keys,
            also=self.metadata_index.on_change,
            name="node-metadata",
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
        keys: set[NodeKey] = self.pod_index.keys() | self.metadata_index.keys()
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
        return [(cr, name) for cr in crs | self.metadata_index.crs_on(name)]

    def _responsible(self, key: NodeKey, node: JSON) -> bool:
        """The core decides for this key: the node is admitted or carries recovery requests
        for the CR, or NodeWright pods of the CR are on it."""
        cr = key[0]
        return bool(self.pod_index.names(key)) or any(
            cr in nodestate.crs_with(node, owner) for owner in _KEYED_BY
        )

    # ---- reconcile ----------------------------------------------------------------------

    async def reconcile(self, key: NodeKey) -> float | None:
        cr_name, node_name = key
        raw_cr, raw_node = self.crs.get(cr_name), self.nodes.get(node_name)
        if raw_node is None:
            return None  # its pods and metadata ConfigMaps are garbage-collected with it
        if raw_cr is None:
            # Pods are garbage-collected with the CR; the metadata ConfigMap is the Node's.
            await self._drop_metadata(key)
            return None
        try:
            cr = api.from_dict(raw_cr, api.NodeWright)
        except msgspec.ValidationError as exc:
            _log.error(
                "Skipped invalid NodeWright", extra={"nodewright": cr_name, "error": str(exc)}
            )
            return None
        if not self._responsible(key, raw_node):
            return None if await self._sync_metadata(cr, raw_node, needed=False) else 0.5
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
        if decision.record is None and decision.create and not await self._still_current(node_name):
            # Creating a pod the record already says is running (it is missing from the pod
            # cache): if another replica meanwhile recorded its result and deleted it, our
            # node is stale and a create would run the stage twice. The precondition-only
            # patch refuses a stale node; the next pass decides on fresh data.
            return 0.5
        stage_pods = any(req.role == "stage" for req in decision.create)
        if not await self._sync_metadata(cr, raw_node, needed=stage_pods):
            return 0.5  # no stage pod before its metadata: the next pass creates both
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

    async def _still_current(self, node: str) -> bool:
        """Whether the cached node is the stored one: a patch carrying nothing but its
        resourceVersion (a no-op the API server refuses with 409 when the node changed)."""
        cached = self.nodes.get(node)
        if cached is None:
            return False
        body = {"metadata": {"resourceVersion": cached["metadata"]["resourceVersion"]}}
        return await patch_node(self.ctx.kube, self.nodes, node, body)

    # ---- the node metadata ConfigMap ----------------------------------------------------

    async def _sync_metadata(self, cr: api.NodeWright, node: JSON, *, needed: bool) -> bool:
        """Create the node's metadata ConfigMap when ``needed`` (a stage pod follows) and it
        does not exist; rewrite it when it exists and says something else than it should.
        False when the write met a concurrent change: the caller retries on fresh data."""
        ns = self.ctx.settings.namespace
        desired = metadata.config_map(cr=cr, node=node, namespace=ns)
        name = desired["metadata"]["name"]
        path = path_of(plural="configmaps", namespace=ns)
        current = self.config_maps.get(f"{ns}/{name}")
        where = {"configmap": name, "nodewright": cr.metadata.name, "node": _name_of(node)}
        try:
            if current is None:
                if not needed:
                    return True
                created = await self.ctx.kube.create_if_absent(path, desired)
                if created is not None:
                    self._observe_metadata(created)
                    _log.info("Created ConfigMap", extra=where)
                    return True
                current = await self.ctx.kube.get(f"{path}/{name}")  # the cache is behind
            body = metadata.replacement(desired, current)
            if body is None:
                return True
            updated = await self.ctx.kube.replace(f"{path}/{name}", body)
        except ApiError as exc:
            if exc.conflict or exc.not_found:
                return False  # changed or deleted meanwhile (the garbage collector, a person)
            raise
        self._observe_metadata(updated)
        _log.info("Updated ConfigMap", extra=where)
        return True

    async def _drop_metadata(self, key: NodeKey) -> None:
        """Delete the metadata ConfigMap of a CR that is gone (the Node still owns it)."""
        ns = self.ctx.settings.namespace
        name = manifests.node_metadata_name(*key)
        if self.config_maps.get(f"{ns}/{name}") is None:
            return
        path = path_of(plural="configmaps", namespace=ns, name=name)
        if await self.ctx.kube.delete_if_present(path):
            _log.info("Deleted ConfigMap", extra={"configmap": name, "nodewright": key[0]})

    def _observe_metadata(self, obj: JSON) -> None:
        old = self.config_maps.get(f"{obj['metadata']['namespace']}/{obj['metadata']['name']}")
        self.config_maps.observe(obj)
        self.metadata_index.on_change(old, obj)

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


def _name_of(node: JSON) -> str:
    return str(node["metadata"]["name"])


class MetadataIndex:
    """Node metadata ConfigMaps by (cr, node), kept up to date from their informer."""

    def __init__(self) -> None:
        self._crs_by_node: dict[str, set[str]] = {}

    def keys(self) -> set[NodeKey]:
        return {(cr, node) for node, crs in self._crs_by_node.items() for cr in crs}

    def crs_on(self, node: str) -> set[str]:
        return set(self._crs_by_node.get(node, ()))

    def to_keys(self, old: JSON | None, new: JSON | None) -> list[NodeKey]:
        key = metadata.key_of(new or old or {})
        return [key] if key else []

    def on_change(self, old: JSON | None, new: JSON | None) -> None:
        if old is not None and (key := metadata.key_of(old)) is not None:
            crs = self._crs_by_node.get(key[1], set())
            crs.discard(key[0])
            if not crs:
                self._crs_by_node.pop(key[1], None)
        if new is not None and (key := metadata.key_of(new)) is not None:
            self._crs_by_node.setdefault(key[1], set()).add(key[0])


def main(environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ

    async def build(ctx: runtime.ServiceContext) -> None:
        assert isinstance(ctx.settings, Settings)
        Executor(ctx, ctx.settings).controller.register()

    return runtime.main(name=NAME, settings_type=Settings, build=build, environ=env)
