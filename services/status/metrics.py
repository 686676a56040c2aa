"""The Prometheus gauges of one NodeWright, as data: built here from a status pass, exported
by the status shell's collector.

From the NodeWright, its DeploymentPolicy (None when it references none, or a missing one),
the status :func:`services.status.core.summarize` computed and the node views of the same
pass, :func:`samples` gives every sample of the NodeWright: its state, nodes per state,
nodes per package version state and stage, retries per package version, and the rollout
progress of each compartment (docs/metrics.md lists them, with the reference's names).

Samples are computed, never accumulated: each pass replaces the NodeWright's samples whole,
so the series of a package version, a compartment or a NodeWright that is gone disappear
with it, instead of lingering or being reset by hand. Package series exist for exactly the
versions of ``status.packages`` (bounded there), compartment series for exactly
``status.compartments``. Equal input gives an equal, ordered output. Pure: no I/O; the
registry and the HTTP endpoint are the shell's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, get_args

from services.status.assessing import NodeView
from shared import api, reasons
from shared.rollout import rules

PREFIX: Final = "nodewright_"

NO_POLICY: Final = "none"
"""The policy label of a NodeWright without spec.deploymentPolicy (the reference: legacy)."""
NO_STRATEGY: Final = "none"
"""The strategy label of a compartment whose rollout sets none (batches as large as the
budget)."""
UNKNOWN_STRATEGY: Final = "unknown"
"""The strategy label of a compartment no rule names (should not occur)."""

STAGES: Final[tuple[str, ...]] = (
    "apply",
    "upgrade",
    "config",
    "interrupt",
    "post-interrupt",
    "uninstall",
)
"""The stages a package record can be at, as the executor writes them."""

PACKAGE_STATES: Final[tuple[str, ...]] = ("complete", "in_progress", "failed", "uninstalling")
"""Disjoint states of a package version on a node, as counted in status.packages[]."""

_NODE_STATES: Final[tuple[tuple[api.NodeState, Callable[[api.NodeCounts], int]], ...]] = (
    ("Waiting", lambda n: n.waiting),
    ("InProgress", lambda n: n.in_progress),
    ("Complete", lambda n: n.complete),
    ("Failed", lambda n: n.failed),
    ("Blocked", lambda n: n.blocked),
)
"""The states status.nodeCounts counts (every target node is in exactly one) and its field."""


@dataclass(frozen=True)
class Family:
    """One gauge: its name, help text and label names, in exposition order."""

    name: str
    help: str
    labels: tuple[str, ...]


@dataclass(frozen=True)
class Sample:
    """One series of one gauge and its value."""

    metric: str
    labels: Mapping[str, str]
    value: int


_NW: Final = ("nodewright",)
_PKG: Final = ("nodewright", "package", "version")
_ROLLOUT: Final = ("nodewright", "policy", "compartment", "strategy")

STATUS: Final = Family(
    f"{PREFIX}status",
    "1 for the NodeWright's current status.state, 0 for every other state",
    (*_NW, "status"),
)
NODES: Final = Family(
    f"{PREFIX}nodes", "Target nodes per state (status.nodeCounts)", (*_NW, "status")
)
TARGET_NODES: Final = Family(f"{PREFIX}target_nodes", "Nodes matching spec.nodeSelectors", _NW)
PACKAGE_NODES: Final = Family(
    f"{PREFIX}package_nodes",
    "Nodes per state of a package version (status.packages[])",
    (*_PKG, "state"),
)
PACKAGE_STAGE_NODES: Final = Family(
    f"{PREFIX}package_stage_nodes",
    "Nodes whose record of a package version is at this stage (current or last)",
    (*_PKG, "stage"),
)
PACKAGE_RESTARTS: Final = Family(
    f"{PREFIX}package_restarts",
    "Runs beyond the first of the current or last stage of a package version, summed over nodes",
    _PKG,
)
ROLLOUT_MATCHED_NODES: Final = Family(
    f"{PREFIX}rollout_matched_nodes", "Target nodes assigned to the compartment", _ROLLOUT
)
ROLLOUT_BUDGET_NODES: Final = Family(
    f"{PREFIX}rollout_budget_nodes",
    "The compartment's budget in nodes: the most it disrupts at once",
    _ROLLOUT,
)
ROLLOUT_IN_PROGRESS: Final = Family(
    f"{PREFIX}rollout_in_progress", "Nodes of the compartment in progress", _ROLLOUT
)
ROLLOUT_COMPLETED: Final = Family(
    f"{PREFIX}rollout_completed", "Nodes of the compartment complete", _ROLLOUT
)
ROLLOUT_FAILED: Final = Family(
    f"{PREFIX}rollout_failed", "Nodes of the compartment failed", _ROLLOUT
)
ROLLOUT_PROGRESS_PERCENT: Final = Family(
    f"{PREFIX}rollout_progress_percent",
    "Complete nodes * 100 / matched nodes of the compartment, rounded down",
    _ROLLOUT,
)
ROLLOUT_CURRENT_BATCH: Final = Family(
    f"{PREFIX}rollout_current_batch", "1-based number of the batch in flight (or next)", _ROLLOUT
)
ROLLOUT_CONSECUTIVE_FAILED_BATCHES: Final = Family(
    f"{PREFIX}rollout_consecutive_failed_batches",
    "Finished batches in a row below batchSuccessPercent",
    _ROLLOUT,
)
ROLLOUT_STOPPED: Final = Family(
    f"{PREFIX}rollout_stopped",
    "1 while the compartment's stop gate holds (no new node starts), else 0",
    _ROLLOUT,
)
ROLLOUT_AWAITING_APPROVAL: Final = Family(
    f"{PREFIX}rollout_awaiting_approval",
    "1 while the compartment waits for a person's approval after a batch "
    "(approvalAfterBatches; nodewright approve), else 0",
    _ROLLOUT,
)

FAMILIES: Final[tuple[Family, ...]] = (
    STATUS,
    NODES,
    TARGET_NODES,
    PACKAGE_NODES,
    PACKAGE_STAGE_NODES,
    PACKAGE_RESTARTS,
    ROLLOUT_MATCHED_NODES,
    ROLLOUT_BUDGET_NODES,
    ROLLOUT_IN_PROGRESS,
    ROLLOUT_COMPLETED,
    ROLLOUT_FAILED,
    ROLLOUT_PROGRESS_PERCENT,
    ROLLOUT_CURRENT_BATCH,
    ROLLOUT_CONSECUTIVE_FAILED_BATCHES,
    ROLLOUT_STOPPED,
    ROLLOUT_AWAITING_APPROVAL,
)
"""Every gauge, in the order :func:`samples` lists them."""


_ROLLOUT_VALUES: Final[tuple[tuple[Family, Callable[[api.CompartmentStatus], int]], ...]] = (
    (ROLLOUT_MATCHED_NODES, lambda c: c.matched_nodes),
    (ROLLOUT_BUDGET_NODES, lambda c: c.budget_nodes),
    (ROLLOUT_IN_PROGRESS, lambda c: c.in_progress_nodes),
    (ROLLOUT_COMPLETED, lambda c: c.complete_nodes),
    (ROLLOUT_FAILED, lambda c: c.failed_nodes),
    (ROLLOUT_PROGRESS_PERCENT, lambda c: c.progress_percent),
    (ROLLOUT_CURRENT_BATCH, lambda c: c.batch.current_batch),
    (ROLLOUT_CONSECUTIVE_FAILED_BATCHES, lambda c: c.batch.consecutive_failed_batches),
    (ROLLOUT_STOPPED, lambda c: int(c.batch.stopped)),
    (
        ROLLOUT_AWAITING_APPROVAL,
        lambda c: int(c.waiting_reason == reasons.BATCH_AWAITING_APPROVAL),
    ),
)
"""The rollout gauges and the compartment status field each exports."""


def _sample(family: Family, value: int, *values: str) -> Sample:
    return Sample(family.name, dict(zip(family.labels, values, strict=True)), value)


def samples(
    cr: api.NodeWright,
    policy: api.DeploymentPolicy | None,
    status: api.NodeWrightStatus,
    views: Sequence[NodeView],
) -> list[Sample]:
    """Every sample of ``cr`` after a status pass that computed ``status`` from ``views``,
    grouped by gauge in :data:`FAMILIES` order."""
    name = cr.metadata.name
    out = [
        _sample(STATUS, int(state == status.state), name, state)
        for state in get_args(api.RolloutState)
    ]
    counts = status.node_counts
    out.extend(_sample(NODES, count(counts), name, s) for s, count in _NODE_STATES)
    out.append(_sample(TARGET_NODES, counts.target, name))
    out.extend(_packages(name, status.packages, views))
    out.extend(_rollouts(cr, policy, status.compartments))
    return out


def _packages(
    name: str, packages: Sequence[api.PackageStatus], views: Sequence[NodeView]
) -> list[Sample]:
    """Package series for exactly the versions status.packages lists; stages and retries
    from the executor records of every node the pass saw (as status.packages counts them)."""
    listed = [(p.name, p.version) for p in packages]
    stages: dict[tuple[str, str, str], int] = {}
    restarts = dict.fromkeys(listed, 0)
    for v in views:
        for pkg, rec in v.facts.executor.packages.items():
            key = (pkg, rec.version)
            if key not in restarts:
                continue
            stages[(*key, rec.stage)] = stages.get((*key, rec.stage), 0) + 1
            restarts[key] += max(rec.attempt - 1, 0)
    out: list[Sample] = []
    for p in packages:
        values = {
            "complete": p.complete_nodes,
            "in_progress": p.in_progress_nodes,
            "failed": p.failed_nodes,
            "uninstalling": p.uninstalling_nodes,
        }
        out.extend(
            _sample(PACKAGE_NODES, values[s], name, p.name, p.version, s) for s in PACKAGE_STATES
        )
    for pkg, version in listed:
        out.extend(
            _sample(PACKAGE_STAGE_NODES, stages.get((pkg, version, s), 0), name, pkg, version, s)
            for s in STAGES
        )
    out.extend(_sample(PACKAGE_RESTARTS, restarts[key], name, *key) for key in listed)
    return out


def _rollouts(
    cr: api.NodeWright,
    policy: api.DeploymentPolicy | None,
    compartments: Sequence[api.CompartmentStatus],
) -> list[Sample]:
    """Rollout series for exactly the compartments status.compartments lists."""
    strategies = {
        r.name: rules.strategy_kind(r.rollout) or NO_STRATEGY
        for r in rules.compartment_rules(cr, policy)
    }
    policy_name = cr.spec.deployment_policy or NO_POLICY
    return [
        _sample(
            family,
            value_of(c),
            cr.metadata.name,
            policy_name,
            c.name,
            strategies.get(c.name, UNKNOWN_STRATEGY),
        )
        for family, value_of in _ROLLOUT_VALUES
        for c in compartments
    ]
