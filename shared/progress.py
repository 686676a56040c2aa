"""What a NodeWright wants on a node, and how far the node has got: pure functions.

Every service needs the same answers — which packages a CR wants at which version and
configuration, whether a node is done, whose turn it is — and they must agree, so the
answers live here, computed only from the CR and the Node object (its labels, status and
the per-service records of ``shared.nodestate``). No I/O, no clock: callers pass ``now``.

The rollout rules the scheduler decides by and the status service explains by live here too,
so they cannot drift apart: budgets in nodes (:func:`budget_nodes`), which nodes hold a
budget slot (:func:`busy`), compartment assignment with deterministic overlap resolution
(:func:`compartment_rules`, :func:`assign_compartments`), maintenance windows
(:func:`in_window`), priority and sequencing across NodeWrights (:func:`priority_waits`),
the node-level admission eligibility in its fixed order (:func:`ineligible`) and the
scheduler's persisted batch book (:class:`BatchBook`). Batch growth and gates are the
scheduler planner's (``services.scheduler.planner``).
"""

from __future__ import annotations

import fnmatch
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from typing import Any, Final, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec

from shared import api, nodestate
from shared.events import Reason
from shared.nodestate import (
    DrainRecord,
    ExecutorRecord,
    PackageRecord,
    Selection,
    ValidatorRecord,
)

INTERRUPT_PRIORITY: Mapping[str, int] = {
    "reboot": 0,
    "restartAllServices": 1,
    "service": 2,
    "noop": 3,
}
"""Merge order of interrupts due on one node: the lowest number wins."""


@dataclass(frozen=True)
class Desired:
    """One package as the CR wants it."""

    name: str
    version: str
    image: str
    """The image reference pods run: image@digest or image:version."""
    config_digest: str
    config: Mapping[str, str]
    interrupt: api.Interrupt | None
    config_interrupts: Mapping[str, api.Interrupt]
    depends_on: tuple[str, ...]
    uninstall_requested: bool
    spec: api.Package


def _digest(*parts: object) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(msgspec.json.encode(part))
        h.update(b"\0")
    return h.hexdigest()[:16]


def image_ref(pkg: api.Package) -> str:
    return f"{pkg.image}@{pkg.digest}" if pkg.digest else f"{pkg.image}:{pkg.version}"


class _PerObject:
    """Memo of a pure function of one CR object, for the life of that object.

    A pass over N nodes asks for the same CR's desired packages and target digest N times;
    recomputing them (hashing every configMap) dominated a 1,000-node pass. Keyed by the
    object's identity (CR models hold dicts, so they are not hashable) and holding the
    object itself, so an id is never reused while cached; a few entries suffice.
    """

    def __init__(self, size: int = 64) -> None:
        self._size = size
        self._entries: dict[int, tuple[object, object]] = {}

    def get(self, obj: object) -> object | None:
        hit = self._entries.get(id(obj))
        return hit[1] if hit is not None and hit[0] is obj else None

    def put(self, obj: object, value: object) -> None:
        if len(self._entries) >= self._size:
            self._entries.pop(next(iter(self._entries)))
        self._entries[id(obj)] = (obj, value)


_DESIRED = _PerObject()
_TARGET = _PerObject()


def desired(cr: api.NodeWright) -> dict[str, Desired]:
    """The packages ``cr`` wants, by name (memoised per CR object; treat as read-only)."""
    cached = _DESIRED.get(cr)
    if cached is not None:
        return cached  # type: ignore[return-value]
    result = _desired(cr)
    _DESIRED.put(cr, result)
    return result


def deleting(cr: api.NodeWright) -> bool:
    """The NodeWright is being deleted: its finalizer uninstalls what can be uninstalled."""
    return cr.metadata.deletion_timestamp is not None


def _desired(cr: api.NodeWright) -> dict[str, Desired]:
    out: dict[str, Desired] = {}
    gone = deleting(cr)
    for name, pkg in sorted(cr.spec.packages.items()):
        enabled = bool(pkg.uninstall and pkg.uninstall.enabled)
        if gone and not enabled:
            # Being deleted: a package without uninstall steps stays as it is on the nodes
            # that have it and is installed nowhere else.
            continue
        out[name] = Desired(
            name=name,
            version=pkg.version,
            image=image_ref(pkg),
            config_digest=_digest(sorted(pkg.config_map.items())),
            config=dict(pkg.config_map),
            interrupt=pkg.interrupt,
            config_interrupts=dict(pkg.config_interrupts),
            depends_on=tuple(sorted(pkg.depends_on)),
            uninstall_requested=gone or bool(pkg.uninstall and pkg.uninstall.requested),
            spec=pkg,
        )
    return out


def target_digest(cr: api.NodeWright) -> str:
    """Identifies the desired package set: when it changes, every node is re-examined."""
    cached = _TARGET.get(cr)
    if isinstance(cached, str):
        return cached
    result = _target_digest(cr)
    _TARGET.put(cr, result)
    return result


def _target_digest(cr: api.NodeWright) -> str:
    return _digest(
        [
            (d.name, d.version, d.image, d.config_digest, d.uninstall_requested)
            for d in desired(cr).values()
        ]
    )


# ---- observed node ----------------------------------------------------------------------


@dataclass(frozen=True)
class NodeFacts:
    """What the node object says, for one CR."""

    name: str
    labels: Mapping[str, str]
    unschedulable: bool
    ready: bool
    boot_id: str
    taints: tuple[Mapping[str, Any], ...]
    created: str
    selection: Selection | None = None
    drain: DrainRecord | None = None
    executor: ExecutorRecord = field(default_factory=ExecutorRecord)
    validator: ValidatorRecord = field(default_factory=ValidatorRecord)
    malformed: tuple[str, ...] = ()
    """Annotation keys whose record does not decode (hand-edited or foreign)."""

    @property
    def ignored(self) -> bool:
        return self.labels.get(nodestate.IGNORE_LABEL) == "true"


def facts(node: Mapping[str, Any], cr: str) -> NodeFacts:
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    malformed: list[str] = []

    def read(owner: str, record: type[nodestate.R]) -> nodestate.R | None:
        try:
            return nodestate.read(node, owner, cr, record)
        except (msgspec.ValidationError, msgspec.DecodeError):
            malformed.append(nodestate.key(owner, cr))
            return None

    selection = read(nodestate.SCHEDULER, Selection)
    drain = read(nodestate.DRAINER, DrainRecord)
    executor = read(nodestate.EXECUTOR, ExecutorRecord) or ExecutorRecord()
    validator = read(nodestate.VALIDATOR, ValidatorRecord) or ValidatorRecord()
    return NodeFacts(
        name=str(meta.get("name", "")),
        labels=dict(meta.get("labels") or {}),
        unschedulable=bool(spec.get("unschedulable")),
        ready=ready,
        boot_id=str((status.get("nodeInfo") or {}).get("bootID") or ""),
        taints=tuple(spec.get("taints") or ()),
        created=str(meta.get("creationTimestamp") or ""),
        selection=selection,
        drain=drain,
        executor=executor,
        validator=validator,
        malformed=tuple(malformed),
    )


# ---- selectors and taints ---------------------------------------------------------------


def selector_matches(selector: api.LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """Kubernetes label-selector semantics (an empty selector matches everything)."""
    if selector is None:
        return True
    for k, v in selector.match_labels.items():
        if labels.get(k) != v:
            return False
    for req in selector.match_expressions:
        present = req.key in labels
        match req.operator:
            case "In":
                if not present or labels[req.key] not in req.values:
                    return False
            case "NotIn":
                if present and labels[req.key] in req.values:
                    return False
            case "Exists":
                if not present:
                    return False
            case "DoesNotExist":
                if present:
                    return False
    return True


def selector_is_empty(selector: api.LabelSelector | None) -> bool:
    return selector is None or (not selector.match_labels and not selector.match_expressions)


# Taints NodeWright's own pods always tolerate: the cordon and the readiness taint it manages.
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
RUNTIME_REQUIRED_TAINT = f"{nodestate.DOMAIN}/runtime-required"


def tolerates(tolerations: Sequence[api.Toleration], taint: Mapping[str, Any]) -> bool:
    key, effect = taint.get("key", ""), taint.get("effect", "")
    if effect == "PreferNoSchedule":
        return True
    if key in (UNSCHEDULABLE_TAINT, RUNTIME_REQUIRED_TAINT):
        return True
    for tol in tolerations:
        if tol.effect and tol.effect != effect:
            continue
        if tol.operator == "Exists":
            if not tol.key or tol.key == key:
                return True
        elif tol.key == key and tol.value == taint.get("value", ""):
            return True
    return False


def untolerated_taints(cr: api.NodeWright, node: NodeFacts) -> list[str]:
    return sorted(
        f"{t.get('key')}={t.get('value', '')}:{t.get('effect')}"
        for t in node.taints
        if not tolerates(cr.spec.additional_tolerations, t)
    )


# ---- progress ---------------------------------------------------------------------------


def package_done(d: Desired, rec: PackageRecord | None) -> bool:
    """The package is installed at the desired version with the desired configuration."""
    if d.uninstall_requested:
        return rec is None or rec.installed == ""
    return (
        rec is not None
        and rec.installed == d.version
        and rec.config == d.config_digest
        and rec.state == "succeeded"
        # Mid-cycle (a stage of a rerun, reinstall or cancelled uninstall succeeded, its
        # check or later stages pending): the executor clears ``previous`` when a cycle ends.
        and not rec.previous
    )


def packages_done(cr: api.NodeWright, node: NodeFacts) -> bool:
    return all(package_done(d, node.executor.packages.get(n)) for n, d in desired(cr).items())


def node_done(cr: api.NodeWright, node: NodeFacts) -> bool:
    """Every package is done and the validator validated the node for the current target.

    While the NodeWright is being deleted a node is done once its uninstall-enabled packages
    are gone (each uninstall stage was checked; there is no node validation to wait for): a
    node that never had them is done at once and is neither admitted nor cordoned.
    """
    if deleting(cr):
        return packages_done(cr, node)
    return packages_done(cr, node) and node.validator.validated == target_digest(cr)


def changed_config_keys(
    d: Desired, rec: PackageRecord | None, applied: Mapping[str, str]
) -> list[str]:
    """Config keys whose content differs from what was applied (``applied``: key -> digest)."""
    keys = set(d.config) | set(applied)
    return sorted(k for k in keys if _digest(d.config.get(k)) != applied.get(k))


def config_key_digests(config: Mapping[str, str]) -> dict[str, str]:
    return {k: _digest(v) for k, v in config.items()}


def interrupt_for_config_change(d: Desired, changed: Sequence[str]) -> api.Interrupt | None:
    """The interrupt a config-only change needs: merged over the matching configInterrupts."""
    due = [
        intr
        for pattern, intr in sorted(d.config_interrupts.items())
        if any(fnmatch.fnmatchcase(k, pattern) for k in changed)
    ]
    return merge_interrupts(due)


def merge_interrupts(interrupts: Sequence[api.Interrupt]) -> api.Interrupt | None:
    """One interrupt for all: reboot > restartAllServices > service (union) > noop."""
    if not interrupts:
        return None
    best = min(interrupts, key=lambda i: INTERRUPT_PRIORITY[i.type])
    if best.type != "service":
        return api.Interrupt(type=best.type)
    services = sorted({s for i in interrupts if i.type == "service" for s in i.services})
    return api.Interrupt(type="service", services=services)


Turn = Literal["scheduler", "drainer", "executor", "validator", "release", "done", "failed"]


def disruptive(cr: api.NodeWright, node: NodeFacts) -> bool:
    """Whether the node must be cordoned and drained before its packages run this time."""
    if not cr.spec.drain.only_for_interrupts:
        return True
    for name, d in desired(cr).items():
        rec = node.executor.packages.get(name)
        if package_done(d, rec):
            continue
        if d.uninstall_requested:
            if d.interrupt is not None:  # an uninstall runs the package's interrupt
                return True
            continue
        if d.interrupt is not None or d.config_interrupts:
            return True
    return False


def drained(node: NodeFacts) -> bool:
    return node.drain is not None and node.drain.phase == "drained"


def failed(cr: api.NodeWright, node: NodeFacts) -> bool:
    """A drain, a stage, the interrupt or a check failed for what the CR wants now.

    Failures recorded for package versions the CR no longer asks for do not count: changing
    the spec is one way to fix a failure.
    """
    if node.drain is not None and node.drain.phase == "failed":
        return True
    wanted = {(n, d.version) for n, d in desired(cr).items()}
    for name, rec in node.executor.packages.items():
        if rec.state == "failed" and (name, rec.version) in wanted:
            return True
    intr = node.executor.interrupt
    if intr is not None and intr.state == "failed":
        current = node.executor.packages
        if any((p, current[p].version) in wanted for p in intr.packages if p in current):
            return True
    for key, check in node.validator.checks.items():
        pkg, version, _ = key.split("/", 2)
        if check.verdict == "failed" and (pkg, version) in wanted:
            return True
    return False


def turn(cr: api.NodeWright, node: NodeFacts) -> Turn:
    """Whose move it is on this node for this CR.

    scheduler: not admitted yet (or admitted for an old target). drainer: admitted and must
    be cordoned and drained first. executor: stages to run. validator: stages done, node
    validation due. release: validated, the drainer must release its cordon and the
    scheduler its admission. done: nothing left. failed: a stage, check or drain failed and
    needs a retry or a fix.
    """
    target = target_digest(cr)
    if node_done(cr, node):
        if node.drain is not None or node.selection is not None:
            return "release"
        return "done"
    if failed(cr, node):
        return "failed"
    if node.selection is None:
        return "scheduler"
    if node.selection.disruptive and not drained(node):
        return "drainer"
    if not packages_done(cr, node):
        return "executor"
    if node.validator.validated != target:
        return "validator"
    return "release"


def now_iso(now: datetime) -> str:
    return now.isoformat()


# ---- rollout rules shared by the scheduler and the status service -----------------------

DEFAULT_COMPARTMENT: Final = "__default__"
"""The compartment of nodes no policy compartment selects (and of every node without a
policy). Policy compartment names are DNS labels, so it cannot clash with one."""

BATCHES_ANNOTATION: Final = f"{nodestate.SCHEDULER}/batches"
"""Annotation on the NodeWright holding the scheduler's :class:`BatchBook` (its only writer)."""

RESET_ANNOTATION: Final = f"{api.GROUP}/reset-batch-state"
"""Annotation on the NodeWright: any new value resets the batch state of every compartment
(``nodewright reset-batches NAME`` sets it to the current time)."""

# Reasons a target node is not admitted, besides the records' own.
NODE_STATE_MALFORMED: Final = "NodeStateMalformed"
NODE_IGNORED: Final = "NodeIgnored"
TAINT_NOT_TOLERATED: Final = "TaintNotTolerated"
NODE_NOT_READY: Final = "NodeNotReady"
PAUSED: Final = "Paused"
DISABLED: Final = "Disabled"
BUDGET_EXHAUSTED: Final = "BudgetExhausted"
CLUSTER_BUDGET_EXHAUSTED: Final = "ClusterBudgetExhausted"
SHARED_BUDGET_EXHAUSTED: Final = "SharedBudgetExhausted"
COMPARTMENT_STOPPED: Final = "CompartmentStopped"
WAITING_FOR_BATCH: Final = api.NodeReason.WAITING_FOR_BATCH
WAITING_FOR_WINDOW: Final = api.NodeReason.WAITING_FOR_WINDOW
WAITING_FOR_PRIORITY: Final = api.NodeReason.WAITING_FOR_PRIORITY

BLOCKING: Final = frozenset(
    {NODE_STATE_MALFORMED, NODE_IGNORED, TAINT_NOT_TOLERATED, api.NodeReason.POLICY_NOT_FOUND}
)
"""Eligibility reasons that make a node Blocked (the others make it Waiting)."""


def budget_nodes(budget: api.Budget | None, matched: int) -> int:
    """A budget in nodes: a count as given; a percent of the ``matched`` nodes rounded DOWN
    but at least 1; unset means one node at a time; 0 when nothing matched."""
    if not matched:
        return 0
    if budget is None:
        return 1
    if budget.count is not None:
        return budget.count
    if budget.percent is not None:
        return max(1, matched * budget.percent // 100)
    return 1


def busy(node: NodeFacts) -> bool:
    """The node holds a budget slot: admitted (until released; a failed node keeps its
    admission and its cordon, so it keeps its slot), NotReady, or cordoned by someone else."""
    return (
        node.selection is not None
        or not node.ready
        or (node.unschedulable and (node.drain is None or not node.drain.cordoned))
    )


def ineligible(cr: api.NodeWright, node: NodeFacts, *, policy_missing: bool) -> Reason | None:
    """Why the node cannot be admitted whatever the batch, in this order: records that do not
    decode, the ignore label, untolerated taints, a missing DeploymentPolicy (those block),
    then disabled, paused and NotReady (those wait). None: eligible."""
    if node.malformed:
        text = "annotations do not decode: " + ", ".join(node.malformed)
        return Reason(code=NODE_STATE_MALFORMED, message=text)
    if node.ignored:
        return Reason(code=NODE_IGNORED, message=f"node is labelled {nodestate.IGNORE_LABEL}=true")
    taints = untolerated_taints(cr, node)
    if taints:
        text = "taints not tolerated by additionalTolerations: " + ", ".join(taints)
        return Reason(code=TAINT_NOT_TOLERATED, message=text)
    if policy_missing:
        text = f"DeploymentPolicy {cr.spec.deployment_policy} does not exist"
        return Reason(code=api.NodeReason.POLICY_NOT_FOUND, message=text)
    if cr.disabled:
        return Reason(code=DISABLED, message="the NodeWright is disabled")
    if cr.paused:
        return Reason(code=PAUSED, message="the NodeWright is paused")
    if not node.ready:
        return Reason(code=NODE_NOT_READY, message="node is not Ready")
    return None


# ---- compartments -------------------------------------------------------------------------


@dataclass(frozen=True)
class CompartmentRule:
    """One compartment of a NodeWright: its name, selector (None: the default) and rollout."""

    name: str
    rollout: api.Rollout
    selector: api.LabelSelector | None = None


STRATEGY_RANK: Final[Mapping[str, int]] = {"fixed": 0, "linear": 1, "exponential": 2, "": 3}
"""Safety order for overlapping compartments: fixed before linear before exponential before
no strategy."""


def strategy_kind(rollout: api.Rollout) -> str:
    s = rollout.strategy
    if s is None:
        return ""
    if s.fixed is not None:
        return "fixed"
    if s.linear is not None:
        return "linear"
    return "exponential" if s.exponential is not None else ""


def compartment_rules(
    cr: api.NodeWright, policy: api.DeploymentPolicy | None
) -> list[CompartmentRule]:
    """The policy's compartments and then the default; without a policy only the default,
    with ``spec.interruptionBudget`` (unset: one node at a time) and no strategy."""
    if policy is None:
        budget = cr.spec.interruption_budget or api.Budget(count=1)
        return [CompartmentRule(DEFAULT_COMPARTMENT, api.Rollout(budget=budget))]
    rules = [CompartmentRule(c.name, c, c.selector) for c in policy.spec.compartments]
    rules.append(CompartmentRule(DEFAULT_COMPARTMENT, policy.spec.default))
    return rules


def assign_compartments(
    rules: Sequence[CompartmentRule], targets: Sequence[NodeFacts]
) -> dict[str, str]:
    """Target node -> compartment, from current labels. A node several compartments select
    goes to the safest: strategy rank, then the smaller budget in nodes (over the target nodes
    each selector matches), then the name. Deterministic: the result does not depend on the
    order of ``rules`` or ``targets``."""
    selective = [r for r in rules if r.selector is not None]
    matches = {
        r.name: {n.name for n in targets if selector_matches(r.selector, n.labels)}
        for r in selective
    }
    key = {
        r.name: (
            STRATEGY_RANK[strategy_kind(r.rollout)],
            budget_nodes(r.rollout.budget, max(1, len(matches[r.name]))),
            r.name,
        )
        for r in selective
    }
    out: dict[str, str] = {}
    for n in targets:
        candidates = [r.name for r in selective if n.name in matches[r.name]]
        out[n.name] = min(candidates, key=key.__getitem__) if candidates else DEFAULT_COMPARTMENT
    return out


def compartment_of(node: NodeFacts, assigned: Mapping[str, str], known: set[str]) -> str:
    """Where a node counts: the compartment it was admitted into while admitted (if it still
    exists), else the one its labels assign it to."""
    sel = node.selection
    if sel is not None and sel.compartment in known:
        return sel.compartment
    return assigned.get(node.name, DEFAULT_COMPARTMENT)


# ---- maintenance windows ------------------------------------------------------------------

_WEEKDAYS: Final = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def _clock(text: str) -> time:
    hours, minutes = text.split(":")
    return time(int(hours), int(minutes))


def in_window(windows: Sequence[api.MaintenanceWindow], now: datetime) -> bool:
    """Whether ``now`` is inside one of the windows (no windows: always). A window is
    [start, end) in its time zone on the days it starts on; end before start runs into the
    next day. An unknown time zone never matches (fails closed)."""
    if not windows:
        return True
    for w in windows:
        try:
            zone = ZoneInfo(w.time_zone)
        except (ZoneInfoNotFoundError, ValueError):
            continue
        local = now.astimezone(zone)
        start, end, t = _clock(w.start), _clock(w.end), local.time().replace(tzinfo=None)
        days = set(w.days) or set(_WEEKDAYS)
        today = _WEEKDAYS[local.weekday()]
        yesterday = _WEEKDAYS[(local - timedelta(days=1)).weekday()]
        if start < end:
            if today in days and start <= t < end:
                return True
        elif (today in days and t >= start) or (yesterday in days and t < end):
            return True
    return False


# ---- priority and sequencing across NodeWrights ------------------------------------------


def _order_key(cr: api.NodeWright) -> tuple[int, str]:
    return (cr.spec.priority, cr.metadata.name)


def priority_waits(
    cr: api.NodeWright,
    crs: Sequence[api.NodeWright],
    nodes: Sequence[Mapping[str, Any]],
) -> dict[str, str]:
    """Target node of ``cr`` -> the NodeWright it waits for, by priority and sequencing.

    A NodeWright ahead of ``cr`` (lower priority number, ties by name; not disabled, not
    being deleted) with sequencing ``node`` holds back ``cr`` on each of its own target nodes
    until it is done there; with ``all`` it holds back ``cr`` on every node until it is done
    on all its target nodes. A paused NodeWright still holds others back (it is not done).
    """
    mine = [n for n in nodes if selector_matches(cr.spec.node_selectors, _labels(n))]
    if not mine:
        return {}
    ahead = sorted(
        (
            o
            for o in crs
            if _order_key(o) < _order_key(cr)
            and not o.disabled
            and o.metadata.deletion_timestamp is None
        ),
        key=_order_key,
    )
    out: dict[str, str] = {}
    for other in ahead:
        name = other.metadata.name
        theirs = [n for n in nodes if selector_matches(other.spec.node_selectors, _labels(n))]
        pending = {
            str(n["metadata"]["name"]) for n in theirs if turn(other, facts(n, name)) != "done"
        }
        if not pending:
            continue
        for n in mine:
            node_name = str(n["metadata"]["name"])
            if node_name in out:
                continue
            if other.spec.sequencing == "all" or node_name in pending:
                out[node_name] = name
    return out


def _labels(node: Mapping[str, Any]) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


# ---- the scheduler's batch book ----------------------------------------------------------


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


class BatchBook(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The scheduler's persisted rollout state of one NodeWright (annotation
    :data:`BATCHES_ANNOTATION`, written only by the scheduler with a resourceVersion
    precondition)."""

    compartments: dict[str, CompartmentBatch] = {}
    versions: str = ""
    """Digest of the package versions the state is about (a change is a new rollout)."""
    reset_token: str = ""
    """The last value of :data:`RESET_ANNOTATION` acted on."""
    admitted: int = 0
    """Node orders handed out in the current rollout: the next batch's nodes get this one
    and on (:attr:`Selection.order <shared.nodestate.Selection.order>`, reserved in
    :attr:`CompartmentBatch.orders`). Advanced by the planner and written with the book
    before the admissions, so an order is never handed out twice. Back to 0 whenever the
    batch state resets."""


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
    return _digest(sorted((n, p.version) for n, p in cr.spec.packages.items()))
