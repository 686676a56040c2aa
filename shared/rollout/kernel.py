"""One NodeWright's rollout decision, in five named phases: which nodes start now, which
admissions go, and why every other target node and every compartment waits.

Per compartment (:func:`shared.rollout.rules.compartment_rules`: the policy's compartments
plus ``__default__``; overlapping selectors resolved by ``rules.assign_compartments``):

1. **reset** (``phases.reset``): the batch book starts over on a new value of the reset
   annotation, a change of package versions (``resetBatchStateOnVersionChange``) or the
   completion of every target node (``resetBatchStateOnCompletion``); the node order then
   starts at 0 again, past any order a node still holding an admission with work left has.
2. **account** (``phases.account``): who holds a budget slot (:func:`shared.rollout.slots.hold`:
   admitted, being admitted, NotReady, cordoned by someone else and not done), and the batch
   in flight judged: done nodes are successes, failed nodes failures, nodes that became
   Blocked count as failures with ``blockedNodesCountAsFailed`` (else are left out), nodes
   gone from the compartment are left out; with none of its nodes in progress the batch
   **finishes**: it passes when ``successes * 100 >= batchSuccessPercent * judged``, only a
   passing batch grows the next one, a failing one keeps or shrinks it, and
   ``stopAfterConsecutiveFailedBatches`` failing ones in a row stop the compartment.
3. **open** (``phases.open_batch``): between batches, the next batch has ``min(nominal size,
   free slots, eligible nodes)`` nodes in node order (creation time, then name); a node that
   already holds a slot (cordoned by someone else) costs none. It reserves its nodes' orders.
   A batch in flight whose member waits for a slot takes in the due nodes cordoned by
   someone else that hold it (they cost none; otherwise each would wait for the other).
4. **admit** (``phases.admit``): members of the batch in flight are admitted while the budget
   and the shared budgets of the :class:`Context` (cluster-wide, a policy's sharedBudget,
   counted in distinct nodes) allow and no gate holds (records that do not decode, the
   ignore label, untolerated taints, a missing policy, disabled, paused, NotReady,
   priority and sequencing, maintenance windows). Each admission carries the node's
   resourceVersion; the shell writes it as the precondition and, before it, into the book's
   fence.
5. **explain** (``phases.explain``; left out for callers that read no reason): the reason
   of every target node not admitted and the wait of every compartment (the first of
   :data:`shared.reasons.COMPARTMENT_WAITS` among its waiting nodes, its batch's members
   while one is in flight), each naming the nodes that hold the slots and why.

**Counting only what is written**: a release planned here frees nothing in the same
decision; the shell writes the releases and decides again on what it wrote (a lost release
keeps its slot). An admission counts from its fence entry until it landed or never can, and
a caller whose node cache is behind the fence's watermark admits nothing (:attr:`Plan.behind`).

Pure: no I/O, no clock (``now`` comes in the :class:`Context`). Reading caches, writing the
admissions and the book and publishing events is the scheduler's shell's job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

import msgspec

from shared import api
from shared.progress import NodeFacts
from shared.rollout import rules
from shared.rollout.book import (
    BatchBook,
    CompartmentBatch,
    behind,
    latest,
)
from shared.rollout.phases import (
    account,
    admit,
    compartment_wait,
    explain,
    open_batch,
    reset,
)
from shared.rollout.plans import (
    Admit,
    CompartmentPlan,
    CompartmentWait,
    Context,
    NodeVerdict,
    Plan,
    Release,
    SharedCap,
)
from shared.rollout.view import View, ineligible, releases, targets, view

__all__ = [
    "Admit",
    "CompartmentPlan",
    "CompartmentWait",
    "Context",
    "NodeVerdict",
    "Plan",
    "Release",
    "SharedCap",
    "View",
    "compartment_wait",
    "ineligible",
    "plan",
    "releases",
    "targets",
    "view",
]


# ---- the decision ---------------------------------------------------------------------------


def plan(
    *,
    cr: api.NodeWright,
    policy: api.DeploymentPolicy | None,
    nodes: Sequence[NodeFacts],
    book: BatchBook,
    ctx: Context,
    explain_waits: bool = True,
) -> Plan:
    """The decision for ``cr`` over ``nodes`` (every node's facts for ``cr``), from its
    persisted ``book``.

    ``explain_waits=False`` leaves out phase 5: the plan's ``nodes`` is empty and no
    compartment has a ``waiting``; everything else is the same. For the scheduler, which
    writes the admissions, the releases and the book and reads no reason: explaining every
    waiting node was a third of a decision over 10,000 nodes (issue 15)."""
    v = view(cr=cr, policy=policy, nodes=nodes, book=book, ctx=ctx)
    start = reset(v, policy, book)
    notes = list(start.notes)
    counter = start.admitted
    compartments = dict(start.compartments)
    cap_taken: Mapping[str, frozenset[str]] = {}
    admits: list[Admit] = []
    verdicts: dict[str, NodeVerdict] = {}
    out: list[CompartmentPlan] = []
    wakes: list[datetime] = []
    for rule in v.rules:
        acc = account(v, rule, compartments.get(rule.name, CompartmentBatch()))
        opened = open_batch(v, acc, counter)
        chosen = admit(v, acc, opened, cap_taken)
        counter, cap_taken = chosen.admitted, chosen.cap_taken
        mine, wait = explain(v, acc, opened, chosen) if explain_waits else ({}, None)
        notes.extend(n for n in (acc.note, opened.note) if n)
        admits.extend(chosen.admit)
        verdicts.update(mine)
        compartments[rule.name] = opened.entry
        if opened.wake is not None:
            wakes.append(opened.wake)
        out.append(
            CompartmentPlan(
                name=rule.name,
                strategy=rules.strategy_kind(rule.rollout),
                matched=acc.matched,
                budget=acc.budget,
                busy=acc.busy,
                batch=opened.entry,
                holders=acc.holders,
                waiting=wait,
                unopened=opened.wait,
            )
        )
    known = {r.name for r in v.rules}
    fence = {**v.fence, **{a.node: a.resource_version for a in admits}}
    new_book = BatchBook(
        compartments={
            k: _as_persisted(c, start.compartments.get(k))
            for k, c in compartments.items()
            if k in known
        },
        versions=start.versions,
        reset_token=start.token,
        admitted=counter,
        admitting=fence,
        nodes_seen=latest(book.nodes_seen, ctx.nodes_seen),
        cluster_budget=ctx.cluster_budget,
    )
    new_book = _unless_only_seen(new_book, book)
    names = tuple(n.name for n in v.targets)
    if behind(ctx.nodes_seen, book.nodes_seen):
        # The node cache has not seen what the book's writer saw: counting on it could
        # miss an admission that landed. Releases are safe (each is preconditioned).
        return Plan(
            release=releases(cr, nodes),
            nodes=verdicts,
            counted=dict(v.counted),
            targets=names,
            book=book,
            compartments=tuple(out),
            behind=True,
        )
    if cr.disabled:
        # Disabled: nothing is started, and the batch state is left as it was (the fence
        # still follows the nodes: it only ever shrinks here).
        kept = _unless_only_seen(
            msgspec.structs.replace(
                book,
                admitting=dict(v.fence),
                nodes_seen=latest(book.nodes_seen, ctx.nodes_seen),
                cluster_budget=ctx.cluster_budget,
            ),
            book,
        )
        return Plan(
            release=releases(cr, nodes),
            nodes=verdicts,
            counted=dict(v.counted),
            targets=names,
            book=kept,
            compartments=tuple(out),
        )
    return Plan(
        admit=tuple(admits),
        release=releases(cr, nodes),
        nodes=verdicts,
        counted=dict(v.counted),
        targets=names,
        book=new_book,
        compartments=tuple(out),
        events=tuple(notes),
        wake_at=min(wakes, default=None),
    )


def _as_persisted(entry: CompartmentBatch, before: CompartmentBatch | None) -> CompartmentBatch:
    """``entry`` as the book keeps it: the counts of a batch still in flight
    (``batchSucceededNodes``, ``batchFailedNodes``) as the book had them. They follow from
    the batch's nodes on every pass (``phases.account``; the plan's compartments carry
    them for the status), and writing them on every change was a NodeWright write per node
    of every batch, which every service watching NodeWrights is sent (issue 15). The batch's
    close writes its outcome into the totals."""
    if before is None or not entry.nodes or entry.nodes != before.nodes:
        return entry
    kept = msgspec.structs.replace(
        entry.state,
        batch_succeeded_nodes=before.state.batch_succeeded_nodes,
        batch_failed_nodes=before.state.batch_failed_nodes,
    )
    return msgspec.structs.replace(entry, state=kept)


def _unless_only_seen(new: BatchBook, book: BatchBook) -> BatchBook:
    """``book`` when ``new`` differs from it only in the watermark. The watermark guards the
    fence entries a write drops (:attr:`BatchBook.nodes_seen`); a book that drops none need
    not move it, and moving it alone made a book write of every pass, which every node change
    starts (issue 15)."""
    if msgspec.structs.replace(new, nodes_seen=book.nodes_seen) == book:
        return book
    return new
