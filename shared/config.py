"""Typed, immutable service configuration decoded once from the environment.

Every service's ``config.py`` defines a frozen ``msgspec.Struct`` built from the groups here
and calls :func:`load` once at startup with an injectable ``environ`` mapping. Nothing else
reads ``os.environ``. Variables are named ``NODEWRIGHT_<GROUP>_<FIELD>`` (``NODEWRIGHT_NATS_URL``)
or ``NODEWRIGHT_<FIELD>`` for top-level fields; an unknown ``NODEWRIGHT_*`` variable is an
error, so a typo fails the start instead of being silently ignored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, TypeVar

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
    user: str = ""
    """NATS user name (shared.grants: ``nodewright-<service>``); empty: no authentication."""
    password_file: str = ""
    """File holding the user's password (a mounted Secret key), read at each connect so a
    rotated Secret is picked up; never logged."""
    tls_ca_file: str = ""
    """CA bundle to verify the NATS servers with; set, the connection uses TLS."""
    tls_cert_file: str = ""
    """Client certificate for mutual TLS (with tls_key_file)."""
    tls_key_file: str = ""


class KubeSettings(_Group, frozen=True, forbid_unknown_fields=True, kw_only=True):
    kubeconfig: str = ""
    """Path to a kubeconfig file; empty means in-cluster service-account credentials."""
    qps_burst: Annotated[int, msgspec.Meta(ge=1)] = 70
    """Concurrent API requests a service may have in flight (a client-side limit): each
    service of a process running several has its own. Watches are not counted. The
    scheduler writes a batch's admissions with all but 10 of them (docs/metrics.md, "Sixty
    admissions in flight")."""


class HealthSettings(_Group, frozen=True, forbid_unknown_fields=True, kw_only=True):
    host: str = "0.0.0.0"
    """Bind address for /healthz, /readyz and /metrics; all interfaces so kubelet can probe."""
    port: Port = 8080
    """Port for the probe and metrics server; 0 picks a free port (tests)."""


PackageStaging = Literal["image-volume", "copy"]


_SECRET_NAME = r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?"
_SECRET_NAMES = f"^({_SECRET_NAME}(,{_SECRET_NAME})*)?$"
"""Secret names (DNS subdomains), comma-separated; empty for none."""


class PodSettings(_Group, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """How services that run NodeWright pods on nodes (executor, validator) build them."""

    agent_image: str = "ghcr.io/nvidia/nodewright/agent:0.1.0"
    """Image of the on-node agent that runs package steps and checks (python -m agent)."""
    image_pull_grace_s: Seconds = 120.0
    """How long a pod may fail to pull its image before its stage fails (ImagePullFailed):
    long enough to ride out a registry blip, short enough not to look stuck."""
    host_root: Annotated[str, msgspec.Meta(pattern="^/")] = "/"
    """The node's path that package pods mount as the host's root, into which the agent
    chroots to change the host. ``/`` on a real node; a test rig points it at a throwaway
    tree so that packages never change the machine running the rig."""
    package_staging: PackageStaging = "image-volume"
    """How a package image's files reach the agent: ``image-volume`` mounts the image
    (Kubernetes image volumes; containerd >= 2.1, CRI-O >= 1.31); ``copy`` copies them into
    the pod with two init containers, for runtimes without image volumes (containerd 1.7).
    Neither needs a shell in the package image."""
    image_pull_secrets: Annotated[str, msgspec.Meta(pattern=_SECRET_NAMES)] = ""
    """Secrets (names, comma-separated, in NodeWright's namespace) the kubelet pulls the
    agent and package images with: every pod that runs a package's stages, checks or
    interrupts carries them as ``imagePullSecrets``. Empty: pulls are anonymous."""
    simulate: bool = False
    """Simulated nodes (kwok): pods carry kwok stage annotations derived from the node's
    sim.nodewright.nvidia.com/* annotations instead of running anything."""
    sim_stage_duration: str = "1s"
    """With simulate: how long a simulated pod runs (Go duration)."""
    sim_in_turn: bool = True
    """With simulate: a stage pod's containers run one after the other, as a kubelet runs
    them (the API server says which one runs); false: kwok ends the init containers at once
    and the pod runs for all their time together. ``bench.rollout`` sets it false: three
    pod status writes per pod fewer, the simulated work of its earlier figures and of the
    reference's run."""


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
    """Full re-read of Kubernetes state, so a lost event delays work by at most this much;
    a key whose last reconcile left nothing to do and that nothing changed since is read
    again every 10 intervals (``shared.controller.SETTLED_RESYNCS``)."""
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


_SERVICE_LINK = re.compile(
    r"_(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT(_\d+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)?)"
)
"""The variables kubelet sets in every pod for each Service of its namespace (service
links): a Service named ``nodewright-validator`` gives ``NODEWRIGHT_VALIDATOR_SERVICE_HOST``,
``NODEWRIGHT_VALIDATOR_PORT_443_TCP_ADDR`` and so on, which are not settings."""


def _service_link(key: str, environ: Mapping[str, str]) -> bool:
    """Whether ``key`` is one of a Service's link variables: its name ends like one, and the
    Service's ``<NAME>_SERVICE_HOST`` is set too (a misspelt setting is still refused)."""
    match = _SERVICE_LINK.search(key)
    while match is not None:
        service = key[: match.start()]
        if match.end() == len(key) and f"{service}_SERVICE_HOST" in environ:
            return True
        match = _SERVICE_LINK.search(key, match.start() + 1)
    return False


def load(cls: type[T], environ: Mapping[str, str]) -> T:
    """Decode ``cls`` from ``environ``; raise :class:`ConfigError` naming the bad variable."""
    names = _env_names(cls)
    data: dict[str, Any] = {}
    for key, value in environ.items():
        if not key.startswith(PREFIX) or (key not in names and _service_link(key, environ)):
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


def load_many(
    types: Sequence[type[ServiceSettings]], environ: Mapping[str, str]
) -> list[ServiceSettings]:
    """Decode each of ``types`` (services sharing a process) from one environment: each gets
    the variables it knows, and a variable none of them knows is refused, as by :func:`load`."""
    names = [_env_names(cls) for cls in types]
    for key in environ:
        unknown = key.startswith(PREFIX) and not any(key in n for n in names)
        if unknown and not _service_link(key, environ):
            known = ", ".join(sorted(set().union(*names)))
            raise ConfigError(f"unknown setting {key}; known settings are: {known}")
    return [
        load(cls, {k: v for k, v in environ.items() if k in n or not k.startswith(PREFIX)})
        for cls, n in zip(types, names, strict=True)
    ]


def _name_variable(message: str) -> str:
    # msgspec reports "... - at `$.nats.port`"; turn the path into the variable to fix.
    match = re.search(r"at `\$\.([\w.]+)`", message)
    if not match:
        return message
    var = PREFIX + match.group(1).replace(".", "_").upper()
    return f"{var}: {message.split(' - at ')[0]}"
