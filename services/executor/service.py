"""The executor's async shell: caches, and carrying out the core's decisions on a node.

For each (NodeWright, node) key it reads the cached CR, node and NodeWright pods on that
node, asks :func:`services.executor.core.decide` what to do, builds the pod manifests and
hands the decision to the shared per-node shell (:func:`shared.nodeshell.apply`), which
writes the node's executor record (with what the decision read of the node as
precondition, :mod:`shared.nodepins`, also before it creates pods when the record does not
change), creates the package ConfigMap and
pods (AlreadyExists is success: names are deterministic; each stage pod carries the node's
metadata as it was decided on, :mod:`shared.nodemetadata`), deletes finished pods, and
publishes the stage events. Any replica may handle any key; the precondition and
deterministic names make a double run harmless. Once the NodeWright is gone the executor
removes its own record, unless it still tracks installed packages (``core.forget``).

The core decides only for nodes the executor is responsible for (admitted, carrying
recovery requests or the executor's record, or running NodeWright pods).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime

import msgspec

from services.executor import core
from services.executor.config import Settings
from shared import (
    api,
    durations,
    events,
    nodemetadata,
    nodeshell,
    nodestate,
    pods,
    podspec as manifests,
    progress,
    runtime,
    streaming,
    subjects,
)
from shared.controller import Controller, NodeKey, PodIndex, node_unchanged, status_only
from shared.decisions import NodeDecision, Remove, Write
from shared.informer import Informer, slim_node
from shared.kube import JSON, ApiError, path_of
from shared.records.executor import ExecutorRecord

NAME = "executor"
_log = logging.getLogger("nodewright.executor")

NODEWRIGHTS = path_of(group=api.GROUP, version=api.VERSION, plural=api.NODEWRIGHT_PLURAL)
NODES = path_of(plural="nodes")
_KEYED_BY = (nodestate.SCHEDULER, nodestate.REQUESTS, nodestate.EXECUTOR)
"""A node is looked at for a CR when admitted, when it carries recovery requests (a rerun
on a finished, released node starts there), or when it carries the executor's record (a
reboot with ``reapplyOnReboot`` starts there; a NodeWright that is gone leaves it to go)."""


class Executor:
    def __init__(self, ctx: runtime.ServiceContext, settings: Settings) -> None:
        self.ctx = ctx
        self._decode_cr = api.Decoded(api.NodeWright)
        self.settings = settings.pods
        self.pod_settings = manifests.PodSettings.of(
            namespace=ctx.settings.namespace, config=self.settings
        )
        self.publisher = streaming.Publisher(
            ctx.bus, source=f"{NAME}/{ctx.identity}", registry=ctx.registry
        )
        self._stage_seconds = durations.stage_histogram(ctx.registry)
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
            label_selector=pods.selector("stage", "interrupt", "pull"),
            to_keys=self.pod_index.to_keys,
            also=self.pod_index.on_change,
            name="pods",
            transform=pods.slim,
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
        self.node_port = nodeshell.KubeNodes(ctx.kube, self.nodes)
        self.config_maps: Informer = nodeshell.package_config_maps(c, ctx.settings.namespace)
        self._unwanted: Mapping[str, datetime] = {}
        """Package ConfigMaps the last sweep found unwanted, and since when."""
        self.object_port = nodeshell.KubeObjects(
            ctx.kube,
            ctx.settings.namespace,
            pods=self.pods,
            on_pod=self.pod_index.on_change,
            config_maps=self.config_maps,
        )
        self.bus_port = nodeshell.BusEvents(self.publisher)

    # ---- key mapping ------------------------------------------------------------------

    def all_keys(self) -> Iterable[NodeKey]:
        keys: set[NodeKey] = self.pod_index.keys()
        for node in self.nodes.values():
            name = node["metadata"]["name"]
            keys.update((cr, name) for cr in self._crs_on(node))
        return keys

    def _crs_on(self, node: JSON) -> set[str]:
        """The CRs the node is looked at for: its records, and its outboxes that still need
        a pass (``shared.outbox``)."""
        crs = {cr for owner in _KEYED_BY for cr in nodestate.crs_with(node, owner)}
        crs.update(
            nodeshell.outboxes_to_look_at(node, nodestate.EXECUTOR, self.bus_port, self._gone)
        )
        return crs

    def _gone(self, cr: str) -> bool:
        return self.crs.get(cr) is None

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
        crs = {cr for o in (old, new) if o for cr in self._crs_on(o)}
        return [(cr, name) for cr in crs]

    def _responsible(self, key: NodeKey, node: JSON) -> bool:
        """The core decides for this key: the node is admitted or carries recovery requests
        for the CR, or NodeWright pods of the CR are on it."""
        cr = key[0]
        return bool(self.pod_index.names(key)) or any(
            cr in nodestate.crs_with(node, owner) for owner in _KEYED_BY
        )

    # ---- reconcile ----------------------------------------------------------------------

    async def reconcile(self, key: NodeKey) -> float | None:
        return await nodeshell.flush_then(
            owner=nodestate.EXECUTOR,
            key=key,
            nodes=self.node_port,
            bus=self.bus_port,
            work=self._reconcile,
            gone=self._gone,
        )

    async def _reconcile(self, key: NodeKey) -> float | None:
        cr_name, node_name = key
        raw_cr, raw_node = self.crs.get(cr_name), self.nodes.get(node_name)
        if raw_node is None:
            return None  # its pods are garbage-collected with it
        if raw_cr is None:
            # Pods are garbage-collected with the CR; the record is this service's to remove.
            gone = core.forget(progress.facts(raw_node, cr_name), cr_name)
            return await self._apply(cr_name, raw_node, gone, [], [])
        try:
            cr = self._decode_cr(raw_cr)
        except msgspec.ValidationError as exc:
            _log.error(
                "Skipped invalid NodeWright", extra={"nodewright": cr_name, "error": str(exc)}
            )
            return None
        if not self._responsible(key, raw_node):
            return None
        facts = progress.facts(raw_node, cr_name)
        # A stage pod is read as its stage; its check is the validator's to judge.
        node_pods = [
            part for part in self.pod_index.parts(key, self.pods.get) if part.role != "check"
        ]
        decision = core.decide(
            cr=cr,
            node=facts,
            node_pods=node_pods,
            now=self.ctx.clock(),
            image_pull_grace_s=self.settings.image_pull_grace_s,
            source=self.publisher.source,
        )
        self._log_decision(cr_name, node_name, facts.executor, decision)
        annotations = nodestate.annotations_of(raw_node)
        config_maps: list[JSON] = []
        bodies: list[JSON] = []
        seen = nodemetadata.text(cr, raw_node) if decision.create else ""
        for req in decision.create:
            if req.role in ("pull", "interrupt"):
                build = manifests.pull_pod if req.role == "pull" else manifests.interrupt_pod
                bodies.append(
                    build(
                        req,
                        cr=cr,
                        node=node_name,
                        node_annotations=annotations,
                        settings=self.pod_settings,
                    )
                )
                continue
            d = req.desired
            assert d is not None
            if d.config:
                ns = self.ctx.settings.namespace
                config_maps.append(manifests.config_map(cr, d.name, d.config_digest, d.config, ns))
            bodies.append(
                manifests.stage_pod(
                    req,
                    cr=cr,
                    node=node_name,
                    node_annotations=annotations,
                    settings=self.pod_settings,
                    node_metadata=seen,
                )
            )

        def observe(results: Sequence[events.Event]) -> None:
            for event in results:
                took = durations.stage_seconds(event, facts)
                if took is not None:
                    self._stage_seconds.labels(*took[0]).observe(took[1])

        return await self._apply(
            cr_name,
            raw_node,
            decision,
            config_maps,
            bodies,
            # Once per result: the write recording it landed, or (a stage whose check runs in
            # its pod) this process published what the pod says.
            written=lambda: observe(decision.publish),
            announced=observe,
        )

    def _log_decision(
        self, cr: str, node: str, before: ExecutorRecord, decision: core.Decision
    ) -> None:
        where = {"nodewright": cr, "node": node}
        if decision.problem:
            _log.error("Cannot run packages on Node", extra={**where, "problem": decision.problem})
        match decision.record:
            case Write(record=ExecutorRecord() as after):
                if after.honoured != before.honoured:
                    _log.info(
                        "Honoured recovery requests", extra={**where, "request": after.honoured}
                    )
                elif after.reset_boot and after.reset_boot != before.reset_boot:
                    _log.info("Reset rebooted Node", extra={**where, "boot_id": after.reset_boot})
            case Remove():
                _log.info("Removed executor record from Node", extra=where)
            case _:
                pass

    async def _apply(
        self,
        cr: str,
        node: JSON,
        decision: core.Decision,
        config_maps: list[JSON],
        bodies: list[JSON],
        written: Callable[[], None] | None = None,
        announced: Callable[[Sequence[events.Event]], None] | None = None,
    ) -> float | None:
        """Carry out the core's decision through the shared per-node shell. Pods are only
        created after a write or a read proving the node unchanged (``fence``): creating a
        pod the record already says is running (it is missing from the pod cache) on a stale
        node could run a stage twice, if another replica meanwhile recorded its result and
        deleted it. The precondition is what the decision read of ``node``, the node decided
        on: its metadata, spec, Ready condition and boot ID (``shared.nodepins``)."""
        return await nodeshell.apply(
            NodeDecision(
                owner=nodestate.EXECUTOR,
                cr=cr,
                node=str(node["metadata"]["name"]),
                observed=node,
                record=decision.record,
                fence=True,
                config_maps=tuple(config_maps),
                create=tuple(bodies),
                delete=nodeshell.pod_refs(self.pods, self.ctx.settings.namespace, decision.delete),
                stop=nodeshell.pod_refs(self.pods, self.ctx.settings.namespace, decision.stop),
                settled=decision.settled,
                events=decision.publish,
                announce=decision.announce,
                requeue_after=decision.requeue_after,
            ),
            nodes=self.node_port,
            objects=self.object_port,
            bus=self.bus_port,
            written=written,
            announced=announced,
        )

    # ---- package ConfigMaps -------------------------------------------------------------

    async def sweep(self) -> None:
        """Every resync interval, delete the package ConfigMaps no NodeWright wants any more
        (:func:`services.executor.core.sweep_config_maps`): one per configuration a package
        ever had, kept until its NodeWright was deleted."""
        await self.controller.synced()
        interval = self.ctx.settings.resync_interval_s
        while True:
            await self.sweep_once(grace_s=interval)
            await asyncio.sleep(interval)

    async def sweep_once(self, *, grace_s: float) -> list[str]:
        """One sweep; the ConfigMaps it deleted."""
        crs: dict[str, api.NodeWright] = {}
        for raw in self.crs.values():
            try:
                crs[raw["metadata"]["name"]] = self._decode_cr(raw)
            except msgspec.ValidationError:
                continue  # its reconciles say so; its ConfigMaps wait
        decided = core.sweep_config_maps(
            [_package_config_map(obj) for obj in self.config_maps.values()],
            crs=crs,
            mounted=_mounted_config_maps(self.pods.values()),
            seen=self._unwanted,
            now=self.ctx.clock(),
            grace_s=grace_s,
        )
        self._unwanted = decided.unwanted
        deleted: list[str] = []
        for name in decided.delete:
            path = path_of(plural="configmaps", namespace=self.ctx.settings.namespace, name=name)
            try:
                await self.ctx.kube.delete_if_present(path)
            except ApiError as exc:
                # The next sweep finds it again.
                _log.warning(
                    "Failed to delete package ConfigMap",
                    extra={"configmap": name, "error": str(exc)},
                )
                continue
            deleted.append(name)
            _log.info("Deleted package ConfigMap no NodeWright wants", extra={"configmap": name})
        return deleted


def _package_config_map(obj: JSON) -> core.PackageConfigMap:
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    return core.PackageConfigMap(
        name=str(meta.get("name") or ""),
        cr=str(labels.get(pods.LABEL_CR) or ""),
        package=str(labels.get(pods.LABEL_PACKAGE) or ""),
    )


def _mounted_config_maps(cached_pods: Iterable[JSON]) -> set[str]:
    """The ConfigMaps the volumes of these pods name."""
    return {
        str(v["configMap"].get("name") or "")
        for pod in cached_pods
        for v in (pod.get("spec") or {}).get("volumes") or ()
        if isinstance(v.get("configMap"), dict)
    }


async def build(ctx: runtime.ServiceContext) -> None:
    """Register the executor's informers, consumer, queue, resync and ConfigMap sweep with
    the supervisor."""
    assert isinstance(ctx.settings, Settings)
    executor = Executor(ctx, ctx.settings)
    executor.controller.register()
    ctx.supervisor.add("sweep:configmaps", executor.sweep)


SERVICE = runtime.Service(name=NAME, settings_type=Settings, build=build)


def main(environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    return runtime.main(name=NAME, settings_type=Settings, build=build, environ=env)
