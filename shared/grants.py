"""Least privilege on the bus: which NATS subjects each service, and a read-only operator,
may publish and subscribe to.

Each service connects as its own NATS user, ``nodewright-<service>``, allowed only what it
does: publish its own event kinds (``nw.ev.*.*.<kind>``) and its dead letters
(``nw.dlq.<service>``), manage the stream (any service may create it first), bind and pull
its own durable consumers and ack their messages, and receive replies on ``_INBOX.>``. The
reader (``nodewright-reader``) may follow the stream (ephemeral consumers, live
subscriptions, stream info and message reads) and nothing else: it cannot publish an event,
ack a service's messages, or change or delete the stream or a consumer. A process that runs
all five services (``python -m services``, the chart's ``oneProcess`` layout) connects once,
as ``nodewright-services``, allowed what the five are together and nothing more.

:func:`authorization` renders these as a nats-server ``authorization`` block, for the
official NATS chart's ``config.merge`` (docs/install.md, "NATS users"). Pure data; who
connects how is shared.bus's job, generating passwords the CLI's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from shared import subjects

SERVICES: Final = ("scheduler", "drainer", "executor", "validator", "status")
PUBLISHES: Final[Mapping[str, tuple[str, ...]]] = {
    "scheduler": ("node.selected", "node.completed", "node.rebooted"),
    "drainer": (
        "node.cordoned",
        "node.waiting",
        "node.drain-blocked",
        "node.drained",
        "node.drain-failed",
        "node.uncordoned",
    ),
    "executor": ("stage.started", "stage.succeeded", "stage.failed"),
    "validator": ("stage.validated", "stage.validation-failed", "node.validated"),
    "status": (),
}
"""The event kinds each service publishes (shared.events): no two services share one."""
CONSUMERS: Final[Mapping[str, tuple[str, ...]]] = {
    "scheduler": ("scheduler",),
    "drainer": ("drainer",),
    "executor": ("executor",),
    "validator": ("validator",),
    "status": ("status", "status-dead-letters"),
}
"""The durable consumers each service binds (their names in the stream)."""
READER: Final = "reader"
ONE_PROCESS: Final = "services"
"""The user of a process running all five services: one connection carries all their work."""


def user(who: str) -> str:
    """The NATS user name of a service, or of the reader."""
    return f"nodewright-{who}"


def _stream_admin(stream: str) -> list[str]:
    return [
        "$JS.API.INFO",
        f"$JS.API.STREAM.INFO.{stream}",
        f"$JS.API.STREAM.CREATE.{stream}",
        f"$JS.API.STREAM.UPDATE.{stream}",
    ]


def _consumer(stream: str, durable: str) -> list[str]:
    return [
        f"$JS.API.CONSUMER.CREATE.{stream}.{durable}",
        f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.>",
        f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
        f"$JS.API.CONSUMER.INFO.{stream}.{durable}",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
    ]


def service_permissions(service: str, *, stream: str) -> dict[str, Any]:
    """What ``service`` may publish and subscribe to (nats-server ``permissions``)."""
    publish = [subjects.kind_filter(kind) for kind in PUBLISHES[service]]
    publish.append(subjects.dead_letter(service))
    publish += _stream_admin(stream)
    # The last message on a subject: is an old outbox event on the stream already?
    # (shared.nodeshell.BusEvents)
    publish.append(f"$JS.API.STREAM.MSG.GET.{stream}")
    for durable in CONSUMERS[service]:
        publish += _consumer(stream, durable)
    return {"publish": {"allow": publish}, "subscribe": {"allow": ["_INBOX.>"]}}


def one_process_permissions(*, stream: str) -> dict[str, Any]:
    """The union of the five services' permissions, each subject once, in their order."""
    allowed = [
        subject
        for service in SERVICES
        for subject in service_permissions(service, stream=stream)["publish"]["allow"]
    ]
    return {
        "publish": {"allow": list(dict.fromkeys(allowed))},
        "subscribe": {"allow": ["_INBOX.>"]},
    }


def reader_permissions(*, stream: str) -> dict[str, Any]:
    """Follow the stream, change nothing: ephemeral (unnamed) consumers only, so a reader can
    neither take over a service's durable consumer nor ack its messages."""
    return {
        "publish": {
            "allow": [
                "$JS.API.INFO",
                # Clients find the stream of a subject by name lookup (nats-py's subscribe
                # without stream=, the nats CLI): names only.
                "$JS.API.STREAM.NAMES",
                f"$JS.API.STREAM.INFO.{stream}",
                f"$JS.API.STREAM.MSG.GET.{stream}",
                f"$JS.API.CONSUMER.CREATE.{stream}",
                f"$JS.API.CONSUMER.INFO.{stream}.*",
                f"$JS.API.CONSUMER.MSG.NEXT.{stream}.*",
                f"$JS.FC.{stream}.>",
            ],
            "deny": [subjects.ALL, "$JS.ACK.>"],
        },
        "subscribe": {"allow": ["_INBOX.>", f"{subjects.EVENTS}.>"]},
    }


def authorization(passwords: Mapping[str, str], *, stream: str = "NODEWRIGHT") -> dict[str, Any]:
    """A nats-server ``authorization`` block with one user per entry of ``passwords``
    (service name, :data:`ONE_PROCESS` or :data:`READER` -> password or bcrypt hash)."""
    users = []
    for who, password in sorted(passwords.items()):
        if who == READER:
            permissions = reader_permissions(stream=stream)
        elif who == ONE_PROCESS:
            permissions = one_process_permissions(stream=stream)
        elif who in PUBLISHES:
            permissions = service_permissions(who, stream=stream)
        else:
            known = ", ".join((*SERVICES, ONE_PROCESS, READER))
            raise ValueError(f"unknown NATS user {who!r}: one of {known}")
        users.append({"user": user(who), "password": password, "permissions": permissions})
    return {"users": users}
