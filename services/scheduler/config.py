"""Configuration of the scheduler service, decoded once at startup (see shared.config)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from shared.config import ServiceSettings, _Group


class SchedulerSettings(_Group, frozen=True, forbid_unknown_fields=True, kw_only=True):
    cluster_budget: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """NODEWRIGHT_SCHEDULER_CLUSTER_BUDGET: the most distinct nodes all NodeWrights together
    (with or without a DeploymentPolicy) disrupt at once, counted from the admissions on the
    nodes at decision time. Unset: unlimited (each NodeWright's own budgets still apply)."""
    decision_share: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.5
    """NODEWRIGHT_SCHEDULER_DECISION_SHARE: the largest share of the time one NodeWright's
    decisions may take. A decision reads every target node; when its nodes change faster
    than it decides (10,000 nodes in a rollout), passes would run back to back and take a
    whole core, in one process starving the other services. After a pass whose decisions
    took d seconds the next waits d x (1 / share - 1): at 1,000 nodes about 15 ms, and every
    change that came meanwhile is decided in that one pass. A lower share leaves more of a
    core to the other services and makes each admission and release wait longer (at 1,000
    nodes, 0.25 cut the process's CPU by a tenth and put the release lag's p99 above 1 s)."""


class Settings(ServiceSettings, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Settings of the scheduler service: the shared groups (nats, kube, health) and its own."""

    scheduler: SchedulerSettings = msgspec.field(default_factory=SchedulerSettings)
