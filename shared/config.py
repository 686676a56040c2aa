"""Typed, immutable service configuration decoded once from the environment.

Every service's ``config.py`` defines a frozen ``msgspec.Struct`` built from the groups here
and calls :func:`load` once at startup with an injectable ``environ`` mapping. Nothing else
reads ``os.environ``. Variables are named ``NODEWRIGHT_<GROUP>_<FIELD>`` (``NODEWRIGHT_NATS_URL``)
or ``NODEWRIGHT_<FIELD>`` for top-level fields; an unknown ``NODEWRIGHT_*`` variable is an
error, so a typo fails the start instead of being silently ignored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

import msgspec

PREFIX = "NODEWRIGHT_"

Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]
Seconds = Annotated[float, msgspec.Meta(gt=0)]


class ConfigError(ValueError):
    """The environment does not describe a valid configuration; the message names the variable."""


class _Group(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Base for configuration groups: immutable, and unknown fields are errors."""


class NatsSettings(_Group, frozen=True, forbid_unknown_fields=True, kw_only=True):
    url: str = "nats://127.0.0.1:4222"
    """Comma-separated NATS server URLs."""
    stream: str = "NODEWRIGHT"
    """The JetStream stream holding every event; created by whichever service starts first."""
    stream_replicas: Annotated[int, msgspec.Meta(ge=1, le=5)] = 1
    """Replicas of the stream; 3 in production so one server may fail (Helm sets this)."""
    stream_max_age_s: Seconds = 7 * 24 * 3600.0
    """How long events stay replayable for operators; a week covers a long rollout."""
    duplicate_window_s: Seconds = 120.0
    """Nats-Msg-Id dedupe window; the server default, longer than any publish retry loop."""
    connect_timeout_s: Seconds = 5.0
    """Per-attempt connect timeout; connection attempts repeat until shutdown."""


class KubeSettings(_Group, frozen=True, forbid_unknown_fields=True, kw_only=True):
    kubeconfig: str = ""
    """Path to a kubeconfig file; empty means in-cluster service-account credentials."""
    qps_burst: Annotated[int, msgspec.Meta(ge=1)] = 50
    """Concurrent API requests a process may have in flight (a client-side limit)."""


class HealthSettings(_Group, frozen=True, forbid_unknown_fields=True, kw_only=True):
    host: str = "0.0.0.0"
    """Bind address for /healthz, /readyz and /metrics; all interfaces so kubelet can probe."""
    port: Port = 8080
    """Port for the probe and metrics server; 0 picks a free port (tests)."""


class PodSettings(_Group, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """How services that run NodeWright pods on nodes (executor, validator) build them."""

    agent_image: str = "ghcr.io/nvidia/nodewright/agent:0.1.0"
    """Image of the on-node agent that runs package steps and checks (python -m agent)."""
    image_pull_grace_s: Seconds = 120.0
    """How long a pod may fail to pull its image before its stage fails (ImagePullFailed):
    long enough to ride out a registry blip, short enough not to look stuck."""
    simulate: bool = False
    """Simulated nodes (kwok): pods carry kwok stage annotations derived from the node's
    sim.nodewright.nvidia.com/* annotations instead of running anything."""
    sim_stage_duration: str = "1s"
    """With simulate: how long a simulated pod runs (Go duration)."""


class ServiceSettings(_Group, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Settings every service has. Services subclass this and add their own groups."""

    nats: NatsSettings = msgspec.field(default_factory=NatsSettings)
    kube: KubeSettings = msgspec.field(default_factory=KubeSettings)
    health: HealthSettings = msgspec.field(default_factory=HealthSettings)
    log_level: str = "INFO"
    """Root log level: INFO or DEBUG (ERROR lines are always written)."""
    graceful_timeout_s: Seconds = 20.0
    """Time in-flight handlers get after SIGTERM; below the pod's 30 s grace period."""
    resync_interval_s: Seconds = 60.0
    """Full re-read of Kubernetes state, so a lost event delays work by at most this much."""
    identity: str = ""
    """This replica's name (the pod name in-cluster); defaults to hostname-pid."""
    namespace: str = "nodewright-system"
    """Namespace of NodeWright's own objects: package pods, ConfigMaps, Leases, Events."""


T = TypeVar("T", bound=ServiceSettings)


def _env_names(cls: type[msgspec.Struct]) -> dict[str, tuple[str, ...]]:
    names: dict[str, tuple[str, ...]] = {}
    for field in msgspec.structs.fields(cls):
        ftype = field.type
        if isinstance(ftype, type) and issubclass(ftype, msgspec.Struct):
            for sub in msgspec.structs.fields(ftype):
                names[f"{PREFIX}{field.name}_{sub.name}".upper()] = (field.name, sub.name)
        else:
            names[f"{PREFIX}{field.name}".upper()] = (field.name,)
    return names


def load(cls: type[T], environ: Mapping[str, str]) -> T:
    """Decode ``cls`` from ``environ``; raise :class:`ConfigError` naming the bad variable."""
    names = _env_names(cls)
    data: dict[str, Any] = {}
    for key, value in environ.items():
        if not key.startswith(PREFIX):
            continue
        path = names.get(key)
        if path is None:
            known = ", ".join(sorted(names))
            raise ConfigError(f"unknown setting {key}; known settings are: {known}")
        target = data
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = value
    try:
        return msgspec.convert(data, cls, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(_name_variable(str(exc))) from exc


def _name_variable(message: str) -> str:
    # msgspec reports "... - at `$.nats.port`"; turn the path into the variable to fix.
    match = re.search(r"at `\$\.([\w.]+)`", message)
    if not match:
        return message
    var = PREFIX + match.group(1).replace(".", "_").upper()
    return f"{var}: {message.split(' - at ')[0]}"
