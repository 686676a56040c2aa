"""The rollout planner: which nodes of one NodeWright start now, batch by batch, and why the
others wait. Pure: no I/O, no clock (``now`` comes in the :class:`Context`).

Per compartment (``shared.progress.compartment_rules``: the policy's compartments plus
``__default__``; overlapping selectors resolved by ``shared.progress.assign_compartments``):

- **Budget** (count, or percent of the compartment's target nodes rounded DOWN, at least 1)
  is always a hard cap on the compartment's nodes holding a slot (``shared.progress.busy``:
  admitted and not released, NotReady, or cordoned by someone else), whatever the strategy.
- **Batches** are discrete: a batch opens only when the previous one finished, with
  ``min(nominal size, free budget slots, eligible nodes)`` nodes in node order (creation
  time, then name). Nominal sizes: fixed ``size, size, ...``; linear ``initial, +delta, ...``;
  exponential ``initial, *factor, ...``; no strategy: the budget. Nominal sizes are capped by
  the budget.
- A batch **finishes** when none of its nodes is still in progress: done nodes are
  successes, failed nodes failures, nodes that became Blocked (ignore label, untolerated
  taint, records that do not decode, or not admitted yet and no longer eligible) count as
  failures when ``blockedNodesCountAsFailed``, else they are left out; nodes gone from the
  compartment are left out. So neither a failed nor a blocked node keeps a batch open.
- A finished batch **passes** when ``successes * 100 >= batchSuccessPercent * judged``
  (judged = successes + counted failures; nothing judged: neither passes nor fails, and the
  next batch keeps the size). Only a passing batch grows the next one. A failing batch keeps
  the size, or shrinks it (linear ``-delta``, exponential ``/factor``, at least 1) while fewer
  than ``shrinkAfterFailureUntilPercent`` of the compartment's nodes are done.
- After exactly ``stopAfterConsecutiveFailedBatches`` failed batches in a row the compartment
  **stops** (only that one), whatever the progress, until its batch state is reset.
- **Resets** of the batch book: a new value of the reset annotation, a change of package
  versions (``resetBatchStateOnVersionChange``), completion of every target node
  (``resetBatchStateOnCompletion``); without a policy both flags are true.
- **Node order**: a batch reserves ``book.admitted + i`` for its i-th node when it opens
  (compartments in rule order, a batch's nodes in node order; ``CompartmentBatch.orders``)
  and the new book counts them; each admission takes its node's reserved order. So orders
  are unique and increasing within a rollout, and an admission made again (its node write
  lost a race, or the shell crashed after writing the book) keeps its order: no gap, no
  duplicate. Only a reserved node leaving the batch before its admission leaves a gap. A
  reset starts the count at 0 again, so each rollout has its own node 0, unless a node
  admitted before the reset still has work left: then past its order, never reusing one.
- **Gates** on starting a node (work in progress always finishes): pause and disable,
  maintenance windows (no new batch opens outside one, no member is admitted outside one),
  priority and sequencing (``shared.progress.priority_waits``), and the shared budgets of
  the :class:`Context` (cluster-wide and per-policy), counted in distinct nodes.

Not this module's job: reading caches, writing the admissions and the batch book, events.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

import msgspec

from shared import api, progress
from shared.events import Reason
from shared.nodestate import ExecutorRecord, PackageRecord, Selection, ValidatorRecord
from shared.progress import (
    BatchBook,
    CompartmentBatch,
    CompartmentRule,
    NodeFacts,
)

STOPPED_REASON = "FailedBatchesLimit"


@dataclass(frozen=True)
class SharedCap:
    """A budget shared with other NodeWrights (the cluster budget, a policy's sharedBudget):
    the distinct nodes already holding it and its limit in nodes."""

    name: str
    code: str
    limit: int
    holders: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Context:
    """What the planner needs beyond the CR, its policy and its nodes."""

    now: datetime
    caps: tuple[SharedCap, ...] = ()
    priority_waits: Mapping[str, str] = field(default_factory=dict)
    """Target node -> the NodeWright it waits for (``shared.progress.priority_waits``)."""
    policy_missing: bool = False
    ignore_windows: bool = False
    """For simulations: act as if a maintenance window were open."""


@dataclass(frozen=True)
class Admit:
    node: str
    selection: Selection


@dataclass(frozen=True)
class CompartmentPlan:
    """One compartment after this decision, for status, logs and ``nodewright plan``."""

    name: str
    strategy: str
    matched: int
    budget: int
    busy: int
    batch: CompartmentBatch
    waiting: Reason | None = None
    """Why the compartment starts nothing now (None: it does, or nothing is left)."""


@dataclass(frozen=True)
class Plan:
    admit: tuple[Admit, ...] = ()
    release: tuple[str, ...] = ()
    """Admitted nodes that finished or are no longer targets: the admission is removed."""
    waiting: Mapping[str, Reason] = field(default_factory=dict)
    targets: tuple[str, ...] = ()
    book: BatchBook = field(default_factory=BatchBook)
    compartments: tuple[CompartmentPlan, ...] = ()
    events: tuple[str, ...] = ()
    """Human-readable changes of the batch book made by this decision (logged by the shell)."""

    @property
    def budget(self) -> int:
        return sum(c.budget for c in self.compartments)

    @property
    def in_flight(self) -> int:
        return sum(c.busy for c in self.compartments)


def _order(node: NodeFacts) -> tuple[str, str]:
    return (node.created, node.name)


def targets(cr: api.NodeWright, nodes: Sequence[NodeFacts]) -> list[NodeFacts]:
    return sorted(
        (n for n in nodes if progress.selector_matches(cr.spec.node_selectors, n.labels)),
        key=_order,
    )


def _releasable(cr: api.NodeWright, node: NodeFacts, names: set[str]) -> bool:
    """Admitted, and either finished (the drainer has released its cordon) or no longer a
    target (labels changed): the admission goes and frees the budget slot."""
    if node.selection is None:
        return False
    if node.name not in names:
        return True
    return progress.turn(cr, node) in ("release", "done") and node.drain is None


def reset_flags(cr: api.NodeWright, policy: api.DeploymentPolicy | None) -> tuple[bool, bool]:
    """(on completion, on version change): the CR's options over the policy's; no policy:
    both true."""
    on_completion = policy.spec.reset_batch_state_on_completion if policy else True
    on_version = policy.spec.reset_batch_state_on_version_change if policy else True
    opts = cr.spec.deployment_policy_options
    if opts is not None:
        if opts.reset_batch_state_on_completion is not None:
            on_completion = opts.reset_batch_state_on_completion
        if opts.reset_batch_state_on_version_change is not None:
            on_version = opts.reset_batch_state_on_version_change
    return on_completion, on_version


def first_size(rollout: api.Rollout, budget: int) -> int:
    s = rollout.strategy
    if s is None:
        return budget
    if s.fixed is not None:
        size = s.fixed.batch_size
    elif s.linear is not None:
        size = s.linear.initial_batch
    elif s.exponential is not None:
        size = s.exponential.initial_batch
    else:
        size = budget
    return max(1, min(size, budget))


def next_size(
    rollout: api.Rollout, last: int, *, passed: bool | None, done_percent: int, budget: int
) -> int:
    """The nominal size after a batch of nominal size ``last`` that passed (True), failed
    (False) or was not judged (None). Capped by ``budget``, at least 1."""
    s = rollout.strategy
    if s is None:
        return max(1, budget)
    size = last
    shrink = passed is False and done_percent < rollout.shrink_after_failure_until_percent
    if s.fixed is not None:
        size = s.fixed.batch_size
    elif s.linear is not None:
        if passed:
            size = last + s.linear.delta
        elif shrink:
            size = last - s.linear.delta
    elif s.exponential is not None:
        if passed:
            size = last * s.exponential.growth_factor
        elif shrink:
            size = last // s.exponential.growth_factor
    return max(1, min(size, max(1, budget)))


def _blocked(cr: api.NodeWright, node: NodeFacts) -> bool:
    return bool(node.malformed or node.ignored or progress.untolerated_taints(cr, node))


def _finish(
    rule: CompartmentRule,
    entry: CompartmentBatch,
    success: int,
    failure: int,
    *,
    done_percent: int,
    budget: int,
) -> tuple[CompartmentBatch, str]:
    """Judge a finished batch and prepare the next one."""
    rollout = rule.rollout
    st = entry.state
    judged = success + failure
    passed: bool | None = None
    if judged:
        passed = success * 100 >= rollout.batch_success_percent * judged
    consecutive = st.consecutive_failed_batches
    if passed is True:
        consecutive = 0
    elif passed is False:
        consecutive += 1
    limit = rollout.stop_after_consecutive_failed_batches
    stopped = st.stopped or (limit is not None and consecutive >= limit)
    last = entry.planned or len(entry.nodes)
    planned = next_size(rollout, last, passed=passed, done_percent=done_percent, budget=budget)
    state = api.BatchState(
        current_batch=st.current_batch + 1,
        batch_size=0,
        total_succeeded_nodes=st.total_succeeded_nodes + success,
        total_failed_nodes=st.total_failed_nodes + failure,
        consecutive_failed_batches=consecutive,
        last_batch_failed=passed is False if passed is not None else st.last_batch_failed,
        stopped=stopped,
        stop_reason=STOPPED_REASON if stopped else "",
        stop_message=(
            f"{consecutive} consecutive batches below {rollout.batch_success_percent}% success "
            f"(stopAfterConsecutiveFailedBatches: {limit}); reset the batch state to resume"
            if stopped
            else ""
        ),
    )
    verdict = {True: "passed", False: "failed", None: "not judged"}[passed]
    text = (
        f"compartment {rule.name} batch {st.current_batch} {verdict}: "
        f"{success} succeeded, {failure} failed"
        + ("; compartment stopped" if stopped and not st.stopped else "")
    )
    return CompartmentBatch(state=state, planned=planned), text


def _first_order(cr: api.NodeWright, nodes: Sequence[NodeFacts], released: set[str]) -> int:
    """The first node order of a rollout that starts now: 0, unless a node admitted before
    the reset still holds its admission and has work left (a failed node kept admitted, a
    node in progress when the versions changed: it runs the new packages with its order);
    then one past the highest such order, so no two nodes with work left share an order."""
    held = [
        n.selection.order
        for n in nodes
        if n.selection is not None
        and n.selection.order is not None
        and n.name not in released
        and not progress.node_done(cr, n)
    ]
    return max(held) + 1 if held else 0


def plan(
    *,
    cr: api.NodeWright,
    policy: api.DeploymentPolicy | None,
    nodes: Sequence[NodeFacts],
    book: BatchBook,
    ctx: Context,
) -> Plan:
    target_nodes = targets(cr, nodes)
    by_name = {n.name: n for n in target_nodes}
    names = set(by_name)
    release = tuple(sorted(n.name for n in nodes if _releasable(cr, n, names)))
    released = set(release)
    notes: list[str] = []

    # ---- resets of the batch book ----
    on_completion, on_version = reset_flags(cr, policy)
    versions = progress.versions_digest(cr)
    token = cr.metadata.annotations.get(progress.RESET_ANNOTATION, "")
    compartments = dict(book.compartments)
    # The next node order (``Selection.order``): every reset starts a rollout with its own 0,
    # past any order a node still holding an admission has (see _first_order).
    admitted = book.admitted
    if token and token != book.reset_token:
        compartments, admitted = {}, _first_order(cr, target_nodes, released)
        notes.append("batch state reset by annotation")
    elif book.versions and book.versions != versions and on_version:
        compartments, admitted = {}, _first_order(cr, target_nodes, released)
        notes.append("batch state reset: package versions changed")
    all_done = bool(target_nodes) and all(progress.node_done(cr, n) for n in target_nodes)
    if (
        all_done
        and on_completion
        and (
            admitted
            or any(
                c.nodes or c.state != api.BatchState() or c.planned for c in compartments.values()
            )
        )
    ):
        compartments, admitted = {}, _first_order(cr, target_nodes, released)
        notes.append("batch state reset: rollout complete")

    rules = progress.compartment_rules(cr, policy)
    known = {r.name for r in rules}
    assigned = progress.assign_compartments(rules, target_nodes)
    members: dict[str, list[NodeFacts]] = {r.name: [] for r in rules}
    for n in target_nodes:
        members[assigned[n.name]].append(n)
    holders: dict[str, int] = {r.name: 0 for r in rules}
    for n in target_nodes:
        if progress.busy(replace(n, selection=None) if n.name in released else n):
            holders[progress.compartment_of(n, assigned, known)] += 1

    open_window = ctx.ignore_windows or policy is None
    if not open_window and policy is not None:
        open_window = progress.in_window(policy.spec.maintenance_windows, ctx.now)
    target = progress.target_digest(cr)
    cap_added: dict[str, set[str]] = {c.name: set() for c in ctx.caps}
    admit: list[Admit] = []
    waiting: dict[str, Reason] = {}
    out: list[CompartmentPlan] = []
    ineligible = {
        n.name: progress.ineligible(cr, n, policy_missing=ctx.policy_missing) for n in target_nodes
    }

    def gate(node: NodeFacts) -> Reason | None:
        """Why a node that is otherwise due may not start now (shared gates)."""
        reason = ineligible[node.name]
        if reason is not None:
            return reason
        blocker = ctx.priority_waits.get(node.name)
        if blocker:
            return Reason(
                code=progress.WAITING_FOR_PRIORITY,
                message=f"waiting for NodeWright {blocker} (priority and sequencing)",
                details={"nodewright": blocker},
            )
        if not open_window:
            return Reason(
                code=progress.WAITING_FOR_WINDOW, message="outside every maintenance window"
            )
        return None

    for rule in rules:
        mine = members[rule.name]
        matched = len(mine)
        budget = progress.budget_nodes(rule.rollout.budget, matched)
        entry = compartments.get(rule.name, CompartmentBatch())
        done_count = sum(1 for n in mine if progress.node_done(cr, n))
        done_percent = done_count * 100 // matched if matched else 0

        # ---- account the batch in flight; finish it when nothing of it is in progress ----
        if entry.nodes:
            success = failure = 0
            running = False
            for name in entry.nodes:
                member = by_name.get(name)
                if member is None or (assigned.get(name) != rule.name and member.selection is None):
                    continue  # gone from the compartment: left out
                n = member
                t = progress.turn(cr, n)
                why = ineligible[name]
                if t in ("done", "release"):
                    success += 1
                elif t == "failed":
                    failure += 1
                elif _blocked(cr, n) or (n.selection is None and why is not None):
                    if why is not None and why.code in (progress.PAUSED, progress.DISABLED):
                        running = True  # paused, not blocked: the batch waits
                    elif rule.rollout.blocked_nodes_count_as_failed:
                        failure += 1
                else:
                    running = True
            if running:
                entry = CompartmentBatch(
                    state=msgspec.structs.replace(
                        entry.state,
                        batch_size=len(entry.nodes),
                        batch_succeeded_nodes=success,
                        batch_failed_nodes=failure,
                    ),
                    nodes=entry.nodes,
                    planned=entry.planned,
                    orders=entry.orders,
                )
            else:
                entry, note = _finish(
                    rule, entry, success, failure, done_percent=done_percent, budget=budget
                )
                notes.append(note)

        # ---- open the next batch ----
        busy_here = holders[rule.name]
        state = entry.state
        candidates = [
            n
            for n in mine
            if n.selection is None and progress.turn(cr, n) == "scheduler" and gate(n) is None
        ]
        comp_wait: Reason | None = None
        if not entry.nodes and candidates:
            if state.stopped:
                comp_wait = Reason(
                    code=progress.COMPARTMENT_STOPPED,
                    message=f"compartment {rule.name} stopped: {state.stop_message}",
                )
            else:
                free = budget - busy_here
                size = entry.planned or first_size(rule.rollout, budget)
                # Nodes of the last batch that are done but not released yet (the drainer is
                # lifting their cordon) free their slots in a moment: opening the batch now
                # would make it smaller than its strategy says for no lasting reason.
                settling = sum(
                    1
                    for n in mine
                    if n.selection is not None
                    and n.name not in released
                    and progress.node_done(cr, n)
                )
                if settling and free < min(size, len(candidates)):
                    comp_wait = Reason(
                        code=progress.WAITING_FOR_BATCH,
                        message=f"{settling} nodes of compartment {rule.name}'s last batch "
                        "are being released",
                    )
                elif free <= 0 and not any(progress.busy(n) for n in candidates):
                    comp_wait = Reason(
                        code=progress.BUDGET_EXHAUSTED,
                        message=f"{busy_here} of {budget} budgeted nodes of compartment "
                        f"{rule.name} are busy",
                        details={"budget": str(budget), "inProgress": str(busy_here)},
                    )
                else:
                    # A node that already holds a slot (cordoned by someone else) costs none.
                    picked: list[str] = []
                    used = 0
                    for n in candidates:
                        if len(picked) >= size:
                            break
                        cost = 0 if progress.busy(n) else 1
                        if used + cost <= free:
                            picked.append(n.name)
                            used += cost
                    chosen = tuple(picked)
                    entry = CompartmentBatch(
                        state=msgspec.structs.replace(
                            state,
                            batch_size=len(chosen),
                            batch_succeeded_nodes=0,
                            batch_failed_nodes=0,
                        ),
                        nodes=chosen,
                        planned=size,
                        orders=tuple(range(admitted, admitted + len(chosen))),
                    )
                    admitted += len(chosen)
                    notes.append(
                        f"compartment {rule.name} batch {state.current_batch} opened with "
                        f"{len(chosen)} nodes"
                    )

        # ---- admit the members of the batch in flight ----
        in_batch = set(entry.nodes)
        reserved = (
            dict(zip(entry.nodes, entry.orders, strict=True))
            if len(entry.orders) == len(entry.nodes)
            else {}
        )
        for name in entry.nodes:
            member = by_name.get(name)
            if member is None or member.selection is not None:
                continue
            n = member
            if progress.turn(cr, n) != "scheduler":
                continue
            why = gate(n)
            if why is None and busy_here >= budget and not progress.busy(n):
                why = Reason(
                    code=progress.BUDGET_EXHAUSTED,
                    message=f"{busy_here} of {budget} budgeted nodes of compartment "
                    f"{rule.name} are busy",
                    details={"budget": str(budget), "inProgress": str(busy_here)},
                )
            if why is None:
                for cap in ctx.caps:
                    taken = cap.holders | cap_added[cap.name]
                    if name not in taken and len(taken) >= cap.limit:
                        why = Reason(
                            code=cap.code,
                            message=f"{len(taken)} of {cap.limit} nodes of the {cap.name} "
                            "are disrupted",
                            details={"budget": str(cap.limit), "inProgress": str(len(taken))},
                        )
                        break
            if why is not None:
                waiting[name] = why
                continue
            for cap in ctx.caps:
                cap_added[cap.name].add(name)
            busy_here += 0 if progress.busy(n) else 1
            admit.append(
                Admit(
                    node=name,
                    selection=Selection(
                        generation=cr.metadata.generation,
                        compartment=rule.name,
                        batch=entry.state.current_batch,
                        selected_at=ctx.now,
                        disruptive=progress.disruptive(cr, n),
                        target=target,
                        order=reserved.get(name, admitted),
                    ),
                )
            )
            if name not in reserved:
                admitted += 1  # a book from before reservations: the next order

        # ---- why the others wait ----
        for n in mine:
            if n.name in in_batch or n.selection is not None or n.name in waiting:
                continue
            if progress.turn(cr, n) != "scheduler":
                continue
            why = gate(n)
            if why is None:
                why = comp_wait or Reason(
                    code=progress.WAITING_FOR_BATCH,
                    message=f"waiting for batch {entry.state.current_batch} of compartment "
                    f"{rule.name} to finish",
                )
            waiting[n.name] = why
        compartments[rule.name] = entry
        out.append(
            CompartmentPlan(
                name=rule.name,
                strategy=progress.strategy_kind(rule.rollout),
                matched=matched,
                budget=budget,
                busy=busy_here,
                batch=entry,
                waiting=comp_wait,
            )
        )

    kept = {k: v for k, v in compartments.items() if k in known}
    new_book = BatchBook(compartments=kept, versions=versions, reset_token=token, admitted=admitted)
    if cr.disabled:
        # Disabled: nothing is started, and the batch book is left as it was.
        return Plan(
            release=release,
            waiting={n: r for n, r in waiting.items() if r.code == progress.DISABLED},
            targets=tuple(n.name for n in target_nodes),
            book=book,
            compartments=tuple(out),
        )
    return Plan(
        admit=tuple(admit),
        release=release,
        waiting=waiting,
        targets=tuple(n.name for n in target_nodes),
        book=new_book,
        compartments=tuple(out),
        events=tuple(notes),
    )


# ---- simulation (nodewright plan) -----------------------------------------------------------


@dataclass(frozen=True)
class PlannedBatch:
    compartment: str
    batch: int
    nodes: tuple[str, ...]
    in_flight: bool = False
    """Already started before the simulation (the batch in flight now)."""
    orders: tuple[int | None, ...] = ()
    """Per node of ``nodes``, its node order (``Selection.order``): the one it holds, or the
    one it will get; None: unknown (an admission without one, or not admitted)."""


def _as_done(cr: api.NodeWright, node: NodeFacts) -> NodeFacts:
    """The node as it will be once the current target is complete on it and released."""
    packages = {
        name: PackageRecord(
            version=d.version,
            stage="done",
            state="succeeded",
            installed="" if d.uninstall_requested else d.version,
            config=d.config_digest,
            updated=datetime.min,
        )
        for name, d in progress.desired(cr).items()
    }
    return replace(
        node,
        selection=None,
        drain=None,
        executor=ExecutorRecord(packages=packages),
        validator=ValidatorRecord(validated=progress.target_digest(cr)),
    )


def simulate(
    *,
    cr: api.NodeWright,
    policy: api.DeploymentPolicy | None,
    nodes: Sequence[NodeFacts],
    book: BatchBook,
    ctx: Context,
    max_steps: int = 10_000,
) -> tuple[list[PlannedBatch], Plan]:
    """The batches the rollout will run from the current state, assuming every batch
    succeeds, maintenance windows are open, priority gates clear and shared budgets allow
    (they only delay admissions, never change batch membership). Returns the batches in
    order (the one in flight first) and the first decision (what happens now)."""
    ctx = replace(ctx, ignore_windows=True, priority_waits={}, caps=())
    state = {n.name: n for n in nodes}
    batches = [
        PlannedBatch(name, c.state.current_batch, c.nodes, in_flight=True)
        for name, c in book.compartments.items()
        if c.nodes
    ]
    seen = {(b.compartment, b.batch) for b in batches}
    orders = {n.name: n.selection.order for n in nodes if n.selection is not None}
    first: Plan | None = None
    for _ in range(max_steps):
        p = plan(cr=cr, policy=policy, nodes=list(state.values()), book=book, ctx=ctx)
        first = first or p
        for a in p.admit:
            orders[a.node] = a.selection.order
        opened = False
        for comp in p.compartments:
            key = (comp.name, comp.batch.state.current_batch)
            if comp.batch.nodes and key not in seen:
                seen.add(key)
                batches.append(PlannedBatch(comp.name, key[1], comp.batch.nodes))
                opened = True
        progressed = False
        for comp in p.compartments:
            for name in comp.batch.nodes:
                n = state.get(name)
                if n is not None and not progress.node_done(cr, n) and not progress.failed(cr, n):
                    state[name] = _as_done(cr, n)
                    progressed = True
        for name, n in list(state.items()):
            if n.selection is not None and not progress.failed(cr, n):
                state[name] = _as_done(cr, n)
                progressed = True
        book = p.book
        if not opened and not progressed:
            break
    assert first is not None
    batches = [replace(b, orders=tuple(orders.get(n) for n in b.nodes)) for b in batches]
    return batches, first
