"""Where each node stands for a NodeWright, as the status service reports it: pure.

For every node that is a target of the CR or carries a record of it, :func:`assess` gives a
phase (the fine-grained one the web page shows), the coarse state the node condition and the
CR status count, a machine-readable reason, the package concerned and since when:

- whose turn it is comes from ``shared.progress.turn``, so every service agrees;
- a node the scheduler has not admitted shows the rollout kernel's verdict
  (``shared.rollout.kernel.Plan.nodes``: the same decision the scheduler takes, with the
  same reasons and messages, naming the nodes that hold the slots); nothing here judges
  budgets, batches, windows or priority;
- a drain record that waits or is blocked makes the node Waiting or Blocked with the
  drainer's reason; any failed record makes it Failed with that record's reason; a record
  that does not decode makes it Blocked (NodeStateMalformed).

``since`` is the time a record gives for the state, else the time of the node condition the
status service wrote while state and reason are unchanged (:class:`Reported`), else ``now``:
an unchanged world gives equal views. Nothing here raises on odd records. Summing views into
the CR status is ``services.status.core``'s job; reading caches and writing is the shell's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from typing import Any, Final

from shared import api, nodestate, progress, reasons
from shared.events import Reason
from shared.progress import NodeFacts
from shared.records.status import (
    REASONED,
    NodePhase,
    Reported,
    condition_type as condition_type,
    find_condition,
    reported,
)
from shared.rollout import kernel
from shared.rollout.book import CompartmentBatch
from shared.rollout.rules import DEFAULT_COMPARTMENT

STATE_OF: Final[Mapping[NodePhase, api.NodeState]] = {
    "Pending": "InProgress",
    "Draining": "InProgress",
    "Running": "InProgress",
    "Validating": "InProgress",
    "Waiting": "Waiting",
    "Blocked": "Blocked",
    "Failed": "Failed",
    "Complete": "Complete",
}
"""Each phase (the view's, shown by the web page) is one state (node condition, counts, node
details)."""

MESSAGE_MAX: Final = 1024
_REASON_OBJECTS: Final = 10
_REASON_DETAILS: Final = 16
_DETAIL_VALUE_MAX: Final = 256
_INVALID_REASON_CHARS: Final = re.compile(r"[^A-Za-z0-9_,:]")
_OWNERS: Final = (
    nodestate.SCHEDULER,
    nodestate.DRAINER,
    nodestate.EXECUTOR,
    nodestate.VALIDATOR,
    nodestate.STATUS,
)


# ---- input -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Observed:
    """One node for one CR: the facts every service shares, plus the node condition this
    service wrote there before."""

    facts: NodeFacts
    condition: Mapping[str, Any] | None = None
    """The node condition ``nodewright.nvidia.com/<cr>``, as the API returned it."""
    legacy_record: str | None = None
    """The status record annotation ``status.nodewright.nvidia.com/<cr>`` an earlier version
    wrote once per step: the status service removes it (this value, compare-and-swap)."""

    @property
    def name(self) -> str:
        return self.facts.name

    @cached_property
    def reported(self) -> Reported | None:
        """What the condition said (the previous pass's report); decoded once per object."""
        return reported(self.condition)


def involves(node: Mapping[str, Any], cr: str, selector: api.LabelSelector | None) -> bool:
    """Whether ``node`` matters to ``cr``: a target (by ``selector``; None when the CR is
    gone), or carrying any record or the node condition of the CR."""
    if selector is not None:
        labels = (node.get("metadata") or {}).get("labels") or {}
        if progress.selector_matches(selector, labels):
            return True
    annotations = nodestate.annotations_of(node)
    if any(nodestate.key(owner, cr) in annotations for owner in _OWNERS):
        return True
    return find_condition(node, cr) is not None


FactsOf = Callable[[Mapping[str, Any], str], NodeFacts]


def observe(node: Mapping[str, Any], cr: str, facts_of: FactsOf = progress.facts) -> Observed:
    """Read one node for ``cr``."""
    return Observed(
        facts=facts_of(node, cr),
        condition=find_condition(node, cr),
        legacy_record=nodestate.annotations_of(node).get(nodestate.key(nodestate.STATUS, cr)),
    )


class ObservedCache:
    """:func:`observe` memoised per (node, NodeWright) and the node's resourceVersion: a pass
    over every node reads again only the nodes that changed since the last one (every pass
    read them all: a third of the status service's CPU, issue 15)."""

    def __init__(self, facts_of: FactsOf = progress.facts) -> None:
        self._facts_of = facts_of
        self._memo: dict[tuple[str, str], tuple[str, Observed]] = {}

    def __call__(self, node: Mapping[str, Any], cr: str) -> Observed:
        meta = node.get("metadata") or {}
        key = (str(meta.get("name", "")), cr)
        version = str(meta.get("resourceVersion") or "")
        hit = self._memo.get(key)
        if hit is not None and version and hit[0] == version:
            return hit[1]
        seen = observe(node, cr, self._facts_of)
        self._memo[key] = (version, seen)
        return seen

    def forget(self, node: str) -> None:
        """Drop a deleted node's entries."""
        for key in [k for k in self._memo if k[0] == node]:
            del self._memo[key]


# ---- helpers -----------------------------------------------------------------------------


def to_second(at: datetime) -> datetime:
    """Times are kept to the second, like Kubernetes' own, so they survive a round trip."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.astimezone(UTC).replace(microsecond=0)


def truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def reason_code(code: str) -> str:
    """``code`` reduced to a valid CamelCase reason (letters, digits, ``_,:``), or Unknown."""
    cleaned = _INVALID_REASON_CHARS.sub("", code).lstrip("0123456789_,:")
    return cleaned[:128].rstrip(",:") or "Unknown"


def _bounded(reason: Reason) -> Reason:
    """A reason small enough for an annotation and valid for the CRD's reason pattern."""
    details = sorted(reason.details.items())[:_REASON_DETAILS]
    return Reason(
        code=reason_code(reason.code),
        message=truncate(reason.message, MESSAGE_MAX),
        objects=reason.objects[:_REASON_OBJECTS],
        details={k[:_DETAIL_VALUE_MAX]: v[:_DETAIL_VALUE_MAX] for k, v in details},
    )


# ---- per node ----------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeView:
    """One node's state for the CR."""

    name: str
    target: bool
    """Selected by spec.nodeSelectors: only targets are counted and get a node condition."""
    phase: NodePhase
    reason: Reason
    since: datetime
    package: str
    compartment: str
    """The compartment the scheduler admitted the node into (the default one until then)."""
    facts: NodeFacts

    @property
    def state(self) -> api.NodeState:
        return STATE_OF[self.phase]


@dataclass(frozen=True)
class _Verdict:
    phase: NodePhase
    reason: Reason
    package: str = ""
    at: datetime | None = None
    """When the node entered this state, if a record says so."""


def _v(
    phase: NodePhase, code: str, message: str, *, package: str = "", at: datetime | None = None
) -> _Verdict:
    return _Verdict(phase, Reason(code=code, message=message), package, at)


def _failure(node: NodeFacts) -> _Verdict:
    """The first failure on the node, in a fixed order: drain, packages, interrupt, checks."""
    drain = node.drain
    if drain is not None and drain.phase == "failed":
        if drain.reason:
            return _Verdict("Failed", drain.reason, at=drain.since)
        return _v("Failed", reasons.DRAIN_FAILED, "the drain failed", at=drain.since)
    for name, rec in sorted(node.executor.packages.items()):
        if rec.state == "failed":
            if rec.reason:
                return _Verdict("Failed", rec.reason, name, rec.updated)
            text = f"stage {rec.stage} of {name} {rec.version} failed"
            return _v("Failed", reasons.STAGE_FAILED, text, package=name, at=rec.updated)
    intr = node.executor.interrupt
    if intr is not None and intr.state == "failed":
        names = ",".join(intr.packages)
        if intr.reason:
            return _Verdict("Failed", intr.reason, names, intr.started)
        text = f"the {intr.type} interrupt failed"
        return _v("Failed", reasons.INTERRUPT_FAILED, text, package=names, at=intr.started)
    for key, check in sorted(node.validator.checks.items()):
        if check.verdict == "failed":
            package = key.split("/", 1)[0]
            if check.reason:
                return _Verdict("Failed", check.reason, package, check.at)
            return _v(
                "Failed", reasons.CHECK_FAILED, f"check {key} failed", package=package, at=check.at
            )
    return _v("Failed", reasons.FAILED, "a record of the node failed")


def _not_admitted(node: NodeFacts, plan: kernel.Plan) -> _Verdict:
    """Why the scheduler has not admitted the node: the kernel's verdict, as it is."""
    verdict = plan.nodes.get(node.name)
    if verdict is None:
        # Not in the decision (the node changed between the two reads): say what is known.
        return _v("Waiting", reasons.WAITING_FOR_BATCH, "waiting to be admitted")
    if verdict.blocked:
        return _Verdict("Blocked", verdict.reason)
    # A due node waits too: it is not admitted before the scheduler wrote it (its reason says
    # it is being admitted).
    return _Verdict("Waiting", verdict.reason)


def _draining(node: NodeFacts) -> _Verdict:
    """Admitted, and must be cordoned and drained first."""
    drain, sel = node.drain, node.selection
    if drain is None:
        where = f" into batch {sel.batch} of compartment {sel.compartment}" if sel else ""
        text = f"admitted{where}; waiting to be cordoned"
        return _v("Pending", reasons.ADMITTED, text, at=sel.selected_at if sel else None)
    if drain.reason is not None and drain.phase in ("waiting", "blocked"):
        return _Verdict(
            "Waiting" if drain.phase == "waiting" else "Blocked", drain.reason, "", drain.since
        )
    if drain.phase == "waiting":
        text = "waiting for protected pods to finish before the drain"
        return _v("Waiting", reasons.WAITING_FOR_PROTECTED_PODS, text, at=drain.since)
    if drain.phase == "blocked":
        return _v("Blocked", reasons.DRAIN_BLOCKED, "evictions are refused", at=drain.since)
    if drain.reason is not None:
        return _Verdict("Draining", drain.reason, "", drain.since)
    return _v("Draining", reasons.DRAINING, f"drain phase {drain.phase}", at=drain.since)


def _executing(cr: api.NodeWright, node: NodeFacts) -> _Verdict:
    """Package stages to run: what runs now, or what the node waits for."""
    desired = progress.desired(cr)
    intr = node.executor.interrupt
    if intr is not None and intr.state == "running":
        code = reasons.REBOOTING if intr.type == "reboot" else reasons.INTERRUPTING
        names = ",".join(intr.packages)
        text = f"{intr.type} interrupt for {names or 'the packages'}"
        return _v("Running", code, text, package=names, at=intr.started)
    records = sorted((n, r) for n, r in node.executor.packages.items() if n in desired)
    for name, rec in records:
        if rec.state == "running":
            text = f"stage {rec.stage} of {name} {rec.version} (attempt {rec.attempt})"
            return _v("Running", reasons.STAGE_RUNNING, text, package=name, at=rec.updated)
    for name, rec in records:
        if rec.state == "succeeded" and not progress.package_done(desired[name], rec):
            text = f"waiting for the check of stage {rec.stage} of {name} {rec.version}"
            return _v("Running", reasons.WAITING_FOR_CHECK, text, package=name, at=rec.updated)
    if cr.disabled:
        return _v("Waiting", reasons.DISABLED, "the NodeWright is disabled")
    if cr.paused:
        return _v("Waiting", reasons.PAUSED, "the NodeWright is paused")
    if not records:
        sel = node.selection
        text = "admitted; package stages have not started"
        return _v("Pending", reasons.ADMITTED, text, at=sel.selected_at if sel else None)
    return _v("Running", reasons.STAGE_PENDING, "the next stage has not started yet")


def _verdict(cr: api.NodeWright, node: NodeFacts, plan: kernel.Plan) -> _Verdict:
    if node.malformed:
        text = (
            "annotations do not decode: "
            + ", ".join(node.malformed)
            + "; run `nodewright node reset` on the node"
        )
        return _v("Blocked", reasons.NODE_STATE_MALFORMED, text)
    match progress.turn(cr, node):
        case "done":
            text = "every package is at its desired version"
            return _v("Complete", reasons.COMPLETE, text, at=node.validator.at)
        case "release":
            if node.drain is not None and node.drain.cordoned:
                text = "validated; waiting for the cordon to be released"
                return _v("Running", reasons.UNCORDONING, text, at=node.validator.at)
            text = "validated; waiting for the admission to be released"
            return _v("Running", reasons.RELEASING, text, at=node.validator.at)
        case "failed":
            return _failure(node)
        case "scheduler":
            return _not_admitted(node, plan)
        case "drainer":
            return _draining(node)
        case "executor":
            return _executing(cr, node)
        case "validator":
            return _v(
                "Validating", reasons.VALIDATING, "every package is done; validating the node"
            )


def assess(
    cr: api.NodeWright,
    nodes: Sequence[Observed],
    now: datetime,
    plan: kernel.Plan,
) -> list[NodeView]:
    """The view of every given node for ``cr``, sorted by node name, with ``plan`` the
    rollout kernel's decision for ``cr`` now. Nodes that are not targets get a NotTargeted
    view: they count only where packages are present."""
    now = to_second(now)
    selector = cr.spec.node_selectors
    is_target = {o.name: progress.selector_matches(selector, o.facts.labels) for o in nodes}
    views: list[NodeView] = []
    # The kernel hands one reason object to every node that waits for the same thing
    # (thousands in a large compartment): bound each object once. Keyed by identity, each
    # entry holding its reason so that no id is reused while the memo lives.
    bounded: dict[int, tuple[Reason, Reason]] = {}
    for obs in sorted(nodes, key=lambda o: o.name):
        f = obs.facts
        # Where the kernel counts it (the admission's compartment while it still exists);
        # a node that is no target counts nowhere and keeps its admission's name.
        compartment = plan.counted.get(f.name) or (
            f.selection.compartment if f.selection is not None else DEFAULT_COMPARTMENT
        )
        if is_target[obs.name]:
            verdict = _verdict(cr, f, plan)
        else:
            verdict = _v("Pending", reasons.NOT_TARGETED, "not selected by spec.nodeSelectors")
        hit = bounded.get(id(verdict.reason))
        if hit is None or hit[0] is not verdict.reason:
            hit = bounded[id(verdict.reason)] = (verdict.reason, _bounded(verdict.reason))
        reason = hit[1]
        prev = obs.reported
        state = STATE_OF[verdict.phase]
        if verdict.at is not None:
            since = to_second(verdict.at)
        elif (
            prev is not None
            and prev.state == state
            and (prev.reason.code if prev.reason is not None else None)
            == (reason.code if state in REASONED else None)
        ):
            since = prev.since
        else:
            since = now
        views.append(
            NodeView(
                name=f.name,
                target=is_target[obs.name],
                phase=verdict.phase,
                reason=reason,
                since=since,
                package=verdict.package,
                compartment=compartment,
                facts=f,
            )
        )
    return views


# ---- what the node itself carries -----------------------------------------------------------

COMPARTMENT_TURN: Final = frozenset(
    {
        reasons.WAITING_FOR_BATCH,
        reasons.BUDGET_EXHAUSTED,
        reasons.CLUSTER_BUDGET_EXHAUSTED,
        reasons.SHARED_BUDGET_EXHAUSTED,
    }
)
"""Waits whose kernel message describes the compartment (which batch is in flight, how many
nodes are busy and which): true for every waiting member at once, and changing with each
node another admits or releases."""


def recorded(cr: str, view: NodeView) -> Reason:
    """The reason the node condition carries: the view's, except that a wait for the
    compartment's turn keeps its code and says where the details are. A condition that
    repeated the compartment's message would be rewritten on every waiting node whenever any
    other node moved (issue 15); the counts and the nodes holding the budget are the
    NodeWright's ``status.compartments`` and ``nodeDetails``, written once per change."""
    if view.reason.code not in COMPARTMENT_TURN:
        return view.reason
    return Reason(
        code=view.reason.code,
        message=truncate(
            f"waiting for its turn in compartment {view.compartment}; NodeWright {cr}'s "
            "status.compartments says what the compartment waits for",
            MESSAGE_MAX,
        ),
    )


# ---- why a compartment waits ---------------------------------------------------------------
#
# The kernel says why each compartment waits (``kernel.CompartmentPlan.waiting``). The
# CompartmentWaiting Events (services.status.kube_events) compare what the nodes said before
# with what they say now, with the kernel's own rule (``kernel.compartment_wait``), so the
# two cannot tell different stories.

CompartmentWait = kernel.CompartmentWait


@dataclass(frozen=True)
class PendingWait:
    """A target node not admitted yet that waits, with the reason it gives."""

    name: str
    code: str
    message: str


def batch_in_flight(entry: CompartmentBatch | None) -> frozenset[str] | None:
    """The nodes of the compartment's batch in flight; ``None`` between batches."""
    if entry is None or entry.state.batch_size == 0 or not entry.nodes:
        return None
    return frozenset(entry.nodes)


def waiting_to_start(members: Sequence[NodeView]) -> list[NodeView]:
    """The members the scheduler has not admitted that wait."""
    return [v for v in members if v.facts.selection is None and v.phase == "Waiting"]


def compartment_wait(
    pending: Sequence[PendingWait], batch_nodes: frozenset[str] | None
) -> kernel.CompartmentWait | None:
    """The kernel's rule (:func:`shared.rollout.kernel.compartment_wait`) over ``pending``."""
    return kernel.compartment_wait(
        [(p.name, Reason(code=p.code, message=p.message)) for p in pending], batch_nodes
    )


def wait_of(
    members: Sequence[NodeView], entry: CompartmentBatch | None
) -> kernel.CompartmentWait | None:
    """Why the compartment of ``members`` (whose batch book entry is ``entry``) waits now."""
    pending = [
        PendingWait(v.name, v.reason.code, v.reason.message) for v in waiting_to_start(members)
    ]
    return compartment_wait(pending, batch_in_flight(entry))
