"""What a service's NATS connection logs, against a real nats-server on loopback: a lost
server is one warning, and the service's own stop none (nats-py calls the disconnected
callback from ``close()`` too: every clean stop of every service warned "Lost NATS")."""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from nodewright.rig import find_nats_server, free_port
from shared import bus, config
from tests.helpers.waiting import Pending, eventually


def _serve(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [str(find_nats_server()), "-a", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.05)


@pytest.fixture
def server() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    proc = _serve(port)
    try:
        yield f"nats://127.0.0.1:{port}", proc
    finally:
        proc.kill()
        proc.wait(10)


def _lost(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "nodewright.bus" and r.levelno >= logging.WARNING and r.msg == "Lost NATS"
    ]


def _settings(url: str, caplog: pytest.LogCaptureFixture) -> config.NatsSettings:
    caplog.set_level(logging.DEBUG, logger="nodewright.bus")
    return config.NatsSettings(url=url, connect_timeout_s=2)


async def test_a_services_own_stop_is_no_outage(
    server: tuple[str, subprocess.Popen[bytes]], caplog: pytest.LogCaptureFixture
) -> None:
    settings = _settings(server[0], caplog)
    async with asyncio.timeout(20), bus.connect(settings, name="t", stopping=asyncio.Event()) as b:
        assert await b.ready()
    assert b.nc.is_closed
    assert _lost(caplog) == []


async def test_a_lost_server_is_one_warning(
    server: tuple[str, subprocess.Popen[bytes]], caplog: pytest.LogCaptureFixture
) -> None:
    settings, proc = _settings(server[0], caplog), server[1]
    async with asyncio.timeout(30), bus.connect(settings, name="t", stopping=asyncio.Event()) as b:
        assert await b.ready()
        proc.kill()
        proc.wait(10)

        async def warned() -> list[logging.LogRecord] | Pending:
            lost = _lost(caplog)
            return lost if lost else Pending("no warning yet")

        lost = await eventually(warned, timeout_s=10, what="the Lost NATS warning")
        await asyncio.sleep(2.5)  # reconnect attempts fail meanwhile (1 s apart)
    assert len(_lost(caplog)) == 1, lost


async def test_a_first_connection_that_fails_is_said_once_and_is_no_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """nats.connect retries the first connection as it reconnects, calling the error
    callback on every try: that said "Lost NATS", of a connection never made."""
    port = free_port()
    settings = _settings(f"nats://127.0.0.1:{port}", caplog)
    proc: subprocess.Popen[bytes] | None = None

    async def late_server() -> None:
        nonlocal proc
        await asyncio.sleep(1.0)
        proc = await asyncio.to_thread(_serve, port)

    try:
        async with asyncio.timeout(30):
            starting = asyncio.create_task(late_server())
            async with bus.connect(settings, name="t", stopping=asyncio.Event()) as b:
                assert await b.ready()
            await starting
    finally:
        if proc is not None:
            proc.kill()
            proc.wait(10)
    said = [
        r.msg for r in caplog.records if r.name == "nodewright.bus" and r.levelno >= logging.WARNING
    ]
    assert said == ["Failed to connect to NATS", "Connected to NATS"]
