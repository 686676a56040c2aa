"""The scheduler's shell writes a pass's admissions (or releases) concurrently, bounded, and
says which landed in their order; a write that raises fails the pass after the others."""

from __future__ import annotations

import asyncio

import pytest

from services.scheduler import passing, service


async def test_writes_run_concurrently_bounded_and_report_in_order() -> None:
    in_flight = peak = 0

    def write(i: int) -> passing.Write:
        async def go() -> bool:
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            await asyncio.sleep(0.01 * (i % 3))
            in_flight -= 1
            return i % 4 != 0

        return go

    landed = await service._together([write(i) for i in range(100)])
    assert landed == [i % 4 != 0 for i in range(100)]
    assert peak == service.CONCURRENT_WRITES


async def test_a_write_that_raises_fails_the_pass_once_the_others_ended() -> None:
    finished: list[int] = []

    def write(i: int) -> passing.Write:
        async def go() -> bool:
            await asyncio.sleep(0.01)
            if i == 3:
                raise RuntimeError("refused")
            finished.append(i)
            return True

        return go

    with pytest.raises(RuntimeError, match="refused"):
        await service._together([write(i) for i in range(40)])
    assert sorted(finished) == [i for i in range(40) if i != 3]


async def test_calls_sharing_a_gate_keep_to_the_bound_together() -> None:
    """A pass's admissions and the release fast path's writes share the scheduler's gate:
    the service's requests in flight stay under its cap, with room for the lease."""
    in_flight = peak = 0

    async def go() -> bool:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return True

    gate = asyncio.Semaphore(service.CONCURRENT_WRITES)
    admissions, releases = await asyncio.gather(
        service._together([go] * 60, gate), service._together([go] * 60, gate)
    )
    assert (admissions, releases) == ([True] * 60, [True] * 60)
    assert peak == service.CONCURRENT_WRITES


def test_the_gate_leaves_the_lease_its_room_under_the_services_cap() -> None:
    assert service.write_gate(70) == 60 == service.CONCURRENT_WRITES
    assert service.write_gate(20) == 20 - service.LEASE_ROOM
    # A cap at or below the room still lets writes through, one at a time.
    assert service.write_gate(5) == 1
