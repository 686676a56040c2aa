"""The status service's pure path for tests: the kernel's decision over the given nodes
alone (no other NodeWright: no shared budgets, no priority), then the node views."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from services.status import assessing
from services.status.assessing import NodeView, Observed
from shared import api
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
