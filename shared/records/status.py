"""The status service's record on a node: the summary people read
(``status.nodewright.nvidia.com/<cr>``).

Written only by the status service.

Import-linter lets no other service import this module: one writer per record.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from shared.events import Reason
from shared.nodestate import Record

NodePhase = Literal[
    "Pending", "Waiting", "Draining", "Running", "Validating", "Complete", "Failed", "Blocked"
]


class StatusRecord(Record, frozen=True, kw_only=True, omit_defaults=True):
    phase: NodePhase
    reason: Reason | None = None
    since: datetime
