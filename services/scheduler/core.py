"""The scheduler's decisions, as data: which nodes of a NodeWright start work now.

Given one NodeWright, its DeploymentPolicy (if any), every node's facts and ``now``, it
returns the nodes to admit (within the budget), the finished nodes whose admission to
release, and, for every target node that must wait, a machine-readable reason. The budget is
a hard cap on nodes admitted and not yet finished (failed nodes keep their slot until retried
or reset), and nodes unavailable for other reasons — NotReady, or cordoned by someone else —
count against it too. Pure: no I/O, no clock (``now`` is passed in). Writing the admissions
and publishing events is the shell's job; batch growth and compartments are planned by
``services.scheduler.planner`` when a policy asks for them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from shared import api, progress
from shared.events import Reason
from shared.nodestate import Selection
from shared.progress import NodeFacts

DEFAULT_COMPARTMENT = "default"


@dataclass(frozen=True)
class Admit:
    node: str
    selection: Selection


@dataclass(frozen=True)
class Plan:
    admit: tuple[Admit, ...] = ()
    release: tuple[str, ...] = ()
    """Nodes that finished: their admission is removed and the budget slot freed."""
    waiting: Mapping[str, Reason] = field(default_factory=dict)
    targets: tuple[str, ...] = ()
    budget: int = 0
    in_flight: int = 0


def budget_of(budget: api.Budget | None, matched: int) -> int:
    """Nodes that may be in progress at once. Percent rounds down with a minimum of 1 (when
    any node matched); unset means one node at a time."""
    if budget is None:
        return 1 if matched else 0
    if budget.count is not None:
        return budget.count
    if budget.percent is not None:
        return max(1, math.floor(matched * budget.percent / 100)) if matched else 0
    return 1 if matched else 0


def _order(node: NodeFacts) -> tuple[str, str]:
    return (node.created, node.name)


def targets(cr: api.NodeWright, nodes: Sequence[NodeFacts]) -> list[NodeFacts]:
    return sorted(
        (n for n in nodes if progress.selector_matches(cr.spec.node_selectors, n.labels)),
        key=_order,
    )


def _releasable(cr: api.NodeWright, node: NodeFacts, targets: tuple[str, ...]) -> bool:
    """Admitted, and either finished (the drainer has released its cordon) or no longer a
    target (labels changed): the admission goes and frees the budget slot."""
    if node.selection is None:
        return False
    if node.name not in targets:
        return True
    return progress.turn(cr, node) in ("release", "done") and node.drain is None


def plan(
    *,
    cr: api.NodeWright,
    policy: api.DeploymentPolicy | None,
    nodes: Sequence[NodeFacts],
    now: datetime,
) -> Plan:
    target_nodes = targets(cr, nodes)
    names = tuple(n.name for n in target_nodes)
    release = tuple(n.name for n in nodes if _releasable(cr, n, names))
    if policy is not None:
        limit = budget_of(policy.spec.default.budget, len(target_nodes))
    else:
        limit = budget_of(cr.spec.interruption_budget, len(target_nodes))
    released = set(release)
    busy = [
        n
        for n in target_nodes
        if n.name not in released
        and (
            n.selection is not None
            or not n.ready
            or (n.unschedulable and (n.drain is None or not n.drain.cordoned))
        )
    ]
    in_flight = len(busy)
    waiting: dict[str, Reason] = {}
    admit: list[Admit] = []
    if cr.disabled:
        return Plan(release=release, targets=names, budget=limit, in_flight=in_flight)
    target = progress.target_digest(cr)
    for node in target_nodes:
        if node.selection is not None or progress.turn(cr, node) in ("done", "release"):
            continue
        if node.malformed:
            waiting[node.name] = Reason(
                code="NodeStateMalformed",
                message="annotations do not decode: " + ", ".join(node.malformed),
            )
            continue
        if node.ignored:
            waiting[node.name] = Reason(code="NodeIgnored", message="node is labelled ignore=true")
            continue
        taints = progress.untolerated_taints(cr, node)
        if taints:
            waiting[node.name] = Reason(
                code="TaintNotTolerated",
                message="taints not tolerated by additionalTolerations: " + ", ".join(taints),
            )
            continue
        if cr.paused:
            waiting[node.name] = Reason(code="Paused", message="the NodeWright is paused")
            continue
        if not node.ready:
            waiting[node.name] = Reason(code="NodeNotReady", message="node is not Ready")
            continue
        if in_flight + len(admit) >= limit:
            waiting[node.name] = Reason(
                code="BudgetExhausted",
                message=f"{in_flight + len(admit)} of {limit} budgeted nodes are in progress",
                details={"budget": str(limit), "inProgress": str(in_flight + len(admit))},
            )
            continue
        admit.append(
            Admit(
                node=node.name,
                selection=Selection(
                    generation=cr.metadata.generation,
                    compartment=DEFAULT_COMPARTMENT,
                    batch=1,
                    selected_at=now,
                    disruptive=progress.disruptive(cr, node),
                    target=target,
                ),
            )
        )
    return Plan(
        admit=tuple(admit),
        release=release,
        waiting=waiting,
        targets=names,
        budget=limit,
        in_flight=in_flight,
    )
