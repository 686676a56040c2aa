"""The status service's pure path for tests: the kernel's decision over the given nodes
alone (no other NodeWright: no shared budgets, no priority), then the node views."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from services.status import assessing, core
from services.status.assessing import NodeView, Observed
from shared import api, nodestate
from shared.rollout import kernel
from shared.rollout.book import read_batch_book


def decided(
    cr: api.NodeWright,
    policy: api.DeploymentPolicy | None,
    observed: Sequence[Observed],
    now: datetime,
) -> kernel.Plan:
    return kernel.plan(
        cr=cr,
        policy=policy,
        nodes=[o.facts for o in observed],
        book=read_batch_book(cr.metadata.annotations),
        ctx=kernel.Context(
            now=now, policy_missing=bool(cr.spec.deployment_policy) and policy is None
        ),
    )


def assess(
    cr: api.NodeWright,
    policy: api.DeploymentPolicy | None,
    observed: Sequence[Observed],
    now: datetime,
) -> tuple[list[NodeView], kernel.Plan]:
    plan = decided(cr, policy, observed, now)
    return assessing.assess(cr, observed, now, plan), plan


def written(node: dict[str, Any], cr: str, update: core.NodeUpdate) -> None:
    """``node`` (changed in place) as the status service leaves it after writing ``update``."""
    if update.remove_record is not None:
        node["metadata"]["annotations"].pop(nodestate.key(nodestate.STATUS, cr), None)
    if update.write_condition:
        ctype = assessing.condition_type(cr)
        status = node.setdefault("status", {})
        conds: list[Mapping[str, Any]] = [
            c for c in status.get("conditions") or () if c.get("type") != ctype
        ]
        if update.condition is not None:
            conds.append(dict(update.condition))
        status["conditions"] = conds
