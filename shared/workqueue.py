"""A keyed work queue for level-based reconcilers, in the spirit of client-go's workqueue.

- A key is processed by at most one worker at a time; adding a key that is already queued
  does nothing, and adding one that is being processed marks it to run once more afterwards.
  So a burst of events about one node becomes one or two reconciles, never a parallel pair.
- ``add(key, after=s)`` schedules a later run (RequeueAfter); the earliest requested time wins.
- ``add(key, low=True)`` queues a key in the low-priority lane, taken only when no other key
  waits: the periodic resync, which re-queues every key a service owns to recover a lost
  event, must not put a node that just changed behind thousands that did not (at 10,000
  nodes a resync is 10,000 keys). A key queued low that is then added normally moves to the
  normal lane; one added low while queued or running is left alone (the run reads the
  cache as it is then). controller-runtime's priority queue does the same for its resyncs.
- A key whose last reconcile succeeded and asked for nothing more (no requeue), and that no
  change, event or timer queued since, is *settled*: for ``settled_s`` after that reconcile
  an add in the low lane leaves it out. Its caches have not changed for it, so a resync
  would decide the same thing again; at 10,000 nodes that was most of the resyncs' work,
  and most of a fleet's work at rest. After ``settled_s`` the resync runs it again, the net
  for a change that reached no key.
- A reconcile that raises is retried with per-key exponential backoff (capped); a success
  resets the backoff. A transient API error (``shared.kube.ApiError.transient``: a slow or
  absent API server) is expected: no traceback, and a short, jittered cap.
- ``reconcile_now(key)`` queues the key and waits until a reconcile of it that *started after
  the call* has finished, returning whether it succeeded: event consumers use it to ack a
  message only after the side effect happened.
- :class:`QueueMetrics` exposes what client-go's workqueue metrics do: depth, adds, time
  waiting in the queue, time working, retries, by queue (the service) and lane.
- :func:`rest_after` paces a reconciler whose every run reads a whole fleet: how long its
  next run waits so that it keeps to a share of the time.

What a reconcile does is the caller's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Final, Generic, Literal, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared import collectors
from shared.kube import ApiError

K = TypeVar("K", bound=Hashable)

_log = logging.getLogger("nodewright.workqueue")

TRANSIENT_BACKOFF_S: Final = 5.0
"""The longest wait before a key that failed on a slow or absent API server is retried."""

Reconcile = Callable[[K], Awaitable[float | None]]
"""Returns seconds until the key should be looked at again, or None."""


Lane = Literal["normal", "low"]

WAIT_BUCKETS: Final = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
"""Seconds a key waits or works: milliseconds when idle, seconds when a wave of a large
fleet's nodes changes at once, minutes only when something is wrong."""


@dataclass(frozen=True)
class QueueMetrics:
    """The work queues' metrics, one set per registry (services sharing a process share
    it; the ``name`` label is the queue's, which is its service's)."""

    depth: Gauge
    adds: Counter
    queue_seconds: Histogram
    work_seconds: Histogram
    retries: Counter

    @classmethod
    def make(cls, registry: CollectorRegistry | None) -> QueueMetrics:
        return collectors.once(registry, "nodewright_workqueue", lambda: cls._new(registry))

    @classmethod
    def _new(cls, registry: CollectorRegistry | None) -> QueueMetrics:
        lanes = ["name", "priority"]
        return cls(
            depth=Gauge(
                "nodewright_workqueue_depth",
                "Keys waiting for a worker, by queue and lane",
                lanes,
                registry=registry,
            ),
            adds=Counter(
                "nodewright_workqueue_adds",
                "Keys queued (not counting a key already waiting), by queue and lane",
                lanes,
                registry=registry,
            ),
            queue_seconds=Histogram(
                "nodewright_workqueue_queue_duration_seconds",
                "How long a key waited for a worker, by queue and lane",
                lanes,
                buckets=WAIT_BUCKETS,
                registry=registry,
            ),
            work_seconds=Histogram(
                "nodewright_workqueue_work_duration_seconds",
                "How long a reconcile took, by queue",
                ["name"],
                buckets=WAIT_BUCKETS,
                registry=registry,
            ),
            retries=Counter(
                "nodewright_workqueue_retries",
                "Reconciles that failed and were queued again after a backoff, by queue",
                ["name"],
                registry=registry,
            ),
        )


@dataclass
class _Waiter:
    future: asyncio.Future[bool]
    after_round: int


@dataclass
class WorkQueue(Generic[K]):
    name: str
    base_backoff_s: float = 0.5
    max_backoff_s: float = 60.0
    metrics: QueueMetrics | None = None
    settled_s: float = 0.0
    """How long a settled key is left out of low-lane adds (0: never)."""
    _ready: deque[K] = field(default_factory=deque)
    _ready_low: deque[K] = field(default_factory=deque)
    """Keys of the low lane; a key moved to the normal lane stays here and is skipped."""
    _queued: dict[K, tuple[Lane, float]] = field(default_factory=dict)
    """Each waiting key's lane and when it was queued."""
    _waiting: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(0))
    """One unit per key in ``_queued``: a key queued wakes one idle worker, not all of them
    (16 tasks woken per key, 15 to find nothing, cost a tenth of a 10,000-node rollout's
    CPU)."""
    _active: set[K] = field(default_factory=set)
    _dirty: set[K] = field(default_factory=set)
    _timers: list[tuple[float, int, K]] = field(default_factory=list)
    _timer_seq: int = 0
    _timer_at: dict[K, float] = field(default_factory=dict)
    """Each key's one pending timer: when it fires. An entry of ``_timers`` that is not its
    key's pending timer (an earlier one replaced it) is skipped."""
    _timer_wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    _failures: dict[K, int] = field(default_factory=dict)
    _rounds: dict[K, int] = field(default_factory=dict)
    _settled: dict[K, float] = field(default_factory=dict)
    """Settled keys: when their last reconcile ended."""
    _waiters: dict[K, list[_Waiter]] = field(default_factory=dict)
    _closing: bool = False
    _working: set[asyncio.Task[None]] = field(default_factory=set)

    def add(self, key: K, *, after: float = 0.0, low: bool = False) -> None:
        if low:
            since = self._settled.get(key)
            if since is not None and time.monotonic() - since < self.settled_s:
                return
        else:
            self._settled.pop(key, None)  # a change, an event or a timer: work to look at
        if after > 0:
            at = time.monotonic() + after
            pending = self._timer_at.get(key)
            if pending is not None and pending <= at:
                # The earliest wins. A timer per request would echo: every pass of a
                # reconciler that asks to be looked at again in a minute (the scheduler, the
                # status service) made a pass a minute later, which asked again, so a
                # rollout's rate of passes went on for ever at rest: 7 passes a second over
                # 1,000 nodes (issue 15).
                return
            self._timer_at[key] = at
            self._timer_seq += 1
            heapq.heappush(self._timers, (at, self._timer_seq, key))
            self._timer_wakeup.set()
            return
        if key in self._active:
            if not low:
                self._dirty.add(key)
            return
        queued = self._queued.get(key)
        if queued is not None:
            if low or queued[0] == "normal":
                return
            self._count_depth("low", -1)  # promoted: its entry in the low lane is skipped
        lane: Lane = "low" if low else "normal"
        self._queued[key] = (lane, time.monotonic() if queued is None else queued[1])
        (self._ready_low if low else self._ready).append(key)
        self._count_depth(lane, 1)
        if self.metrics is not None:
            self.metrics.adds.labels(self.name, lane).inc()
        if queued is None:
            self._waiting.release()

    def retain(self, keys: set[K]) -> None:
        """Forget what is kept per key (settled, rounds) of keys not in ``keys`` and not
        queued, running or waited for: the keys of nodes that are gone."""
        keep = keys | set(self._queued) | self._active | set(self._waiters)
        for table in (self._settled, self._rounds):
            for key in [k for k in table if k not in keep]:
                del table[key]

    def __len__(self) -> int:
        return len(self._queued) + len(self._active)

    def _count_depth(self, lane: Lane, change: int) -> None:
        if self.metrics is not None:
            self.metrics.depth.labels(self.name, lane).inc(change)

    async def _next(self) -> K:
        """The next key to work on: the normal lane first, then the low one."""
        await self._waiting.acquire()
        # A unit is a key in _queued, so one of the lanes holds it (and nothing can take it
        # before this returns: no await below).
        while True:
            if self._ready:
                key = self._ready.popleft()
                lane: Lane = "normal"
            else:
                key = self._ready_low.popleft()
                lane = "low"
            queued = self._queued.get(key)
            if queued is None or queued[0] != lane:
                continue  # an entry left behind in the low lane by a promotion
            del self._queued[key]
            self._count_depth(lane, -1)
            if self.metrics is not None:
                self.metrics.queue_seconds.labels(self.name, lane).observe(
                    time.monotonic() - queued[1]
                )
            return key

    async def reconcile_now(self, key: K) -> bool:
        """Queue ``key`` and wait for a reconcile that starts after now; True if it succeeded,
        False if it failed or the queue stopped before it ran (:meth:`close`)."""
        if self._closing:
            return False
        loop = asyncio.get_running_loop()
        # A round already running started before this call: only a later one counts.
        waiter = _Waiter(future=loop.create_future(), after_round=self._rounds.get(key, 0))
        self._waiters.setdefault(key, []).append(waiter)
        self.add(key)
        return await waiter.future

    async def run(
        self,
        reconcile: Reconcile[K],
        *,
        workers: int = 4,
        stopping: asyncio.Event | None = None,
    ) -> None:
        """Process keys until cancelled, or until ``stopping`` is set: then the reconciles in
        progress finish and no new one starts."""
        tasks = [asyncio.create_task(self._timer_loop(), name=f"{self.name}-timers")]
        workers_ = [
            asyncio.create_task(self._worker(reconcile), name=f"{self.name}-worker-{i}")
            for i in range(workers)
        ]
        tasks += workers_
        try:
            if stopping is None:
                await asyncio.gather(*tasks)
            else:
                await stopping.wait()
                self._closing = True
                idle = [w for w, busy in self._busy_workers(workers_) if not busy]
                for w in idle:
                    w.cancel()
                await asyncio.gather(*workers_, return_exceptions=True)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.close()

    def close(self) -> None:
        """No reconcile runs any more: every waiter still waiting is answered False at once
        (an event handler then leaves its event unacked, to be delivered again), instead of
        holding its consumer, and the service's stop, until the grace period ends."""
        self._closing = True
        for waiters in self._waiters.values():
            for waiter in waiters:
                if not waiter.future.done():
                    waiter.future.set_result(False)
        self._waiters.clear()

    async def _timer_loop(self) -> None:
        while True:
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                at, _, key = heapq.heappop(self._timers)
                if self._timer_at.get(key) != at:
                    continue  # replaced by an earlier timer of the key, which already fired
                del self._timer_at[key]
                self.add(key)
            self._timer_wakeup.clear()
            timeout = self._timers[0][0] - now if self._timers else None
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
            # that arrives together with the wake-up, leaving this task unstoppable.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._timer_wakeup.wait()

    def _busy_workers(
        self, workers: list[asyncio.Task[None]]
    ) -> list[tuple[asyncio.Task[None], bool]]:
        return [(w, w in self._working) for w in workers]

    async def _worker(self, reconcile: Reconcile[K]) -> None:
        me = asyncio.current_task()
        assert me is not None
        while not self._closing:
            key = await self._next()
            self._working.add(me)
            self._active.add(key)
            began = time.monotonic()
            round_no = self._rounds.get(key, 0) + 1
            self._rounds[key] = round_no
            ok = False
            try:
                requeue = await reconcile(key)
                ok = True
                self._failures.pop(key, None)
                if requeue is not None:
                    self.add(key, after=max(requeue, 0.001))
                elif self.settled_s > 0:
                    # A change during the run (dirty) unsettles it again below.
                    self._settled[key] = time.monotonic()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures = self._failures.get(key, 0) + 1
                self._failures[key] = failures
                if self.metrics is not None:
                    self.metrics.retries.labels(self.name).inc()
                if isinstance(exc, ApiError) and exc.transient:
                    # A slow or absent API server: expected, logged once by kube.Outage;
                    # retried soon (jittered), so work resumes within seconds of its return.
                    delay = min(self.base_backoff_s * 2.0 ** (failures - 1), TRANSIENT_BACKOFF_S)
                    delay *= random.uniform(0.5, 1.0)
                    _log.debug(
                        "Failed to reconcile",
                        extra={"queue": self.name, "key": str(key), "error": str(exc)},
                    )
                else:
                    delay = min(self.base_backoff_s * 2 ** (failures - 1), self.max_backoff_s)
                    _log.exception(
                        "Failed to reconcile",
                        extra={"queue": self.name, "key": str(key), "retry_s": delay},
                    )
                self.add(key, after=delay)
            finally:
                if self.metrics is not None:
                    self.metrics.work_seconds.labels(self.name).observe(time.monotonic() - began)
                self._working.discard(me)
                self._active.discard(key)
                self._wake_waiters(key, round_no, ok)
                if key in self._dirty:
                    self._dirty.discard(key)
                    self.add(key)

    def _wake_waiters(self, key: K, round_no: int, ok: bool) -> None:
        waiters = self._waiters.get(key)
        if not waiters:
            return
        keep = []
        for waiter in waiters:
            if round_no > waiter.after_round:
                if not waiter.future.done():
                    waiter.future.set_result(ok)
            else:
                keep.append(waiter)
        if keep:
            self._waiters[key] = keep
        else:
            del self._waiters[key]


def rest_after(spent_s: float, share: float) -> float:
    """Seconds a key's next run waits after one that spent ``spent_s`` computing, so that
    its computing takes at most ``share`` (0 < share <= 1) of the time. For runs that read
    every node (a rollout decision, a status pass): when the nodes change faster than they
    are read, runs would follow each other at once and take a whole core."""
    return max(spent_s, 0.0) * (1.0 / share - 1.0)
