"""A command's connections get :data:`nodewright.connecting.CLOSE_DEADLINE_S` to close: a
TLS close the API server does not answer (asyncio waits up to 30 s for one) must not hold
the command after its answer, nor after ^C."""

from __future__ import annotations

import asyncio

import pytest

from nodewright import connecting


async def test_a_close_that_never_ends_does_not_hold_the_command() -> None:
    never = asyncio.Event()
    await asyncio.wait_for(connecting.closed(never.wait(), 0.05), 10)
    assert not never.is_set()


async def test_a_close_that_ends_is_waited_for() -> None:
    done: list[bool] = []

    async def close() -> None:
        await asyncio.sleep(0)
        done.append(True)

    await connecting.closed(close(), 5)
    assert done == [True]


async def test_after_a_cancel_the_close_is_bounded_and_the_cancel_goes_on() -> None:
    """What asyncio.run does on ^C: cancel the command; its close must not hang the exit."""
    started = asyncio.Event()

    async def command() -> None:
        try:
            started.set()
            await asyncio.Event().wait()  # following a log
        finally:
            await connecting.closed(asyncio.Event().wait(), 0.05)

    task = asyncio.create_task(command())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)
