"""The recovery protocol every owner of a per-node record follows (docs/recovery.md).

People ask for recovery with requests (``nodewright node retry|reset``, ``package rerun``:
``shared.nodestate.Requests``, the CLI's annotation); each service honours them in its own
record and nowhere else. What is common to every owner lives here, so the drainer,
executor, validator and scheduler cannot honour them differently:

- :func:`honour`: apply the requests newer than a record's ``honoured`` mark in order, with
  the owner's own step per request, and move the mark to the newest request;
- :func:`reset_malformed`: a record that does not decode is dropped by its owner once a
  reset newer than its (still readable) mark asks for it: the next pass starts a fresh record
  that has honoured every request, so the reset is not repeated;
- :func:`rebooted`: the typed cause of a reboot reset (``spec.reapplyOnReboot``), the one
  rule the executor acts on and the validator follows.

What one action means for one record is the owner's core's business (its ``honour`` step).
Pure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import msgspec

from shared import api, nodestate, progress
from shared.nodestate import Request, Requests
from shared.progress import NodeFacts

R = TypeVar("R", bound=msgspec.Struct)


def honour(record: R, requests: Requests, step: Callable[[R, Request], R]) -> R:
    """``record`` after ``step`` applied each request newer than its mark, oldest first,
    with the mark moved to the newest request (also when no step changed anything)."""
    mark: int = getattr(record, "honoured")  # noqa: B009 - every owner's record has one
    for req in requests.after(mark):
        record = step(record, req)
    return msgspec.structs.replace(record, honoured=requests.latest)


def reset_malformed(node: NodeFacts, owner: str, cr: str) -> bool:
    """``owner``'s record for ``cr`` on the node does not decode and a reset newer than the
    mark still readable from it (0 if none) asks to forget it: the owner removes it."""
    key = nodestate.key(owner, cr)
    if key not in node.malformed:
        return False
    mark = node.marks.get(key, 0)
    return any(r.action == "reset" and r.seq > mark for r in node.requests.requests)


def rebooted(cr: api.NodeWright, node: NodeFacts) -> str:
    """The boot ID the node rebooted into since its packages completed, when
    ``spec.reapplyOnReboot`` asks to start it over there; "" otherwise.

    The executor recorded the boot the packages were complete in
    (``ExecutorRecord.boot_id``; NodeWright's own reboots end before that); a different boot
    ID on a node that is done for the NodeWright means the host rebooted outside NodeWright
    (on an ephemeral OS image it lost what the packages did). One reset per boot: the
    executor's reset forgets that boot ID, so the rule holds again only once the packages
    completed anew."""
    if not cr.spec.reapply_on_reboot or progress.deleting(cr) or node.ignored:
        return ""
    before = node.executor.boot_id
    if not before or not node.boot_id or node.boot_id == before:
        return ""
    if not progress.selector_matches(cr.spec.node_selectors, node.labels):
        return ""
    if progress.turn(cr, node) != "done":
        return ""
    return node.boot_id
