"""Configuration of the drainer service, decoded once at startup (see shared.config)."""

from __future__ import annotations

from shared.config import ServiceSettings


class Settings(ServiceSettings, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Settings of the drainer service: the shared groups (nats, kube, health) and its own."""
