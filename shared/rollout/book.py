"""The scheduler's batch book: the persisted rollout state of one NodeWright.

Annotation ``scheduler.nodewright.nvidia.com/batches`` on the NodeWright, written only by the
scheduler as a compare-and-swap of the book the pass read (and of the generation), before any
admission of the same pass. Besides each compartment's batch state it carries the **fence**
of the budget (:attr:`BatchBook.admitting`): the nodes a pass is about to admit, written
before their admissions, so a replica deciding on a stale view of the nodes still counts
every admission another pass may be writing (docs/rollouts.md "Budget: always a hard cap").

Pure: decoding and encoding. Deciding what goes into the book is :mod:`shared.rollout.kernel`'s.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from typing import Final

import msgspec

from shared import api, nodestate

BATCHES_ANNOTATION: Final = f"{nodestate.SCHEDULER}/batches"
"""Annotation on the NodeWright holding the scheduler's :class:`BatchBook` (its only writer)."""

RESET_ANNOTATION: Final = f"{api.GROUP}/reset-batch-state"
"""Annotation on the NodeWright: any new value resets the batch state of every compartment
(``nodewright reset-batches NAME`` sets it to the current time)."""


class CompartmentBatch(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One compartment's batch state and the nodes of its current batch."""

    state: api.BatchState = msgspec.field(default_factory=api.BatchState)
    nodes: tuple[str, ...] = ()
    """Nodes of the batch in flight; empty between batches."""
    planned: int = 0
    """Nominal size of the batch in flight, or of the next one once a batch finished (0: the
    first batch). Already capped by the budget; a batch is smaller only when fewer nodes
    are eligible or budget slots are free."""
    orders: tuple[int, ...] = ()
    """The node order reserved for each of :attr:`nodes` (same length) when the batch
    opened: an admission whose write failed (the node changed meanwhile) or that a crash
    cut off is made again with the same order, so orders have no gap. Empty in a book
    written before the field existed: the admissions then take the next of
    :attr:`BatchBook.admitted`."""
    finished: datetime | None = None
    """When the last batch finished (the pass that judged it), between batches: the next
    one opens ``batchSoakSeconds`` after it. None during a batch and before the first."""


class BatchBook(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The scheduler's persisted rollout state of one NodeWright."""

    compartments: dict[str, CompartmentBatch] = {}
    versions: str = ""
    """Digest of the package versions the state is about (a change is a new rollout)."""
    reset_token: str = ""
    """The last value of :data:`RESET_ANNOTATION` acted on."""
    admitted: int = 0
    """Node orders handed out in the current rollout: the next batch's nodes get this one
    and on (:attr:`Selection.order <shared.Selection.order>`, reserved in
    :attr:`CompartmentBatch.orders`). Written with the book before the admissions, so an
    order is never handed out twice. Back to 0 whenever the batch state resets."""
    admitting: dict[str, str] = {}
    """The budget's fence: node -> the node's resourceVersion when a pass decided to admit
    it. Written before the admission, which carries that resourceVersion as its
    precondition; so while the node still has it the admission may still land and the node
    holds a slot (:func:`shared.rollout.slots.hold`), and once the node changed the
    admission either landed (and the admission itself holds the slot) or never will. The
    kernel drops entries of nodes that changed."""
    nodes_seen: str = ""
    """The fence's watermark: the resourceVersion up to which the node cache of the pass
    that last wrote the book had seen every change. A pass whose node cache is behind it
    admits nothing (it may not have seen an admission the writer saw land, and whose fence
    entry the writer therefore dropped); it waits until its cache caught up. Only grows."""
    cluster_budget: int | None = None
    """The scheduler's ``NODEWRIGHT_SCHEDULER_CLUSTER_BUDGET`` when it wrote the book: the
    status service and ``nodewright plan`` explain waits with the same setting."""


def behind(seen: str, mark: str) -> bool:
    """Whether a node cache that has every change up to ``seen`` is behind ``mark`` (both
    resourceVersions: etcd revisions, which grow; unknown or not numbers: never behind)."""
    return seen.isdigit() and mark.isdigit() and int(seen) < int(mark)


def latest(a: str, b: str) -> str:
    """The later of two resourceVersions (see :func:`behind`)."""
    return b if behind(a, b) or not a else a


def read_batch_book(annotations: Mapping[str, str]) -> BatchBook:
    """The batch book of a NodeWright; absent or undecodable reads as empty (a fresh start
    of the batches, never a crash: the budgets still hold)."""
    raw = annotations.get(BATCHES_ANNOTATION)
    if not raw:
        return BatchBook()
    try:
        return msgspec.json.decode(raw, type=BatchBook)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return BatchBook()


def encode_batch_book(book: BatchBook) -> str:
    return msgspec.json.encode(book).decode()


def versions_digest(cr: api.NodeWright) -> str:
    """Identifies the package versions (not the configuration) of a NodeWright."""
    text = msgspec.json.encode(sorted((n, p.version) for n, p in cr.spec.packages.items()))
    return hashlib.sha256(text + b"\0").hexdigest()[:16]
