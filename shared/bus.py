"""The NATS connection every service uses.

Connects with unbounded reconnects (a NATS restart must not kill a service) and retries the
first connection until it succeeds or the service is asked to stop. The JetStream stream,
consumers and the publish/consume loops are built on top of :class:`Bus` by
``shared.streaming``; this module only owns the connection and its readiness.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import nats
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from shared.config import NatsSettings

_log = logging.getLogger("nodewright.bus")

_MAX_CONNECT_BACKOFF_S = 5.0


@dataclass(frozen=True)
class Bus:
    nc: NATS
    js: JetStreamContext
    settings: NatsSettings

    async def ready(self) -> bool:
        return bool(self.nc.is_connected)


async def _connect_once(settings: NatsSettings, name: str) -> NATS:
    async def on_error(exc: Exception) -> None:
        _log.warning("NATS connection error", extra={"error": str(exc)})

    async def on_disconnected() -> None:
        _log.warning("Disconnected from NATS")

    async def on_reconnected() -> None:
        _log.info("Reconnected to NATS")

    return await nats.connect(
        servers=settings.url.split(","),
        name=name,
        connect_timeout=settings.connect_timeout_s,
        allow_reconnect=True,
        max_reconnect_attempts=-1,
        reconnect_time_wait=1,
        error_cb=on_error,
        disconnected_cb=on_disconnected,
        reconnected_cb=on_reconnected,
    )


@contextlib.asynccontextmanager
async def connect(
    settings: NatsSettings, *, name: str, stopping: asyncio.Event
) -> AsyncIterator[Bus]:
    """Connect, retrying with backoff until connected or ``stopping`` is set."""
    delay = 0.2
    nc: NATS | None = None
    while nc is None:
        try:
            nc = await _connect_once(settings, name)
        except Exception as exc:
            if stopping.is_set():
                raise
            _log.warning("Failed to connect to NATS", extra={"error": str(exc), "retry_s": delay})
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await stopping.wait()
            if stopping.is_set():
                raise
            delay = min(delay * 2, _MAX_CONNECT_BACKOFF_S)
    try:
        yield Bus(nc=nc, js=nc.jetstream(), settings=settings)
    finally:
        # drain() flushes pending publishes and lets subscriptions finish; close() if that fails.
        try:
            await asyncio.wait_for(nc.drain(), timeout=5)
        except Exception:
            await nc.close()
