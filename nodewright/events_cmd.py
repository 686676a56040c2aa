"""``nodewright events``: follow the event stream, decoded, like ``kubectl get -w``.

Creates an ephemeral ordered consumer (nothing is acked or left behind) on the
``nw.ev.>`` subjects, optionally narrowed to one NodeWright and/or node, and prints one line
per event. Replays history with ``--all``. Read-only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from typing import Any

import msgspec
import nats
from nats.js.api import DeliverPolicy

from shared import events, subjects


def add_parser(sub: Any) -> None:
    p = sub.add_parser("events", help="follow NodeWright's event stream")
    p.add_argument("--server", default="nats://127.0.0.1:4222", help="NATS URL")
    p.add_argument("--stream", default="NODEWRIGHT", help="JetStream stream name")
    p.add_argument("--nodewright", default="", help="only events of this NodeWright")
    p.add_argument("--node", default="", help="only events about this node")
    p.add_argument("--all", action="store_true", help="replay the stored history first")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    p.set_defaults(handler=run)


def subject_filter(nodewright: str, node: str) -> str:
    cr = subjects.encode(nodewright) if nodewright else "*"
    nd = subjects.encode(node) if node else "*"
    return f"{subjects.EVENTS}.{cr}.{nd}.>"


def describe(event: events.AnyEvent) -> str:
    """One human line for an event."""
    fields = msgspec.structs.asdict(event)
    extras = []
    for key in ("package", "version", "stage", "batch", "compartment", "pod"):
        if fields.get(key) not in (None, ""):
            extras.append(f"{key}={fields[key]}")
    reason = fields.get("reason")
    if isinstance(reason, events.Reason):
        extras.append(f"reason={reason.code}: {reason.message}")
    where = f"{event.cr}/{event.node or '-'}"
    return (
        f"{event.at.isoformat(timespec='seconds')} {event.kind:<24} {where:<40} {' '.join(extras)}"
    )


async def _follow(args: argparse.Namespace) -> int:
    nc = await nats.connect(args.server)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        js = nc.jetstream()
        sub = await js.subscribe(
            subject_filter(args.nodewright, args.node),
            stream=args.stream,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL if args.all else DeliverPolicy.NEW,
        )
        while not stop.is_set():
            try:
                msg = await sub.next_msg(timeout=0.5)
            except nats.errors.TimeoutError:
                continue
            try:
                event = events.decode(msg.data)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                print(f"{msg.subject}: undecodable event ({exc})", flush=True)
                continue
            print(msg.data.decode() if args.output == "json" else describe(event), flush=True)
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
    return 0


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_follow(args))
