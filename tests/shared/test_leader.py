"""Leader election on a real Lease: hand-over on release, take-over from a dead holder, a
skewed holder clock, and API failures that must not end the election."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta

import pytest

from shared import kubeaccess
from shared.kube import Kube, path_of
from shared.leader import LeaderElector
from tests.helpers.waiting import eventually

pytestmark = pytest.mark.rig

LEASES = "coordination.k8s.io"


def _fmt(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@contextlib.asynccontextmanager
async def running(elector: LeaderElector) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(elector.run())
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _lease(kapi: Kube, namespace: str, holder: str, renewed: datetime) -> None:
    await kapi.create(
        path_of(group=LEASES, plural="leases", namespace=namespace),
        {
            "metadata": {"name": "election"},
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": 2,
                "renewTime": _fmt(renewed),
                "acquireTime": _fmt(renewed),
            },
        },
    )


def _elector(kapi: Kube, namespace: str, identity: str) -> LeaderElector:
    return LeaderElector(
        kube=kapi, namespace=namespace, name="election", identity=identity, duration_s=2
    )


async def test_one_leader_and_a_standby_takes_over_at_once_on_release(
    kapi: Kube, namespace: str
) -> None:
    a, b = _elector(kapi, namespace, "a"), _elector(kapi, namespace, "b")
    a_task = asyncio.create_task(a.run())
    await asyncio.wait_for(a.became_leader.wait(), 10)
    async with running(b):
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(_stop, a_task)
            await asyncio.sleep(3)  # longer than the duration: a keeps renewing, b waits
            assert a.is_leader
            assert not b.is_leader
        # a released the lease on the way out; b campaigns every duration/5 and takes it
        # well before the released lease would have expired.
        await asyncio.wait_for(b.became_leader.wait(), 1.5)
    assert not a.is_leader


async def test_a_dead_holder_is_replaced_after_one_duration_of_silence(
    kapi: Kube, namespace: str
) -> None:
    await _lease(kapi, namespace, "dead", datetime.now(UTC))
    b = _elector(kapi, namespace, "b")
    async with running(b):
        await asyncio.sleep(1.0)
        assert not b.is_leader, "the lease was renewed a moment ago"
        await asyncio.wait_for(b.became_leader.wait(), 6)


async def test_a_holder_clock_running_ahead_does_not_keep_a_dead_lease_forever(
    kapi: Kube, namespace: str
) -> None:
    # The dead holder's clock was an hour fast: by its renewTime the lease is good for an
    # hour. The standby judges by its own clock, from when it saw the record unchanged.
    await _lease(kapi, namespace, "skewed", datetime.now(UTC) + timedelta(hours=1))
    b = _elector(kapi, namespace, "b")
    async with running(b):
        await asyncio.wait_for(b.became_leader.wait(), 6)
        assert b.is_leader


async def test_a_lease_long_dead_by_any_clock_is_taken_at_once(kapi: Kube, namespace: str) -> None:
    await _lease(kapi, namespace, "gone", datetime.now(UTC) - timedelta(hours=1))
    b = _elector(kapi, namespace, "b")
    async with running(b):
        await asyncio.wait_for(b.became_leader.wait(), 1.5)
        assert b.is_leader


async def test_an_unreachable_api_server_is_not_leadership_and_never_ends_the_election(
    kapi: Kube, namespace: str
) -> None:
    # Nothing listens on port 9: connection refused.
    refused = kubeaccess.Access(server="https://127.0.0.1:9", ssl=ssl.create_default_context())
    async with contextlib.AsyncExitStack() as stack:
        raw = kubeaccess.Session(refused, max_in_flight=1)
        stack.push_async_callback(raw.close)
        lost = LeaderElector(
            kube=Kube(raw), namespace=namespace, name="election", identity="x", duration_s=1
        )
        async with running(lost) as task:
            await asyncio.sleep(1.5)  # several failed rounds
            assert not task.done(), "a failed round ended the election task"
            assert not lost.is_leader

    # The lease itself was never touched.
    async def untouched() -> bool:
        listed = await kapi.get(path_of(group=LEASES, plural="leases", namespace=namespace))
        return not listed["items"]

    await eventually(untouched, timeout_s=1, what="no lease in the namespace")


async def _until(holds: Callable[[], bool], what: str) -> None:
    async def probe() -> bool:
        return holds()

    await eventually(probe, timeout_s=10, what=what)


class _Counting:
    """The API client, counting the reads of the Lease (issue 15: a renewal is one PUT)."""

    def __init__(self, kapi: Kube) -> None:
        self.kapi, self.gets, self.puts = kapi, 0, 0

    async def get(self, path: str, **query: object) -> dict[str, object]:
        self.gets += 1
        return await self.kapi.get(path)

    async def create(self, path: str, body: dict[str, object]) -> dict[str, object]:
        return await self.kapi.create(path, body)

    async def replace(self, path: str, body: dict[str, object]) -> dict[str, object]:
        self.puts += 1
        return await self.kapi.replace(path, body)


async def test_a_leader_renews_with_one_write_and_reads_the_lease_after_a_foreign_write(
    kapi: Kube, namespace: str
) -> None:
    counting = _Counting(kapi)
    elector = LeaderElector(
        kube=counting,  # type: ignore[arg-type]
        namespace=namespace,
        name="election",
        identity="a",
        duration_s=2,
    )
    async with running(elector):
        await asyncio.wait_for(elector.became_leader.wait(), 10)
        await _until(lambda: counting.puts >= 3, "three renewals")
        assert counting.gets == 1, "read once, when it campaigned; renewed without reading"
        # Someone else writes the lease: the next renewal meets a 409, reads it and renews
        # it in the same round (no flap of leadership).
        path = path_of(group=LEASES, plural="leases", namespace=namespace, name="election")
        lease = await kapi.get(path)
        lease["metadata"].setdefault("labels", {})["touched"] = "yes"
        await kapi.replace(path, lease)
        await _until(lambda: counting.gets >= 2, "a read after the foreign write")
        puts = counting.puts
        await _until(lambda: counting.puts > puts + 1, "renewals again")
        assert elector.is_leader
        assert not elector.lost_leadership.is_set()
