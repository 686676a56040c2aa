"""The scheduler's decisions, as data: a thin adapter over ``services.scheduler.planner``.

The shell calls :func:`plan` with one NodeWright, its DeploymentPolicy (if any), every node's
facts, the persisted batch book and what other NodeWrights hold (shared budgets, priority
waits); it gets back the nodes to admit, the admissions to release, the reasons the others
wait, and the new batch book. Pure: no I/O, no clock (``now`` is passed in). Budgets,
compartments, strategies, gates and windows are the planner's and ``shared.progress``'s;
writing the admissions and the book and publishing events is the shell's job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from services.scheduler.planner import Admit, Context, Plan, SharedCap, plan as _plan
from shared import api, progress
from shared.progress import DEFAULT_COMPARTMENT, BatchBook, NodeFacts

__all__ = ["DEFAULT_COMPARTMENT", "Admit", "Plan", "SharedCap", "budget_of", "plan"]


def budget_of(budget: api.Budget | None, matched: int) -> int:
    """Nodes that may hold a slot at once (``shared.progress.budget_nodes``): a percent
    rounds down with a minimum of 1 when any node matched; unset means one node at a time."""
    return progress.budget_nodes(budget, matched)


def plan(
    *,
    cr: api.NodeWright,
    policy: api.DeploymentPolicy | None,
    nodes: Sequence[NodeFacts],
    now: datetime,
    book: BatchBook | None = None,
    caps: Sequence[SharedCap] = (),
    priority_waits: Mapping[str, str] | None = None,
    policy_missing: bool = False,
) -> Plan:
    return _plan(
        cr=cr,
        policy=policy,
        nodes=nodes,
        book=book or progress.read_batch_book(cr.metadata.annotations),
        ctx=Context(
            now=now,
            caps=tuple(caps),
            priority_waits=dict(priority_waits or {}),
            policy_missing=policy_missing,
        ),
    )
