"""The pins of a per-node decision (``shared.nodepins``): what they hold against, the JSON
Patch they make of a merge patch, and strings written as the API server compares them.
The same patches against the real API server: tests/shared/test_nodepins_rig.py."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from shared import nodepins
from shared.informer import LAST_APPLIED, slim_node
from tests.helpers.facts import node


def _ops(pins: nodepins.Pins, merge: dict[str, Any]) -> list[dict[str, Any]]:
    patch = pins.json_patch(merge)
    assert patch is not None
    ops: list[dict[str, Any]] = json.loads(patch)
    return ops


def _node() -> dict[str, Any]:
    raw = node("n1", taints=[{"key": "a", "effect": "NoSchedule"}])
    raw["metadata"]["annotations"] = {"example.com/rack": "r12", "nodewright.nvidia.com/x": "1"}
    raw["status"]["conditions"].insert(0, {"type": "MemoryPressure", "status": "False"})
    return raw


def test_strings_are_written_as_go_writes_them() -> None:
    # Go's encoding/json escapes <, >, & and the two line separators, writes other
    # non-ASCII characters raw and control characters as \\u00xx (checked against the API
    # server in the rig test).
    got = nodepins.encode({"k": 'a<b>&c é \u2028\u2029 \x01\t"\\'})
    assert got == '{"k":"a\\u003cb\\u003e\\u0026c é \\u2028\\u2029 \\u0001\\t\\"\\\\"}'.encode()
    assert nodepins.encode([True, None, 3]) == b"[true,null,3]"
    with pytest.raises(ValueError, match="float"):
        nodepins.encode({"k": 0.1})
    with pytest.raises(ValueError, match="surrogate"):
        nodepins.encode("\ud800")  # a lone surrogate: Go would write U+FFFD


def test_without_status_the_pins_hold_whatever_the_status_does() -> None:
    raw = _node()
    pins = nodepins.of(raw, status=False)
    assert pins is not None
    assert pins.holds(copy.deepcopy(raw))
    later = copy.deepcopy(raw)
    later["metadata"]["resourceVersion"] = "2"
    later["status"]["conditions"][1]["status"] = "False"  # not Ready any more
    later["status"]["nodeInfo"]["bootID"] = "boot-2"
    later["status"]["conditions"].append({"type": "NodeWright", "status": "True"})
    assert pins.holds(later)
    tests = pins.tests()
    assert [t["path"] for t in tests] == ["/metadata/labels", "/metadata/annotations", "/spec"]


@pytest.mark.parametrize(
    "change",
    [
        lambda n: n["metadata"]["labels"].update(zone="b"),
        lambda n: n["metadata"]["annotations"].update({"nodewright.nvidia.com/y": "1"}),
        lambda n: n["metadata"]["annotations"].pop("example.com/rack"),
        lambda n: n["spec"].update(unschedulable=True),
        lambda n: n["spec"]["taints"].append({"key": "b", "effect": "NoExecute"}),
        lambda n: n.update({nodepins.TRIMMED: True}),
    ],
    ids=["label", "annotation added", "annotation removed", "cordon", "taint", "trimmed"],
)
def test_any_change_of_the_metadata_or_spec_breaks_the_pins(change: Any) -> None:
    raw = _node()
    pins = nodepins.of(raw, status=True)
    assert pins is not None
    later = copy.deepcopy(raw)
    change(later)
    assert not pins.holds(later)
    assert not pins.holds(None)


def test_with_status_ready_and_the_boot_id_are_pinned_and_nothing_else_of_it() -> None:
    raw = _node()
    pins = nodepins.of(raw, status=True)
    assert pins is not None
    assert pins.ready == (1, "True")
    assert pins.boot_id == "boot-1"
    heartbeat = copy.deepcopy(raw)
    heartbeat["status"]["conditions"][1]["lastHeartbeatTime"] = "2026-12-05T10:00:00Z"
    heartbeat["status"]["conditions"].append({"type": "NodeWright", "status": "False"})
    assert pins.holds(heartbeat)
    not_ready = copy.deepcopy(raw)
    not_ready["status"]["conditions"][1]["status"] = "Unknown"
    assert not pins.holds(not_ready)
    rebooted = copy.deepcopy(raw)
    rebooted["status"]["nodeInfo"]["bootID"] = "boot-2"
    assert not pins.holds(rebooted)
    moved = copy.deepcopy(raw)
    moved["status"]["conditions"].reverse()  # Ready is no longer where the test looks
    assert not pins.holds(moved)
    assert pins.tests()[3:] == [
        {"op": "test", "path": "/status/conditions/1/type", "value": "Ready"},
        {"op": "test", "path": "/status/conditions/1/status", "value": "True"},
        {"op": "test", "path": "/status/nodeInfo/bootID", "value": "boot-1"},
    ]


def test_nothing_is_pinned_that_cannot_be_pinned_exactly() -> None:
    no_ready = _node()
    no_ready["status"]["conditions"] = []
    assert nodepins.of(no_ready, status=True) is None
    assert nodepins.of(no_ready, status=False) is not None  # the status is not read
    applied = _node()
    applied["metadata"]["annotations"][LAST_APPLIED] = "{}"
    slim = slim_node(applied)
    assert slim.get(nodepins.TRIMMED) is True  # the cache dropped an annotation
    assert nodepins.of(slim, status=False) is None
    assert slim_node(_node()).get(nodepins.TRIMMED) is None
    floating = _node()
    floating["spec"]["weight"] = 0.5  # Go and Python may write a float differently
    pins = nodepins.of(floating, status=False)
    assert pins is not None
    assert pins.json_patch({"metadata": {"annotations": {"a": "1"}}}) is None


def test_the_merge_patch_becomes_the_tests_then_its_operations() -> None:
    raw = _node()
    pins = nodepins.of(raw, status=False)
    assert pins is not None
    merge = {
        "metadata": {
            "resourceVersion": "1",  # pins replace it
            "annotations": {
                "nodewright.nvidia.com/drainer.gpu~tuning": '{"phase":"cordoned"}',
                "nodewright.nvidia.com/x": None,  # there: removed
                "nodewright.nvidia.com/absent": None,  # not there: nothing to remove
            },
        },
        "spec": {"unschedulable": True, "taints": [{"key": "a", "effect": "NoSchedule"}]},
    }
    ops = _ops(pins, merge)
    assert [o["op"] for o in ops[:3]] == ["test"] * 3
    assert ops[3:] == [
        {
            "op": "add",
            "path": "/metadata/annotations/nodewright.nvidia.com~1drainer.gpu~0tuning",
            "value": '{"phase":"cordoned"}',
        },
        {"op": "remove", "path": "/metadata/annotations/nodewright.nvidia.com~1x"},
        {"op": "add", "path": "/spec/unschedulable", "value": True},
        {"op": "add", "path": "/spec/taints", "value": [{"key": "a", "effect": "NoSchedule"}]},
    ]


def test_a_node_without_annotations_gets_them_whole() -> None:
    raw = _node()
    del raw["metadata"]["annotations"]
    pins = nodepins.of(raw, status=False)
    assert pins is not None
    merge = {"metadata": {"annotations": {"a/b": "1", "c": None}}}
    assert _ops(pins, merge)[3:] == [
        {"op": "add", "path": "/metadata/annotations", "value": {"a/b": "1"}}
    ]
    assert _ops(pins, {"metadata": {"resourceVersion": "1"}})[3:] == []


def test_a_merge_patch_of_anything_unpinned_has_no_json_patch() -> None:
    pins = nodepins.of(_node(), status=False)
    assert pins is not None
    assert pins.json_patch({"metadata": {"finalizers": ["x"]}}) is None
    assert pins.json_patch({"status": {"phase": "x"}}) is None
    assert pins.json_patch({"spec": {"weight": 0.5}}) is None
