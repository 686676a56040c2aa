"""The rollout rules that are plain functions of the spec: budgets in nodes, compartments and
which one a node belongs to, batch sizes by strategy, maintenance windows, priority and
sequencing across NodeWrights, and when the batch state resets.

Pure. Applying them to a fleet, batch by batch, is :mod:`shared.rollout.kernel`'s job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from shared import api, progress
from shared.progress import NodeFacts

DEFAULT_COMPARTMENT: Final = "__default__"
"""The compartment of nodes no policy compartment selects (and of every node without a
policy). Policy compartment names are DNS labels, so it cannot clash with one."""


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
        r.name: {n.name for n in targets if progress.selector_matches(r.selector, n.labels)}
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


# ---- batch sizes ----------------------------------------------------------------------------


def first_size(rollout: api.Rollout, budget: int) -> int:
    """The nominal size of a compartment's first batch, capped by its budget."""
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


FactsOf = Callable[[Mapping[str, Any], str], NodeFacts]
"""``(node object, NodeWright name) -> facts``: ``shared.progress.facts`` or a cache of it."""


def priority_waits(
    cr: api.NodeWright,
    crs: Sequence[api.NodeWright],
    nodes: Sequence[Mapping[str, Any]],
    facts_of: FactsOf = progress.facts,
) -> dict[str, str]:
    """Target node of ``cr`` -> the NodeWright it waits for, by priority and sequencing.

    A NodeWright ahead of ``cr`` (lower priority number, ties by name; not disabled, not
    being deleted) with sequencing ``node`` holds back ``cr`` on each of its own target nodes
    until it is done there; with ``all`` it holds back ``cr`` on every node until it is done
    on all its target nodes. A paused NodeWright still holds others back (it is not done).
    """
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
    if not ahead:
        return {}  # the common case: no scan of every node
    mine = [n for n in nodes if progress.selector_matches(cr.spec.node_selectors, _labels(n))]
    if not mine:
        return {}
    out: dict[str, str] = {}
    for other in ahead:
        name = other.metadata.name
        theirs = [
            n for n in nodes if progress.selector_matches(other.spec.node_selectors, _labels(n))
        ]
        pending = {
            str(n["metadata"]["name"])
            for n in theirs
            if progress.turn(other, facts_of(n, name)) != "done"
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
