"""``nodewright plan``: the document built from the scheduler's planner (``plan_cmd.document``,
pure: the CR, its policy and the Node objects in, JSON-ready dict out) and its text
rendering (``plan_cmd.render``), asserted line by line for known inputs. ``plan_for`` only
adds the reads from the API server (exercised on the rig in ``tests/e2e/test_policies.py``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec

from nodewright import plan_cmd
from shared import api, nodestate, progress
from shared.records.executor import ExecutorRecord, PackageRecord
from shared.records.scheduler import Selection
from shared.records.validator import ValidatorRecord
from shared.rollout import book as rollout_book, rules as rollout_rules
from tests.helpers.facts import T0, node, nodewright

HEADER = "COMPARTMENT   STRATEGY      NODES   BUDGET   BUSY   BATCH   STATE"


def _policy(spec: Mapping[str, Any]) -> api.DeploymentPolicy:
    return api.from_dict({"metadata": {"name": "p"}, "spec": spec}, api.DeploymentPolicy)


def _done(cr: api.NodeWright) -> dict[str, msgspec.Struct]:
    """The records of a node on which ``cr`` is complete and released."""
    packages = {
        name: PackageRecord(
            version=d.version,
            stage="done",
            state="succeeded",
            installed=d.version,
            config=d.config_digest,
            updated=T0,
        )
        for name, d in progress.desired(cr).items()
    }
    return {
        nodestate.EXECUTOR: ExecutorRecord(packages=packages),
        nodestate.VALIDATOR: ValidatorRecord(validated=progress.target_digest(cr)),
    }


def _admitted(cr: api.NodeWright, compartment: str, batch: int) -> dict[str, msgspec.Struct]:
    return {
        nodestate.SCHEDULER: Selection(
            generation=1,
            compartment=compartment,
            batch=batch,
            selected_at=T0,
            disruptive=True,
            target=progress.target_digest(cr),
        )
    }


THREE_COMPARTMENTS = {
    "default": {"budget": {"count": 4}, "strategy": {"linear": {"initialBatch": 1, "delta": 1}}},
    "compartments": [
        {
            "name": "canary",
            "selector": {"matchLabels": {"rack": "a"}},
            "budget": {"count": 1},
            "strategy": {"fixed": {"batchSize": 1}},
        },
        {
            "name": "bulk",
            "selector": {"matchLabels": {"rack": "b"}},
            "budget": {"percent": 50},
            "strategy": {"exponential": {"initialBatch": 1, "growthFactor": 2}},
        },
    ],
}


def test_a_fresh_rollout_lists_every_compartment_and_batch() -> None:
    cr = nodewright(deploymentPolicy="p")
    # n0-n1 rack a (canary), n2-n7 rack b (bulk, 50 % of 6 = 3), n8-n10 the default.
    racks = ["a"] * 2 + ["b"] * 6 + [""] * 3
    nodes = [
        node(f"n{i:02d}", labels={"rack": rack} if rack else {}) for i, rack in enumerate(racks)
    ]
    doc = plan_cmd.document(cr, _policy(THREE_COMPARTMENTS), nodes, T0)

    assert doc == {
        "nodewright": "gpu-node-tuning",
        "paused": False,
        "disabled": False,
        "inMaintenanceWindow": True,
        "compartments": [
            {
                "name": "canary",
                "strategy": "fixed",
                "matchedNodes": 2,
                "budgetNodes": 1,
                "busyNodes": 0,
                "batch": {},
                "soakingUntil": None,
                "awaitingApproval": None,
            },
            {
                "name": "bulk",
                "strategy": "exponential",
                "matchedNodes": 6,
                "budgetNodes": 3,
                "busyNodes": 0,
                "batch": {},
                "soakingUntil": None,
                "awaitingApproval": None,
            },
            {
                "name": "__default__",
                "strategy": "linear",
                "matchedNodes": 3,
                "budgetNodes": 4,
                "busyNodes": 0,
                "batch": {},
                "soakingUntil": None,
                "awaitingApproval": None,
            },
        ],
        "batches": [
            {
                "compartment": c,
                "batch": b,
                "size": len(ns),
                "nodes": ns,
                "orders": orders,
                "inFlight": False,
                "afterApproval": False,
            }
            # The node orders they will get: one counter, compartments in rule order.
            for c, b, ns, orders in [
                ("canary", 1, ["n00"], [0]),
                ("bulk", 1, ["n02"], [1]),
                ("__default__", 1, ["n08"], [2]),
                ("canary", 2, ["n01"], [3]),
                ("bulk", 2, ["n03", "n04"], [4, 5]),
                ("__default__", 2, ["n09", "n10"], [6, 7]),
                ("bulk", 3, ["n05", "n06", "n07"], [8, 9, 10]),
            ]
        ],
    }
    # -o json prints the document as it is.
    assert json.loads(json.dumps(doc)) == doc
    assert plan_cmd.render(doc).splitlines() == [
        "NodeWright gpu-node-tuning",
        HEADER,
        "canary        fixed         2       1        0      1       next batch pending",
        "bulk          exponential   6       3        0      1       next batch pending",
        "__default__   linear        3       4        0      1       next batch pending",
        "",
        "BATCHES (assuming each succeeds)",
        "COMPARTMENT   BATCH   SIZE   STATE     NODES",
        "canary        1       1      planned   n00",
        "bulk          1       1      planned   n02",
        "__default__   1       1      planned   n08",
        "canary        2       1      planned   n01",
        "bulk          2       2      planned   n03, n04",
        "__default__   2       2      planned   n09, n10",
        "bulk          3       3      planned   n05, n06, n07",
    ]
    # -o wide adds the node order each node will get.
    wide = plan_cmd.render(doc, wide=True).splitlines()
    assert wide[7] == "COMPARTMENT   BATCH   SIZE   STATE     ORDERS     NODES"
    assert wide[-1] == "bulk          3       3      planned   8, 9, 10   n05, n06, n07"


def _in_flight(*, paused: bool) -> dict[str, Any]:
    """7 nodes, linear 1+1, budget 3, outside the only window: n00 done in batch 1, n01-n02
    in batch 2 (in flight), n03-n06 not started."""
    window = {"start": "22:00", "end": "23:00", "timeZone": "UTC"}
    policy = _policy(
        {
            "default": {
                "budget": {"count": 3},
                "strategy": {"linear": {"initialBatch": 1, "delta": 1}},
            },
            "maintenanceWindows": [window],
        }
    )
    book = rollout_book.BatchBook(
        compartments={
            rollout_rules.DEFAULT_COMPARTMENT: rollout_book.CompartmentBatch(
                state=api.BatchState(current_batch=2, batch_size=2, total_succeeded_nodes=1),
                nodes=("n01", "n02"),
                planned=2,
            )
        },
        versions=rollout_book.versions_digest(nodewright()),
    )
    annotations = {rollout_book.BATCHES_ANNOTATION: rollout_book.encode_batch_book(book)}
    if paused:
        annotations[api.PAUSE_ANNOTATION] = "true"
    cr = nodewright(deploymentPolicy="p", annotations=annotations)
    records = [_done(cr), _admitted(cr, "__default__", 2), _admitted(cr, "__default__", 2)]
    nodes = [node(f"n{i:02d}", records=records[i] if i < 3 else None) for i in range(7)]
    return plan_cmd.document(cr, policy, nodes, datetime(2026, 1, 1, 12, 0, tzinfo=UTC))


def test_a_rollout_in_flight_shows_its_batch_state_busy_nodes_and_a_closed_window() -> None:
    doc = _in_flight(paused=False)
    assert doc["paused"] is False
    assert doc["inMaintenanceWindow"] is False
    assert doc["compartments"] == [
        {
            "name": "__default__",
            "strategy": "linear",
            "matchedNodes": 7,
            "budgetNodes": 3,
            "busyNodes": 2,
            "batch": {"currentBatch": 2, "batchSize": 2, "totalSucceededNodes": 1},
            "soakingUntil": None,
            "awaitingApproval": None,
        }
    ]
    assert plan_cmd.render(doc).splitlines() == [
        "NodeWright gpu-node-tuning",
        "  outside every maintenance window: batches start when one opens",
        "COMPARTMENT   STRATEGY   NODES   BUDGET   BUSY   BATCH   STATE",
        "__default__   linear     7       3        2      2       batch in flight",
        "",
        "BATCHES (assuming each succeeds)",
        "COMPARTMENT   BATCH   SIZE   STATE       NODES",
        "__default__   2       2      in flight   n01, n02",
        "__default__   3       3      planned     n03, n04, n05",
        "__default__   4       1      planned     n06",
    ]


def test_a_paused_rollout_lists_only_the_batch_in_flight() -> None:
    # Pause is not one of the plan's assumptions (windows, priority, shared budgets are): a
    # paused NodeWright opens no batch, so only the work in progress is listed.
    doc = _in_flight(paused=True)
    assert plan_cmd.render(doc).splitlines() == [
        "NodeWright gpu-node-tuning",
        "  paused",
        "  outside every maintenance window: batches start when one opens",
        "COMPARTMENT   STRATEGY   NODES   BUDGET   BUSY   BATCH   STATE",
        "__default__   linear     7       3        2      2       batch in flight",
        "",
        "BATCHES (assuming each succeeds)",
        "COMPARTMENT   BATCH   SIZE   STATE       NODES",
        "__default__   2       2      in flight   n01, n02",
    ]


def test_a_complete_rollout_has_nothing_left_and_no_policy_means_no_strategy() -> None:
    cr = nodewright(interruptionBudget={"count": 2})
    nodes = [node("n00", records=_done(cr)), node("n01", records=_done(cr))]
    doc = plan_cmd.document(cr, None, nodes, T0)
    assert plan_cmd.render(doc).splitlines() == [
        "NodeWright gpu-node-tuning",
        "COMPARTMENT   STRATEGY   NODES   BUDGET   BUSY   BATCH   STATE",
        "__default__   none       2       2        0      1       done",
        "",
        "BATCHES (assuming each succeeds): none, nothing left to do",
    ]
    assert doc["batches"] == []


def test_a_stopped_compartment_says_why_instead_of_a_boolean() -> None:
    """``plan`` printed ``STOPPED False`` for every compartment; the state is words now."""
    doc = _in_flight(paused=False)
    doc["compartments"][0]["batch"] |= {
        "stopped": True,
        "stopReason": "FailedBatchesLimit",
        "batchSize": 0,
    }
    text = plan_cmd.render(doc)
    assert (
        "__default__   linear     7       3        2      2       stopped (FailedBatchesLimit)"
        in (text.splitlines())
    )
    assert "False" not in text
    assert "True" not in text
