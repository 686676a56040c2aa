"""What every phase of the rollout kernel reads: the NodeWright's fleet derived once per
decision (:class:`View`: targets in node order, compartment assignment, who holds a slot, who
is eligible, whether a window is open, the fence that still holds), and the releases.

Pure. The phases are :mod:`shared.rollout.phases`'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shared import api, nodestate, progress, reasons, recovery
from shared.events import Reason
from shared.progress import NodeFacts
from shared.rollout import approvals as approvals_, rules, slots
from shared.rollout.book import (
    BatchBook,
)
from shared.rollout.plans import Context, Release
from shared.rollout.rules import CompartmentRule


def _order(node: NodeFacts) -> tuple[str, str]:
    return (node.created, node.name)


def targets(cr: api.NodeWright, nodes: Sequence[NodeFacts]) -> list[NodeFacts]:
    """The NodeWright's target nodes in node order (creation time, then name)."""
    return sorted(
        (n for n in nodes if progress.selector_matches(cr.spec.node_selectors, n.labels)),
        key=_order,
    )


def ineligible(cr: api.NodeWright, node: NodeFacts, *, policy_missing: bool) -> Reason | None:
    """Why the node cannot be admitted whatever the batch, in this order: records that do not
    decode, the ignore label, untolerated taints, a missing DeploymentPolicy (those block),
    then disabled, paused and NotReady (those wait). None: eligible."""
    if node.malformed:
        text = (
            "annotations do not decode: "
            + ", ".join(node.malformed)
            + "; run `nodewright node reset` on the node"
        )
        return Reason(code=reasons.NODE_STATE_MALFORMED, message=text)
    if node.ignored:
        text = f"node is labelled {nodestate.IGNORE_LABEL}=true"
        return Reason(code=reasons.NODE_IGNORED, message=text)
    taints = progress.untolerated_taints(cr, node)
    if taints:
        text = "taints not tolerated by additionalTolerations: " + ", ".join(taints)
        return Reason(code=reasons.TAINT_NOT_TOLERATED, message=text)
    if policy_missing:
        text = f"DeploymentPolicy {cr.spec.deployment_policy} does not exist"
        return Reason(code=reasons.POLICY_NOT_FOUND, message=text)
    if cr.disabled:
        return Reason(code=reasons.DISABLED, message="the NodeWright is disabled")
    if cr.paused:
        return Reason(code=reasons.PAUSED, message="the NodeWright is paused")
    if not node.ready:
        return Reason(code=reasons.NODE_NOT_READY, message="node is not Ready")
    return None


@dataclass(frozen=True)
class View:
    """The NodeWright's fleet as every phase reads it (derived once per decision)."""

    cr: api.NodeWright
    ctx: Context
    targets: tuple[NodeFacts, ...]
    by_name: Mapping[str, NodeFacts]
    rules: tuple[CompartmentRule, ...]
    assigned: Mapping[str, str]
    """Target node -> the compartment its labels assign it to."""
    counted: Mapping[str, str]
    """Target node -> the compartment it counts in (where it was admitted, while it is)."""
    holds: Mapping[str, str]
    """Target node holding a slot -> why (:func:`shared.rollout.slots.hold`)."""
    ineligible: Mapping[str, Reason | None]
    window_open: bool
    fence: Mapping[str, str]
    """The book's fence entries that still hold (their node has not changed)."""
    approvals: approvals_.Approvals
    """What the NodeWright's approvals annotation lets go on (``approvalAfterBatches``)."""

    def members(self, compartment: str) -> list[NodeFacts]:
        return [n for n in self.targets if self.assigned[n.name] == compartment]

    def holders(self, compartment: str) -> tuple[tuple[str, str], ...]:
        return tuple(
            sorted((n, why) for n, why in self.holds.items() if self.counted[n] == compartment)
        )

    def gate(self, node: NodeFacts) -> Reason | None:
        """Why a node that is otherwise due may not start now (the shared gates)."""
        reason = self.ineligible[node.name]
        if reason is not None:
            return reason
        blocker = self.ctx.priority_waits.get(node.name)
        if blocker:
            return Reason(
                code=reasons.WAITING_FOR_PRIORITY,
                message=f"waiting for NodeWright {blocker} (priority and sequencing)",
                details={"nodewright": blocker},
            )
        if not self.window_open:
            return Reason(
                code=reasons.WAITING_FOR_WINDOW, message="outside every maintenance window"
            )
        return None

    def due(self, node: NodeFacts) -> bool:
        """Not admitted, and the scheduler's turn (``progress.turn``)."""
        return node.selection is None and progress.turn(self.cr, node) == "scheduler"


def view(
    *,
    cr: api.NodeWright,
    policy: api.DeploymentPolicy | None,
    nodes: Sequence[NodeFacts],
    book: BatchBook,
    ctx: Context,
) -> View:
    target_nodes = tuple(targets(cr, nodes))
    rule_list = tuple(rules.compartment_rules(cr, policy))
    known = {r.name for r in rule_list}
    assigned = rules.assign_compartments(rule_list, target_nodes)
    fence = {
        n.name: n.resource_version
        for n in target_nodes
        if n.selection is None and slots.being_admitted(n, book.admitting)
    }
    holds: dict[str, str] = {}
    for n in target_nodes:
        why = slots.hold(cr, n, fence)
        if why is not None:
            holds[n.name] = why
    open_window = ctx.ignore_windows or policy is None
    if not open_window and policy is not None:
        open_window = rules.in_window(policy.spec.maintenance_windows, ctx.now)
    return View(
        cr=cr,
        ctx=ctx,
        targets=target_nodes,
        by_name={n.name: n for n in target_nodes},
        rules=rule_list,
        assigned=assigned,
        counted={n.name: rules.compartment_of(n, assigned, known) for n in target_nodes},
        holds=holds,
        ineligible={
            n.name: ineligible(cr, n, policy_missing=ctx.policy_missing) for n in target_nodes
        },
        window_open=open_window,
        fence=fence,
        approvals=approvals_.read(cr.metadata.annotations),
    )


def releases(cr: api.NodeWright, nodes: Sequence[NodeFacts]) -> tuple[Release, ...]:
    """Admissions that go: the node finished (the drainer has released its cordon) or is no
    longer a target (labels changed); and an admission record that does not decode once a
    ``nodewright node reset`` asks to forget it (it is removed like a release)."""
    out: list[Release] = []
    for n in sorted(nodes, key=lambda n: n.name):
        target = progress.selector_matches(cr.spec.node_selectors, n.labels)
        if n.selection is not None:
            if not target or (progress.release_due(cr, n) and n.drain is None):
                out.append(Release(n.name, done=target and progress.node_done(cr, n)))
        elif recovery.reset_malformed(n, nodestate.SCHEDULER, cr.metadata.name):
            out.append(Release(n.name, done=False))
    return tuple(out)
