"""The status service's word on a node: the node condition ``nodewright.nvidia.com/<cr>``, read
back (:func:`reported`), and the phases it tells a node's progress by.

The status service keeps no record of its own on a node: its per-node output is that
condition, written when the node's state or reason changes (a record rewritten per step cost
about ten Node writes per node, issue 15); the record ``status.nodewright.nvidia.com/<cr>``
an earlier version wrote is removed. The condition is the status service's memory of what it
reported (its Events compare with it) and what the CLI shows.

Written only by the status service; import-linter lets no other service import this module.
Deciding what the condition says is ``services.status.core``'s job.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

from shared.api import NodeState
from shared.events import Reason
from shared.nodestate import DOMAIN

NodePhase = Literal[
    "Pending", "Waiting", "Draining", "Running", "Validating", "Complete", "Failed", "Blocked"
]

REPORTED_STATES: Final[frozenset[str]] = frozenset(
    {"Waiting", "InProgress", "Complete", "Failed", "Blocked"}
)
"""The states the condition's reason takes."""
REASONED: Final[frozenset[str]] = frozenset({"Waiting", "Blocked", "Failed"})
"""The states whose condition message is the node's reason, ``code: message``."""


def condition_type(cr: str) -> str:
    """The node condition type carrying a CR's summary on each node."""
    return f"{DOMAIN}/{cr}"


def find_condition(node: Mapping[str, Any], cr: str) -> Mapping[str, Any] | None:
    """The node's condition of ``cr``, as the API returned it."""
    ctype = condition_type(cr)
    for cond in (node.get("status") or {}).get("conditions") or ():
        if isinstance(cond, Mapping) and cond.get("type") == ctype:
            return cond
    return None


def reported_crs(node: Mapping[str, Any]) -> Iterator[str]:
    """The NodeWrights whose condition the node carries."""
    prefix = condition_type("")
    for cond in (node.get("status") or {}).get("conditions") or ():
        ctype = str(cond.get("type") or "") if isinstance(cond, Mapping) else ""
        if ctype.startswith(prefix) and len(ctype) > len(prefix):
            yield ctype[len(prefix) :]


@dataclass(frozen=True)
class Reported:
    """What the node condition said: the state, the reason of a Waiting, Blocked or Failed
    node (None otherwise) and since when."""

    state: NodeState
    reason: Reason | None
    since: datetime
    """The condition's lastHeartbeatTime: it is written only when state or reason change."""


def reported(condition: Mapping[str, Any] | None) -> Reported | None:
    """The condition read back; None when absent or not in the form the service writes."""
    if condition is None:
        return None
    state = condition.get("reason")
    if state not in REPORTED_STATES:
        return None
    try:
        since = datetime.fromisoformat(str(condition.get("lastHeartbeatTime")))
    except ValueError:
        return None
    if since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    reason = None
    if state in REASONED:
        code, _, message = str(condition.get("message") or "").partition(": ")
        reason = Reason(code=code, message=message)
    return Reported(state=state, reason=reason, since=since.astimezone(UTC).replace(microsecond=0))
