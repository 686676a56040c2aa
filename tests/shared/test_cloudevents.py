"""The CloudEvents attributes of events and dead letters, their header encoding (the NATS
binding's percent-encoding) and the structured form, from known inputs; and the duration
histograms' measurements."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import msgspec
import pytest

from shared import cloudevents, durations, events, progress
from shared.records.drainer import DrainRecord
from shared.records.executor import ExecutorRecord, PackageRecord
from tests.helpers.facts import T0, node


def _selected(**kw: object) -> events.NodeSelected:
    fields: dict[str, object] = {
        "id": "gpu/node-1.example/selected/1",
        "at": T0,
        "cr": "gpu",
        "generation": 1,
        "node": "node-1.example",
        "source": "scheduler/scheduler-7d9f",
        "compartment": "__default__",
        "batch": 1,
        "disruptive": True,
    }
    fields.update(kw)
    return events.NodeSelected(**fields)  # type: ignore[arg-type]


def test_an_event_has_every_attribute_the_issue_names() -> None:
    assert cloudevents.attributes(_selected()) == {
        "specversion": "1.0",
        "id": "gpu/node-1.example/selected/1",
        "source": "/nodewright/scheduler",
        "type": "com.nvidia.nodewright.node.selected",
        "subject": "nodewrights/gpu/nodes/node-1.example",
        "time": "2026-01-01T00:00:00Z",
        "datacontenttype": "application/json",
        "dataschema": "https://nodewright.nvidia.com/schemas/events.v1.json#/$defs/NodeSelected",
    }
    whole = cloudevents.attributes(events.NodeCompleted(id="x", at=T0, cr="gpu", generation=1))
    assert whole["subject"] == "nodewrights/gpu"
    assert whole["source"] == "/nodewright", "no emitter named"


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        ("plain-ascii/1.0:x", "plain-ascii/1.0:x"),
        ("a b", "a%20b"),
        ('say "hi"', "say%20%22hi%22"),
        ("100%", "100%25"),
        ("Euro € 😀", "Euro%20%E2%82%AC%20%F0%9F%98%80"),
        ("tab\there", "tab%09here"),
    ],
)
def test_header_values_are_percent_encoded_as_the_binding_says(value: str, encoded: str) -> None:
    assert cloudevents.encode_value(value) == encoded
    assert cloudevents.decode_value(encoded) == value
    lower = re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), encoded)
    assert cloudevents.decode_value(lower) == value, "decoding accepts lower-case escapes"


def test_headers_round_trip_case_insensitively_and_ignore_others() -> None:
    attrs = cloudevents.attributes(_selected(node="node 1"))
    headers = {**cloudevents.headers(attrs), "Nats-Msg-Id": "x"}
    assert headers["ce-subject"] == "nodewrights/gpu/nodes/node%201"
    upper = {k.upper() if k.startswith("ce-") else k: v for k, v in headers.items()}
    assert cloudevents.from_headers(upper) == attrs
    assert cloudevents.from_headers(None) == {}


def test_the_structured_form_carries_json_data_or_base64() -> None:
    event = _selected()
    doc = cloudevents.structured(cloudevents.attributes(event), events.encode(event))
    assert doc["data"]["kind"] == "node.selected"
    assert "data_base64" not in doc
    letter = cloudevents.dead_letter_attributes(
        service="status", id_="dlq/status/7", original_subject="nw.ev.a.b.c", at=T0
    )
    assert letter["type"] == "com.nvidia.nodewright.dead-letter"
    assert "dataschema" not in letter
    raw = cloudevents.structured(letter, b"\x00\xff")
    assert raw["data_base64"] == "AP8="


def test_stage_and_drain_durations_come_from_the_records_before_the_result() -> None:
    running = PackageRecord(version="1.0", stage="apply", state="running", attempt=2, updated=T0)
    drain = DrainRecord(phase="draining", cordoned=True, started=T0, since=T0)
    facts = progress.facts(
        node(
            "n",
            records={
                "executor.nodewright.nvidia.com": ExecutorRecord(packages={"p": running}),
                "drainer.nodewright.nvidia.com": drain,
            },
        ),
        "gpu-node-tuning",
    )
    later = T0 + timedelta(seconds=42)
    base: dict[str, Any] = {
        "id": "i",
        "at": later,
        "cr": "gpu-node-tuning",
        "generation": 1,
        "node": "n",
    }
    ok = events.StageSucceeded(**base, package="p", version="1.0", stage="apply", attempt=2)
    assert durations.stage_seconds(ok, facts) == (("p", "apply", "succeeded"), 42.0)
    reason = events.Reason(code="StageFailed", message="m")
    bad = events.StageFailed(
        **base, package="p", version="1.0", stage="apply", attempt=2, reason=reason
    )
    assert durations.stage_seconds(bad, facts) == (("p", "apply", "failed"), 42.0)
    # Another attempt or stage than the record's: the start is unknown, nothing is observed.
    assert durations.stage_seconds(msgspec.structs.replace(ok, attempt=3), facts) is None
    assert durations.stage_seconds(msgspec.structs.replace(ok, stage="config"), facts) is None
    drained = events.NodeDrained(**base, evicted=3)
    assert durations.drain_seconds(drained, facts) == ("drained", 42.0)
    assert durations.drain_seconds(ok, facts) is None
