"""JetStream plumbing: the event stream, publishing with dedupe, and the consume loop.

- :func:`ensure_stream` creates or updates the one stream (file storage, limits retention) that
  keeps every event replayable; any replica of any service may call it.
- :class:`Publisher` publishes an event with ``Nats-Msg-Id`` = its deterministic id, as a
  CloudEvent in binary content mode (``ce-*`` headers, ``shared.cloudevents``; the payload is
  the event as before), and retries while JetStream has no responder (a restart or leader
  election): nats-py does not. It sends nothing while the connection is down: nats-py would
  buffer each attempt and deliver them all on reconnecting, however late, and a copy that
  reaches JetStream after its deduplication window is stored twice. With ``send_by`` it
  sends no attempt that could arrive after that instant (:class:`TooLate`).
- :class:`Consumer` runs a durable pull consumer with explicit AckWait, MaxDeliver, BackOff
  and MaxAckPending. The handler decides, the loop acts and logs once: ``Ack``; ``Retry`` ->
  nak with delay (dead-lettered once MaxDeliver is reached); ``Reject`` -> term and
  dead-letter. A payload that does not decode is dead-lettered at once and never reaches the
  handler. A dead letter is a CloudEvent too (``com.nvidia.nodewright.dead-letter``).
  :class:`RawConsumer` is the same loop over raw messages that never dead-letters (for
  reading the dead letters). The one loop re-binds the consumer after errors, because
  nats-py pull subscriptions do not recover from a server restart by themselves.

What an event means is the handler's business, not this module's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from prometheus_client import CollectorRegistry, Counter

from shared import cloudevents, collectors, events, subjects
from shared.bus import Bus
from shared.config import NatsSettings

_log = logging.getLogger("nodewright.streaming")

HEADER_ERROR = "Nodewright-Error"
HEADER_SUBJECT = "Nodewright-Original-Subject"
HEADER_SEQUENCE = "Nodewright-Original-Sequence"
HEADER_DELIVERIES = "Nodewright-Deliveries"

_PUBLISH_ATTEMPTS = 8
_PUBLISH_TIMEOUT_S = 5.0
SUBJECT_SCAN_LIMIT: Final = 4096
"""At most this many messages of one subject are read by :meth:`Publisher.ids_on`: a
subject is one kind of event about one node and NodeWright, a few per rollout, kept for
the stream's ``max_age``."""


ATTEMPT_SPAN: Final = timedelta(seconds=_PUBLISH_TIMEOUT_S)
"""How long after it is sent an attempt may still reach JetStream: its timeout."""


class TooLate(Exception):
    """An attempt would be sent after the publish's ``send_by``: the caller looks up whether
    the stream holds the event instead (its deduplication window may be over)."""


_REBIND_BACKOFF_MAX_S = 10.0


def stream_config(settings: NatsSettings) -> StreamConfig:
    return StreamConfig(
        name=settings.stream,
        subjects=[subjects.ALL],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        max_age=settings.stream_max_age_s,
        duplicate_window=settings.duplicate_window_s,
        num_replicas=settings.stream_replicas,
    )


async def ensure_stream(js: JetStreamContext, settings: NatsSettings) -> None:
    """Create the event stream, or update it to ``settings``; safe to race with other replicas."""
    config = stream_config(settings)
    try:
        await js.stream_info(settings.stream)
    except nats.js.errors.NotFoundError:
        try:
            await js.add_stream(config)
            return
        except nats.js.errors.BadRequestError:
            pass  # another replica created it between our two calls
    await js.update_stream(config)


class Publisher:
    """Publishes events with dedupe and retries through JetStream outages."""

    def __init__(
        self,
        bus: Bus,
        *,
        source: str,
        registry: CollectorRegistry | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._nc = bus.nc
        self._js = bus.js
        self._now = now
        self._stream = bus.settings.stream
        self._window_s = bus.settings.duplicate_window_s
        self.source = source
        self._published = collectors.once(
            registry,
            "nodewright_events_published",
            lambda: Counter(
                "nodewright_events_published",
                "Events published, by kind and whether JetStream reported a duplicate",
                ["kind", "duplicate"],
                registry=registry,
            ),
        )

    async def publish(self, event: events.Event, *, send_by: datetime | None = None) -> bool:
        """Publish ``event``; return False when JetStream had it already (a duplicate).

        Raises :class:`TooLate` rather than send an attempt that may still be in flight at
        ``send_by``, and the last error after :data:`_PUBLISH_ATTEMPTS` failed ones."""
        payload = events.encode(event)
        headers = {"Nats-Msg-Id": event.id, **cloudevents.headers(cloudevents.attributes(event))}
        delay = 0.1
        for attempt in range(1, _PUBLISH_ATTEMPTS + 1):
            if send_by is not None and self._now() + ATTEMPT_SPAN > send_by:
                raise TooLate(event.id)
            try:
                if not self._nc.is_connected:
                    # Buffered, this attempt would go out on reconnecting, however late.
                    raise nats.errors.ConnectionReconnectingError
                ack = await self._js.publish(
                    event.subject,
                    payload,
                    stream=self._stream,
                    headers=headers,
                    timeout=_PUBLISH_TIMEOUT_S,
                )
            except (
                nats.js.errors.NoStreamResponseError,
                nats.errors.TimeoutError,
                nats.errors.ConnectionReconnectingError,
                nats.js.errors.ServiceUnavailableError,
            ):
                if attempt == _PUBLISH_ATTEMPTS:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            self._published.labels(event.kind, str(bool(ack.duplicate)).lower()).inc()
            return not ack.duplicate
        raise AssertionError("unreachable")  # pragma: no cover

    @property
    def duplicate_window_s(self) -> float:
        """How long JetStream drops a re-published ``Nats-Msg-Id``."""
        return self._window_s

    async def last_id(self, subject: str) -> str | None:
        """The ``Nats-Msg-Id`` of the last message the stream holds on ``subject`` (None:
        none, or none with an id)."""
        try:
            msg = await self._js.get_last_msg(self._stream, subject)
        except nats.js.errors.NotFoundError:
            return None
        headers = msg.headers or {}
        found = headers.get("Nats-Msg-Id")
        return str(found) if found else None

    async def ids_on(self, subject: str) -> set[str]:
        """The ``Nats-Msg-Id`` of every message the stream holds on ``subject``, oldest
        first, one request each (at most :data:`SUBJECT_SCAN_LIMIT`: beyond, the newest are
        missing and an old event may be published again)."""
        ids: set[str] = set()
        seq = 1
        for _ in range(SUBJECT_SCAN_LIMIT):
            try:
                msg = await self._js.get_msg(self._stream, seq=seq, subject=subject, next=True)
            except nats.js.errors.NotFoundError:
                break
            found = (msg.headers or {}).get("Nats-Msg-Id")
            if found:
                ids.add(str(found))
            if msg.seq is None:
                break
            seq = msg.seq + 1
        return ids


# ---- consuming ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ack:
    """Done: the side effect happened (or was not needed)."""


@dataclass(frozen=True)
class Retry:
    """A temporary problem: redeliver after ``delay_s``."""

    why: str
    delay_s: float = 5.0


@dataclass(frozen=True)
class Reject:
    """A permanent problem with this message: never redeliver; dead-letter it."""

    why: str


Outcome = Ack | Retry | Reject


@dataclass(frozen=True)
class Delivery:
    """What the handler may want to know about the message besides the event."""

    subject: str
    stream_sequence: int
    deliveries: int


Handler = Callable[[events.AnyEvent, Delivery], Awaitable[Outcome]]


@dataclass(frozen=True)
class ConsumerSpec:
    """A durable pull consumer. Field defaults are deliberate; see each docstring."""

    durable: str
    filter_subjects: tuple[str, ...]
    ack_wait_s: float = 60.0
    """How long a delivery may stay un-acked; handlers wait on Kubernetes calls, keep it long."""
    max_deliver: int = 10
    """Deliveries before a message is dead-lettered; never unbounded (-1 hides poison)."""
    backoff_s: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0)
    """Redelivery delays after ack timeouts; must be shorter than max_deliver (server rule)."""
    max_ack_pending: int = 256
    """In-flight messages per consumer; at the limit the server silently stops delivering."""
    batch: int = 32
    concurrency: int = 16
    deliver_new_only: bool = False
    """Start a brand-new durable at the stream's end instead of replaying history."""

    def config(self) -> ConsumerConfig:
        return ConsumerConfig(
            durable_name=self.durable,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait_s,
            max_deliver=self.max_deliver,
            backoff=list(self.backoff_s),
            max_ack_pending=self.max_ack_pending,
            filter_subjects=list(self.filter_subjects),
            deliver_policy=DeliverPolicy.NEW if self.deliver_new_only else DeliverPolicy.ALL,
        )


@dataclass
class _Metrics:
    handled: Counter
    dead: Counter

    @classmethod
    def make(cls, registry: CollectorRegistry | None) -> _Metrics:
        return collectors.once(registry, "nodewright_events_handled", lambda: cls._new(registry))

    @classmethod
    def _new(cls, registry: CollectorRegistry | None) -> _Metrics:
        return cls(
            handled=Counter(
                "nodewright_events_handled",
                "Events handled, by consumer, kind and outcome",
                ["consumer", "kind", "outcome"],
                registry=registry,
            ),
            dead=Counter(
                "nodewright_events_dead_lettered",
                "Messages copied to the dead-letter subject, by consumer",
                ["consumer"],
                registry=registry,
            ),
        )


@dataclass
class _PullLoop:
    """A durable pull consumer's loop: bind (creating the stream and the consumer if need
    be), fetch, hand each message to :meth:`_handle` (at most ``spec.concurrency`` at once),
    re-bind after errors with backoff, and let in-flight messages finish on stop. What a
    message means and how it is acked is the subclass's."""

    bus: Bus
    spec: ConsumerSpec
    stopping: asyncio.Event

    async def run(self) -> None:
        delay = 0.2
        while not self.stopping.is_set():
            try:
                await ensure_stream(self.bus.js, self.bus.settings)
                await self.bus.js.add_consumer(self.bus.settings.stream, self.spec.config())
                sub = await self.bus.js.pull_subscribe_bind(
                    durable=self.spec.durable, stream=self.bus.settings.stream
                )
                delay = 0.2
                await self._pull(sub)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self.stopping.is_set():
                    return
                _log.warning(
                    "Re-binding JetStream consumer",
                    extra={"consumer": self.spec.durable, "error": repr(exc), "retry_s": delay},
                )
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self.stopping.wait()
                delay = min(delay * 2, _REBIND_BACKOFF_MAX_S)

    async def _pull(self, sub: JetStreamContext.PullSubscription) -> None:
        sem = asyncio.Semaphore(self.spec.concurrency)
        inflight: set[asyncio.Task[None]] = set()
        try:
            while not self.stopping.is_set():
                try:
                    msgs = await sub.fetch(self.spec.batch, timeout=1.0)
                except (nats.errors.TimeoutError, TimeoutError):
                    continue  # nothing to fetch in this round
                for msg in msgs:
                    await sem.acquire()
                    task = asyncio.create_task(self._handle(msg), name="event-handler")
                    inflight.add(task)
                    task.add_done_callback(inflight.discard)
                    task.add_done_callback(lambda _: sem.release())
        finally:
            # Let in-flight handlers finish: their side effects are done or about to be acked.
            if inflight:
                await asyncio.gather(*inflight, return_exceptions=True)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _handle(self, msg: Msg) -> None:
        raise NotImplementedError


RawHandler = Callable[[Msg], Awaitable[Outcome]]


@dataclass
class RawConsumer(_PullLoop):
    """A consumer that hands every message, decoded or not, to ``report`` and never
    dead-letters: a message it cannot handle is dropped after ``max_deliver`` attempts, with
    an error log (the status service reads the dead letters themselves with it)."""

    report: RawHandler = field(kw_only=True)

    async def _handle(self, msg: Msg) -> None:
        deliveries = msg.metadata.num_delivered
        try:
            outcome = await self.report(msg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            _log.exception("Failed to handle message", extra={"subject": msg.subject})
            outcome = Retry(why=repr(exc), delay_s=5.0)
        match outcome:
            case Ack():
                await msg.ack()
            case Retry(why=why, delay_s=delay_s):
                if deliveries >= self.spec.max_deliver:
                    _log.error(
                        "Dropped message after retries",
                        extra={"subject": msg.subject, "why": why, "attempt": deliveries},
                    )
                    await msg.term()
                else:
                    await msg.nak(delay=delay_s)
            case Reject(why=why):
                _log.error("Dropped message", extra={"subject": msg.subject, "why": why})
                await msg.term()


@dataclass
class Consumer(_PullLoop):
    """One durable consumer's loop over decoded events; run :meth:`run` as a root task."""

    handler: Handler = field(kw_only=True)
    service: str = field(kw_only=True)
    registry: CollectorRegistry | None = field(default=None, kw_only=True)
    _metrics: _Metrics = field(init=False)

    def __post_init__(self) -> None:
        self._metrics = _Metrics.make(self.registry)

    async def _handle(self, msg: Msg) -> None:
        meta = msg.metadata
        delivery = Delivery(
            subject=msg.subject,
            stream_sequence=meta.sequence.stream,
            deliveries=meta.num_delivered,
        )
        log_extra = {
            "consumer": self.spec.durable,
            "subject": msg.subject,
            "stream_seq": delivery.stream_sequence,
            "attempt": delivery.deliveries,
        }
        try:
            event = events.decode(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            _log.error("Dead-lettered malformed event", extra={**log_extra, "error": str(exc)})
            await self._dead_letter(msg, delivery, f"malformed event: {exc}")
            await msg.term()
            self._metrics.handled.labels(self.spec.durable, "malformed", "rejected").inc()
            return
        kind = event.kind
        try:
            outcome = await self.handler(event, delivery)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # An unexpected error is treated as temporary: the state is in Kubernetes, and a
            # later delivery (or the resync) can succeed. MaxDeliver bounds the retries.
            _log.exception("Failed to handle event", extra={**log_extra, "kind": kind})
            outcome = Retry(why=repr(exc), delay_s=5.0)
        match outcome:
            case Ack():
                await msg.ack()
                self._metrics.handled.labels(self.spec.durable, kind, "acked").inc()
            case Retry(why=why, delay_s=delay_s):
                if delivery.deliveries >= self.spec.max_deliver:
                    _log.error(
                        "Dead-lettered event after retries",
                        extra={**log_extra, "kind": kind, "why": why},
                    )
                    await self._dead_letter(msg, delivery, f"gave up after retries: {why}")
                    await msg.term()
                    self._metrics.handled.labels(self.spec.durable, kind, "dead").inc()
                else:
                    _log.info(
                        "Retrying event later",
                        extra={**log_extra, "kind": kind, "why": why, "delay_s": delay_s},
                    )
                    await msg.nak(delay=delay_s)
                    self._metrics.handled.labels(self.spec.durable, kind, "retried").inc()
            case Reject(why=why):
                _log.error("Rejected event", extra={**log_extra, "kind": kind, "why": why})
                await self._dead_letter(msg, delivery, why)
                await msg.term()
                self._metrics.handled.labels(self.spec.durable, kind, "rejected").inc()

    async def _dead_letter(self, msg: Msg, delivery: Delivery, why: str) -> None:
        msg_id = f"dlq/{self.spec.durable}/{delivery.stream_sequence}"
        attributes = cloudevents.dead_letter_attributes(
            service=self.service, id_=msg_id, original_subject=msg.subject, at=datetime.now(UTC)
        )
        headers = {
            **cloudevents.headers(attributes),
            "Nats-Msg-Id": msg_id,
            HEADER_ERROR: why[:1024],
            HEADER_SUBJECT: msg.subject,
            HEADER_SEQUENCE: str(delivery.stream_sequence),
            HEADER_DELIVERIES: str(delivery.deliveries),
        }
        await self.bus.js.publish(
            subjects.dead_letter(self.service),
            msg.data,
            stream=self.bus.settings.stream,
            headers=headers,
            timeout=5,
        )
        self._metrics.dead.labels(self.spec.durable).inc()
