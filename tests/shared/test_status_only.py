"""Which NodeWright changes wake the per-node services: not the status service's writes."""

from __future__ import annotations

import copy
from typing import Any

from shared.controller import status_only


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
    paused = copy.deepcopy(old)
    paused["metadata"]["annotations"]["nodewright.nvidia.com/pause"] = "true"
    assert not status_only(old, paused)
    deleting = copy.deepcopy(old)
    deleting["metadata"]["deletionTimestamp"] = "2026-12-03T00:00:00Z"
    assert not status_only(old, deleting)
    assert not status_only(None, old), "an added NodeWright"
    assert not status_only(old, None), "a deleted one"
