"""The first connection survives a server that answers the handshake PING with another line
first (an asynchronous INFO before the PONG): the services' connect drops that client, which
nats-py would leave "connecting" and silent for ever, and connects again.

The peer is a scripted NATS protocol speaker on loopback: a real nats-server sends that INFO
only under timing no test can force (a password check slowed to 2.6 s by a loaded node, in the
helm upgrade of the install tests), so the sequence is played byte for byte instead."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from shared import bus, config

INFO = {
    "server_id": "NSCRIPTED",
    "server_name": "scripted",
    "version": "2.15.1",
    "proto": 1,
    "headers": True,
    "max_payload": 1048576,
}


@dataclass
class Peer:
    """Answers the first ``early_info`` connections' PING with an INFO, then the PONG; later
    ones with the PONG only. Keeps what every connection sent after its CONNECT."""

    early_info: int
    port: int = 0
    received: list[bytes] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = len(self.received)
        self.received.append(b"")
        writer.write(f"INFO {json.dumps(INFO)}\r\n".encode())
        await writer.drain()
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while line := await reader.readline():
                if line.startswith(b"CONNECT"):
                    continue
                if line.startswith(b"PING"):
                    if index < self.early_info:
                        urls = {**INFO, "connect_urls": ["127.0.0.1:4222"]}
                        writer.write(f"INFO {json.dumps(urls)}\r\n".encode())
                    writer.write(b"PONG\r\n")
                    await writer.drain()
                    continue
                self.received[index] += line
        writer.close()


@contextlib.asynccontextmanager
async def serving(peer: Peer) -> AsyncIterator[Peer]:
    server = await asyncio.start_server(peer.handle, "127.0.0.1", 0)
    peer.port = server.sockets[0].getsockname()[1]
    async with server:
        yield peer


@pytest.mark.timeout(30)
async def test_a_client_left_connecting_by_an_early_info_is_dropped_and_connected_again() -> None:
    async with serving(Peer(early_info=1)) as peer:
        settings = config.NatsSettings(url=f"nats://127.0.0.1:{peer.port}")
        stopping = asyncio.Event()
        async with bus.connect(settings, name="test", stopping=stopping) as b:
            assert await b.ready()
            await b.nc.publish("nw.probe", b"x")
            await b.nc.flush(timeout=5)
        assert len(peer.received) == 2, "the first client was dropped, a second one connected"
        assert b"PUB nw.probe" in peer.received[1]


@pytest.mark.timeout(30)
async def test_checked_refuses_a_client_that_is_not_connected() -> None:
    import nats

    async with serving(Peer(early_info=1)) as peer:
        nc = await nats.connect(f"nats://127.0.0.1:{peer.port}", allow_reconnect=False)
        with pytest.raises(bus.HandshakeIncomplete, match="connect again"):
            await bus.checked(nc)
        assert nc.is_closed
