"""The supervisor stops cleanly, gives graceful tasks their time, and treats a root task
that ends as a crash; the config loader names the variable at fault."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from shared import config, runtime


async def test_sigterm_cancels_caches_at_once_and_lets_graceful_tasks_finish() -> None:
    sup = runtime.Supervisor(name="t", graceful_timeout_s=5)
    log: list[str] = []

    async def cache() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            log.append("cache cancelled")
            raise

    async def consumer() -> None:
        await sup.stopping.wait()
        await asyncio.sleep(0.2)  # in-flight work
        log.append("consumer drained")

    sup.add("cache", cache)
    sup.add("consumer", consumer, graceful=True)
    run = asyncio.create_task(sup.run())
    await asyncio.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)
    assert await asyncio.wait_for(run, 5) == 0
    assert log == ["cache cancelled", "consumer drained"]


async def test_a_root_task_that_fails_stops_the_service_with_exit_code_1() -> None:
    sup = runtime.Supervisor(name="t", graceful_timeout_s=1)

    async def boom() -> None:
        raise RuntimeError("boom")

    async def forever() -> None:
        await asyncio.Event().wait()

    sup.add("boom", boom)
    sup.add("forever", forever)
    assert await asyncio.wait_for(sup.run(), 5) == 1


def test_config_decodes_groups_and_rejects_unknown_or_bad_variables() -> None:
    s = config.load(
        config.ServiceSettings,
        {"NODEWRIGHT_NATS_URL": "nats://x:1", "NODEWRIGHT_HEALTH_PORT": "9000", "HOME": "/x"},
    )
    assert s.nats.url == "nats://x:1"
    assert s.health.port == 9000
    with pytest.raises(config.ConfigError, match="NODEWRIGHT_NATS_URLS"):
        config.load(config.ServiceSettings, {"NODEWRIGHT_NATS_URLS": "x"})
    with pytest.raises(config.ConfigError, match="NODEWRIGHT_HEALTH_PORT"):
        config.load(config.ServiceSettings, {"NODEWRIGHT_HEALTH_PORT": "70000"})
