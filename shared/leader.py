"""Leader election on a coordination.k8s.io Lease, for work only one replica may do.

The scheduler admits nodes against budgets; two replicas admitting at once could exceed a
budget, so only the lease holder acts while the others stand by. The lease is taken when it
is free or expired, renewed every ``duration/3`` with optimistic concurrency (a 409 means
someone else won), and given up on shutdown so a standby takes over at once. A holder that
dies stops renewing and its lease expires after ``duration``. What the leader does is the
caller's business: it reads :attr:`LeaderElector.is_leader` and ``became_leader``.

Expiry is judged the way client-go does, by this process's own monotonic clock: a standby
takes a foreign lease only once its record (holder, renewTime) has not changed for
``duration`` since the standby first saw it. Comparing the holder's ``renewTime`` with the
local wall clock would let a skewed clock steal a live lease, or never take a dead one whose
holder's clock ran ahead. Any failure to talk to the API server (an HTTP error, a timeout, a
refused connection) counts as "not leader" for that round and is retried; it never ends the
election task.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.kube import ApiError, Kube, path_of

_log = logging.getLogger("nodewright.leader")


def _fmt(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None  # a hand-edited lease: judged by observation alone


@dataclass
class LeaderElector:
    kube: Kube
    namespace: str
    name: str
    identity: str
    duration_s: float = 15.0
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    monotonic: Callable[[], float] = time.monotonic
    is_leader: bool = False
    became_leader: asyncio.Event = field(default_factory=asyncio.Event)
    lost_leadership: asyncio.Event = field(default_factory=asyncio.Event)
    _observed: tuple[str, str] | None = None
    """The foreign lease record last seen (holder, renewTime) ..."""
    _observed_at: float = 0.0
    """... and when (``monotonic``) it was first seen unchanged."""
    _held: dict[str, Any] | None = None
    """The lease as this holder's last write left it: a renewal replaces it without reading
    it first (its resourceVersion is the lock; a 409 says someone else wrote it since)."""

    @property
    def _path(self) -> str:
        return path_of(
            group="coordination.k8s.io", plural="leases", namespace=self.namespace, name=self.name
        )

    async def run(self) -> None:
        """Campaign and renew until cancelled; release the lease on the way out."""
        try:
            while True:
                try:
                    held = await self._try_acquire_or_renew()
                except Exception as exc:  # any failure: not leader this round, try again
                    _log.warning(
                        "Failed to update Lease", extra={"lease": self.name, "error": repr(exc)}
                    )
                    held = False
                self._set(held)
                await asyncio.sleep(self.duration_s / 3 if held else self.duration_s / 5)
        finally:
            if self.is_leader:
                await asyncio.shield(self._release())

    def _set(self, held: bool) -> None:
        if held and not self.is_leader:
            _log.info("Acquired leadership", extra={"lease": self.name, "identity": self.identity})
            self.lost_leadership.clear()
            self.became_leader.set()
        elif not held and self.is_leader:
            _log.warning("Lost leadership", extra={"lease": self.name, "identity": self.identity})
            self.became_leader.clear()
            self.lost_leadership.set()
        self.is_leader = held

    async def _try_acquire_or_renew(self) -> bool:
        now = self.clock()
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.duration_s),
            "renewTime": _fmt(now),
        }
        if self._held is not None and self.is_leader:
            lease, self._held = self._held, None
            lease["spec"] = {**(lease.get("spec") or {}), **spec}
            try:
                self._held = await self.kube.replace(self._path, lease)
                return True
            except ApiError as exc:
                if not (exc.conflict or exc.not_found):
                    raise
                # Written or removed by someone else since: read it, as a candidate does.
        try:
            lease = await self.kube.get(self._path)
        except ApiError as exc:
            if not exc.not_found:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {**spec, "acquireTime": _fmt(now), "leaseTransitions": 0},
            }
            try:
                self._held = await self.kube.create(
                    path_of(group="coordination.k8s.io", plural="leases", namespace=self.namespace),
                    body,
                )
            except ApiError as create_exc:
                if create_exc.conflict:
                    return False
                raise
            return True
        current = lease.get("spec") or {}
        holder = current.get("holderIdentity") or ""
        if holder and holder != self.identity and not self._foreign_expired(current):
            return False
        new_spec = dict(current)
        new_spec.update(spec)
        if holder != self.identity:
            new_spec["acquireTime"] = _fmt(now)
            new_spec["leaseTransitions"] = int(current.get("leaseTransitions") or 0) + 1
        lease["spec"] = new_spec
        try:
            # resourceVersion in the body: optimistic lock
            self._held = await self.kube.replace(self._path, lease)
        except ApiError as exc:
            if exc.conflict:
                return False
            raise
        return True

    def _foreign_expired(self, spec: dict[str, Any]) -> bool:
        """Whether another holder's lease has gone unrenewed for its duration, as measured
        here: from when this record was first seen unchanged."""
        record = (str(spec.get("holderIdentity") or ""), str(spec.get("renewTime") or ""))
        duration = float(spec.get("leaseDurationSeconds") or 0)
        now = self.monotonic()
        if record != self._observed:
            self._observed, self._observed_at = record, now
            # A record seen for the first time may be long dead (its holder died before we
            # started). Its renewTime says so only by the holder's clock; trust it when it is
            # far enough in the past (two durations) that skew cannot matter, else wait.
            renewed = _parse(record[1])
            return renewed is not None and renewed + timedelta(seconds=2 * duration) < self.clock()
        return now - self._observed_at >= duration

    async def _release(self) -> None:
        try:
            lease = await self.kube.get(self._path)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"]["holderIdentity"] = ""
            lease["spec"]["renewTime"] = _fmt(self.clock() - timedelta(seconds=self.duration_s))
            await self.kube.replace(self._path, lease)
            _log.info("Released leadership", extra={"lease": self.name})
        except ApiError as exc:
            _log.warning("Failed to release Lease", extra={"lease": self.name, "error": str(exc)})
        self.is_leader = False
