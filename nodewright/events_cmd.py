"""``nodewright events``: follow the event stream, decoded, like ``kubectl get -w``.

Creates an ephemeral ordered consumer (nothing is acked or left behind) on the ``nw.ev.>``
subjects, optionally narrowed to one NodeWright and/or node, and prints one line per event
(``-o table``; ``wide`` adds the emitter and the event's id), or each message as a
structured CloudEvent (``-o json``: one JSON document per line; ``-o yaml``: YAML documents),
built from its ``ce-*`` headers (``shared.cloudevents``). Replays history with ``--all``.
Read-only.

The NATS URL is ``--server``, else ``$NATS_URL`` (what the ``nats`` CLI reads), else
``nats://127.0.0.1:4222``. On an install with NATS users (docs/install.md, "NATS users"),
``--user`` and ``--password-file`` (the reader's: Secret ``nodewright-nats-users-reader``) log
in; the password is read from a file, never from the command line, where ``ps`` shows it.
``--tls-ca`` verifies a TLS server. A server that does not answer, a missing stream or a lost
connection ends the command with one line saying what to do; nothing retries for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgspec

from nodewright import output
from nodewright.connecting import CommandError
from shared import cloudevents, events, subjects

if TYPE_CHECKING:
    from nats.aio.msg import Msg

DEFAULT_SERVER: Final = "nats://127.0.0.1:4222"
_CONNECT_ATTEMPTS: Final = 3
"""Tries of each server before giving up (about a second apart), at start and after a
connection is lost."""


def subject_filter(nodewright: str, node: str) -> str:
    cr = subjects.encode(nodewright) if nodewright else "*"
    nd = subjects.encode(node) if node else "*"
    return f"{subjects.EVENTS}.{cr}.{nd}.>"


def describe(event: events.AnyEvent, *, wide: bool = False) -> str:
    """One human line for an event."""
    fields = msgspec.structs.asdict(event)
    extras = []
    for key in ("package", "version", "stage", "batch", "compartment", "pod"):
        if fields.get(key) not in (None, ""):
            extras.append(f"{key}={fields[key]}")
    reason = fields.get("reason")
    if isinstance(reason, events.Reason):
        extras.append(f"reason={reason.code}: {reason.message}")
    if wide:
        extras.append(f"source={event.source or '-'} id={event.id}")
    where = f"{event.cr}/{event.node or '-'}"
    return (
        f"{event.at.isoformat(timespec='seconds')} {event.kind:<24} {where:<40} {' '.join(extras)}"
    )


def as_cloudevent(msg: Msg) -> dict[str, Any]:
    """A message as a structured CloudEvent; one published without ``ce-*`` headers (an
    older service) gets its attributes from the payload."""
    attrs = cloudevents.from_headers(msg.headers)
    if not attrs:
        with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
            attrs = cloudevents.attributes(events.decode(msg.data))
    return cloudevents.structured(attrs, msg.data or b"")


class Login(msgspec.Struct, frozen=True, kw_only=True):
    """How to log in to NATS: a user with a password file, and a CA for TLS."""

    user: str = ""
    password_file: str = ""
    tls_ca: str = ""

    def options(self) -> dict[str, Any]:
        """``nats.connect`` keyword arguments; CommandError when a file cannot be read."""
        out: dict[str, Any] = {}
        if self.password_file and not self.user:
            raise CommandError("--password-file needs --user (the reader is nodewright-reader)")
        if self.user:
            out["user"] = self.user
            if self.password_file:
                try:
                    out["password"] = Path(self.password_file).read_text().strip()
                except OSError as exc:
                    raise CommandError(
                        f"cannot read the password file {self.password_file}: {exc.strerror} "
                        "(e.g. `kubectl -n nodewright-system get secret "
                        "nodewright-nats-users-reader -o jsonpath='{.data.password}' | base64 -d "
                        "> reader.pw`)"
                    ) from None
        if self.tls_ca:
            import ssl

            try:
                out["tls"] = ssl.create_default_context(cafile=self.tls_ca)
            except (OSError, ssl.SSLError) as exc:
                raise CommandError(f"cannot use the CA file {self.tls_ca}: {exc}") from None
        return out


def _connect_problem(server: str, why: str) -> str:
    if "authorization" in why.lower() or "authentication" in why.lower():
        return (
            f"NATS at {server} refused the login ({why}): pass --user and --password-file "
            "(the reader's user and password are in Secret nodewright-nats-users-reader; "
            "docs/install.md, NATS users)"
        )
    return (
        f"cannot connect to NATS at {server} ({why}): is NodeWright's NATS running? "
        "(`nodewright sandbox` prints its URL) Pass --server URL or set NATS_URL"
    )


async def follow(
    *,
    server: str,
    stream: str,
    nodewright: str,
    node: str,
    replay: bool,
    fmt: output.Format,
    login: Login | None = None,
) -> None:
    import nats
    import nats.errors
    import nats.js.errors
    from nats.aio.client import Client as NATS
    from nats.js.api import DeliverPolicy

    from shared import bus

    failure: list[str] = []

    async def quiet(exc: Exception) -> None:
        # nats-py logs every failed attempt with a traceback by default; keep the last one
        # for the one line the command ends with.
        failure.append(str(exc) or type(exc).__name__)
        del failure[:-10]

    lost = asyncio.Event()

    async def closed() -> None:
        lost.set()

    options = (login or Login()).options()

    async def connect() -> NATS:
        for attempt in range(1, _CONNECT_ATTEMPTS + 1):
            try:
                return await bus.checked(
                    await nats.connect(
                        servers=server.split(","),
                        **options,
                        connect_timeout=2,
                        reconnect_time_wait=1,
                        max_reconnect_attempts=_CONNECT_ATTEMPTS,
                        error_cb=quiet,
                        closed_cb=closed,
                    )
                )
            except bus.HandshakeIncomplete:
                if attempt == _CONNECT_ATTEMPTS:
                    raise
                lost.clear()  # that client's close is not the one the command waits for
        raise AssertionError("unreachable")  # pragma: no cover

    try:
        nc = await connect()
    except (nats.errors.NoServersError, OSError, TimeoutError) as exc:
        # A refused login shows as an authorization error, then as the closed socket.
        refused = [f for f in failure if "authoriz" in f.lower() or "authentic" in f.lower()]
        why = (refused or failure or [str(exc) or type(exc).__name__])[-1]
        raise CommandError(_connect_problem(server, why)) from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        js = nc.jetstream()
        try:
            sub = await js.subscribe(
                subject_filter(nodewright, node),
                stream=stream,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.ALL if replay else DeliverPolicy.NEW,
            )
        except nats.js.errors.NotFoundError:
            raise CommandError(
                f"NATS at {server} has no stream {stream}: the services create it when they "
                "start (are they running against this server?); another name: --stream NAME"
            ) from None
        except (nats.errors.TimeoutError, nats.js.errors.APIError) as exc:
            why = failure[-1] if failure else str(exc) or type(exc).__name__
            raise CommandError(
                f"NATS at {server} did not let this user read stream {stream} ({why}): log in "
                "as the reader (--user nodewright-reader --password-file FILE)"
            ) from None
        first = True
        while not stop.is_set():
            if lost.is_set():
                why = f" ({failure[-1]})" if failure else ""
                raise CommandError(
                    f"lost the connection to NATS at {server}{why}; run the command again "
                    "once it is back"
                )
            try:
                msg = await sub.next_msg(timeout=0.5)
            except nats.errors.TimeoutError:
                continue
            except nats.errors.ConnectionClosedError:
                lost.set()
                continue
            if fmt in ("json", "yaml"):
                doc = as_cloudevent(msg)
                if fmt == "json":
                    output.say(json.dumps(doc, separators=(",", ":")))
                else:
                    output.say(("" if first else "---\n") + output.document(doc, "yaml"))
                first = False
                continue
            try:
                event = events.decode(msg.data)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                output.say(f"{msg.subject}: undecodable event ({exc})")
                continue
            output.say(describe(event, wide=fmt == "wide"))
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        with contextlib.suppress(Exception):
            await nc.close()


def run(
    *,
    server: str,
    stream: str,
    nodewright: str,
    node: str,
    replay: bool,
    fmt: output.Format,
    login: Login | None = None,
) -> None:
    asyncio.run(
        follow(
            server=server,
            stream=stream,
            nodewright=nodewright,
            node=node,
            replay=replay,
            fmt=fmt,
            login=login,
        )
    )
