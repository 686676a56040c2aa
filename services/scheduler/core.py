"""The scheduler's decisions, as data: a thin adapter over ``services.scheduler.planner``.

The shell calls :func:`plan` with one NodeWright, its DeploymentPolicy (if any), every node's
facts, the persisted batch book and what other NodeWrights hold (shared budgets, priority
waits); it gets back the nodes to admit, the admissions to release, the reasons the others
wait, and the new batch book; and what the NodeWright's finalizer needs (:func:`finalizer`):
added while the CR lives, removed once a deletion's uninstalls finished and nothing of the
CR holds a node; and which nodes start over because they rebooted (:func:`reboot_reset`,
``spec.reapplyOnReboot``). Pure: no I/O, no clock (``now`` is passed in). Budgets,
compartments, strategies, gates and windows are the planner's and ``shared.progress``'s;
writing the admissions and the book and publishing events is the shell's job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

import msgspec

from services.scheduler.planner import Admit, Context, Plan, SharedCap, plan as _plan
from shared import api, nodestate, progress
from shared.progress import DEFAULT_COMPARTMENT, BatchBook, NodeFacts

__all__ = [
    "DEFAULT_COMPARTMENT",
    "FINALIZER",
    "Admit",
    "Finalizer",
    "Plan",
    "SharedCap",
    "budget_of",
    "cleanup_patch",
    "finalizer",
    "plan",
    "reboot_reset",
]

FINALIZER: Final = f"{api.GROUP}/uninstall"
"""On every NodeWright (added by the scheduler): deleting it first uninstalls its
uninstall-enabled packages and releases every node it holds."""


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


@dataclass(frozen=True)
class Finalizer:
    """What to do about :data:`FINALIZER` on one NodeWright."""

    action: Literal["add", "wait", "remove", "none"]
    pending: tuple[str, ...] = ()
    """While deleting: target nodes whose uninstall or release is not finished, sorted."""


def _deletion_pending(cr: api.NodeWright, node: NodeFacts) -> bool:
    if node.selection is not None or node.drain is not None:
        return True  # admitted or cordoned for this CR: released first
    if node.ignored or not progress.selector_matches(cr.spec.node_selectors, node.labels):
        return False  # NodeWright leaves these nodes alone (documented in docs/packages.md)
    return not progress.packages_done(cr, node)


def finalizer(cr: api.NodeWright, nodes: Sequence[NodeFacts]) -> Finalizer:
    """Add the finalizer to a live NodeWright; while it is being deleted, wait until every
    target node finished its uninstalls (``shared.progress.desired`` turns a deletion into
    uninstall requests for the uninstall-enabled packages) and no node is admitted or
    cordoned for it, then remove it. Failed, paused or disabled uninstalls keep it: the
    status service shows why (condition ``DeletionBlocked``)."""
    present = FINALIZER in cr.metadata.finalizers
    if not progress.deleting(cr):
        return Finalizer("none" if present else "add")
    if not present:
        return Finalizer("none")
    pending = tuple(sorted(n.name for n in nodes if _deletion_pending(cr, n)))
    return Finalizer("wait", pending) if pending else Finalizer("remove")


def cleanup_patch(node: Mapping[str, Any], cr: str) -> dict[str, Any] | None:
    """The merge patch removing what a deleted NodeWright leaves on ``node``: the
    validator's verdicts, recovery requests, and the executor's record unless it still
    tracks installed packages (those without uninstall steps stay tracked, so a NodeWright
    of the same name created later does not install them again). The status service removes
    its own record and node condition once the NodeWright is gone. None: nothing to remove."""
    annotations = nodestate.annotations_of(node)
    drop: dict[str, None] = {}
    for owner in (nodestate.VALIDATOR, nodestate.REQUESTS):
        if nodestate.key(owner, cr) in annotations:
            drop[nodestate.key(owner, cr)] = None
    executor_key = nodestate.key(nodestate.EXECUTOR, cr)
    if executor_key in annotations:
        try:
            record = nodestate.read(node, nodestate.EXECUTOR, cr, nodestate.ExecutorRecord)
        except (msgspec.ValidationError, msgspec.DecodeError):
            record = None  # undecodable: nothing worth keeping
        if record is None or not any(p.installed for p in record.packages.values()):
            drop[executor_key] = None
    if not drop:
        return None
    meta: dict[str, Any] = {"annotations": drop}
    version = (node.get("metadata") or {}).get("resourceVersion")
    if version:
        meta["resourceVersion"] = version
    return {"metadata": meta}


REBOOT_REQUESTER: Final = nodestate.REBOOT_REQUESTER
"""``Request.by`` of the reset a reboot causes, followed by the new boot ID: one per boot."""


def reboot_reset(
    cr: api.NodeWright, node: NodeFacts, requests: nodestate.Requests, now: datetime
) -> nodestate.Requests | None:
    """With ``spec.reapplyOnReboot``: the node's requests with a reset appended when it
    rebooted since its packages completed (its boot ID differs from the one the executor
    recorded then; NodeWright's own reboots end before that record is written) and it is
    done for this CR, so it starts over like after ``nodewright node reset``. One reset per
    boot: a request already made for this boot ID is not repeated. None: nothing to do."""
    if not cr.spec.reapply_on_reboot or progress.deleting(cr) or node.ignored:
        return None
    before = node.executor.boot_id
    if not before or not node.boot_id or node.boot_id == before:
        return None
    if not progress.selector_matches(cr.spec.node_selectors, node.labels):
        return None
    if progress.turn(cr, node) != "done":
        return None
    by = nodestate.reboot_requester(node.boot_id)
    if any(r.by == by for r in requests.requests):
        return None
    return nodestate.add_request(requests, nodestate.Request(seq=0, action="reset", at=now, by=by))
