"""The scheduler's record on a node: its admission into a batch
(``scheduler.nodewright.nvidia.com/<cr>``).

Written only by the scheduler; every other service reads it through ``shared.progress.NodeFacts``.

Import-linter lets no other service import this module: one writer per record.
"""

from __future__ import annotations

from datetime import datetime

from shared.nodestate import Record


class Selection(Record, frozen=True, kw_only=True, omit_defaults=True):
    """The scheduler admitted this node for this CR; it counts against budgets until released."""

    generation: int
    compartment: str
    batch: int
    selected_at: datetime
    disruptive: bool
    target: str
    """Digest of the desired package set the node was admitted for."""
    order: int | None = None
    """The node's zero-based position in the rollout (admission order, monotonic across
    batches; the packages see it as ``NODEWRIGHT_NODE_ORDER``). None: unknown (a record
    written before the field existed); 0 is the rollout's first node, so unknown is not 0."""
