"""A service's NATS connection with a user, a password file and TLS, against a real
nats-server on loopback that requires all three."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodewright.rig import find_nats_server, free_port, pki
from shared import bus, config


@pytest.fixture
def secure_server(tmp_path: Path) -> Iterator[tuple[str, pki.Pki]]:
    certs = pki.write(tmp_path / "pki")
    port = free_port()
    proc = subprocess.Popen(
        [
            str(find_nats_server()),
            "-a",
            "127.0.0.1",
            "-p",
            str(port),
            "--tls",
            "--tlscert",
            str(certs.serving_cert),
            "--tlskey",
            str(certs.serving_key),
            "--user",
            "nodewright-executor",
            "--pass",
            "s3cret",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"nats://127.0.0.1:{port}", certs
    finally:
        proc.terminate()
        proc.wait(10)


async def _connect(settings: config.NatsSettings) -> bool:
    stopping = asyncio.Event()
    async with asyncio.timeout(10), bus.connect(settings, name="t", stopping=stopping) as b:
        return await b.ready()


async def test_a_service_connects_with_its_user_password_file_and_tls(
    secure_server: tuple[str, pki.Pki], tmp_path: Path
) -> None:
    url, certs = secure_server
    password = tmp_path / "password"
    password.write_text("s3cret\n")
    settings = config.NatsSettings(
        url=url,
        user="nodewright-executor",
        password_file=str(password),
        tls_ca_file=str(certs.ca_cert),
        connect_timeout_s=2,
    )
    await asyncio.sleep(0.5)  # the server's listener
    assert await _connect(settings)


async def test_a_wrong_password_never_gets_in(
    secure_server: tuple[str, pki.Pki], tmp_path: Path
) -> None:
    url, certs = secure_server
    password = tmp_path / "password"
    password.write_text("guess\n")
    settings = config.NatsSettings(
        url=url,
        user="nodewright-executor",
        password_file=str(password),
        tls_ca_file=str(certs.ca_cert),
        connect_timeout_s=1,
    )
    with pytest.raises(TimeoutError):  # bus.connect keeps retrying: it never connects
        await _connect(settings)
