"""The five phases of one rollout decision (docs/rollouts.md): :func:`reset`, :func:`account`,
:func:`open_batch`, :func:`admit` and :func:`explain`, each a function of the
:class:`shared.rollout.view.View` and what the phases before it returned.

Pure. Putting them together is :func:`shared.rollout.kernel.plan`'s job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import msgspec

from shared import api, progress, reasons
from shared.events import Reason
from shared.progress import NodeFacts
from shared.records.scheduler import Selection
from shared.rollout import approvals, rules, slots
from shared.rollout.book import (
    RESET_ANNOTATION,
    BatchBook,
    CompartmentBatch,
    versions_digest,
)
from shared.rollout.plans import Admit, CompartmentWait, NodeVerdict, SharedCap
from shared.rollout.rules import CompartmentRule
from shared.rollout.view import View

# ---- phase 1: reset -------------------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    """The batch state a decision starts from, after the resets."""

    compartments: Mapping[str, CompartmentBatch]
    admitted: int
    versions: str
    token: str
    notes: tuple[str, ...] = ()


def _first_order(cr: api.NodeWright, nodes: Sequence[NodeFacts]) -> int:
    """The first node order of a rollout that starts now: 0, unless a node admitted before
    the reset still holds its admission and has work left (a failed node kept admitted, a
    node in progress when the versions changed: it runs the new packages with its order);
    then one past the highest such order, so no two nodes with work left share an order."""
    held = [
        n.selection.order
        for n in nodes
        if n.selection is not None
        and n.selection.order is not None
        and not progress.node_done(cr, n)
    ]
    return max(held) + 1 if held else 0


def reset(v: View, policy: api.DeploymentPolicy | None, book: BatchBook) -> Start:
    cr = v.cr
    on_completion, on_version = rules.reset_flags(cr, policy)
    versions = versions_digest(cr)
    token = cr.metadata.annotations.get(RESET_ANNOTATION, "")
    compartments = dict(book.compartments)
    admitted = book.admitted
    notes: list[str] = []
    if token and token != book.reset_token:
        compartments, admitted = {}, _first_order(cr, v.targets)
        notes.append("batch state reset by annotation")
    elif book.versions and book.versions != versions and on_version:
        compartments, admitted = {}, _first_order(cr, v.targets)
        notes.append("batch state reset: package versions changed")
    all_done = bool(v.targets) and all(progress.node_done(cr, n) for n in v.targets)
    started = admitted or any(
        c.nodes or c.state != api.BatchState() or c.planned for c in compartments.values()
    )
    if all_done and on_completion and started:
        compartments, admitted = {}, _first_order(cr, v.targets)
        notes.append("batch state reset: rollout complete")
    return Start(compartments, admitted, versions, token, tuple(notes))


# ---- phase 2: account -----------------------------------------------------------------------


@dataclass(frozen=True)
class Accounted:
    """A compartment with its batch in flight judged (and finished, if nothing of it runs)."""

    rule: CompartmentRule
    entry: CompartmentBatch
    matched: int
    budget: int
    busy: int
    holders: tuple[tuple[str, str], ...]
    note: str = ""


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
    now: datetime,
) -> tuple[CompartmentBatch, str]:
    """Judge a finished batch and prepare the next one (its soak counts from ``now``)."""
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
    planned = rules.next_size(
        rollout, last, passed=passed, done_percent=done_percent, budget=budget
    )
    state = api.BatchState(
        current_batch=st.current_batch + 1,
        batch_size=0,
        total_succeeded_nodes=st.total_succeeded_nodes + success,
        total_failed_nodes=st.total_failed_nodes + failure,
        consecutive_failed_batches=consecutive,
        last_batch_failed=passed is False if passed is not None else st.last_batch_failed,
        stopped=stopped,
        stop_reason=reasons.STOPPED_AFTER_FAILED_BATCHES if stopped else "",
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
    return CompartmentBatch(state=state, planned=planned, finished=now), text


def account(v: View, rule: CompartmentRule, entry: CompartmentBatch) -> Accounted:
    cr = v.cr
    mine = v.members(rule.name)
    matched = len(mine)
    budget = rules.budget_nodes(rule.rollout.budget, matched)
    holders = v.holders(rule.name)
    base = Accounted(rule, entry, matched, budget, len(holders), holders)
    if not entry.nodes:
        return base
    success = failure = 0
    running = False
    for name in entry.nodes:
        member = v.by_name.get(name)
        if member is None or (v.assigned.get(name) != rule.name and member.selection is None):
            continue  # gone from the compartment: left out
        t = progress.turn(cr, member)
        why = v.ineligible[name]
        if t in ("done", "release"):
            success += 1
        elif t == "failed":
            failure += 1
        elif _blocked(cr, member) or (member.selection is None and why is not None):
            if why is not None and why.code in (reasons.PAUSED, reasons.DISABLED):
                running = True  # paused, not blocked: the batch waits
            elif rule.rollout.blocked_nodes_count_as_failed:
                failure += 1
        else:
            running = True
    if running:
        state = msgspec.structs.replace(
            entry.state,
            batch_size=len(entry.nodes),
            batch_succeeded_nodes=success,
            batch_failed_nodes=failure,
        )
        return Accounted(
            rule,
            msgspec.structs.replace(entry, state=state),
            matched,
            budget,
            len(holders),
            holders,
        )
    done_count = sum(1 for n in mine if progress.node_done(cr, n))
    done_percent = done_count * 100 // matched if matched else 0
    finished, note = _finish(
        rule, entry, success, failure, done_percent=done_percent, budget=budget, now=v.ctx.now
    )
    return Accounted(rule, finished, matched, budget, len(holders), holders, note)


# ---- phase 3: open --------------------------------------------------------------------------


@dataclass(frozen=True)
class Opened:
    entry: CompartmentBatch
    admitted: int
    """The node-order counter after this compartment."""
    wait: Reason | None = None
    """Why no batch opened although nodes wait (stopped, soaking, settling, budget)."""
    note: str = ""
    wake: datetime | None = None
    """When the wait ends by itself (the soak's end): decide again then."""


def _budget_reason(
    compartment: str, busy: int, budget: int, holders: Sequence[tuple[str, str]]
) -> Reason:
    named = slots.describe(holders)
    return Reason(
        code=reasons.BUDGET_EXHAUSTED,
        message=f"{busy} of {budget} budgeted nodes of compartment {compartment} are busy"
        + (f": {named}" if named else ""),
        details={
            "budget": str(budget),
            "inProgress": str(busy),
            "holders": ",".join(n for n, _ in holders)[:256],
        },
    )


def _join(v: View, acc: Accounted, admitted: int) -> Opened:
    """The batch in flight takes in the due nodes that hold a slot without being admitted
    (cordoned by someone else) when a member of it waits for a slot: they cost none, and left
    out they would hold the slot the member waits for until the batch finished, which it
    never would (each waits for the other)."""
    entry = acc.entry
    members = [v.by_name[n] for n in entry.nodes if n in v.by_name]
    starved = [n for n in members if v.due(n) and v.gate(n) is None and n.name not in v.holds]
    if not starved or acc.busy + 1 <= acc.budget:
        return Opened(entry, admitted)
    joiners = tuple(
        n.name
        for n in v.members(acc.rule.name)
        if n.name not in entry.nodes
        and v.due(n)
        and v.gate(n) is None
        and v.holds.get(n.name) == slots.CORDONED
    )
    if not joiners:
        return Opened(entry, admitted)
    orders = entry.orders
    if len(orders) == len(entry.nodes):
        orders = (*orders, *range(admitted, admitted + len(joiners)))
        admitted += len(joiners)
    nodes = (*entry.nodes, *joiners)
    joined = msgspec.structs.replace(
        entry,
        nodes=nodes,
        orders=orders,
        state=msgspec.structs.replace(entry.state, batch_size=len(nodes)),
    )
    note = (
        f"compartment {acc.rule.name} batch {entry.state.current_batch} took in "
        f"{', '.join(joiners)} (cordoned by someone else, holding the slot its nodes wait for)"
    )
    return Opened(joined, admitted, note=note)


def _approval_reason(v: View, compartment: str, batch: int, finished: datetime | None) -> Reason:
    command = f"nodewright approve {v.cr.metadata.name} --compartment {compartment}"
    problem = f" ({v.approvals.error})" if v.approvals.error else ""
    return Reason(
        code=reasons.BATCH_AWAITING_APPROVAL,
        message=(
            f"compartment {compartment} waits for approval after batch {batch} "
            f"(approvalAfterBatches){problem}: check its nodes, then `{command}`"
        ),
        details={
            "batch": str(batch),
            "finished": finished.isoformat() if finished is not None else "",
            "command": command,
        },
    )


def open_batch(v: View, acc: Accounted, admitted: int) -> Opened:
    cr, rule, entry = v.cr, acc.rule, acc.entry
    if entry.nodes:
        return _join(v, acc, admitted)
    mine = v.members(rule.name)
    candidates = [n for n in mine if v.due(n) and v.gate(n) is None]
    if not candidates:
        return Opened(entry, admitted)
    state = entry.state
    if state.stopped:
        wait = Reason(
            code=reasons.COMPARTMENT_STOPPED,
            message=f"compartment {rule.name} stopped: {state.stop_message}",
        )
        return Opened(entry, admitted, wait)
    soak = rule.rollout.batch_soak_seconds
    if soak and entry.finished is not None:
        until = entry.finished + timedelta(seconds=soak)
        if v.ctx.now < until:
            wait = Reason(
                code=reasons.BATCH_SOAKING,
                message=(
                    f"compartment {rule.name} soaks after batch {state.current_batch - 1} until "
                    f"{until.isoformat(timespec='seconds')} (batchSoakSeconds: {soak})"
                ),
                details={"until": until.isoformat(), "batchSoakSeconds": str(soak)},
            )
            return Opened(entry, admitted, wait, wake=until)
    gated = approvals.gated_batch(rule.rollout, entry)
    if gated is not None and not approvals.approved(v.approvals, rule.name, gated, entry.finished):
        return Opened(entry, admitted, _approval_reason(v, rule.name, gated, entry.finished))
    free = acc.budget - acc.busy
    size = entry.planned or rules.first_size(rule.rollout, acc.budget)
    # Nodes of the last batch that are done but not released yet free their slots in a
    # moment: opening the batch now would make it smaller than its strategy says for no
    # lasting reason.
    settling = sum(1 for n in mine if n.selection is not None and progress.node_done(cr, n))
    if settling and free < min(size, len(candidates)):
        wait = Reason(
            code=reasons.WAITING_FOR_BATCH,
            message=f"{settling} nodes of compartment {rule.name}'s last batch are being released",
        )
        return Opened(entry, admitted, wait)
    if free <= 0 and not any(n.name in v.holds for n in candidates):
        return Opened(entry, admitted, _budget_reason(rule.name, acc.busy, acc.budget, acc.holders))
    # A node that already holds a slot (cordoned by someone else) costs none.
    picked: list[str] = []
    used = 0
    for n in candidates:
        if len(picked) >= size:
            break
        cost = 0 if n.name in v.holds else 1
        if used + cost <= free:
            picked.append(n.name)
            used += cost
    chosen = tuple(picked)
    opened = CompartmentBatch(
        state=msgspec.structs.replace(
            state, batch_size=len(chosen), batch_succeeded_nodes=0, batch_failed_nodes=0
        ),
        nodes=chosen,
        planned=size,
        orders=tuple(range(admitted, admitted + len(chosen))),
    )
    note = f"compartment {rule.name} batch {state.current_batch} opened with {len(chosen)} nodes"
    return Opened(opened, admitted + len(chosen), note=note)


# ---- phase 4: admit -------------------------------------------------------------------------


@dataclass(frozen=True)
class Admitted:
    admit: tuple[Admit, ...]
    waiting: Mapping[str, Reason]
    """Members of the batch in flight that are due but may not start now, with why."""
    admitted: int
    cap_taken: Mapping[str, frozenset[str]]
    """Per shared budget, the nodes it holds after this compartment's admissions."""


def _cap_reason(cap: SharedCap, taken: frozenset[str], added: Mapping[str, str]) -> Reason:
    holders = [(n, cap.holders.get(n) or added.get(n, "being admitted")) for n in taken]
    return Reason(
        code=cap.code,
        message=f"{len(taken)} of {cap.limit} nodes of the {cap.name} are disrupted: "
        + slots.describe(holders),
        details={"budget": str(cap.limit), "inProgress": str(len(taken))},
    )


def admit(
    v: View,
    acc: Accounted,
    opened: Opened,
    cap_taken: Mapping[str, frozenset[str]],
) -> Admitted:
    cr, rule, entry = v.cr, acc.rule, opened.entry
    taken = dict(cap_taken)
    admitted = opened.admitted
    busy = acc.busy
    target = progress.target_digest(cr)
    reserved = (
        dict(zip(entry.nodes, entry.orders, strict=True))
        if len(entry.orders) == len(entry.nodes)
        else {}
    )
    out: list[Admit] = []
    waiting: dict[str, Reason] = {}
    for name in entry.nodes:
        n = v.by_name.get(name)
        if n is None or not v.due(n):
            continue
        why = v.gate(n)
        cost = 0 if name in v.holds else 1
        if why is None and busy + cost > acc.budget:
            why = _budget_reason(rule.name, busy, acc.budget, acc.holders)
        if why is None:
            for cap in v.ctx.caps:
                held = taken.get(cap.name, frozenset(cap.holders))
                if name not in held and len(held) >= cap.limit:
                    mine = {a.node: f"being admitted by NodeWright {cr.metadata.name}" for a in out}
                    why = _cap_reason(cap, held, mine)
                    break
        if why is not None:
            waiting[name] = why
            continue
        for cap in v.ctx.caps:
            taken[cap.name] = taken.get(cap.name, frozenset(cap.holders)) | {name}
        busy += cost
        out.append(
            Admit(
                node=name,
                selection=Selection(
                    generation=cr.metadata.generation,
                    compartment=rule.name,
                    batch=entry.state.current_batch,
                    selected_at=v.ctx.now,
                    disruptive=progress.disruptive(cr, n),
                    target=target,
                    order=reserved.get(name, admitted),
                ),
                resource_version=n.resource_version,
            )
        )
        if name not in reserved:
            admitted += 1  # a book from before reservations: the next order
    return Admitted(tuple(out), waiting, admitted, taken)


# ---- phase 5: explain -----------------------------------------------------------------------


def compartment_wait(
    waiting: Sequence[tuple[str, Reason]], batch_nodes: frozenset[str] | None
) -> CompartmentWait | None:
    """The wait that holds a compartment back, from its nodes that wait to be admitted
    (node, reason): with a batch in flight (``batch_nodes``) a wait of one of its members,
    between batches a wait of any node; the first of :data:`shared.reasons.COMPARTMENT_WAITS`
    that holds."""
    relevant = [(n, r) for n, r in waiting if batch_nodes is None or n in batch_nodes]
    for code in reasons.COMPARTMENT_WAITS:
        hits = sorted((n, r) for n, r in relevant if r.code == code)
        if hits:
            return CompartmentWait(
                code=code, message=hits[0][1].message, example=hits[0][0], nodes=len(hits)
            )
    return None


def explain(
    v: View,
    acc: Accounted,
    opened: Opened,
    admitted: Admitted,
) -> tuple[dict[str, NodeVerdict], CompartmentWait | None]:
    """The verdict of every node of the compartment the scheduler has not admitted, and the
    compartment's wait."""
    rule, entry = acc.rule, opened.entry
    due = {a.node for a in admitted.admit}
    # One reason object for every node that shares it (Reason is frozen): a pass explains
    # each waiting node of the compartment, 9,000 of them in the first batch of 10,000.
    admitting = Reason(
        code=reasons.ADMITTING,
        message=f"being admitted into batch {entry.state.current_batch} of compartment {rule.name}",
    )
    batch_wait = opened.wait or Reason(
        code=reasons.WAITING_FOR_BATCH,
        message=f"waiting for batch {entry.state.current_batch} of compartment "
        f"{rule.name} to finish",
    )
    verdicts: dict[str, NodeVerdict] = {}
    for n in v.members(rule.name):
        if n.selection is not None or progress.turn(v.cr, n) != "scheduler":
            continue
        if n.name in due:
            verdicts[n.name] = NodeVerdict(n.name, rule.name, admitting, due=True)
            continue
        why = admitted.waiting.get(n.name) or v.gate(n) or batch_wait
        verdicts[n.name] = NodeVerdict(n.name, rule.name, why, blocked=why.code in reasons.BLOCKING)
    waits = [(name, x.reason) for name, x in verdicts.items() if not x.blocked and not x.due]
    batch_nodes = frozenset(entry.nodes) if entry.state.batch_size and entry.nodes else None
    return verdicts, compartment_wait(waits, batch_nodes)
