"""The scheduler's async shell: caches, leader election, and carrying out the core's plan.

One replica holds the ``nodewright-scheduler`` Lease and acts; the others stand by, so two
replicas never admit nodes against the same budget at once (a dead holder's lease expires
and another replica takes over). For each NodeWright (the work key) it reads the cached CR,
policy and nodes, what every other NodeWright holds (the admissions on the nodes: the
cluster budget ``NODEWRIGHT_SCHEDULER_CLUSTER_BUDGET`` and a policy's ``sharedBudget`` are
counted from them at decision time, so they survive crashes) and the priority order, asks
:func:`services.scheduler.core.plan` what to do, writes the batch book to the CR
(annotation ``scheduler.nodewright.nvidia.com/batches``, resourceVersion precondition),
then each admission to the node (node resourceVersion precondition, written through to the
cache so the next decision counts it), and publishes ``node.selected`` / ``node.completed``.
It also owns the NodeWright's finalizer: added before the first admission; on deletion the
same plan admits nodes for their uninstalls, and once nothing of the CR is left on any node
the leftovers are removed and then the finalizer.
Decisions of all NodeWrights are serialized by one lock, so two CRs never both take the
last slot of a shared budget. Deciding is the core's job.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable, Mapping

import msgspec

from services.scheduler import core
from services.scheduler.config import Settings
from shared import api, events, nodestate, progress, runtime, streaming, subjects
from shared.controller import Controller, patch_node
from shared.informer import Informer
from shared.kube import JSON, ApiError, path_of
from shared.leader import LeaderElector

NAME = "scheduler"
_log = logging.getLogger("nodewright.scheduler")

NODEWRIGHTS = path_of(group=api.GROUP, version=api.VERSION, plural=api.NODEWRIGHT_PLURAL)
POLICIES = path_of(group=api.GROUP, version=api.VERSION, plural=api.DEPLOYMENT_POLICY_PLURAL)
NODES = path_of(plural="nodes")


class Scheduler:
    def __init__(self, ctx: runtime.ServiceContext) -> None:
        self.ctx = ctx
        assert isinstance(ctx.settings, Settings)
        self.settings = ctx.settings.scheduler
        self._decide = asyncio.Lock()
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
        if progress.deleting(cr) and core.FINALIZER not in cr.metadata.finalizers:
            return None  # ours is done (or was never added): nothing left to do for it
        policy = None
        if cr.spec.deployment_policy:
            raw_policy = self.policies.get(cr.spec.deployment_policy)
            if raw_policy is None:
                # Nothing new starts; finished nodes are still released.
                async with self._decide:
                    return await self._decide_for(cr, None, missing=True)
            policy = api.from_dict(raw_policy, api.DeploymentPolicy)
        async with self._decide:
            return await self._decide_for(cr, policy, missing=False)

    async def _decide_for(
        self, cr: api.NodeWright, policy: api.DeploymentPolicy | None, *, missing: bool
    ) -> float | None:
        name = cr.metadata.name
        raw_nodes = list(self.nodes.values())
        facts = [progress.facts(n, name) for n in raw_nodes]
        finalizer = core.finalizer(cr, facts)
        if finalizer.action == "add" and not await self._set_finalizers(
            cr, [*cr.metadata.finalizers, core.FINALIZER]
        ):
            # No node is admitted before the finalizer is in place: a deletion racing the
            # first admission still uninstalls and releases.
            self.controller.queue.add(name, after=0.5)
            return None
        crs = self._decoded_crs()
        plan = core.plan(
            cr=cr,
            policy=policy,
            nodes=facts,
            now=self.ctx.clock(),
            book=progress.read_batch_book(cr.metadata.annotations),
            caps=self._caps(cr, policy, crs, raw_nodes),
            priority_waits=progress.priority_waits(cr, crs, raw_nodes),
            policy_missing=missing,
        )
        for note in plan.events:
            _log.info("Changed batch state", extra={"nodewright": name, "change": note})
        for node in plan.release:
            await self._release(cr, node)
        changed = plan.book != progress.read_batch_book(cr.metadata.annotations)
        if changed and not await self._write_book(cr, plan.book):
            self.controller.queue.add(name, after=0.5)
            return None
        for admit in plan.admit:
            await self._admit(cr, admit)
        if cr.spec.reapply_on_reboot:
            await self._reapply_after_reboots(cr, raw_nodes, facts)
        if finalizer.action == "wait":
            _log.info(
                "Waiting to finalize NodeWright",
                extra={"nodewright": name, "pending": len(finalizer.pending)},
            )
        elif finalizer.action == "remove" and not await self._finalize(cr, raw_nodes):
            self.controller.queue.add(name, after=0.5)
            return None
        return self.ctx.settings.resync_interval_s

    async def _reapply_after_reboots(
        self, cr: api.NodeWright, raw_nodes: list[JSON], facts: list[progress.NodeFacts]
    ) -> None:
        """Nodes that rebooted since their packages completed start over: a reset request
        (honoured by every service like ``nodewright node reset``) and ``node.rebooted``."""
        name = cr.metadata.name
        now = self.ctx.clock()
        for raw, node in zip(raw_nodes, facts, strict=True):
            requests = nodestate.read_requests(raw, name)
            new = core.reboot_reset(cr, node, requests, now)
            if new is None:
                continue
            body = nodestate.patch(
                nodestate.REQUESTS, name, new, resource_version=raw["metadata"]["resourceVersion"]
            )
            if not await patch_node(self.ctx.kube, self.nodes, node.name, body):
                self.controller.queue.add(name, after=0.5)
                continue
            _log.info(
                "Reset rebooted Node",
                extra={"nodewright": name, "node": node.name, "boot_id": node.boot_id},
            )
            await self.publisher.publish(
                events.NodeRebooted(
                    id=events.event_id(name, node.name, "rebooted", node.boot_id),
                    at=now,
                    cr=name,
                    generation=cr.metadata.generation,
                    node=node.name,
                    source=self.publisher.source,
                    boot_id_before=node.executor.boot_id,
                    boot_id=node.boot_id,
                )
            )

    async def _set_finalizers(self, cr: api.NodeWright, finalizers: list[str]) -> bool:
        """Write the CR's finalizers; False if the CR changed meanwhile (decide again)."""
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
                return False
            raise
        self.crs.observe(written)
        return True

    async def _finalize(self, cr: api.NodeWright, raw_nodes: list[JSON]) -> bool:
        """The deletion finished: remove the CR's leftovers from the nodes, then the
        finalizer (the API server then deletes the CR). False if anything changed meanwhile;
        every step is idempotent, so the next pass simply continues."""
        name = cr.metadata.name
        for node in raw_nodes:
            body = core.cleanup_patch(node, name)
            if body is not None and not await patch_node(
                self.ctx.kube, self.nodes, str(node["metadata"]["name"]), body
            ):
                return False
        if not await self._set_finalizers(
            cr, [f for f in cr.metadata.finalizers if f != core.FINALIZER]
        ):
            return False
        _log.info("Finalized NodeWright", extra={"nodewright": name})
        return True

    def _decoded_crs(self) -> list[api.NodeWright]:
        out = []
        for raw in self.crs.values():
            try:
                out.append(api.from_dict(raw, api.NodeWright))
            except msgspec.ValidationError:
                continue
        return out

    def _caps(
        self,
        cr: api.NodeWright,
        policy: api.DeploymentPolicy | None,
        crs: list[api.NodeWright],
        raw_nodes: list[JSON],
    ) -> list[core.SharedCap]:
        """The budgets shared with other NodeWrights, with the distinct nodes holding them
        now: the admissions of every NodeWright on the nodes."""
        caps: list[core.SharedCap] = []
        held: dict[str, set[str]] = {}
        for n in raw_nodes:
            for owner in nodestate.crs_with(n, nodestate.SCHEDULER):
                held.setdefault(owner, set()).add(str(n["metadata"]["name"]))
        limit = self.settings.cluster_budget
        if limit is not None:
            holders = frozenset().union(*held.values()) if held else frozenset()
            caps.append(
                core.SharedCap(
                    name="cluster budget",
                    code=progress.CLUSTER_BUDGET_EXHAUSTED,
                    limit=limit,
                    holders=holders,
                )
            )
        if policy is not None and policy.spec.shared_budget is not None:
            peers = [o for o in crs if o.spec.deployment_policy == policy.metadata.name]
            scope = {
                str(n["metadata"]["name"])
                for n in raw_nodes
                for o in peers
                if progress.selector_matches(
                    o.spec.node_selectors, n["metadata"].get("labels") or {}
                )
            }
            holders = frozenset(node for o in peers for node in held.get(o.metadata.name, set()))
            caps.append(
                core.SharedCap(
                    name=f"sharedBudget of DeploymentPolicy {policy.metadata.name}",
                    code=progress.SHARED_BUDGET_EXHAUSTED,
                    limit=progress.budget_nodes(policy.spec.shared_budget, len(scope)),
                    holders=holders,
                )
            )
        return caps

    async def _write_book(self, cr: api.NodeWright, book: progress.BatchBook) -> bool:
        """Persist the batch book on the CR; False if the CR changed meanwhile."""
        body = {
            "metadata": {
                "resourceVersion": cr.metadata.resource_version,
                "annotations": {progress.BATCHES_ANNOTATION: progress.encode_batch_book(book)},
            }
        }
        try:
            written = await self.ctx.kube.patch(f"{NODEWRIGHTS}/{cr.metadata.name}", body)
        except ApiError as exc:
            if exc.conflict or exc.not_found:
                _log.info("Skipped stale batch state write", extra={"nodewright": cr.metadata.name})
                return False
            raise
        self.crs.observe(written)
        return True

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
