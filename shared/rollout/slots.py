"""Which nodes hold a budget slot, and why: the one definition the kernel counts by and
every waiting message names.

A node of a compartment holds one of its slots (:func:`hold`):

- while it is **admitted** (until the admission is released; a failed node keeps it, and
  its cordon, until it is retried or reset), or while its admission record does not decode
  (it may be mid-work: the safe reading);
- while a pass of the scheduler is **admitting** it (:attr:`BatchBook.admitting
  <shared.rollout.book.BatchBook.admitting>`: the admission is written after the book and may
  still land);
- while it is **NotReady** (unless it is labelled ``nodewright.nvidia.com/ignore=true`` and
  not admitted: NodeWright leaves such a node alone, and the label is the way out of a wait
  for a node that will not come back);
- while it is **cordoned by someone else** (a person, another tool, another NodeWright), unless
  this NodeWright is done with it. The budget caps how many nodes are out of service while
  this rollout runs, so a node someone else took out counts until this rollout has finished
  it: no second node is disrupted meanwhile, and the cordoned node itself joins a batch
  without taking another slot. Once this NodeWright is done with such a node, the cordon is
  neither its doing nor in its way, and counting it would let one hand-cordoned node stop
  the rollout for as long as the cordon stays (with the default one-at-a-time budget,
  completely, and silently). A node cordoned by someone else that is due joins the batch in
  flight when a member of it waits for a slot: it costs none, and left out it would hold the
  slot the member waits for until the batch finished, which it never would.
  docs/rollouts.md says the same, with the way out of each wait.

Pure. Counting holders per compartment and shared budget is :mod:`shared.rollout.kernel`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from shared import api, nodestate, progress
from shared.progress import NodeFacts

ADMITTED: Final = "admitted"
FAILED: Final = "failed: keeps its slot until it is retried or reset"
RELEASING: Final = "done: its admission is being released"
UNDECODABLE: Final = "its admission record does not decode"
ADMITTING: Final = "being admitted"
NOT_READY: Final = "NotReady"
CORDONED: Final = "cordoned by someone else"


def hold(cr: api.NodeWright, node: NodeFacts, admitting: Mapping[str, str]) -> str | None:
    """Why ``node`` holds a slot of ``cr``'s budgets (None: it holds none). ``admitting`` is
    the fence of ``cr``'s batch book (node -> resourceVersion when a pass decided to admit
    it)."""
    if node.selection is not None:
        if progress.failed(cr, node):
            return FAILED
        if progress.node_done(cr, node):
            return RELEASING
        return ADMITTED
    if nodestate.key(nodestate.SCHEDULER, cr.metadata.name) in node.malformed:
        return UNDECODABLE
    if being_admitted(node, admitting):
        return ADMITTING
    if node.ignored:
        return None  # left alone: outside the rollout, whatever state it is in
    if not node.ready:
        return NOT_READY
    ours = node.drain is not None and node.drain.cordoned
    if node.unschedulable and not ours and not progress.node_done(cr, node):
        return CORDONED
    return None


def being_admitted(node: NodeFacts, admitting: Mapping[str, str]) -> bool:
    """A pass decided to admit the node and, as far as these facts know, the node has not
    changed since: the admission, preconditioned on that resourceVersion, may still land.

    Facts older than the decision (a node cache lagging behind the NodeWright cache that
    carried the book) count it too: only a node seen *after* the decision's version can
    tell the admission landed (and counts as admitted) or never will (its precondition
    fails). resourceVersions are etcd revisions, which grow; one that is not a number is
    only ever compared for equality."""
    version = admitting.get(node.name)
    if version is None:
        return False
    seen = node.resource_version
    if version.isdigit() and seen.isdigit():
        return int(seen) <= int(version)
    return version == seen


def describe(holders: Sequence[tuple[str, str]], limit: int = 5) -> str:
    """``gpu-3: cordoned by someone else; gpu-1: admitted`` for the first ``limit`` holders
    (node, why), sorted by node, with how many more."""
    ordered = sorted(holders)
    text = "; ".join(f"{n}: {why}" for n, why in ordered[:limit])
    if len(ordered) > limit:
        text += f"; and {len(ordered) - limit} more"
    return text
