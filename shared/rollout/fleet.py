"""The kernel's front door: the whole cluster as the scheduler, the status service and
``nodewright plan`` see it, turned into one NodeWright's decision.

:class:`Fleet` holds every NodeWright, every DeploymentPolicy, every Node object and the
scheduler's :class:`Settings`; :func:`decide` derives what one NodeWright's decision needs
from the others (the shared budgets with the nodes holding them, priority and sequencing,
whether its policy exists) and calls :func:`shared.rollout.kernel.plan`. All three callers
go through here, so they count the same holders and give the same reasons.

Per-node facts come from ``facts_of`` (``shared.progress.facts`` or a :class:`FactsCache`),
a function of one node object and one NodeWright name only: a cache keyed by the node's
resourceVersion stays valid whatever happens to the other nodes.

Pure. Reading the caches is the callers' job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shared import api, nodestate, progress, reasons
from shared.progress import NodeFacts
from shared.rollout import kernel, rules
from shared.rollout.book import BatchBook, read_batch_book
from shared.rollout.rules import FactsOf


@dataclass(frozen=True)
class Settings:
    """The scheduler's settings the decision depends on."""

    cluster_budget: int | None = None
    """``NODEWRIGHT_SCHEDULER_CLUSTER_BUDGET``: the most distinct nodes all NodeWrights
    disrupt at once (None: unlimited)."""


def recorded_settings(crs: Sequence[api.NodeWright]) -> Settings:
    """The settings the scheduler recorded in the batch books (for readers without the
    scheduler's environment: the status service, ``nodewright plan``): the cluster budget of
    the first book, by NodeWright name, that records one."""
    for cr in sorted(crs, key=lambda c: c.metadata.name):
        budget = read_batch_book(cr.metadata.annotations).cluster_budget
        if budget is not None:
            return Settings(cluster_budget=budget)
    return Settings()


class FactsCache:
    """``shared.progress.facts`` memoised per (node, NodeWright) and the node's
    resourceVersion: a node that did not change is not decoded again."""

    def __init__(self) -> None:
        self._memo: dict[tuple[str, str], tuple[str, NodeFacts]] = {}

    def __call__(self, node: Mapping[str, Any], cr: str) -> NodeFacts:
        meta = node.get("metadata") or {}
        key = (str(meta.get("name", "")), cr)
        version = str(meta.get("resourceVersion") or "")
        hit = self._memo.get(key)
        if hit is not None and version and hit[0] == version:
            return hit[1]
        facts = progress.facts(node, cr)
        self._memo[key] = (version, facts)
        return facts

    def forget(self, node: str) -> None:
        """Drop a deleted node's entries."""
        for key in [k for k in self._memo if k[0] == node]:
            del self._memo[key]


def wake_signature(
    crs: Sequence[api.NodeWright], node: Mapping[str, Any], facts_of: FactsOf = progress.facts
) -> tuple[object, ...]:
    """What of one node the decisions of ``crs`` read, compared by ``==`` (not hashable): a
    node change that leaves it equal changes no NodeWright's plan, so it need not wake the
    scheduler (the executor's and validator's steps between its admission and its
    validation, the status service's node condition, outbox drains: ~15 of the ~20 changes
    a node goes through in a rollout, each a pass over every node; issue 15).

    Per NodeWright: the node's labels, taints, readiness, cordon, creation, the scheduler's
    and drainer's records, undecodable records and recovery requests, and what the kernel
    derives from the executor's and validator's records (``progress.turn``, ``failed``,
    ``node_done``, ``disruptive``); the resourceVersion of a node the NodeWright may admit
    (a batch book's fence entry holds while the node has not changed); and every
    NodeWright holding the node (:func:`_holders`, gone ones included). A kernel phase that
    starts reading more of a node must add it here (``tests/shared/rollout``'s replay checks
    that equal signatures give equal plans)."""
    parts: list[object] = [nodestate.crs_with(node, nodestate.SCHEDULER)]
    for cr in crs:
        f = facts_of(node, cr.metadata.name)
        turn = progress.turn(cr, f)
        parts.append(
            (
                f.labels,
                f.taints,
                f.ready,
                f.unschedulable,
                f.created,
                f.selection,
                f.drain,
                f.malformed,
                f.marks,
                f.requests,
                turn,
                progress.failed(cr, f),
                progress.node_done(cr, f),
                progress.disruptive(cr, f),
                f.resource_version if f.selection is None and turn == "scheduler" else "",
            )
        )
    return tuple(parts)


@dataclass(frozen=True)
class Fleet:
    """Everything a rollout decision reads."""

    crs: Sequence[api.NodeWright]
    """Every NodeWright that decodes."""
    policies: Mapping[str, api.DeploymentPolicy]
    """Every DeploymentPolicy that decodes, by name."""
    nodes: Sequence[Mapping[str, Any]]
    settings: Settings = field(default_factory=Settings)
    facts_of: FactsOf = progress.facts
    nodes_seen: str = ""
    """The resourceVersion up to which ``nodes`` has every change (the node informer's
    progress; "": unknown, not checked against the book's fence)."""


def _holders(fleet: Fleet) -> dict[str, dict[str, str]]:
    """NodeWright -> node -> why, for every node a NodeWright holds for the shared budgets:
    admitted by it (its scheduler record, even one that does not decode), or being admitted
    by it (its book's fence entry, the node unchanged since)."""
    out: dict[str, dict[str, str]] = {}
    versions: dict[str, str] = {}
    for n in fleet.nodes:
        meta = n.get("metadata") or {}
        name = str(meta.get("name", ""))
        versions[name] = str(meta.get("resourceVersion") or "")
        for owner in nodestate.crs_with(n, nodestate.SCHEDULER):
            out.setdefault(owner, {})[name] = f"admitted by NodeWright {owner}"
    for cr in fleet.crs:
        owner = cr.metadata.name
        held = out.setdefault(owner, {})
        for node, version in read_batch_book(cr.metadata.annotations).admitting.items():
            if node not in held and versions.get(node) == version:
                held[node] = f"being admitted by NodeWright {owner}"
    return out


def shared_caps(
    cr: api.NodeWright, policy: api.DeploymentPolicy | None, fleet: Fleet
) -> tuple[kernel.SharedCap, ...]:
    """The budgets ``cr`` shares with other NodeWrights, with the distinct nodes holding
    them now: the cluster budget (every NodeWright) and the policy's sharedBudget (the
    NodeWrights referencing the policy; a percent is of the union of their target nodes)."""
    limit = fleet.settings.cluster_budget
    shared_budget = policy.spec.shared_budget if policy is not None else None
    if limit is None and shared_budget is None:
        return ()  # no budget shared: no scan of every node's holders
    held = _holders(fleet)
    caps: list[kernel.SharedCap] = []
    if limit is not None:
        everyone: dict[str, str] = {}
        for owner in sorted(held):
            for node, why in held[owner].items():
                everyone.setdefault(node, why)
        caps.append(
            kernel.SharedCap(
                name="cluster budget",
                code=reasons.CLUSTER_BUDGET_EXHAUSTED,
                limit=limit,
                holders=everyone,
            )
        )
    if policy is not None and shared_budget is not None:
        peers = [o for o in fleet.crs if o.spec.deployment_policy == policy.metadata.name]
        scope = {
            str(n["metadata"]["name"])
            for n in fleet.nodes
            for o in peers
            if progress.selector_matches(o.spec.node_selectors, n["metadata"].get("labels") or {})
        }
        theirs: dict[str, str] = {}
        for o in sorted(peers, key=lambda o: o.metadata.name):
            for node, why in held.get(o.metadata.name, {}).items():
                theirs.setdefault(node, why)
        caps.append(
            kernel.SharedCap(
                name=f"sharedBudget of DeploymentPolicy {policy.metadata.name}",
                code=reasons.SHARED_BUDGET_EXHAUSTED,
                limit=rules.budget_nodes(shared_budget, len(scope)),
                holders=theirs,
            )
        )
    return tuple(caps)


def decide(
    fleet: Fleet,
    cr: api.NodeWright,
    now: datetime,
    *,
    book: BatchBook | None = None,
    ignore_windows: bool = False,
    explain_waits: bool = True,
) -> kernel.Plan:
    """``cr``'s decision now, from its batch book (``book``, default: the one on ``cr``);
    ``explain_waits``: see :func:`shared.rollout.kernel.plan`."""
    policy = None
    if cr.spec.deployment_policy:
        policy = fleet.policies.get(cr.spec.deployment_policy)
    name = cr.metadata.name
    return kernel.plan(
        cr=cr,
        policy=policy,
        nodes=[fleet.facts_of(n, name) for n in fleet.nodes],
        book=book if book is not None else read_batch_book(cr.metadata.annotations),
        ctx=kernel.Context(
            now=now,
            caps=shared_caps(cr, policy, fleet),
            priority_waits=rules.priority_waits(cr, fleet.crs, fleet.nodes, fleet.facts_of),
            policy_missing=bool(cr.spec.deployment_policy) and policy is None,
            ignore_windows=ignore_windows,
            cluster_budget=fleet.settings.cluster_budget,
            nodes_seen=fleet.nodes_seen,
        ),
        explain_waits=explain_waits,
    )
