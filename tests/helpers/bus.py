"""Waiting on JetStream instead of on the clock: a consumer has handled everything stored."""

from __future__ import annotations

from datetime import UTC, datetime

import nats
from nats.js import JetStreamContext

from shared import events
from tests.helpers.waiting import eventually


async def caught_up(js: JetStreamContext, stream: str, durable: str) -> bool:
    """Every message of ``stream`` the consumer ``durable`` filters is delivered and acked.
    Consumers of NodeWright ack an event only after a reconcile of what it names that
    started after it finished, so this says those reconciles happened."""
    info = await js.consumer_info(stream, durable)
    ack_floor = info.ack_floor.stream_seq if info.ack_floor is not None else 0
    delivered = info.delivered.stream_seq if info.delivered is not None else 0
    return (
        (info.num_pending or 0) == 0 and (info.num_ack_pending or 0) == 0 and ack_floor >= delivered
    )


async def nudge(
    nats_url: str, stream: str, *, cr: str, nodes: list[str], durable: str, tag: str
) -> None:
    """Make the services look at every (cr, node) again and wait until ``durable`` (a
    service's consumer of ``node.uncordoned``) acked it: each ack follows a reconcile of the
    pair that started after the event. A wait on a condition where a sleep would wait for a
    periodic resync."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        for node in nodes:
            event = events.NodeUncordoned(
                id=events.event_id(cr, node, "nudge", tag),
                at=datetime.now(UTC),
                cr=cr,
                generation=1,
                node=node,
                source="test",
            )
            await js.publish(
                event.subject,
                events.encode(event),
                stream=stream,
                headers={"Nats-Msg-Id": event.id},
            )
        await eventually(
            lambda: caught_up(js, stream, durable), timeout_s=60, what=f"{durable} to catch up"
        )
    finally:
        await nc.close()


async def stream_events(nats_url: str, *, cr: str, node: str) -> list[events.AnyEvent]:
    """Every event about ``node`` of NodeWright ``cr`` stored on the stream so far, in order
    (an ordered consumer from the start; nothing acked or left behind)."""
    from nats.js.api import DeliverPolicy

    from shared import subjects

    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        subject = f"{subjects.EVENTS}.{subjects.encode(cr)}.{subjects.encode(node)}.>"
        sub = await js.subscribe(subject, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL)
        found: list[events.AnyEvent] = []
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=1.0)
                except nats.errors.TimeoutError:
                    return found
                found.append(events.decode(msg.data))
        finally:
            await sub.unsubscribe()
    finally:
        await nc.close()
