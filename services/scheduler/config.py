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


class Settings(ServiceSettings, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Settings of the scheduler service: the shared groups (nats, kube, health) and its own."""

    scheduler: SchedulerSettings = msgspec.field(default_factory=SchedulerSettings)
