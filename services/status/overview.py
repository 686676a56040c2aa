"""What the status service's web page shows, as one JSON-ready document: built here from the
caches, served by ``services.status.webpage``.

For every NodeWright: its state and Ready condition, node counts by state (the status this
service wrote), its compartments with budget and batch (the status's compartments, and the
nodes of each batch in flight from the scheduler's batch book), and its target nodes grouped
by state (Failed, Blocked, InProgress, Waiting, Complete), each with the state, reason and
time of the node condition this service wrote (the phase of a node in progress from whose
turn it is), and where the scheduler admitted it.
Complete nodes are listed by name only, and each group is cut at :data:`MAX_NODES_PER_STATE`
(the document says how many were left out), so a large fleet stays a small page.

Everything comes from what the status passes already computed and wrote; nothing is decided
here. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgspec

from services.status import assessing
from shared import api, progress
from shared.records.status import NodePhase
from shared.rollout.book import CompartmentBatch, read_batch_book

STATES: Final = ("Failed", "Blocked", "InProgress", "Waiting", "Complete")
"""Node groups in the order the page shows them: what needs a person first."""
MAX_NODES_PER_STATE: Final = 200


_STEP: Final[Mapping[progress.Turn, NodePhase]] = {
    "scheduler": "Pending",
    "drainer": "Draining",
    "executor": "Running",
    "validator": "Validating",
    "release": "Validating",
}
"""The phase of a node in progress, by whose turn it is (the condition says only InProgress)."""
_SAME_PHASE: Final[Mapping[str, NodePhase]] = {
    "Waiting": "Waiting",
    "Blocked": "Blocked",
    "Failed": "Failed",
    "Complete": "Complete",
}
"""The states that are phases too."""


def _node(name: str, node: Mapping[str, Any], cr: api.NodeWright) -> dict[str, Any] | None:
    """The page's row of a target node: None when the status service has not reported it."""
    obs = assessing.observe(node, cr.metadata.name)
    reported = obs.reported
    if reported is None:
        return None
    sel = obs.facts.selection
    phase = _SAME_PHASE.get(reported.state) or _STEP.get(progress.turn(cr, obs.facts), "Pending")
    return {
        "name": name,
        "state": reported.state,
        "phase": phase,
        "reason": reported.reason.code if reported.reason is not None else "",
        "message": reported.reason.message if reported.reason is not None else "",
        "since": reported.since.isoformat(),
        "compartment": sel.compartment if sel is not None else "",
        "batch": sel.batch if sel is not None else None,
    }


def nodewright(raw: Mapping[str, Any], nodes: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The page's view of one NodeWright (its API object) over the cached nodes."""
    cr = api.from_dict(dict(raw), api.NodeWright)
    name = cr.metadata.name
    status = cr.status
    groups: dict[str, list[dict[str, Any]]] = {s: [] for s in STATES}
    for node in nodes:
        labels = (node.get("metadata") or {}).get("labels") or {}
        if not progress.selector_matches(cr.spec.node_selectors, labels):
            continue
        row = _node(str(node["metadata"]["name"]), node, cr)
        if row is not None:
            groups[row["state"]].append(row)
    omitted = {}
    for state, rows in groups.items():
        rows.sort(key=lambda r: str(r["name"]))
        omitted[state] = max(len(rows) - MAX_NODES_PER_STATE, 0)
        del rows[MAX_NODES_PER_STATE:]
    book = read_batch_book(cr.metadata.annotations)
    ready = next((c for c in status.conditions if c.type == "Ready"), None)
    counts = status.node_counts
    return {
        "name": name,
        "state": status.state,
        "ready": ready is not None and ready.status == "True",
        "readyMessage": ready.message if ready is not None else "",
        "paused": cr.paused,
        "disabled": cr.disabled,
        "packages": status.package_list,
        "completeNodes": status.complete_nodes,
        "counts": {
            "Target": counts.target,
            "Complete": counts.complete,
            "InProgress": counts.in_progress,
            "Waiting": counts.waiting,
            "Failed": counts.failed,
            "Blocked": counts.blocked,
        },
        "compartments": [
            {
                "name": c.name,
                "matchedNodes": c.matched_nodes,
                "budgetNodes": c.budget_nodes,
                "inProgressNodes": c.in_progress_nodes,
                "completeNodes": c.complete_nodes,
                "failedNodes": c.failed_nodes,
                "progressPercent": c.progress_percent,
                "currentBatch": c.batch.current_batch,
                "batchSize": c.batch.batch_size,
                "stopped": c.batch.stopped,
                "stopReason": c.batch.stop_reason,
                "waitingReason": c.waiting_reason,
                "waitingMessage": c.waiting_message,
                "batchNodes": list((book.compartments.get(c.name) or CompartmentBatch()).nodes),
            }
            for c in status.compartments
        ],
        "nodes": groups,
        "omittedNodes": omitted,
    }


def document(
    crs: Iterable[Mapping[str, Any]], nodes: Iterable[Mapping[str, Any]]
) -> dict[str, Any]:
    """Every NodeWright that decodes, sorted by name; the names of those that do not."""
    listed = list(nodes)
    out: list[dict[str, Any]] = []
    invalid: list[str] = []
    for raw in sorted(crs, key=lambda r: str(r["metadata"]["name"])):
        try:
            out.append(nodewright(raw, listed))
        except msgspec.ValidationError:
            invalid.append(str(raw["metadata"]["name"]))
    return {"nodewrights": out, "invalid": invalid}
