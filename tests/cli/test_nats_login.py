"""``nodewright nats-users`` and ``nodewright events`` logging in as the reader it made,
against a real nats-server on loopback that requires a user, a password and TLS and
enforces the reader's permissions (shared.grants) — the command lines run as processes."""

from __future__ import annotations

import asyncio
import json
import signal
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from nodewright import events_cmd, natsusers
from nodewright.rig import find_nats_server, free_port, pki
from shared import config, events, grants, streaming
from shared.bus import connect

pytestmark = pytest.mark.timeout(120)


@dataclass(frozen=True)
class Server:
    url: str
    ca: Path
    passwords: dict[str, str]
    out: Path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nodewright.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """nats-server with JetStream, TLS and the users `nodewright nats-users` wrote (its
    values' authorization block as the server's config), plus an admin with every right."""
    out = tmp_path / "users"
    made = _run("nats-users", "--out", str(out), "-n", "nw")
    assert made.returncode == 0, made.stderr
    assert "kubectl apply -f" in made.stdout
    secrets = {
        d["metadata"]["name"]: d["stringData"]
        for d in yaml.safe_load_all((out / natsusers.SECRETS_FILE).read_text())
    }
    passwords = {**secrets["nodewright-nats-users"]}
    passwords["reader"] = secrets["nodewright-nats-users-reader"]["password"]
    values = yaml.safe_load((out / natsusers.VALUES_FILE).read_text())
    users = values["config"]["merge"]["authorization"]["users"]
    users.append({"user": "admin", "password": "admin-pw"})
    certs = pki.write(tmp_path / "pki")
    port = free_port()
    conf = tmp_path / "nats.conf"
    conf.write_text(
        json.dumps(
            {
                "host": "127.0.0.1",
                "port": port,
                "jetstream": {"store_dir": str(tmp_path / "js")},
                "tls": {"cert_file": str(certs.serving_cert), "key_file": str(certs.serving_key)},
                "authorization": {"users": users},
            }
        )
    )
    proc = subprocess.Popen(
        [str(find_nats_server()), "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield Server(f"nats://127.0.0.1:{port}", certs.ca_cert, passwords, out)
    finally:
        proc.terminate()
        proc.wait(10)


async def _publish_one(s: Server) -> events.NodeSelected:
    """The scheduler's user publishes one event into the stream (the admin creates it)."""
    event = events.NodeSelected(
        id=events.event_id("tuning", "gpu-1", "selected"),
        at=datetime.now(UTC),
        cr="tuning",
        generation=1,
        node="gpu-1",
        compartment="default",
        batch=1,
        disruptive=True,
    )
    pw = s.out / "scheduler.pw"
    pw.write_text(s.passwords["scheduler"])
    settings = config.NatsSettings(
        url=s.url,
        user=grants.user("scheduler"),
        password_file=str(pw),
        tls_ca_file=str(s.ca),
        connect_timeout_s=2,
    )
    await asyncio.sleep(0.5)  # the server's listener
    stopping = asyncio.Event()
    async with asyncio.timeout(20), connect(settings, name="t", stopping=stopping) as b:
        assert await b.ready()
        await streaming.ensure_stream(b.js, settings)
        assert await streaming.Publisher(b, source="scheduler/test").publish(event)
    return event


async def test_events_logs_in_as_the_reader_and_follows_the_stream(server: Server) -> None:
    event = await _publish_one(server)
    pw = server.out / "reader.pw"
    pw.write_text(server.passwords["reader"] + "\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "nodewright.cli", "events", "--server", server.url,
        "--user", grants.user(grants.READER), "--password-file", str(pw),
        "--tls-ca", str(server.ca), "--all", "-o", "json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        doc = json.loads(line)
        assert doc["id"] == event.id
        assert doc["type"].endswith("node.selected")
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    assert "password" not in err.decode().lower()


def test_events_without_a_login_says_how_to_log_in(server: Server) -> None:
    result = _run("events", "--server", server.url, "--tls-ca", str(server.ca))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "refused the login" in lines[0]
    assert "--user and --password-file" in lines[0]
    assert "nodewright-nats-users-reader" in lines[0]


def test_a_wrong_password_is_refused_in_one_line(server: Server) -> None:
    pw = server.out / "wrong.pw"
    pw.write_text("guess")
    result = _run(
        "events", "--server", server.url, "--tls-ca", str(server.ca),
        "--user", grants.user(grants.READER), "--password-file", str(pw),
    )  # fmt: skip
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "refused the login" in lines[0]


def test_nats_users_writes_hashes_apart_from_the_passwords(tmp_path: Path) -> None:
    out = tmp_path / "u"
    result = _run("nats-users", "--out", str(out), "--secret", "nw-users", "-n", "ops")
    assert result.returncode == 0, result.stderr
    values = (out / natsusers.VALUES_FILE).read_text()
    secrets = list(yaml.safe_load_all((out / natsusers.SECRETS_FILE).read_text()))
    assert [(d["metadata"]["name"], d["metadata"]["namespace"]) for d in secrets] == [
        ("nw-users", "ops"),
        ("nw-users-reader", "ops"),
    ]
    for password in secrets[0]["stringData"].values():
        assert password not in values, "the values file holds hashes only"
    assert (out / natsusers.SECRETS_FILE).stat().st_mode & 0o077 == 0
    assert "--set nats.auth.secretName=nw-users" in result.stdout


def test_nats_users_into_a_file_says_so_in_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = _run("nats-users", "--out", str(blocker / "sub"))
    assert result.returncode != 0
    (line,) = result.stderr.strip().splitlines()
    assert str(blocker / "sub") in line


async def test_the_reader_cannot_take_over_a_service_consumer(server: Server) -> None:
    """The reader's grant lets it create unnamed consumers of its own (as `nodewright events`
    does), never a service's durable (that would change what the service receives)."""
    import nats
    import nats.errors
    import nats.js.errors
    from nats.js.api import ConsumerConfig

    await _publish_one(server)
    nc = await nats.connect(
        servers=[server.url],
        user=grants.user(grants.READER),
        password=server.passwords["reader"],
        tls=ssl.create_default_context(cafile=str(server.ca)),
        max_reconnect_attempts=1,
    )
    try:
        js = nc.jetstream(timeout=2)
        with pytest.raises((nats.errors.TimeoutError, nats.js.errors.APIError)):
            await js.add_consumer(
                "NODEWRIGHT", ConsumerConfig(durable_name="drainer", filter_subject="nw.ev.>")
            )
        sub = await js.subscribe(events_cmd.subject_filter("", ""), ordered_consumer=True)
        assert (await sub.next_msg(timeout=10)).subject.startswith("nw.ev.")
        await sub.unsubscribe()
    finally:
        await nc.close()
