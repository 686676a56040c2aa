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


def test_in_verbose_mode_a_node_event_is_one_event_on_the_nodewright_naming_the_node() -> None:
    occ = kube_events.for_event(_stage_failed(), cr_uid="uid-cr", node_uid="uid-node")
    body = kube_events.body(occ, instance="status-0")
    assert body["apiVersion"] == "events.k8s.io/v1"
    assert body["regarding"] == {
        "apiVersion": "nodewright.nvidia.com/v1alpha1",
        "kind": "NodeWright",
        "name": "gpu-tuning",
        "uid": "uid-cr",
    }
    assert body["related"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "node-1.example",
        "uid": "uid-node",
    }
    assert body["metadata"]["namespace"] == "default"
    assert body["metadata"]["labels"] == {"nodewright.nvidia.com/nodewright": "gpu-tuning"}
    assert (body["reason"], body["type"], body["action"]) == (
        "StageFailed",
        "Warning",
        "stage.failed",
    )
    assert body["eventTime"] == "2026-01-01T00:00:00.000000Z"
    assert body["reportingController"] == "nodewright.nvidia.com/status"
    assert body["reportingInstance"] == "status-0"
    # events.k8s.io/v1 refuses the core/v1 fields.
    assert not {"firstTimestamp", "lastTimestamp", "count", "source"} & set(body)
    assert DNS_SUBDOMAIN.match(body["metadata"]["name"])
    note = body["note"]
    for part in ("gpu-tuning", "node-1.example", "nvidia-tuned", "apply", "attempt 2"):
        assert part in note
    assert "ImagePullFailed: cannot pull image ghcr.io/x:0.9.0" in note
    assert "Pod nodewright-system/p1" in note


def test_a_series_is_one_event_per_kind_and_node_and_counts_each_occurrence_once() -> None:
    first = kube_events.for_event(_stage_failed())
    again = kube_events.for_event(_stage_failed())  # a redelivery: the same occurrence
    later = kube_events.for_event(_stage_failed(at=T0 + timedelta(hours=1), id="other"))
    other_node = kube_events.for_event(_stage_failed(node="node-2"))
    name = kube_events.body(first, instance="a")["metadata"]["name"]
    assert kube_events.body(again, instance="b")["metadata"]["name"] == name
    assert kube_events.body(later, instance="a")["metadata"]["name"] == name
    assert kube_events.body(other_node, instance="a")["metadata"]["name"] != name
    stored = {
        **kube_events.body(first, instance="a"),
        "metadata": {**kube_events.body(first, instance="a")["metadata"], "resourceVersion": "7"},
    }
    assert kube_events.series_patch(stored, again) is None
    patch = kube_events.series_patch(stored, later)
    assert patch is not None
    assert patch["series"] == {"count": 2, "lastObservedTime": "2026-01-01T01:00:00.000000Z"}
    # The API server refuses changing the note of an events.k8s.io Event: only the series moves.
    assert set(patch) == {"metadata", "series"}
    assert patch["metadata"]["resourceVersion"] == "7"
    counted = {
        **stored,
        "series": patch["series"],
        "metadata": {**stored["metadata"], "annotations": patch["metadata"]["annotations"]},
    }
    assert kube_events.series_patch(counted, later) is None
    third = kube_events.for_event(_stage_failed(at=T0 + timedelta(hours=2), id="third"))
    assert kube_events.series_patch(counted, third)["series"]["count"] == 3  # type: ignore[index]


def test_a_nodewright_created_again_with_the_same_name_gets_its_own_events() -> None:
    """kubectl describe shows the Events of the object's UID: a series of the deleted one
    must not swallow the new one's occurrences."""
    old = kube_events.for_event(_stage_failed(), cr_uid="uid-1")
    new = kube_events.for_event(_stage_failed(), cr_uid="uid-2")
    old_body, new_body = kube_events.body(old, instance="a"), kube_events.body(new, instance="a")
    assert old_body["metadata"]["name"] != new_body["metadata"]["name"]
    assert new_body["regarding"]["uid"] == "uid-2"


def test_a_whole_nodewright_event_relates_to_no_node() -> None:
    event = events.NodeCompleted(id="x", at=T0, cr="gpu-tuning", generation=1)
    body = kube_events.body(kube_events.for_event(event), instance="i")
    assert body["regarding"]["kind"] == "NodeWright"
    assert "related" not in body
    assert body["type"] == "Normal"
    assert "every node" in body["note"]


def test_notes_are_bounded() -> None:
    long = Reason(code="StageFailed", message="y" * 10_000)
    body = kube_events.body(kube_events.for_event(_stage_failed(reason=long)), instance="i")
    assert len(body["note"]) == kube_events.MESSAGE_MAX
    assert body["note"].endswith("...")


def test_a_dead_letter_of_a_known_nodewright_is_a_warning_on_it() -> None:
    original = subjects.event(cr="gpu.tuning", node="node-1", kind="stage.failed")
    letter = kube_events.DeadLetter(
        subject=subjects.dead_letter("executor"),
        original_subject=original,
        error="malformed event: expected object",
        deliveries="1",
        size=9,
    )
    occ = kube_events.for_dead_letter(
        letter, key="S/7/t", cr_uid="uid-1", fallback_namespace="nw-system", at=T0
    )
    body = kube_events.body(occ, instance="i")
    assert body["metadata"]["namespace"] == "default"
    assert body["regarding"]["kind"] == "NodeWright"
    assert body["regarding"]["name"] == "gpu.tuning"
    assert (body["reason"], body["type"]) == ("DeadLetteredEvent", "Warning")
    for part in ("executor", "stage.failed", "node-1", "malformed event", "9 bytes"):
        assert part in body["note"]
    # The next dead letter of the same service and kind counts in the same Event.
    second = kube_events.for_dead_letter(
        letter, key="S/8/t", cr_uid="uid-1", fallback_namespace="nw-system", at=T0
    )
    assert kube_events.body(second, instance="i")["metadata"]["name"] == body["metadata"]["name"]
    assert kube_events.series_patch(body, second) is not None


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
    occ = kube_events.for_dead_letter(
        letter, key="k", cr_uid=None, fallback_namespace="nw-system", at=T0
    )
    body = kube_events.body(occ, instance="i")
    assert body["metadata"]["namespace"] == "nw-system"
    assert body["regarding"] == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "name": "nw-system",
        "namespace": "nw-system",
    }
    assert body["type"] == "Warning"
    assert "dead-lettered" in body["note"]


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
    defaults = config.load(Settings, {}).status
    assert (defaults.verbose_events, defaults.ui) == (False, True)
    verbose = config.load(Settings, {"NODEWRIGHT_STATUS_VERBOSE_EVENTS": "true"}).status
    assert verbose.verbose_events is True
    with pytest.raises(config.ConfigError, match="NODEWRIGHT_STATUS_WORKERS"):
        config.load(Settings, {"NODEWRIGHT_STATUS_WORKERS": "0"})
