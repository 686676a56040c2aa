"""The outbox: events of a transition written to Kubernetes in the same node patch as the
transition, and published afterwards.

Why: a service that wrote a transition (a stage recorded as succeeded, a node admitted) and
died before it published the event lost that event for good; the stream said less than
Kubernetes did. Now the events go into the node, under
``outbox.<owner>/<cr>`` (e.g. ``outbox.executor.nodewright.nvidia.com/gpu-node-tuning``; not
under ``<owner>/``, where every key is read as a record), *in the same write* as the record
they describe. Whoever next looks at the key — the same replica a moment later, another
replica, a restarted one — publishes what is there and the stream does not hold yet
(``shared.nodeshell.flush``). Nothing clears it on its own: the owner's next write of the
node drops the events known to be on the stream, so the annotation holds at most the
owner's last events (published, unless their writer died or NATS is away). JetStream drops
a re-published event by its ``Nats-Msg-Id`` (deterministic: :attr:`shared.events.Event.id`)
within its deduplication window; an older one is looked up on the stream before it is
published again (``shared.nodeshell.BusEvents``), so every transition that reached
Kubernetes is on the stream exactly once (docs/events.md "Guarantees").

Pure: keys, encoding and merging. Publishing is ``shared.nodeshell``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from shared import events, nodestate

PREFIX = "outbox."

_log = logging.getLogger("nodewright.outbox")
_encoder = msgspec.json.Encoder()
_decoder: msgspec.json.Decoder[list[events.AnyEvent]] = msgspec.json.Decoder(list[events.AnyEvent])


def key(owner: str, cr: str) -> str:
    """The annotation holding ``owner``'s unpublished events about ``cr``."""
    return f"{PREFIX}{owner}/{cr}"


def crs_with(node: Mapping[str, Any], owner: str) -> list[str]:
    """The CRs ``owner`` has an outbox about on ``node`` (its events published or not), sorted."""
    prefix = f"{PREFIX}{owner}/"
    return sorted(k[len(prefix) :] for k in nodestate.annotations_of(node) if k.startswith(prefix))


def pending(node: Mapping[str, Any] | None, owner: str, cr: str) -> tuple[events.Event, ...]:
    """The events ``owner``'s outbox about ``cr`` on ``node`` holds (published or not). An
    outbox that does not decode (written by a newer version, or damaged) is dropped with an
    error log: the records it was written with are the truth, and every service re-reads
    them."""
    if node is None:
        return ()
    raw = nodestate.annotations_of(node).get(key(owner, cr))
    if not raw:
        return ()
    try:
        return tuple(_decoder.decode(raw))
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        _log.error(
            "Dropped an outbox that does not decode",
            extra={"owner": owner, "nodewright": cr, "error": str(exc)},
        )
        return ()


def merged(before: Iterable[events.Event], new: Iterable[events.Event]) -> tuple[events.Event, ...]:
    """``before`` then ``new``, each event once (by id), in order."""
    out: dict[str, events.Event] = {}
    for event in (*before, *new):
        out.setdefault(event.id, event)
    return tuple(out.values())


def value(items: Iterable[events.Event]) -> str | None:
    """The annotation value for ``items`` (None removes the annotation)."""
    listed = list(items)
    return _encoder.encode(listed).decode() if listed else None
