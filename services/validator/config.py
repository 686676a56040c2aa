"""Configuration of the validator service, decoded once at startup (see shared.config)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from services.validator.webhook import WebhookSettings
from shared.config import PodSettings, ServiceSettings


class Settings(ServiceSettings, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Settings of the validator service: the shared groups (nats, kube, health) and its own."""

    pods: PodSettings = msgspec.field(default_factory=PodSettings)
    workers: Annotated[int, msgspec.Meta(ge=1, le=256)] = 16
    """Nodes reconciled concurrently."""
    webhook: WebhookSettings = msgspec.field(default_factory=WebhookSettings)
    """The validating admission webhook this service serves (NODEWRIGHT_WEBHOOK_*)."""
    webhook_enabled: bool = True
    """Serve and register the admission webhook. Turn off only where another replica set
    serves it; without it the API server alone (schema and CEL) judges NodeWrights."""
