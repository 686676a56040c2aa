"""Every stream message as a CloudEvent 1.0: the NATS protocol binding's binary content mode.

The binding (cloudevents/spec, ``cloudevents/bindings/nats-protocol-binding.md``; binary mode
needs NATS message headers, which the released 1.0.2 text predates) puts each context
attribute in a NATS header named ``ce-<attribute>`` and the event data in the payload as it
is. NodeWright's payload is unchanged, so the wire contract stays additive: every consumer
decodes the payload exactly as before, and ``Nats-Msg-Id`` (JetStream's dedupe) stays the
event's deterministic id. The attributes:

============================  =================================================================
``ce-specversion``            ``1.0``
``ce-id``                     the event's ``id`` (the ``Nats-Msg-Id``): the same fact has one id
``ce-source``                 ``/nodewright/<service>`` (the replica is in the payload's source)
``ce-type``                   ``com.nvidia.nodewright.<kind>``, e.g. ``...node.selected``
``ce-subject``                ``nodewrights/<cr>`` or ``nodewrights/<cr>/nodes/<node>``
``ce-time``                   the event's ``at``, RFC 3339 in UTC
``ce-datacontenttype``        ``application/json``
``ce-dataschema``             the JSON Schema of the kind in ``schemas/events.v<v>.json``: the
                              contract version is in the URI (a breaking change is a new URI)
============================  =================================================================

A dead letter is a CloudEvent of its own (``com.nvidia.nodewright.dead-letter``, data the
original payload as ``application/octet-stream``: it may not even be JSON). Values are
percent-encoded as the binding asks (space, ``"``, ``%`` and anything outside printable
ASCII). :func:`structured` gives the JSON event format (structured mode) of a message, for
tools that want one document per event. Pure: no I/O; publishing is ``shared.streaming``'s.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from shared import events

SPEC_VERSION: Final = "1.0"
TYPE_PREFIX: Final = "com.nvidia.nodewright."
DEAD_LETTER_TYPE: Final = f"{TYPE_PREFIX}dead-letter"
JSON_CONTENT: Final = "application/json"
OPAQUE_CONTENT: Final = "application/octet-stream"
SCHEMA_ID: Final = "https://nodewright.nvidia.com/schemas/events.v{version}.json"
"""The ``$id`` of the JSON Schema of contract version ``version`` (schemas/events.v1.json);
an identifier, like a Kubernetes API group, not a page to fetch."""
HEADER_PREFIX: Final = "ce-"
ATTRIBUTES: Final = (
    "specversion",
    "id",
    "source",
    "type",
    "subject",
    "time",
    "datacontenttype",
    "dataschema",
)


def encode_value(value: str) -> str:
    """The binding's percent-encoding of a header value."""
    out: list[str] = []
    for ch in value:
        if ch in ' "%' or not ("\x21" <= ch <= "\x7e"):
            out.extend(f"%{b:02X}" for b in ch.encode())
        else:
            out.append(ch)
    return "".join(out)


def decode_value(value: str) -> str:
    """Undo :func:`encode_value` (one round of percent-decoding, UTF-8 checked)."""
    raw = bytearray()
    i = 0
    while i < len(value):
        if value[i] == "%" and i + 2 < len(value):
            raw.append(int(value[i + 1 : i + 3], 16))
            i += 3
        else:
            raw.extend(value[i].encode())
            i += 1
    return raw.decode("utf-8")


def _time(at: datetime) -> str:
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def source_of(emitter: str) -> str:
    """``/nodewright/<service>`` from the payload's ``source`` (``<service>/<replica>``)."""
    service = emitter.split("/", 1)[0]
    return f"/nodewright/{service}" if service else "/nodewright"


def schema_of(event: events.Event) -> str:
    """The dataschema URI of the event's kind in its contract version's schema."""
    return SCHEMA_ID.format(version=event.v) + f"#/$defs/{type(event).__name__}"


def attributes(event: events.Event) -> dict[str, str]:
    """The CloudEvents context attributes of an event, unencoded."""
    subject = f"nodewrights/{event.cr}" + (f"/nodes/{event.node}" if event.node else "")
    return {
        "specversion": SPEC_VERSION,
        "id": event.id,
        "source": source_of(event.source),
        "type": TYPE_PREFIX + event.kind,
        "subject": subject,
        "time": _time(event.at),
        "datacontenttype": JSON_CONTENT,
        "dataschema": schema_of(event),
    }


def dead_letter_attributes(
    *, service: str, id_: str, original_subject: str, at: datetime
) -> dict[str, str]:
    """The attributes of a dead letter: the copy of a message ``service`` could not handle."""
    return {
        "specversion": SPEC_VERSION,
        "id": id_,
        "source": source_of(service),
        "type": DEAD_LETTER_TYPE,
        "subject": original_subject,
        "time": _time(at),
        "datacontenttype": OPAQUE_CONTENT,
    }


def headers(attrs: Mapping[str, str]) -> dict[str, str]:
    """NATS headers carrying ``attrs`` (binary content mode)."""
    return {HEADER_PREFIX + name: encode_value(value) for name, value in attrs.items()}


def from_headers(hdrs: Mapping[str, str] | None) -> dict[str, str]:
    """The CloudEvents attributes a message's headers carry (names are case-insensitive);
    {} for a message that is no CloudEvent."""
    out = {}
    for name, value in (hdrs or {}).items():
        if name.lower().startswith(HEADER_PREFIX):
            out[name.lower()[len(HEADER_PREFIX) :]] = decode_value(value)
    return out


def structured(attrs: Mapping[str, str], data: bytes) -> dict[str, Any]:
    """The JSON event format of a message (structured mode): the attributes, and ``data``
    (parsed JSON) or ``data_base64`` (anything else)."""
    doc: dict[str, Any] = dict(attrs)
    if attrs.get("datacontenttype") == JSON_CONTENT:
        try:
            doc["data"] = json.loads(data)
            return doc
        except ValueError:
            pass
    doc["data_base64"] = base64.b64encode(data).decode()
    return doc
