"""Configuration of the drainer service, decoded once at startup (see shared.config).

What each CR wants from a drain (timeout, grace period, pod policies) is in its
``spec.drain``; this is only how the service itself paces its work.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from shared.config import Seconds, ServiceSettings, _Group


class DrainerSettings(_Group, frozen=True, forbid_unknown_fields=True, kw_only=True):
    eviction_retry_s: Seconds = 5.0
    """Seconds between attempts to evict a pod the API server refused (429: a PDB at zero;
    500: several PDBs); kubectl drain's interval. Each attempt costs one request per pod."""
    deletion_poll_s: Seconds = 5.0
    """Seconds between re-checks while evicted pods terminate. Their deletions arrive as
    watch events anyway; this only bounds the delay if one is missed."""
    max_parallel_evictions: Annotated[int, msgspec.Meta(ge=1, le=256)] = 16
    """Eviction requests one node's drain has in flight at once (a node holds at most a few
    hundred pods; the API server's rate limits apply to the whole process)."""
    image_pull_grace_s: Seconds = 120.0
    """With ``spec.drain.prePullImages``: how long the pod pulling a node's package images
    may fail to pull one before the drain fails (ImagePullFailed, nothing evicted); the
    executor's ``NODEWRIGHT_PODS_IMAGE_PULL_GRACE_S`` for its stage pods (the chart sets
    both from ``imagePullGraceSeconds``)."""
    workers: Annotated[int, msgspec.Meta(ge=1, le=256)] = 32
    """Nodes reconciled concurrently. A long wait never occupies a worker (it is a requeue),
    so this bounds only the API calls in flight. At 10,000 nodes 16 were all busy the whole
    rollout: a key waited 9.9 s for one, a node 22 s from cordon to drained (p50); with 32,
    5.1 to 6.1 s and 13 to 14 s (issue 15, docs/metrics.md)."""


class Settings(ServiceSettings, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Settings of the drainer service: the shared groups (nats, kube, health) and its own."""

    drainer: DrainerSettings = msgspec.field(default_factory=DrainerSettings)
