"""Kubernetes Events built from bus events and dead letters: reasons, types, messages,
deterministic names and where they live."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from services.status import kube_events
from services.status.config import Settings
from shared import config, events, subjects
from shared.events import ObjectRef, Reason
from tests.helpers.facts import T0

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _stage_failed(**kw: object) -> events.StageFailed:
    fields: dict[str, object] = {
        "id": "gpu-tuning/node-1.example/nvidia-tuned/0.9.0/apply/2/failed",
        "at": T0,
        "cr": "gpu-tuning",
        "generation": 3,
        "node": "node-1.example",
        "package": "nvidia-tuned",
        "version": "0.9.0",
        "stage": "apply",
        "attempt": 2,
        "reason": Reason(
            code="ImagePullFailed",
            message="cannot pull image ghcr.io/x:0.9.0",
            objects=(ObjectRef(kind="Pod", name="p1", namespace="nodewright-system"),),
        ),
    }
    fields.update(kw)
    return events.StageFailed(**fields)  # type: ignore[arg-type]


def test_every_event_kind_has_a_camel_case_reason() -> None:
    for kind in events.KINDS:
        reason = kube_events.reason_of(kind)
        assert re.fullmatch(r"[A-Z][A-Za-z]+", reason), (kind, reason)
        assert kind in kube_events.REASONS, f"{kind} has no reason in the table"
    assert kube_events.reason_of("node.cordoned") == "Cordoned"
    assert kube_events.reason_of("stage.validation-failed") == "ValidationFailed"
    assert kube_events.reason_of("node.brand-new") == "NodeBrandNew"


@pytest.mark.parametrize(
    ("kind", "type_"),
    [
        ("stage.failed", "Warning"),
        ("stage.validation-failed", "Warning"),
        ("node.drain-blocked", "Warning"),
        ("node.drain-failed", "Warning"),
        ("node.selected", "Normal"),
        ("node.completed", "Normal"),
        ("node.waiting", "Normal"),
    ],
)
def test_failures_and_blocked_drains_are_warnings(kind: str, type_: str) -> None:
    assert kube_events.type_of(kind) == type_


def test_a_node_event_raises_one_event_on_the_nodewright_and_one_on_the_node() -> None:
    event = _stage_failed()
    on_cr, on_node = kube_events.for_event(
        event, cr_uid="uid-cr", node_uid="uid-node", instance="status-0"
    )
    assert on_cr["involvedObject"] == {
        "apiVersion": "nodewright.nvidia.com/v1alpha1",
        "kind": "NodeWright",
        "name": "gpu-tuning",
        "uid": "uid-cr",
    }
    assert on_node["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "node-1.example",
        "uid": "uid-node",
    }
    for body in (on_cr, on_node):
        assert body["metadata"]["namespace"] == "default"
        assert body["metadata"]["labels"] == {"nodewright.nvidia.com/nodewright": "gpu-tuning"}
        assert (body["reason"], body["type"]) == ("StageFailed", "Warning")
        assert body["firstTimestamp"] == body["lastTimestamp"] == "2026-01-01T00:00:00Z"
        assert DNS_SUBDOMAIN.match(body["metadata"]["name"])
        message = body["message"]
        for part in ("gpu-tuning", "node-1.example", "nvidia-tuned", "apply", "attempt 2"):
            assert part in message
        assert "ImagePullFailed: cannot pull image ghcr.io/x:0.9.0" in message
        assert "Pod nodewright-system/p1" in message
    assert on_cr["metadata"]["name"] != on_node["metadata"]["name"]


def test_event_names_are_deterministic_and_differ_per_message() -> None:
    event = _stage_failed()
    again = kube_events.for_event(event, instance="another-replica")
    assert [b["metadata"]["name"] for b in again] == [
        b["metadata"]["name"] for b in kube_events.for_event(event, instance="x")
    ]
    later = kube_events.for_event(_stage_failed(at=T0 + timedelta(hours=1)), instance="x")
    other = kube_events.for_event(_stage_failed(id="other"), instance="x")
    names = {b["metadata"]["name"] for b in [*again, *later, *other]}
    assert len(names) == 6


def test_a_whole_nodewright_event_has_no_node_event() -> None:
    event = events.NodeCompleted(id="x", at=T0, cr="gpu-tuning", generation=1)
    (body,) = kube_events.for_event(event, instance="i")
    assert body["involvedObject"]["kind"] == "NodeWright"
    assert body["type"] == "Normal"
    assert "every node" in body["message"]


def test_messages_are_bounded() -> None:
    long = Reason(code="StageFailed", message="y" * 10_000)
    (body, _) = kube_events.for_event(_stage_failed(reason=long), instance="i")
    assert len(body["message"]) == kube_events.MESSAGE_MAX
    assert body["message"].endswith("...")


def test_a_dead_letter_of_a_known_nodewright_is_a_warning_on_it() -> None:
    original = subjects.event(cr="gpu.tuning", node="node-1", kind="stage.failed")
    letter = kube_events.DeadLetter(
        subject=subjects.dead_letter("executor"),
        original_subject=original,
        error="malformed event: expected object",
        deliveries="1",
        size=9,
    )
    body = kube_events.for_dead_letter(
        letter, key="S/7/t", cr_uid="uid-1", fallback_namespace="nw-system", at=T0, instance="i"
    )
    assert body["metadata"]["namespace"] == "default"
    assert body["involvedObject"]["kind"] == "NodeWright"
    assert body["involvedObject"]["name"] == "gpu.tuning"
    assert (body["reason"], body["type"]) == ("DeadLetteredEvent", "Warning")
    for part in ("executor", "stage.failed", "node-1", "malformed event", "9 bytes"):
        assert part in body["message"]


@pytest.mark.parametrize(
    "letter",
    [
        pytest.param(kube_events.DeadLetter(subject="nw.dlq.x"), id="no-headers"),
        pytest.param(
            kube_events.DeadLetter(subject="nw.dlq.x", original_subject="garbage.subject"),
            id="not-an-event-subject",
        ),
        pytest.param(
            kube_events.DeadLetter(
                subject="nw.dlq.x", original_subject="nw.ev.unknown-cr.-.node.selected"
            ),
            id="unknown-nodewright",
        ),
    ],
)
def test_a_dead_letter_naming_no_known_nodewright_lands_on_the_namespace(
    letter: kube_events.DeadLetter,
) -> None:
    body = kube_events.for_dead_letter(
        letter, key="k", cr_uid=None, fallback_namespace="nw-system", at=T0, instance="i"
    )
    assert body["metadata"]["namespace"] == "nw-system"
    assert body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "name": "nw-system",
        "namespace": "nw-system",
    }
    assert body["type"] == "Warning"
    assert "dead-lettered" in body["message"]


def test_status_settings_come_from_the_environment() -> None:
    settings = config.load(
        Settings,
        {
            "NODEWRIGHT_STATUS_WORKERS": "2",
            "NODEWRIGHT_STATUS_NODE_WRITES": "8",
            "NODEWRIGHT_STATUS_REPLAY_HISTORY": "true",
        },
    )
    assert (settings.status.workers, settings.status.node_writes) == (2, 8)
    assert settings.status.replay_history is True
    assert config.load(Settings, {}).status.replay_history is False
    with pytest.raises(config.ConfigError, match="NODEWRIGHT_STATUS_WORKERS"):
        config.load(Settings, {"NODEWRIGHT_STATUS_WORKERS": "0"})
