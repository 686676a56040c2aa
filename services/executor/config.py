"""Configuration of the executor service, decoded once at startup (see shared.config)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from shared.config import PodSettings, ServiceSettings


class Settings(ServiceSettings, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Settings of the executor service: the shared groups (nats, kube, health) and its own."""

    pods: PodSettings = msgspec.field(default_factory=PodSettings)
    workers: Annotated[int, msgspec.Meta(ge=1, le=256)] = 16
    """Nodes reconciled concurrently."""
