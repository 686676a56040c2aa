"""What the sandbox shows while a rollout runs (``nodewright.liveview``), and what the status
service's web page draws (``services.status.overview``), from known NodeWrights and nodes."""

from __future__ import annotations

import io
from typing import Any

import msgspec
from rich.console import Console

from nodewright import liveview
from services.status import overview
from shared import api, nodestate
from shared.events import Reason
from shared.records.executor import ExecutorRecord, PackageRecord
from shared.records.scheduler import Selection
from shared.rollout import book as rollout_book
from tests.helpers.facts import T0, node, nodewright, reported
from tests.helpers.segment import CYCLE, segment_pod

FAILED = Reason(code="StageFailed", message="simulated failure of nvidia-tuned apply")


def _cr(*, compartments: list[api.CompartmentStatus]) -> dict[str, Any]:
    cr = nodewright(interruptionBudget={"count": 2})
    status = api.NodeWrightStatus(
        state="InProgress",
        compartments=compartments,
        node_counts=api.NodeCounts(target=5, complete=1, in_progress=2, failed=1, waiting=1),
        complete_nodes="1/5",
    )
    book = rollout_book.BatchBook(
        compartments={
            "__default__": rollout_book.CompartmentBatch(
                state=api.BatchState(current_batch=2, batch_size=2), nodes=("n1", "n2")
            )
        }
    )
    annotations = {rollout_book.BATCHES_ANNOTATION: rollout_book.encode_batch_book(book)}
    meta = msgspec.structs.replace(cr.metadata, annotations=annotations)
    return api.to_dict(msgspec.structs.replace(cr, status=status, metadata=meta))


def _compartment(batch: int, size: int, complete: int) -> api.CompartmentStatus:
    return api.CompartmentStatus(
        name="__default__",
        matched_nodes=5,
        budget_nodes=2,
        in_progress_nodes=size,
        complete_nodes=complete,
        failed_nodes=1,
        batch=api.BatchState(current_batch=batch, batch_size=size),
    )


def _sel(batch: int) -> Selection:
    return Selection(
        generation=1,
        compartment="__default__",
        batch=batch,
        selected_at=T0,
        disruptive=False,
        target="t",
    )


def _pkg(stage: str, state: Any) -> ExecutorRecord:
    return ExecutorRecord(
        packages={
            "nvidia-tuned": PackageRecord(
                version="0.9.0",
                stage=stage,
                state=state,
                updated=T0,
                reason=FAILED if state == "failed" else None,
            )
        }
    )


def _nodes() -> list[dict[str, Any]]:
    """n0 waits, n1 runs apply, n2 config, n3 failed apply, x is no target."""
    return [
        node("n0"),
        node(
            "n1",
            records={
                nodestate.SCHEDULER: _sel(2),
                nodestate.EXECUTOR: _pkg("apply", "running"),
            },
            conditions=[reported("InProgress")],
        ),
        node(
            "n2",
            records={
                nodestate.SCHEDULER: _sel(2),
                nodestate.EXECUTOR: _pkg("config", "running"),
            },
            conditions=[reported("InProgress")],
        ),
        node(
            "n3",
            records={
                nodestate.SCHEDULER: _sel(1),
                nodestate.EXECUTOR: _pkg("apply", "failed"),
            },
            conditions=[reported("Failed", FAILED)],
        ),
        node("x", labels={"nodepool": "cpu"}),
    ]


def test_a_snapshot_says_which_node_is_in_which_batch_at_which_stage() -> None:
    snap = liveview.snapshot(_cr(compartments=[_compartment(2, 2, 1)]), _nodes())
    assert (snap.targets, snap.complete, snap.failed, snap.waiting) == (4, 0, 1, 1)
    assert [(n.name, n.batch, n.stage) for n in snap.in_flight] == [
        ("n1", 2, "apply running"),
        ("n2", 2, "config running"),
    ]
    assert snap.stages == {"apply": 1, "config": 1}
    assert snap.budget == 2
    lines = liveview.lines(snap, 75.0)
    assert lines[0] == (
        "gpu-node-tuning InProgress: complete 0/4 | in flight 2 (apply 1, config 1) | waiting 1 "
        "| failed 1 | budget 2 | __default__ batch 2 (2 in flight) | time left 1m15s"
    )
    assert lines[1:] == [
        "  __default__ batch 2: n1 apply running, n2 config running",
        "  FAILED n3: StageFailed: simulated failure of nvidia-tuned apply",
    ]


def test_a_snapshot_reads_what_a_segment_pod_runs_past_the_recorded_stage() -> None:
    """n1's record says apply runs; its pod has run apply and its check and runs config."""
    cr = api.from_dict(_cr(compartments=[_compartment(2, 2, 1)]), api.NodeWright)
    nodes = _nodes()
    rec = _pkg("apply", "running").packages["nvidia-tuned"]
    nodes[1] = node(
        "n1",
        records={
            nodestate.SCHEDULER: _sel(2),
            nodestate.EXECUTOR: ExecutorRecord(
                packages={"nvidia-tuned": msgspec.structs.replace(rec, cycle_started=CYCLE)}
            ),
        },
        conditions=[reported("InProgress")],
    )
    pod = segment_pod(cr, "nvidia-tuned", 0, 0, node="n1")
    other = segment_pod(nodewright("other"), "nvidia-tuned", 0, 0, node="n2", name="x")
    snap = liveview.snapshot(api.to_dict(cr), nodes, [pod, other])
    assert [(n.name, n.stage) for n in snap.in_flight] == [
        ("n1", "config running"),
        ("n2", "config running"),
    ]
    assert snap.stages == {"config": 2}
    without = liveview.snapshot(api.to_dict(cr), nodes)
    assert [n.stage for n in without.in_flight] == ["apply running", "config running"]


def test_the_time_left_is_the_mean_batch_times_the_batches_left() -> None:
    clock = liveview.Clock(started=0.0)
    first = liveview.snapshot(_cr(compartments=[_compartment(1, 2, 0)]), _nodes())
    clock.observe(first, 0.0)
    assert clock.left_s(first, 5.0) is None, "no batch finished yet: no estimate"
    second = liveview.snapshot(_cr(compartments=[_compartment(2, 2, 1)]), _nodes())
    clock.observe(second, 30.0)  # batch 1 took 30 s
    assert clock.finished == [30.0]
    # Batch 2 in flight for 10 s, and the waiting node's batch after it: 2 x 30 - 10.
    assert second.batches_left == 2
    assert clock.left_s(second, 40.0) == 50.0
    assert liveview.duration(50.0) == "50s"
    assert liveview.duration(None) == "estimating"


def test_a_compartment_whose_nodes_all_completed_is_done_not_back_at_batch_one() -> None:
    """The sandbox printed "__default__ batch 1" on the line saying the NodeWright was
    Ready: its batch state had started over (resetBatchStateOnCompletion)."""
    finished = api.CompartmentStatus(
        name="__default__", matched_nodes=5, budget_nodes=2, complete_nodes=5
    )
    between = api.CompartmentStatus(
        name="cpu", matched_nodes=5, budget_nodes=2, complete_nodes=2,
        batch=api.BatchState(current_batch=2),
    )  # fmt: skip
    snap = liveview.snapshot(_cr(compartments=[finished, between]), _nodes())
    line = liveview.lines(snap, 0.0)[0]
    assert "| __default__ done, cpu batch 2 |" in line, line
    out = io.StringIO()
    Console(file=out, width=160, color_system=None).print(liveview.panel(snap, 0.0, 12.0))
    rows = [r.split() for r in out.getvalue().splitlines()]
    assert ["__default__", "2", "-", "0", "5/5", "0", "done"] in rows, rows
    assert ["cpu", "2", "2", "0", "2/5", "0", "between", "batches"] in rows, rows


def test_the_live_panel_renders_with_rich() -> None:
    snap = liveview.snapshot(_cr(compartments=[_compartment(2, 2, 1)]), _nodes())
    out = io.StringIO()
    Console(file=out, width=160, color_system=None).print(liveview.panel(snap, 75.0, 12.0))
    text = out.getvalue()
    for fragment in ("time left ~1m15s", "__default__ 2", "n1", "apply running", "StageFailed"):
        assert fragment in text, fragment


def test_the_page_document_groups_target_nodes_by_state_with_reasons() -> None:
    doc = overview.document([_cr(compartments=[_compartment(2, 2, 1)])], _nodes())
    (nw,) = doc["nodewrights"]
    assert nw["counts"] == {
        "Target": 5,
        "Complete": 1,
        "InProgress": 2,
        "Waiting": 1,
        "Failed": 1,
        "Blocked": 0,
    }
    assert [r["name"] for r in nw["nodes"]["InProgress"]] == ["n1", "n2"]
    (failed,) = nw["nodes"]["Failed"]
    assert (failed["name"], failed["reason"], failed["message"], failed["batch"]) == (
        "n3",
        "StageFailed",
        "simulated failure of nvidia-tuned apply",
        1,
    )
    assert nw["nodes"]["Waiting"] == [], "n0 has no node condition yet: not reported"
    (comp,) = nw["compartments"]
    assert (comp["currentBatch"], comp["batchSize"], comp["batchNodes"]) == (2, 2, ["n1", "n2"])
    assert (comp["waitingReason"], comp["waitingMessage"]) == ("", "")
    assert doc["invalid"] == []
    approval = msgspec.structs.replace(
        _compartment(2, 0, 1),
        waiting_reason="BatchAwaitingApproval",
        waiting_message="compartment __default__ waits for approval after batch 1",
    )
    (waits,) = overview.document([_cr(compartments=[approval])], _nodes())["nodewrights"]
    assert waits["compartments"][0]["waitingReason"] == "BatchAwaitingApproval"
    assert waits["compartments"][0]["waitingMessage"].endswith("after batch 1")
    broken = {"metadata": {"name": "broken"}, "spec": {"packages": "not a map"}}
    assert overview.document([broken], [])["invalid"] == ["broken"]
