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
import ssl
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from shared.config import NatsSettings
from shared.outages import Outage

_log = logging.getLogger("nodewright.bus")

_MAX_CONNECT_BACKOFF_S = 5.0
_FLUSH_TIMEOUT_S = 5
_CLOSING: weakref.WeakSet[NATS] = weakref.WeakSet()
"""Clients this process is closing: nats-py calls the disconnected callback from
``close()`` too, and a service's own stop is no outage to warn of."""


@dataclass(frozen=True)
class Bus:
    nc: NATS
    js: JetStreamContext
    settings: NatsSettings

    async def ready(self) -> bool:
        return bool(self.nc.is_connected)


def credentials(settings: NatsSettings) -> dict[str, Any]:
    """The user, password and TLS context ``nats.connect`` takes, from the settings."""
    options: dict[str, Any] = {}
    if settings.user:
        options["user"] = settings.user
        if settings.password_file:
            options["password"] = Path(settings.password_file).read_text().strip()
    if settings.tls_ca_file:
        context = ssl.create_default_context(cafile=settings.tls_ca_file)
        if settings.tls_cert_file:
            context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file or None)
        options["tls"] = context
    return options


async def _connect_once(settings: NatsSettings, name: str) -> NATS:
    # One warning when NATS is lost, one when it is back (nats-py calls error_cb on every
    # failed reconnect attempt: a 30 s outage was ~100 warnings per service).
    outage = Outage(lost="Lost NATS", back="Reconnected to NATS", log=_log)
    # nats.connect retries the first connection too (unbounded reconnects), calling on_error
    # for each try: that is no lost connection yet.
    first = Outage(lost="Failed to connect to NATS", back="Connected to NATS", log=_log)
    client: list[NATS] = []  # once connected

    async def on_error(exc: Exception) -> None:
        (outage if client else first).failed(str(exc))

    async def on_disconnected() -> None:
        if client and client[0] in _CLOSING:
            return
        outage.failed("disconnected")

    async def on_reconnected() -> None:
        outage.answered()

    nc = await nats.connect(
        servers=settings.url.split(","),
        name=name,
        **credentials(settings),
        connect_timeout=settings.connect_timeout_s,
        allow_reconnect=True,
        max_reconnect_attempts=-1,
        reconnect_time_wait=1,
        error_cb=on_error,
        disconnected_cb=on_disconnected,
        reconnected_cb=on_reconnected,
    )
    client.append(nc)
    nc = await checked(nc)
    first.answered()  # only once the handshake is whole: see checked()
    return nc


class HandshakeIncomplete(ConnectionError):
    """nats.connect returned a client that is not connected (see :func:`checked`)."""


async def checked(nc: NATS) -> NATS:
    """``nc`` as ``nats.connect`` returned it, if it is connected; else closed, and
    :class:`HandshakeIncomplete` raised (connect again).

    nats-py (2.16) takes the first line after its handshake PING for the PONG. When the
    server sends another line first (an asynchronous INFO: seen when a slow password check
    held the CONNECT for 2.6 s during a helm upgrade), connect() returns a client that is
    still "connecting" and never writes: every request would time out, forever."""
    if nc.is_connected:
        return nc
    _CLOSING.add(nc)
    with contextlib.suppress(Exception):
        await nc.close()
    raise HandshakeIncomplete(
        "the NATS server answered the handshake with another message first; connect again"
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
        await _close(nc)


async def _close(nc: NATS) -> None:
    """Send what is still buffered, then close. Not ``drain()``: nats-py (2.16) never marks
    the messages a pull subscription fetched as done, so a drain waited for them until its
    timeout (5 s more on every stop of a service with a consumer) and left a cancelled
    gather that asyncio logged as an error. Nothing is lost without it: events are acked
    after their side effect, so one fetched and not acked is delivered again."""
    if nc.is_connected:
        with contextlib.suppress(Exception):
            await nc.flush(timeout=_FLUSH_TIMEOUT_S)
    _CLOSING.add(nc)
    await nc.close()
