"""What the sandbox shows of a rollout while it runs: batches, nodes, stages, budget, time left.

:func:`snapshot` reads one NodeWright, every Node and the stage pods (as the API server
returns them) into a :class:`Snapshot`: the compartments with their budget and batch, the
batch in flight and which node is in it at which stage, how many nodes wait, are complete
or failed.
:class:`Clock` remembers when batches finished across snapshots and estimates the time
left: the mean duration of the batches finished so far times the batches still to run
(less the time the current one has run), or, before any batch finished, nothing.
:func:`lines` renders a snapshot as plain text (one summary line for logs and pipes, plus
per-batch lines for a terminal); :func:`panel` as a rich renderable for the live view.

Pure: no I/O, and the clock is passed in. The numbers come from the services' own records
(``shared.progress.facts``) and the status the status service wrote; deciding anything is
the services' business.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared import api, pods, progress
from shared.records.status import find_condition, reported


@dataclass(frozen=True)
class NodeLine:
    name: str
    compartment: str
    batch: int | None
    """The batch it was admitted in; None while it waits for one."""
    phase: str
    """The status service's state (its node condition) where the node waits, is blocked or
    failed, else whose turn it is by the services' records."""
    stage: str
    """The stage running or last run ("" before the first), e.g. ``apply running``."""
    reason: str


@dataclass(frozen=True)
class CompartmentLine:
    name: str
    budget: int
    matched: int
    complete: int
    in_progress: int
    failed: int
    batch: int
    batch_size: int
    stopped: bool

    @property
    def done(self) -> bool:
        """Every node of it complete, no batch in flight. Its batch state may have started
        over by then (``resetBatchStateOnCompletion``: batch 1, empty), which says nothing of
        the rollout just finished."""
        return self.matched > 0 and self.complete == self.matched and not self.batch_size


@dataclass(frozen=True)
class Snapshot:
    nodewright: str
    state: str
    targets: int
    complete: int
    failed: int
    waiting: int
    in_flight: tuple[NodeLine, ...]
    """Nodes admitted and not done, by compartment, batch and name."""
    failed_nodes: tuple[NodeLine, ...]
    compartments: tuple[CompartmentLine, ...]
    stages: Mapping[str, int] = field(default_factory=dict)
    """In-flight nodes per stage (``apply``, ``config``, ``drain`` ...)."""

    @property
    def done(self) -> bool:
        return self.targets > 0 and self.complete == self.targets

    @property
    def budget(self) -> int:
        return sum(c.budget for c in self.compartments)

    @property
    def batches_left(self) -> int:
        """Batches still to run, the one in flight included (each compartment's waiting
        nodes in batches as large as its budget)."""
        return sum(
            (1 if c.batch_size else 0)
            + math.ceil(
                max(c.matched - c.complete - c.failed - c.in_progress, 0) / max(c.budget, 1)
            )
            for c in self.compartments
            if not c.stopped
        )


def _stage(cr: api.NodeWright, f: progress.NodeFacts, parts: Sequence[pods.PodView]) -> str:
    wanted = progress.desired(cr)
    intr = f.executor.interrupt
    if intr is not None and intr.state == "running":
        return f"{intr.type} interrupt"
    for name, rec in sorted(f.executor.packages.items()):
        if name in wanted and rec.state == "running":
            # A segment pod runs the stage's check and the stages after it unwritten.
            now = pods.past_first(parts, progress.pod_key(name, rec))
            if now is not None:
                return pods.doing(now)
            return f"{rec.stage} running"
    for name, rec in sorted(f.executor.packages.items()):
        if name in wanted and not progress.package_done(wanted[name], rec):
            return f"{rec.stage} {rec.state}"
    if f.selection is not None and f.selection.disruptive and not progress.drained(f):
        return "drain" if f.drain is not None else "cordon"
    if f.executor.packages and progress.packages_done(cr, f):
        return "validate"
    return "admitted" if f.selection is not None else ""


def snapshot(
    raw_cr: Mapping[str, Any],
    nodes: Sequence[Mapping[str, Any]],
    stage_pods: Sequence[Mapping[str, Any]] = (),
) -> Snapshot:
    """The rollout of the NodeWright ``raw_cr`` over ``nodes`` (API objects) as it is now;
    ``stage_pods`` (API objects), for what a stage pod runs past its recorded stage."""
    cr = api.from_dict(dict(raw_cr), api.NodeWright)
    name = cr.metadata.name
    by_node = pods.by_node((p for pod in stage_pods for p in pods.parts(pod)), name)
    in_flight: list[NodeLine] = []
    failed: list[NodeLine] = []
    stages: Counter[str] = Counter()
    targets = complete = waiting = 0
    for node in nodes:
        f = progress.facts(node, name)
        if not progress.selector_matches(cr.spec.node_selectors, f.labels):
            continue
        targets += 1
        record = reported(find_condition(node, name))
        turn = progress.turn(cr, f)
        sel = f.selection
        line = NodeLine(
            name=f.name,
            compartment=sel.compartment if sel is not None else "",
            batch=sel.batch if sel is not None else None,
            phase=record.state if record is not None and record.reason is not None else turn,
            stage=_stage(cr, f, by_node.get(f.name, ())),
            reason=(
                f"{record.reason.code}: {record.reason.message}"
                if record is not None and record.reason is not None
                else ""
            ),
        )
        if turn in ("done", "release") and progress.node_done(cr, f):
            complete += 1
        elif turn == "failed":
            failed.append(line)
        elif sel is None:
            waiting += 1
        else:
            in_flight.append(line)
            stages[line.stage.split(" ")[0] or "admitted"] += 1
    compartments = tuple(
        CompartmentLine(
            name=c.name,
            budget=c.budget_nodes,
            matched=c.matched_nodes,
            complete=c.complete_nodes,
            in_progress=c.in_progress_nodes,
            failed=c.failed_nodes,
            batch=c.batch.current_batch,
            batch_size=c.batch.batch_size,
            stopped=c.batch.stopped,
        )
        for c in cr.status.compartments
    )
    return Snapshot(
        nodewright=name,
        state=cr.status.state,
        targets=targets,
        complete=complete,
        failed=len(failed),
        waiting=waiting,
        in_flight=tuple(sorted(in_flight, key=lambda n: (n.compartment, n.batch or 0, n.name))),
        failed_nodes=tuple(sorted(failed, key=lambda n: n.name)),
        compartments=compartments,
        stages=dict(sorted(stages.items())),
    )


@dataclass
class Clock:
    """Batch durations seen across snapshots, and the estimate of the time left."""

    started: float
    _batch: dict[str, tuple[int, float]] = field(default_factory=dict)
    """Compartment -> (batch number, when it was first seen in flight)."""
    finished: list[float] = field(default_factory=list)
    """Durations of the batches seen from start to end, in seconds."""

    def observe(self, snap: Snapshot, now: float) -> None:
        for c in snap.compartments:
            seen = self._batch.get(c.name)
            if c.batch_size == 0 and seen is None:
                continue
            if seen is None:
                self._batch[c.name] = (c.batch, now)
            elif c.batch != seen[0] or c.batch_size == 0:
                self.finished.append(now - seen[1])
                if c.batch_size:
                    self._batch[c.name] = (c.batch, now)
                else:
                    del self._batch[c.name]

    def left_s(self, snap: Snapshot, now: float) -> float | None:
        """Seconds left, estimated; None until a batch finished (0 once all are done)."""
        if snap.done:
            return 0.0
        if not self.finished:
            return None
        mean = sum(self.finished) / len(self.finished)
        running = max((now - t for _, t in self._batch.values()), default=0.0)
        return max(mean * snap.batches_left - min(running, mean), 0.0)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "estimating"
    total = round(seconds)
    return f"{total // 60}m{total % 60:02d}s" if total >= 60 else f"{total}s"


def summary(snap: Snapshot, left: float | None) -> str:
    """One line: what a log or a pipe gets whenever it changes."""
    batches = ", ".join(
        f"{c.name} done"
        if c.done
        else f"{c.name} batch {c.batch}"
        + (f" ({c.batch_size} in flight)" if c.batch_size else "")
        + (" STOPPED" if c.stopped else "")
        for c in snap.compartments
    )
    stages = ", ".join(f"{s} {n}" for s, n in snap.stages.items())
    return (
        f"{snap.nodewright} {snap.state}: complete {snap.complete}/{snap.targets} | in flight "
        f"{len(snap.in_flight)}{f' ({stages})' if stages else ''} | waiting {snap.waiting} | "
        f"failed {snap.failed} | budget {snap.budget} | {batches or 'no batch yet'} | "
        f"time left {duration(left)}"
    )


def lines(snap: Snapshot, left: float | None) -> list[str]:
    """The summary, then each batch in flight with its nodes and their stages, then the
    failed nodes with their reasons."""
    out = [summary(snap, left)]
    by_batch: dict[tuple[str, int], list[NodeLine]] = {}
    for n in snap.in_flight:
        by_batch.setdefault((n.compartment, n.batch or 0), []).append(n)
    for (comp, batch), members in sorted(by_batch.items()):
        out.append(f"  {comp} batch {batch}: " + ", ".join(f"{n.name} {n.stage}" for n in members))
    for n in snap.failed_nodes:
        out.append(f"  FAILED {n.name}: {n.reason or n.phase}")
    return out


def panel(snap: Snapshot, left: float | None, elapsed_s: float) -> Any:
    """The live view (a rich renderable): the compartments with budget and batch, the nodes
    of each batch in flight with their stage, the failed nodes, and the time left."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    head = Text(
        f"NodeWright {snap.nodewright}: {snap.state}   complete {snap.complete}/{snap.targets}"
        f"   in flight {len(snap.in_flight)}   waiting {snap.waiting}   failed {snap.failed}"
        f"   elapsed {duration(elapsed_s)}   time left ~{duration(left)}"
    )
    comps = Table(box=None, pad_edge=False, header_style="bold")
    for h in ("COMPARTMENT", "BUDGET", "BATCH", "IN BATCH", "COMPLETE", "FAILED", "STATE"):
        comps.add_column(h)
    for c in snap.compartments:
        comps.add_row(
            c.name,
            str(c.budget),
            "-" if c.done else str(c.batch),
            str(c.batch_size),
            f"{c.complete}/{c.matched}",
            str(c.failed),
            "stopped"
            if c.stopped
            else ("rolling" if c.batch_size else "done" if c.done else "between batches"),
        )
    nodes = Table(box=None, pad_edge=False, header_style="bold")
    for h in ("BATCH", "NODE", "STAGE", "PHASE"):
        nodes.add_column(h)
    for n in snap.in_flight:
        nodes.add_row(f"{n.compartment} {n.batch}", n.name, n.stage or "-", n.phase)
    for n in snap.failed_nodes:
        nodes.add_row("failed", n.name, n.stage or "-", n.reason or n.phase, style="red")
    return Group(head, Text(""), comps, Text(""), nodes)
