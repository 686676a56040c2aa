"""The drainer's record on a node: drain phase and cordon ownership
(``drainer.nodewright.nvidia.com/<cr>``).

Written only by the drainer; every other service reads it through ``shared.progress.NodeFacts``.

Import-linter lets no other service import this module: one writer per record.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from shared.events import Reason
from shared.nodestate import Record

DrainPhase = Literal["cordoned", "waiting", "draining", "drained", "blocked", "failed"]


class DrainRecord(Record, frozen=True, kw_only=True, omit_defaults=True):
    phase: DrainPhase
    cordoned: bool = False
    """This CR holds a cordon on the node (it set, or joined, spec.unschedulable)."""
    preexisting: bool = False
    """The node was cordoned by someone else before NodeWright came: never uncordon it."""
    started: datetime
    """When work on the node began (the drain timeout counts from here)."""
    since: datetime
    """When the current phase began."""
    reason: Reason | None = None
    honoured: int = 0
    """The newest recovery request (:attr:`Request.seq`) the drainer has acted on."""
