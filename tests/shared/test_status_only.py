"""Which NodeWright and Node changes wake the per-node services: not the status service's writes."""

from __future__ import annotations

import copy
from typing import Any

from shared.controller import node_unchanged, status_only


def _cr() -> dict[str, Any]:
    return {
        "metadata": {
            "name": "gpu",
            "generation": 3,
            "resourceVersion": "10",
            "annotations": {"nodewright.nvidia.com/batches": "{}"},
            "finalizers": ["nodewright.nvidia.com/scheduler"],
        },
        "spec": {"packages": {}},
        "status": {"state": "InProgress", "nodesCompleted": 1},
    }


def test_a_status_write_wakes_no_node_but_spec_annotations_and_deletion_do() -> None:
    old = _cr()
    status = copy.deepcopy(old)
    status["metadata"]["resourceVersion"] = "11"
    status["status"] = {"state": "InProgress", "nodesCompleted": 2}
    assert status_only(old, status)
    finalized = copy.deepcopy(old)
    finalized["metadata"]["finalizers"] = []
    assert status_only(old, finalized)
    spec = copy.deepcopy(old)
    spec["metadata"]["generation"] = 4
    assert not status_only(old, spec)
    book = copy.deepcopy(old)
    book["metadata"]["annotations"]["nodewright.nvidia.com/batches"] = '{"b":1}'
    assert not status_only(old, book)
    scheduler = copy.deepcopy(old)
    scheduler["metadata"]["annotations"]["scheduler.nodewright.nvidia.com/batches"] = "{}"
    assert status_only(old, scheduler), "the scheduler's batch book is its own"
    rebooked = copy.deepcopy(scheduler)
    rebooked["metadata"]["annotations"]["scheduler.nodewright.nvidia.com/batches"] = '{"a":2}'
    assert status_only(scheduler, rebooked), "the scheduler's batch book is its own"
    approved = copy.deepcopy(old)
    approved["metadata"]["annotations"]["nodewright.nvidia.com/approved-batches"] = "{}"
    assert status_only(old, approved), "only the scheduler decides from approvals"
    paused = copy.deepcopy(old)
    paused["metadata"]["annotations"]["nodewright.nvidia.com/pause"] = "true"
    assert not status_only(old, paused)
    deleting = copy.deepcopy(old)
    deleting["metadata"]["deletionTimestamp"] = "2026-12-03T00:00:00Z"
    assert not status_only(old, deleting)
    assert not status_only(None, old), "an added NodeWright"
    assert not status_only(old, None), "a deleted one"


def _node() -> dict[str, Any]:
    return {
        "metadata": {
            "name": "n1",
            "resourceVersion": "10",
            "labels": {"nodepool": "gpu"},
            "annotations": {"executor.nodewright.nvidia.com/gpu": "{}"},
        },
        "spec": {"unschedulable": False},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-12-04T00:00:00Z"},
                {"type": "nodewright.nvidia.com/gpu", "status": "False", "reason": "Waiting"},
            ],
            "nodeInfo": {"bootID": "b1"},
        },
    }


def test_a_heartbeat_or_a_node_condition_wakes_no_owner_but_what_they_read_does() -> None:
    old = _node()
    heartbeat = copy.deepcopy(old)
    heartbeat["metadata"]["resourceVersion"] = "11"
    heartbeat["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-12-04T00:00:40Z"
    assert node_unchanged(old, heartbeat)
    reported = copy.deepcopy(old)
    reported["status"]["conditions"][1] = {"type": "nodewright.nvidia.com/gpu", "status": "True"}
    assert node_unchanged(old, reported)
    changes: list[tuple[tuple[str | int, ...], dict[str, Any]]] = [
        (("metadata", "annotations"), {"drainer.nodewright.nvidia.com/gpu": "{}"}),
        (("metadata", "labels"), {"nodepool": "cpu"}),
        (("spec",), {"unschedulable": True}),
        (("status", "conditions", 0), {"status": "False"}),
        (("status", "nodeInfo"), {"bootID": "b2"}),
        (("metadata",), {"deletionTimestamp": "2026-12-04T00:01:00Z"}),
    ]
    for where, update in changes:
        changed = copy.deepcopy(old)
        target: Any = changed
        for step in where:
            target = target[step]
        target.update(update)
        assert not node_unchanged(old, changed), changed
    assert not node_unchanged(old, old), "the informer's replay of its cache"
    assert not node_unchanged(None, old)
    assert not node_unchanged(old, None)
