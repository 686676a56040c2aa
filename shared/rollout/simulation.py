"""The batches a rollout will run from the current state, for ``nodewright plan``.

The simulation drives :func:`shared.rollout.kernel.plan` the way the services drive the real
rollout, assuming every batch succeeds, maintenance windows are open, priority gates clear,
approvals between batches are given and shared budgets allow (those only delay admissions;
they never change which nodes form a batch): each step the scheduler writes its releases
and decides again on them, admits, and every admitted node then finishes the way the
drainer, executor and validator finish it (records complete, its cordon lifted unless
someone else holds it), so the next step releases it. A node that failed stays failed (it
keeps its slot until it is retried or reset), and a node that cannot be admitted (NotReady,
ignored ...) is never admitted: the simulation says what would run, not what should.

Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

import msgspec

from shared import api, progress, reasons
from shared.progress import NodeFacts
from shared.records.executor import ExecutorRecord, PackageRecord
from shared.records.validator import ValidatorRecord
from shared.rollout import approvals, kernel
from shared.rollout.book import BatchBook


@dataclass(frozen=True)
class PlannedBatch:
    compartment: str
    batch: int
    nodes: tuple[str, ...]
    in_flight: bool = False
    """Already started before the simulation (the batch in flight now)."""
    orders: tuple[int | None, ...] = ()
    """Per node of ``nodes``, its node order (``Selection.order``): the one it holds, or the
    one it will get; None: unknown (an admission without one, or not admitted)."""
    after_approval: bool = False
    """It opens only once a person approved the batch before it (``approvalAfterBatches``):
    the simulation gave that approval."""


def written(node: NodeFacts, **changes: object) -> NodeFacts:
    """``node`` after a write: every write gives the node a new resourceVersion (which is
    what tells the kernel's fence that an admission landed)."""
    version = int(node.resource_version) + 1 if node.resource_version.isdigit() else 1
    return replace(node, resource_version=str(version), **changes)  # type: ignore[arg-type]


def as_done(cr: api.NodeWright, node: NodeFacts) -> NodeFacts:
    """The node once the current target is complete on it and the drainer let go of it:
    still admitted (the scheduler's next decision releases it), no drain record, and no
    longer cordoned unless the cordon was someone else's."""
    packages = {
        name: PackageRecord(
            version=d.version,
            stage="done",
            state="succeeded",
            installed="" if d.uninstall_requested else d.version,
            config=d.config_digest,
            updated=datetime.min,
        )
        for name, d in progress.desired(cr).items()
    }
    ours = node.drain is not None and node.drain.cordoned and not node.drain.preexisting
    return written(
        node,
        unschedulable=node.unschedulable and not ours,
        drain=None,
        executor=ExecutorRecord(packages=packages),
        validator=ValidatorRecord(validated=progress.target_digest(cr)),
    )


def approve_waits(cr: api.NodeWright, p: kernel.Plan) -> api.NodeWright:
    """``cr`` with an approval of every batch a compartment of ``p`` waits to have approved
    (``cr`` itself when none waits)."""
    return _approving(cr, p)[0]


def _approving(cr: api.NodeWright, p: kernel.Plan) -> tuple[api.NodeWright, set[tuple[str, int]]]:
    """:func:`approve_waits`, and the (compartment, batch) that each approval lets open."""
    opens: set[tuple[str, int]] = set()
    found = approvals.read(cr.metadata.annotations)
    given = dict(found.by_compartment)
    for comp in p.compartments:
        wait = comp.unopened
        if wait is None or wait.code != reasons.BATCH_AWAITING_APPROVAL:
            continue
        batch = int(wait.details["batch"])
        given[comp.name] = approvals.Approval(batch=batch, finished=comp.batch.finished)
        opens.add((comp.name, batch + 1))
    if given == found.by_compartment:
        return cr, set()
    notes = {**cr.metadata.annotations, approvals.APPROVALS_ANNOTATION: approvals.encode(given)}
    meta = msgspec.structs.replace(cr.metadata, annotations=notes)
    return msgspec.structs.replace(cr, metadata=meta), opens


def simulate(
    *,
    cr: api.NodeWright,
    policy: api.DeploymentPolicy | None,
    nodes: Sequence[NodeFacts],
    book: BatchBook,
    ctx: kernel.Context,
    max_steps: int = 10_000,
) -> tuple[list[PlannedBatch], kernel.Plan]:
    """The batches in order (the one in flight first) and the first decision (what the
    scheduler decides now, before anything of the simulation)."""
    ctx = replace(ctx, ignore_windows=True, priority_waits={}, caps=())
    state = {n.name: n for n in nodes}
    first = kernel.plan(cr=cr, policy=policy, nodes=nodes, book=book, ctx=ctx)
    batches = [
        PlannedBatch(name, c.state.current_batch, c.nodes, in_flight=True)
        for name, c in book.compartments.items()
        if c.nodes
    ]
    seen = {(b.compartment, b.batch) for b in batches}
    approved: set[tuple[str, int]] = set()
    orders: dict[str, int | None] = {
        n.name: n.selection.order for n in nodes if n.selection is not None
    }
    for entry in book.compartments.values():
        if len(entry.orders) == len(entry.nodes):
            for name, order in zip(entry.nodes, entry.orders, strict=True):
                orders.setdefault(name, order)
    for _ in range(max_steps):
        p = kernel.plan(cr=cr, policy=policy, nodes=list(state.values()), book=book, ctx=ctx)
        changed = False
        if p.release:
            # What the scheduler does: write the releases, then decide on what it wrote.
            for r in p.release:
                state[r.node] = written(state[r.node], selection=None)
            changed = True
            p = kernel.plan(cr=cr, policy=policy, nodes=list(state.values()), book=book, ctx=ctx)
        for comp in p.compartments:
            key = (comp.name, comp.batch.state.current_batch)
            if comp.batch.nodes and key not in seen:
                seen.add(key)
                batches.append(
                    PlannedBatch(
                        comp.name, key[1], comp.batch.nodes, after_approval=key in approved
                    )
                )
        for a in p.admit:
            orders[a.node] = a.selection.order
            state[a.node] = written(state[a.node], selection=a.selection)
            changed = True
        for name, n in list(state.items()):
            if (
                n.selection is not None
                and not progress.failed(cr, n)
                and not (progress.node_done(cr, n) and n.drain is None)
            ):
                state[name] = as_done(cr, n)
                changed = True
        changed = changed or p.book != book
        book = p.book
        if not changed and p.wake_at is not None and p.wake_at > ctx.now:
            # A compartment soaks between batches: the simulation moves on to its end.
            ctx = replace(ctx, now=p.wake_at)
            changed = True
        if not changed:
            # A compartment waits for a person's approval: the simulation gives it.
            given, opens = _approving(cr, p)
            changed = given is not cr
            cr = given
            approved |= opens
        if not changed:
            break
    batches = [replace(b, orders=tuple(orders.get(n) for n in b.nodes)) for b in batches]
    return batches, first
