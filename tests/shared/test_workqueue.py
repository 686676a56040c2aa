"""The keyed work queue serialises each key, coalesces bursts and retries failures."""

from __future__ import annotations

import asyncio
from collections import Counter

from prometheus_client import CollectorRegistry

from shared.workqueue import QueueMetrics, WorkQueue


async def _running(
    queue: WorkQueue[str], reconcile: object, workers: int = 4
) -> asyncio.Task[None]:
    return asyncio.create_task(queue.run(reconcile, workers=workers))  # type: ignore[arg-type]


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _idle() -> None:
    """Until every task that can run has run (no real time passes)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_key_never_runs_twice_at_once_and_a_burst_during_a_run_is_one_more_run() -> None:
    queue: WorkQueue[str] = WorkQueue("t")
    active: set[str] = set()
    overlaps = 0
    runs: Counter[str] = Counter()
    gate = asyncio.Event()
    started = asyncio.Event()

    async def reconcile(key: str) -> None:
        nonlocal overlaps
        if key in active:
            overlaps += 1
        active.add(key)
        runs[key] += 1
        started.set()
        await gate.wait()
        active.discard(key)

    task = await _running(queue, reconcile)
    queue.add("a")
    await started.wait()  # the first run of "a" is in progress
    for _ in range(50):
        queue.add("a")
        queue.add("b")
    await _idle()
    assert runs == Counter({"a": 1, "b": 1}), "b runs beside a; a waits for its own run"
    gate.set()
    assert await queue.reconcile_now("a") is True
    assert await queue.reconcile_now("b") is True
    await _stop(task)
    assert overlaps == 0
    # 50 adds while each ran became exactly one more run, which the waits above waited for.
    assert runs == Counter({"a": 2, "b": 2})


async def test_reconcile_now_waits_for_a_run_that_started_after_the_call() -> None:
    queue: WorkQueue[str] = WorkQueue("t")
    seen: list[int] = []
    gate = asyncio.Event()
    started = asyncio.Event()
    value = 0

    async def reconcile(key: str) -> None:
        seen.append(value)
        started.set()
        await gate.wait()

    task = await _running(queue, reconcile)
    queue.add("k")
    await started.wait()  # the first run is now in progress and saw value 0
    value = 1
    waiting = asyncio.create_task(queue.reconcile_now("k"))
    await _idle()
    assert not waiting.done(), "the run in progress started before the call and does not count"
    gate.set()
    assert await waiting is True
    assert seen == [0, 1]
    await _stop(task)


async def test_failures_are_retried_with_backoff_and_requeue_after_is_honoured() -> None:
    queue: WorkQueue[str] = WorkQueue("t", base_backoff_s=0.01)
    calls: Counter[str] = Counter()

    async def reconcile(key: str) -> float | None:
        calls[key] += 1
        if key == "flaky" and calls[key] < 3:
            raise RuntimeError("temporary")
        if key == "later" and calls[key] == 1:
            return 0.05
        return None

    requeued = asyncio.Event()

    async def watched(key: str) -> float | None:
        got = await reconcile(key)
        if calls["flaky"] >= 3 and calls["later"] >= 2:
            requeued.set()
        return got

    task = await _running(queue, watched)
    assert await queue.reconcile_now("flaky") is False
    queue.add("later")
    await asyncio.wait_for(requeued.wait(), 5)
    await _stop(task)
    assert calls["flaky"] == 3
    assert calls["later"] == 2


async def test_a_waiter_whose_key_cannot_run_any_more_is_answered_false_when_the_queue_stops() -> (
    None
):
    """A service's stop: the key of an event being handled is queued behind one in progress
    when the queue stops taking keys. Its handler learns at once that it did not run (the
    event stays unacked, to be delivered again) instead of waiting out the grace period."""
    queue: WorkQueue[str] = WorkQueue("t")
    stopping = asyncio.Event()
    gate = asyncio.Event()
    started = asyncio.Event()
    ran: list[str] = []

    async def reconcile(key: str) -> None:
        ran.append(key)
        started.set()
        await gate.wait()

    task = asyncio.create_task(queue.run(reconcile, workers=1, stopping=stopping))
    busy = asyncio.create_task(queue.reconcile_now("a"))
    await started.wait()  # the only worker is busy with "a"
    behind = asyncio.create_task(queue.reconcile_now("b"))
    await _idle()
    stopping.set()
    gate.set()  # the run in progress finishes; no new one starts
    await asyncio.wait_for(task, timeout=5)
    assert await busy is True
    assert await asyncio.wait_for(behind, timeout=1) is False
    assert ran == ["a"]
    assert await queue.reconcile_now("c") is False, "a stopped queue answers at once"


async def test_a_resync_key_waits_until_no_changed_key_does() -> None:
    """The periodic resync queues every key in the low lane: a node that changed meanwhile
    runs before the thousands that did not, whatever the order they were queued in."""
    queue: WorkQueue[str] = WorkQueue("t")
    order: list[str] = []
    all_ran = asyncio.Event()

    async def reconcile(key: str) -> None:
        order.append(key)
        if len(order) == 4:
            all_ran.set()

    for key in ("r1", "r2", "r3"):
        queue.add(key, low=True)
    queue.add("changed")
    queue.add("r2")  # the informer saw r2 change: it leaves the low lane
    queue.add("r2", low=True)  # and a later resync does not put it back
    task = await _running(queue, reconcile, workers=1)
    await asyncio.wait_for(all_ran.wait(), 5)
    await _idle()
    await _stop(task)
    assert order == ["changed", "r2", "r1", "r3"], "each key once, the changed ones first"
    assert len(queue) == 0


async def test_a_resync_does_not_make_a_running_key_run_again() -> None:
    queue: WorkQueue[str] = WorkQueue("t")
    gate = asyncio.Event()
    started = asyncio.Event()
    runs: Counter[str] = Counter()

    async def reconcile(key: str) -> None:
        runs[key] += 1
        started.set()
        await gate.wait()

    task = await _running(queue, reconcile)
    queue.add("k")
    await started.wait()
    queue.add("k", low=True)  # the run in progress reads the cache as it is now
    gate.set()
    await _idle()
    assert runs == Counter({"k": 1})
    queue.add("k", low=True)  # idle: the resync runs it
    assert await queue.reconcile_now("k") is True
    await _stop(task)
    assert runs == Counter({"k": 2}), "the waiter's add joined the queued resync run"


def _sample(registry: CollectorRegistry, metric: str, **labels: str) -> float:
    value = registry.get_sample_value(metric, labels)
    return 0.0 if value is None else value


async def test_the_queue_counts_adds_depth_waits_work_and_retries_by_lane() -> None:
    registry = CollectorRegistry()
    queue: WorkQueue[str] = WorkQueue(
        "svc", base_backoff_s=0.01, metrics=QueueMetrics.make(registry)
    )
    failed = False

    async def reconcile(key: str) -> None:
        nonlocal failed
        if key == "flaky" and not failed:
            failed = True
            raise RuntimeError("temporary")

    queue.add("a", low=True)
    queue.add("b", low=True)
    queue.add("b")
    queue.add("c")
    assert _sample(registry, "nodewright_workqueue_depth", name="svc", priority="low") == 1
    assert _sample(registry, "nodewright_workqueue_depth", name="svc", priority="normal") == 2
    assert _sample(registry, "nodewright_workqueue_adds_total", name="svc", priority="low") == 2
    assert _sample(registry, "nodewright_workqueue_adds_total", name="svc", priority="normal") == 2
    task = await _running(queue, reconcile)
    await _idle()  # a, b and c ran
    assert len(queue) == 0
    assert await queue.reconcile_now("flaky") is False
    assert await queue.reconcile_now("flaky") is True
    await _stop(task)
    for lane in ("low", "normal"):
        assert _sample(registry, "nodewright_workqueue_depth", name="svc", priority=lane) == 0
    waited = "nodewright_workqueue_queue_duration_seconds_count"
    assert _sample(registry, waited, name="svc", priority="low") == 1  # a
    assert _sample(registry, waited, name="svc", priority="normal") == 4  # b, c, flaky twice
    assert _sample(registry, "nodewright_workqueue_work_duration_seconds_count", name="svc") == 5
    assert _sample(registry, "nodewright_workqueue_retries_total", name="svc") == 1


async def test_a_settled_key_is_left_out_of_resyncs_until_something_queues_it() -> None:
    """A key whose last reconcile asked for nothing, queued by nothing since, is settled: a
    resync (low lane) leaves it out for ``settled_s``; a change, an event or a requeue
    unsettles it; a key that asked to be looked at again, or failed, is never settled."""
    queue: WorkQueue[str] = WorkQueue("t", base_backoff_s=0.01, settled_s=3600.0)
    runs: Counter[str] = Counter()
    failed = False

    async def reconcile(key: str) -> float | None:
        nonlocal failed
        runs[key] += 1
        if key == "again":
            return 3600.0  # a deadline: the resync must keep looking at it
        if key == "flaky" and not failed:
            failed = True
            raise RuntimeError("temporary")
        return None

    task = await _running(queue, reconcile)
    for key in ("settled", "again", "flaky"):
        assert await queue.reconcile_now(key) is (key != "flaky")
    assert await queue.reconcile_now("flaky") is True  # its retry, now settled
    runs.clear()

    for key in ("settled", "again", "flaky"):
        queue.add(key, low=True)  # a resync
    await _idle()
    assert runs == Counter({"again": 1}), "only the key that asked to be looked at again"

    queue.add("settled")  # its node changed: a normal add runs it, and unsettles it
    await _idle()
    queue.add("settled", low=True)
    await _idle()
    assert runs == Counter({"again": 1, "settled": 1}), "the change ran; it settled again"
    await _stop(task)


async def test_a_settled_key_is_resynced_again_after_settled_s() -> None:
    queue: WorkQueue[str] = WorkQueue("t", settled_s=0.05)
    runs: Counter[str] = Counter()

    async def reconcile(key: str) -> None:
        runs[key] += 1

    task = await _running(queue, reconcile)
    assert await queue.reconcile_now("k") is True
    queue.add("k", low=True)
    await _idle()
    assert runs["k"] == 1
    await asyncio.sleep(0.06)
    queue.add("k", low=True)  # settled for longer than settled_s: the net runs it
    await _idle()
    assert runs["k"] == 2
    await _stop(task)


def test_retain_forgets_what_it_kept_of_keys_that_are_gone() -> None:
    queue: WorkQueue[str] = WorkQueue("t", settled_s=3600.0)
    queue._settled.update({"gone": 1.0, "here": 1.0})
    queue._rounds.update({"gone": 3, "here": 2, "queued": 1})
    queue.add("queued")
    queue.retain({"here"})
    assert set(queue._settled) == {"here"}
    assert set(queue._rounds) == {"here", "queued"}


async def test_a_key_has_one_pending_timer_the_earliest() -> None:
    queue: WorkQueue[str] = WorkQueue("t")
    runs: Counter[str] = Counter()

    async def reconcile(key: str) -> None:
        runs[key] += 1

    task = await _running(queue, reconcile)
    for after in (0.2, 0.05, 0.1):
        queue.add("k", after=after)
    await asyncio.sleep(0.3)
    await _stop(task)
    assert runs == Counter({"k": 1}), "three requeues of one key are one run, at the earliest"


async def test_a_burst_of_runs_asking_to_run_again_does_not_echo() -> None:
    """Five runs 10 ms apart, each asking to be looked at again in 50 ms, make one run every
    50 ms afterwards, not five: a timer per request kept a rollout's rate of passes going
    at rest."""
    queue: WorkQueue[str] = WorkQueue("t")
    runs = 0

    async def reconcile(key: str) -> float:
        nonlocal runs
        runs += 1
        return 0.05

    task = await _running(queue, reconcile)
    for _ in range(5):
        assert await queue.reconcile_now("k") is True
        await asyncio.sleep(0.01)
    runs = 0
    await asyncio.sleep(0.26)
    await _stop(task)
    assert 1 <= runs <= 7, runs  # about one per 50 ms; with a timer per request, about 25
