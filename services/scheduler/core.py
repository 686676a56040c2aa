"""The scheduler's own decisions, as data, besides the rollout: the NodeWright's finalizer.

Which nodes start now and which admissions go is the rollout kernel's (``shared.rollout``),
which the status service and ``nodewright plan`` call too. What is left here is what only
the scheduler decides: :func:`finalizer` says whether the NodeWright's finalizer is added
(while the CR lives), kept (while a deletion's uninstalls run or a node is still admitted or
cordoned for it) or removed. Pure: no I/O. Writing is the shell's job; every other service
removes its own records of a NodeWright that is gone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from shared import api, progress
from shared.progress import NodeFacts

FINALIZER: Final = f"{api.GROUP}/uninstall"
"""On every NodeWright (added by the scheduler): deleting it first uninstalls its
uninstall-enabled packages and releases every node it holds."""


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
