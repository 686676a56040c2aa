"""What the rollout kernel decides, as data: its inputs besides the fleet (:class:`Context`,
:class:`SharedCap`) and its one output, the :class:`Plan` (admissions, releases, the new batch
book, the verdict of every node and compartment).

Pure data; deciding is :mod:`shared.rollout.phases`' and :mod:`shared.rollout.kernel`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from shared.events import Reason
from shared.records.scheduler import Selection
from shared.rollout.book import (
    BatchBook,
    CompartmentBatch,
)


@dataclass(frozen=True)
class SharedCap:
    """A budget shared with other NodeWrights (the cluster budget, a policy's sharedBudget):
    the distinct nodes already holding it, with why, and its limit in nodes."""

    name: str
    code: str
    limit: int
    holders: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Context:
    """What the kernel needs beyond the CR, its policy, its nodes and its batch book."""

    now: datetime
    caps: tuple[SharedCap, ...] = ()
    priority_waits: Mapping[str, str] = field(default_factory=dict)
    """Target node -> the NodeWright it waits for (``rules.priority_waits``)."""
    policy_missing: bool = False
    ignore_windows: bool = False
    """For simulations: act as if a maintenance window were open."""
    cluster_budget: int | None = None
    """The scheduler's cluster budget, recorded in the new book for other readers."""
    nodes_seen: str = ""
    """The resourceVersion up to which the caller's node cache has every change ("": not
    known, not checked; see :attr:`BatchBook.nodes_seen`)."""


@dataclass(frozen=True)
class Admit:
    node: str
    selection: Selection
    resource_version: str
    """The node's resourceVersion the decision was taken on: the admission's precondition
    and the book's fence entry."""


@dataclass(frozen=True)
class Release:
    node: str
    done: bool
    """The node finished the NodeWright's current target (``node.completed``)."""


@dataclass(frozen=True)
class NodeVerdict:
    """A target node the scheduler has not admitted: where it counts and why it waits."""

    node: str
    compartment: str
    reason: Reason
    blocked: bool = False
    """The reason blocks (:data:`shared.reasons.BLOCKING`) rather than makes it wait."""
    due: bool = False
    """Admitted by this decision (the shell writes it next)."""


@dataclass(frozen=True)
class CompartmentWait:
    """The wait that holds a compartment back."""

    code: str
    """One of :data:`shared.reasons.COMPARTMENT_WAITS`."""
    message: str
    """The reason's message of :attr:`example`."""
    example: str
    """The first node by name that waits for this reason."""
    nodes: int
    """How many of the nodes looked at wait for this reason."""


@dataclass(frozen=True)
class CompartmentPlan:
    """One compartment after this decision, for status, logs and ``nodewright plan``."""

    name: str
    strategy: str
    matched: int
    budget: int
    busy: int
    """Nodes holding one of its slots before this decision's admissions."""
    batch: CompartmentBatch
    holders: tuple[tuple[str, str], ...] = ()
    """(node, why) of every node holding a slot before this decision's admissions, sorted."""
    waiting: CompartmentWait | None = None
    """Why the compartment starts nothing now (None: it does, or nothing is left, or it
    simply waits for its batch in flight)."""
    unopened: Reason | None = None
    """Why no batch opened although nodes wait for one (stopped, the last batch being
    released, no free slot)."""


@dataclass(frozen=True)
class Plan:
    admit: tuple[Admit, ...] = ()
    release: tuple[Release, ...] = ()
    """Admissions of nodes that finished or are no longer targets (and undecodable ones a
    reset asks to forget): the shell removes them, which frees their slots."""
    nodes: Mapping[str, NodeVerdict] = field(default_factory=dict)
    """Every target node the scheduler has not admitted (before this decision)."""
    counted: Mapping[str, str] = field(default_factory=dict)
    """Every target node -> the compartment it counts in (where it was admitted while it
    is, else where its labels assign it)."""
    targets: tuple[str, ...] = ()
    book: BatchBook = field(default_factory=BatchBook)
    compartments: tuple[CompartmentPlan, ...] = ()
    events: tuple[str, ...] = ()
    """Human-readable changes of the batch book made by this decision (logged by the shell)."""
    behind: bool = False
    """The caller's node cache is behind the book's fence (:attr:`BatchBook.nodes_seen`):
    nothing is admitted and the book is left as it is; decide again once it caught up."""
    wake_at: datetime | None = None
    """When a compartment's wait ends by itself (a soak, ``batchSoakSeconds``): nothing
    changes then that would wake the scheduler, so it decides again at that time."""

    @property
    def waiting(self) -> dict[str, Reason]:
        """Node -> why it is not admitted now (the due nodes left out)."""
        return {n: v.reason for n, v in self.nodes.items() if not v.due}

    @property
    def budget(self) -> int:
        return sum(c.budget for c in self.compartments)

    @property
    def in_flight(self) -> int:
        return sum(c.busy for c in self.compartments)

    def compartment(self, name: str) -> CompartmentPlan | None:
        return next((c for c in self.compartments if c.name == name), None)
