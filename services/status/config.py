"""Configuration of the status service, decoded once at startup (see shared.config)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from shared.config import ServiceSettings, _Group


class StatusSettings(_Group, frozen=True, forbid_unknown_fields=True, kw_only=True):
    workers: Annotated[int, msgspec.Meta(ge=1)] = 4
    """NodeWrights whose status is computed concurrently; one pass reads every node."""
    node_writes: Annotated[int, msgspec.Meta(ge=1)] = 40
    """The most node conditions written concurrently within one pass: one per 250 target
    nodes, at least 10 (``core.write_concurrency``). Below the service's own cap of requests
    in flight (``NODEWRIGHT_KUBE_QPS_BURST``, 70), so the pass's status and Event writes
    never wait behind them. At 16, when the drainer and the executor sped up at 10,000
    nodes, passes that found 4,000 nodes to write took 43 s each, and the status was written
    13 times in 10 minutes (issue 15)."""
    waiting_writes_per_pass: Annotated[int, msgspec.Meta(ge=1)] = 400
    """The most conditions of waiting nodes one pass writes (the others are all written,
    before them); the next pass writes the rest (``core.this_pass``)."""
    pass_interval_s: Annotated[float, msgspec.Meta(ge=0)] = 1.0
    """The least time between two passes over one NodeWright (a pass reads all its nodes and
    writes what changed: node conditions, the status, Events). The first change after a
    quiet spell is handled at once, the changes within the next interval in one pass: a
    rollout changes nodes many times a second, and each status write is decoded by every
    service watching NodeWrights. 0: a pass for every change."""
    pass_share: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.25
    """The largest share of the time the passes over one NodeWright may spend computing
    (reading its nodes, the rollout decision, each node's view): after a pass that spent c
    seconds the next waits at least c x (1 / share - 1), beyond ``pass_interval_s`` when
    that is longer. At 1,000 nodes a pass computes for tens of milliseconds and the interval
    rules; at 10,000 for most of a second, which once a second took most of a core from the
    services sharing its process. The status then lags the nodes by a few seconds."""
    replay_history: bool = False
    """Whether a brand-new event consumer replays the stream's history into Kubernetes Events.
    false: it starts at the stream's end, so installing the service does not raise a week of
    old Events. An existing consumer always resumes where it stopped."""
    verbose_events: bool = False
    """Also write a Kubernetes Event for every stream event (on its NodeWright, counted per
    kind and node) and for each compartment's waits and completion. false: Events only for
    what a person acts on or audits (docs/events.md, "Kubernetes Events"); the step-by-step
    trail is the event stream either way."""
    ui: bool = True
    """Serve the read-only web page on the health port, under /ui/ (access: any Kubernetes
    user who may list NodeWrights, by bearer token)."""


class Settings(ServiceSettings, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Settings of the status service: the shared groups (nats, kube, health) and its own."""

    status: StatusSettings = msgspec.field(default_factory=StatusSettings)
