"""The scheduler's async shell: caches, leader election, and carrying out the core's plan.

One replica holds the ``nodewright-scheduler`` Lease and acts; the others stand by, so two
replicas never admit nodes against the same budget at once. For each NodeWright (the work
key) it reads the cached CR, policy and nodes, asks :func:`services.scheduler.core.plan`
what to do, writes each admission to the node (with the node's resourceVersion as a
precondition, and through to the cache so the next decision counts it), and publishes
``node.selected`` / ``node.completed``. Deciding is the core's job.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping

import msgspec

from services.scheduler import core
from services.scheduler.config import Settings
from shared import api, events, nodestate, progress, runtime, streaming, subjects
from shared.controller import Controller, patch_node
from shared.informer import Informer
from shared.kube import JSON, path_of
from shared.leader import LeaderElector

NAME = "scheduler"
_log = logging.getLogger("nodewright.scheduler")

NODEWRIGHTS = path_of(group=api.GROUP, version=api.VERSION, plural=api.NODEWRIGHT_PLURAL)
POLICIES = path_of(group=api.GROUP, version=api.VERSION, plural=api.DEPLOYMENT_POLICY_PLURAL)
NODES = path_of(plural="nodes")


class Scheduler:
    def __init__(self, ctx: runtime.ServiceContext) -> None:
        self.ctx = ctx
        self.publisher = streaming.Publisher(
            ctx.bus, source=f"{NAME}/{ctx.identity}", registry=ctx.registry
        )
        self.leader = LeaderElector(
            kube=ctx.kube,
            namespace=ctx.settings.namespace,
            name="nodewright-scheduler",
            identity=ctx.identity,
        )
        self.controller: Controller[str] = Controller(
            ctx=ctx, name=NAME, reconcile=self.reconcile, all_keys=self.all_crs, workers=4
        )
        c = self.controller
        self.crs: Informer = c.watch(NODEWRIGHTS, to_keys=self._cr_keys, name="nodewrights")
        self.policies: Informer = c.watch(POLICIES, to_keys=self._policy_keys, name="policies")
        self.nodes: Informer = c.watch(NODES, to_keys=self._node_keys, name="nodes")
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
            ),
            to_keys=lambda e: [e.cr],
        )

    # ---- key mapping ------------------------------------------------------------------

    def all_crs(self) -> Iterable[str]:
        return [str(o["metadata"]["name"]) for o in self.crs.values()]

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

    def _node_keys(self, old: JSON | None, new: JSON | None) -> Iterable[str]:
        # Any node change may free or need a slot of any NodeWright; the queue coalesces.
        return self.all_crs()

    # ---- reconcile ----------------------------------------------------------------------

    async def reconcile(self, name: str) -> float | None:
        if not self.leader.is_leader:
            return None
        raw = self.crs.get(name)
        if raw is None:
            return None
        try:
            cr = api.from_dict(raw, api.NodeWright)
        except msgspec.ValidationError as exc:
            _log.error("Skipped invalid NodeWright", extra={"nodewright": name, "error": str(exc)})
            return None
        if cr.metadata.deletion_timestamp is not None:
            return None
        policy = None
        if cr.spec.deployment_policy:
            raw_policy = self.policies.get(cr.spec.deployment_policy)
            if raw_policy is None:
                return (
                    self.ctx.settings.resync_interval_s
                )  # status reports DeploymentPolicyNotFound
            policy = api.from_dict(raw_policy, api.DeploymentPolicy)
        facts = [progress.facts(n, name) for n in self.nodes.values()]
        plan = core.plan(cr=cr, policy=policy, nodes=facts, now=self.ctx.clock())
        for node in plan.release:
            await self._release(cr, node)
        for admit in plan.admit:
            await self._admit(cr, admit)
        return self.ctx.settings.resync_interval_s

    async def _write(self, cr: str, node: str, selection: nodestate.Selection | None) -> bool:
        """Write (or remove) this CR's admission on the node; False if the node changed."""
        cached = self.nodes.get(node)
        if cached is None:
            return False
        body = nodestate.patch(
            nodestate.SCHEDULER,
            cr,
            selection,
            resource_version=cached["metadata"]["resourceVersion"],
        )
        if await patch_node(self.ctx.kube, self.nodes, node, body):
            return True
        self.controller.queue.add(cr, after=0.5)  # the node changed: decide again
        return False

    async def _admit(self, cr: api.NodeWright, admit: core.Admit) -> None:
        if not await self._write(cr.metadata.name, admit.node, admit.selection):
            return
        _log.info("Admitted Node", extra={"nodewright": cr.metadata.name, "node": admit.node})
        desired = progress.desired(cr)
        await self.publisher.publish(
            events.NodeSelected(
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
        )

    async def _release(self, cr: api.NodeWright, node: str) -> None:
        cached = self.nodes.get(node)
        if cached is None:
            return
        facts = progress.facts(cached, cr.metadata.name)
        done = progress.node_done(cr, facts)
        if not await self._write(cr.metadata.name, node, None):
            return
        _log.info(
            "Released Node", extra={"nodewright": cr.metadata.name, "node": node, "done": done}
        )
        if done:
            await self.publisher.publish(
                events.NodeCompleted(
                    id=events.event_id(
                        cr.metadata.name, node, "completed", progress.target_digest(cr)
                    ),
                    at=self.ctx.clock(),
                    cr=cr.metadata.name,
                    generation=cr.metadata.generation,
                    node=node,
                    source=self.publisher.source,
                )
            )

    async def _on_leadership(self) -> None:
        while True:
            await self.leader.became_leader.wait()
            for name in self.all_crs():
                self.controller.queue.add(name)
            await self.leader.lost_leadership.wait()


async def build(ctx: runtime.ServiceContext) -> None:
    scheduler = Scheduler(ctx)
    scheduler.controller.register()
    ctx.supervisor.add("leader", scheduler.leader.run)
    ctx.supervisor.add("leadership-watch", scheduler._on_leadership)


def main(environ: Mapping[str, str] | None = None) -> int:
    return runtime.main(
        name=NAME,
        settings_type=Settings,
        build=build,
        environ=os.environ if environ is None else environ,
    )
