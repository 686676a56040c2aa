"""The JetStream plumbing against a real nats-server: dedupe, ack decisions, dead letters,
and recovery from a server restart."""

from __future__ import annotations

import asyncio
import gc
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import nats
import pytest
from nats.aio.msg import Msg

from nodewright.rig import Rig
from shared import bus as shared_bus, events, streaming, subjects
from shared.bus import Bus
from shared.config import NatsSettings
from tests.helpers.waiting import eventually


@pytest.fixture
async def bus(rig: Rig) -> AsyncIterator[Bus]:
    settings = NatsSettings(url=rig.endpoints.nats_url, stream=f"T{uuid.uuid4().hex[:10].upper()}")
    nc = await nats.connect(settings.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    the_bus = Bus(nc=nc, js=nc.jetstream(), settings=settings)
    await streaming.ensure_stream(the_bus.js, settings)
    try:
        yield the_bus
    finally:
        await the_bus.js.delete_stream(settings.stream)
        await nc.close()


def _selected(
    cr: str = "gpu.tuning", node: str = "node-1.example", n: int = 1
) -> events.NodeSelected:
    return events.NodeSelected(
        id=events.event_id(cr, 1, node, "node.selected", n),
        at=datetime.now(UTC),
        cr=cr,
        generation=1,
        node=node,
        compartment="default",
        batch=n,
        disruptive=True,
    )


async def _run(consumer: streaming.Consumer) -> asyncio.Task[None]:
    return asyncio.create_task(consumer.run())


async def _stop(consumer: streaming.Consumer, task: asyncio.Task[None]) -> None:
    consumer.stopping.set()
    await asyncio.wait_for(task, 15)


async def test_a_republished_event_is_stored_once_and_names_with_dots_survive(bus: Bus) -> None:
    publisher = streaming.Publisher(bus, source="test")
    event = _selected()
    assert await publisher.publish(event) is True
    assert await publisher.publish(event) is False, "same id: JetStream reports a duplicate"
    info = await bus.js.stream_info(bus.settings.stream)
    assert info.state.messages == 1
    assert event.subject == "nw.ev.gpu%2Etuning.node-1%2Eexample.node.selected"
    address = subjects.parse(event.subject)
    assert address == subjects.Address(cr="gpu.tuning", node="node-1.example", kind="node.selected")


async def test_the_ids_on_a_subject_are_every_message_there_and_the_last_is_the_newest(
    bus: Bus,
) -> None:
    """What :class:`shared.nodeshell.BusEvents` looks up for an event older than the
    deduplication window: the last message on its subject, and every one there."""
    publisher = streaming.Publisher(bus, source="test")
    first, second = _selected(n=1), _selected(n=2)
    other = _selected(node="node-2.example", n=3)  # another node: another subject
    for event in (first, other, second):
        assert await publisher.publish(event)
    assert first.subject == second.subject != other.subject
    assert await publisher.last_id(first.subject) == second.id
    assert await publisher.ids_on(first.subject) == {first.id, second.id}
    assert await publisher.ids_on(other.subject) == {other.id}
    nowhere = _selected(node="node-3.example").subject
    assert (await publisher.last_id(nowhere), await publisher.ids_on(nowhere)) == (None, set())


async def test_handler_outcomes_ack_retry_and_dead_letter(bus: Bus) -> None:
    publisher = streaming.Publisher(bus, source="test")
    seen: list[tuple[int, int]] = []

    async def handler(event: events.AnyEvent, delivery: streaming.Delivery) -> streaming.Outcome:
        assert isinstance(event, events.NodeSelected)
        seen.append((event.batch, delivery.deliveries))
        if event.batch == 1:
            return streaming.Ack()
        if event.batch == 2 and delivery.deliveries < 2:
            return streaming.Retry(why="not yet", delay_s=0.2)
        if event.batch == 2:
            return streaming.Ack()
        if event.batch == 3:
            return streaming.Reject(why="permanently wrong")
        return streaming.Retry(why="never works", delay_s=0.1)

    consumer = streaming.Consumer(
        bus=bus,
        spec=streaming.ConsumerSpec(
            durable="outcomes",
            filter_subjects=(subjects.kind_filter("node.selected"),),
            max_deliver=3,
            backoff_s=(0.5, 0.5),
        ),
        handler=handler,
        service="tester",
        stopping=asyncio.Event(),
    )
    task = await _run(consumer)
    for n in (1, 2, 3, 4):
        await publisher.publish(_selected(n=n))

    dlq = await bus.js.pull_subscribe(
        subjects.dead_letter("tester"), durable="dlq-reader", stream=bus.settings.stream
    )

    async def dead_letters() -> list[Msg]:
        try:
            return await dlq.fetch(10, timeout=1)
        except nats.errors.TimeoutError:
            return []

    got = await eventually(dead_letters, timeout_s=30, what="dead letters")
    more = await dead_letters()
    letters = {m.headers[streaming.HEADER_ERROR] if m.headers else "" for m in [*got, *more]}
    await _stop(consumer, task)
    assert (1, 1) in seen
    assert (2, 1) in seen
    assert (2, 2) in seen, "a retried event comes back"
    assert [d for b, d in seen if b == 3] == [1], "a rejected event is never redelivered"
    assert [d for b, d in seen if b == 4] == [1, 2, 3], "retries stop at max_deliver"
    assert letters == {"permanently wrong", "gave up after retries: never works"}


async def test_closing_after_a_consumer_fetched_is_prompt_and_sends_what_is_buffered(
    rig: Rig, bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    """A service's stop: its consumer fetched events, then the connection closes. Drained,
    nats-py waited for the fetched messages to be marked done, which a pull subscription
    never does: 5 s more on every stop, and a cancelled gather asyncio logged as an error.
    A publish still buffered when the connection closes reaches the stream."""
    handled: list[int] = []

    async def handler(event: events.AnyEvent, delivery: streaming.Delivery) -> streaming.Outcome:
        assert isinstance(event, events.NodeSelected)
        handled.append(event.batch)
        return streaming.Ack()

    publisher = streaming.Publisher(bus, source="test")
    for n in (1, 2, 3):
        await publisher.publish(_selected(n=n))
    stopping = asyncio.Event()
    late = _selected(n=4)
    async with shared_bus.connect(bus.settings, name="closing", stopping=stopping) as mine:
        consumer = streaming.Consumer(
            bus=mine,
            spec=streaming.ConsumerSpec(
                durable="closing", filter_subjects=(subjects.kind_filter("node.selected"),)
            ),
            handler=handler,
            service="closing",
            stopping=stopping,
        )
        task = await _run(consumer)
        await eventually(lambda: _contains(handled, 3), timeout_s=30, what="the events handled")
        await _stop(consumer, task)
        # Not awaited: still in the client's buffer when the connection closes.
        await mine.nc.publish(late.subject, events.encode(late))
        started = asyncio.get_running_loop().time()
    took = asyncio.get_running_loop().time() - started
    gc.collect()  # an unretrieved future is reported when it is collected
    assert took < 2.0, f"closing took {took:.1f} s: it waited for a drain"
    never = [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]
    assert never == []
    info = await bus.js.stream_info(bus.settings.stream)
    assert info.state.messages == 4, "the buffered publish was sent before closing"


async def test_a_malformed_payload_is_dead_lettered_and_the_consumer_keeps_going(bus: Bus) -> None:
    handled: list[int] = []

    async def handler(event: events.AnyEvent, delivery: streaming.Delivery) -> streaming.Outcome:
        assert isinstance(event, events.NodeSelected)
        handled.append(event.batch)
        return streaming.Ack()

    consumer = streaming.Consumer(
        bus=bus,
        spec=streaming.ConsumerSpec(
            durable="malformed", filter_subjects=(subjects.kind_filter("node.selected"),)
        ),
        handler=handler,
        service="tester2",
        stopping=asyncio.Event(),
    )
    task = await _run(consumer)
    subject = subjects.event(cr="x", node="n", kind="node.selected")
    await bus.js.publish(subject, b"{not json", stream=bus.settings.stream)
    await bus.js.publish(subject, b'{"kind":"node.selected","id":"x"}', stream=bus.settings.stream)
    await streaming.Publisher(bus, source="t").publish(_selected(n=7))

    async def handled_seven() -> bool:
        return 7 in handled

    await eventually(handled_seven, what="the good event after two bad ones")
    dlq = await bus.js.pull_subscribe(
        subjects.dead_letter("tester2"), durable="r", stream=bus.settings.stream
    )
    msgs = await dlq.fetch(2, timeout=5)
    await _stop(consumer, task)
    assert [m.data for m in msgs] == [b"{not json", b'{"kind":"node.selected","id":"x"}']
    assert all(m.headers and m.headers[streaming.HEADER_SUBJECT] == subject for m in msgs)
    assert handled == [7]


async def test_the_consumer_recovers_after_a_nats_server_restart(rig: Rig, bus: Bus) -> None:
    handled: list[int] = []

    async def handler(event: events.AnyEvent, delivery: streaming.Delivery) -> streaming.Outcome:
        assert isinstance(event, events.NodeSelected)
        handled.append(event.batch)
        return streaming.Ack()

    consumer = streaming.Consumer(
        bus=bus,
        spec=streaming.ConsumerSpec(
            durable="restart", filter_subjects=(subjects.kind_filter("node.selected"),)
        ),
        handler=handler,
        service="tester3",
        stopping=asyncio.Event(),
    )
    task = await _run(consumer)
    publisher = streaming.Publisher(bus, source="t")
    await publisher.publish(_selected(n=1))
    await eventually(lambda: _contains(handled, 1), what="event before the restart")
    rig.restart_nats()
    await publisher.publish(_selected(n=2))  # retries until JetStream answers again
    await eventually(lambda: _contains(handled, 2), timeout_s=60, what="event after the restart")
    await _stop(consumer, task)


async def _contains(items: list[int], value: int) -> bool:
    return value in items


async def test_a_publish_sends_nothing_while_nats_is_away_and_nothing_after_send_by(
    rig: Rig, bus: Bus
) -> None:
    """nats-py buffers what is published while it reconnects and sends it all once back,
    however late: a copy of an event reaching JetStream after its deduplication window is
    stored twice (CI, 200 nodes under kills and a NATS partition)."""
    # The fixture's stream with a 3 s window (the stream is deleted after the test).
    short = NatsSettings(url=bus.settings.url, stream=bus.settings.stream, duplicate_window_s=3)
    await bus.js.update_stream(streaming.stream_config(short))
    publisher = streaming.Publisher(Bus(nc=bus.nc, js=bus.js, settings=short), source="test")
    event = _selected(n=9)
    assert await publisher.publish(event)
    outage = asyncio.create_task(asyncio.to_thread(rig.restart_nats, down_s=6, crash=True))
    await eventually(lambda: _away(bus), what="the client to notice nats-server is gone")
    with pytest.raises(streaming.TooLate):
        await publisher.publish(
            event, send_by=datetime.now(UTC) + streaming.ATTEMPT_SPAN + timedelta(seconds=1)
        )
    await outage
    await eventually(lambda: bus.ready(), timeout_s=30, what="the client to reconnect")
    await asyncio.sleep(1)  # anything nats-py held back has been sent by now
    info = await bus.js.stream_info(short.stream)
    assert info.state.messages == 1, "no copy went out after the window"


async def _away(bus: Bus) -> bool:
    return not await bus.ready()
