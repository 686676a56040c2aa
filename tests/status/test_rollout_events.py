"""Kubernetes Events about nodes and the whole rollout: a node that failed, is blocked or
recovered raises one Event on the Node and one on the NodeWright, a healthy node none; a
complete rollout raises RolloutComplete once; a pass seen again names the same occurrence.
Status passes are computed as the status service computes them (``World`` from the
compartment tests), pure."""

from __future__ import annotations

import copy
from typing import Any

import msgspec

from services.status import assessing, core, kube_events
from shared.events import Reason
from shared.records.executor import ExecutorRecord, PackageRecord
from tests.helpers import status as status_helpers
from tests.helpers.facts import T0, reported
from tests.status.test_compartment_events import (
    CR,
    DRAINED,
    World,
    _admit,
    _batch,
    _exe,
    _fail,
    _finish,
    _sel,
    _world,
)


class Trail(World):
    """A World whose passes return the node and rollout Events they raise."""

    def trail(self) -> list[kube_events.Occurrence]:
        observed = [assessing.observe(n, CR) for n in self.nodes.values()]
        views, plan = status_helpers.assess(self.cr, self.policy, observed, self.now)
        status = core.summarize(self.cr, self.policy, views, self.now, plan)
        out = kube_events.node_changes(self.cr, views, observed, at=self.now)
        out += kube_events.rollout_change(self.cr, status, at=self.now)
        self.step()
        return out


def _trail(*names: str) -> Trail:
    w = _world(*names)
    return Trail(w.cr, list(w.nodes.values()))


def _seen(occurrences: list[kube_events.Occurrence]) -> list[tuple[str, str, str]]:
    return [(o.regarding.kind, o.reason, o.type_) for o in occurrences]


def test_a_healthy_rollout_raises_no_node_event_and_one_rollout_complete() -> None:
    w = _trail("a", "b")
    assert w.trail() == []
    w.book(default=_batch(1, ["a", "b"], planned=2))
    for name in ("a", "b"):
        _admit(w, name, 1)
    assert w.trail() == [], "admitted and running: no news for a person"
    for name in ("a", "b"):
        _finish(w, name)
    w.book()
    (done,) = w.trail()
    assert _seen([done]) == [("NodeWright", "RolloutComplete", "Normal")]
    assert "all 2 target nodes" in done.note
    assert w.trail() == [], "complete stays complete: said once"


def test_a_failed_node_is_a_warning_on_the_node_and_the_nodewright_until_it_recovers() -> None:
    w = _trail("a", "b")
    w.book(default=_batch(1, ["a"], planned=1))
    _admit(w, "a", 1)
    w.trail()
    _fail(w, "a")
    on_node, on_cr = w.trail()
    assert _seen([on_node, on_cr]) == [
        ("Node", "NodeFailed", "Warning"),
        ("NodeWright", "NodeFailed", "Warning"),
    ]
    assert (on_node.regarding.name, on_node.related) == (
        "a",
        kube_events.nodewright_ref(CR, "uid-1"),
    )
    assert on_cr.related == kube_events.node_ref("a")
    assert "node a failed" in on_cr.note
    assert "nodewright node retry a" in on_cr.note
    assert on_node.occurrence == on_cr.occurrence
    assert w.trail() == [], "still failed: no new Event"
    # A retry runs it again: it recovered.
    w.records("a", executor=_exe("running"))
    recovered = w.trail()
    assert _seen(recovered) == [
        ("Node", "NodeRecovered", "Normal"),
        ("NodeWright", "NodeRecovered", "Normal"),
    ]
    assert "recovered: it was Failed" in recovered[0].note


def test_the_same_failure_seen_again_is_the_same_occurrence_and_a_new_one_is_not() -> None:
    w = _trail("a")
    w.book(default=_batch(1, ["a"], planned=1))
    _admit(w, "a", 1)
    w.trail()
    _fail(w, "a")
    before = copy.deepcopy(w.nodes["a"]["status"])
    first = w.trail()
    # Another replica (or a re-run) that still sees the previous node condition.
    w.nodes["a"]["status"] = before
    again = w.trail()
    assert [o.occurrence for o in again] == [o.occurrence for o in first]
    bodies = [kube_events.body(o, instance="status-1") for o in first]
    assert all(kube_events.series_patch(b, o) is None for b, o in zip(bodies, again, strict=True))
    # Failing again later (after a retry) counts in the same Event's series.
    w.records("a", executor=_exe("running"))
    w.trail()
    w.now = T0.replace(hour=3)
    later = ExecutorRecord(
        packages={
            "nvidia-tuned": msgspec.convert(
                {
                    "version": "0.9.0",
                    "stage": "apply",
                    "state": "failed",
                    "attempt": 2,
                    "updated": w.now.isoformat(),
                },
                PackageRecord,
            )
        }
    )
    w.records("a", executor=later)
    second = w.trail()
    assert [kube_events.body(o, instance="x")["metadata"]["name"] for o in second] == [
        b["metadata"]["name"] for b in bodies
    ]
    patch = kube_events.series_patch(bodies[0], second[0])
    assert patch is not None
    assert patch["series"]["count"] == 2


def test_a_blocked_node_is_reported_and_a_non_target_never() -> None:
    w = _trail("a")
    w.records(
        "a",
        scheduler=_sel(1),
        drainer=msgspec.structs.replace(
            DRAINED,
            phase="blocked",
            reason=Reason(code="PodDisruptionBudgetBlocking", message="pdb x"),
        ),
    )
    (on_node, on_cr) = w.trail()
    assert _seen([on_node, on_cr]) == [
        ("Node", "NodeBlocked", "Warning"),
        ("NodeWright", "NodeBlocked", "Warning"),
    ]
    assert "PodDisruptionBudgetBlocking" in on_cr.note
    # A node of another pool, even with a failure on record, is nobody's news here.
    other = _world("x").nodes["x"]
    other["metadata"]["labels"] = {"nodepool": "cpu"}
    other["status"]["conditions"].append(reported("InProgress", cr=CR))
    w.nodes["x"] = other
    w.records("x", executor=_exe("failed"))
    assert all(
        o.regarding.name != "x" and o.related != kube_events.node_ref("x") for o in w.trail()
    )


def test_waits_and_compartment_completions_are_verbose_only() -> None:
    assert {
        kube_events.COMPARTMENT_WAITING,
        kube_events.COMPARTMENT_COMPLETED,
    } == kube_events.VERBOSE_ONLY
    kept: set[Any] = set(kube_events.COMPARTMENT_REASONS) - kube_events.VERBOSE_ONLY
    assert kept == {"BatchStarted", "BatchFinished", "CompartmentStopped"}


def test_a_new_failure_no_pass_saw_running_is_news_too() -> None:
    """A retry that ran and failed again between two passes still counts as a new failure:
    its record gives a later time."""
    w = _trail("a")
    w.book(default=_batch(1, ["a"], planned=1))
    _admit(w, "a", 1)
    w.trail()
    _fail(w, "a")
    first = w.trail()
    w.now = T0.replace(hour=5)
    rec = {"version": "0.9.0", "stage": "apply", "state": "failed", "attempt": 2}
    w.records(
        "a",
        executor=ExecutorRecord(
            packages={
                "nvidia-tuned": msgspec.convert(
                    {**rec, "updated": w.now.isoformat()}, PackageRecord
                )
            }
        ),
    )
    second = w.trail()
    assert _seen(second) == _seen(first)
    assert {o.occurrence for o in second}.isdisjoint({o.occurrence for o in first})
    assert w.trail() == []
