"""How long package stages and drains took: Prometheus histograms, observed once per result.

``nodewright_stage_duration_seconds`` (package, stage, outcome) is observed by the executor
when it publishes a stage's result (``stage.succeeded`` / ``stage.failed``): from the start
the event names (in events of earlier versions, the one its record says) to the result.
``nodewright_drain_duration_seconds`` (outcome) is observed by the drainer when it
publishes ``node.drained`` or
``node.drain-failed``: from when the drain began (the cordon; a wait for protected pods is
part of it) to its end. A result is observed only once the node write that records it
landed (a stale write of a lagging replica does not), so a retried pass or another replica
does not count it twice; its events reach the stream through the node's outbox.

What a stage or a drain does is its service's business; this module only measures, from the
records the service read before the result (:func:`stage_seconds`, :func:`drain_seconds` are
pure).
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Histogram

from shared import events, progress

STAGE_BUCKETS: Final = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)
"""Seconds: a simulated stage takes a second, a driver install minutes, a slow one an hour."""
DRAIN_BUCKETS: Final = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0)
"""Seconds: an empty node drains at once; protected pods and PDBs can hold one for hours."""


def stage_histogram(registry: CollectorRegistry) -> Histogram:
    return Histogram(
        "nodewright_stage_duration_seconds",
        "How long package stages ran, from start to result, by package, stage and outcome",
        ["package", "stage", "outcome"],
        buckets=STAGE_BUCKETS,
        registry=registry,
    )


def drain_histogram(registry: CollectorRegistry) -> Histogram:
    return Histogram(
        "nodewright_drain_duration_seconds",
        "How long drains took, from the cordon to every pod gone (or the drain failing)",
        ["outcome"],
        buckets=DRAIN_BUCKETS,
        registry=registry,
    )


def stage_seconds(
    event: events.Event, before: progress.NodeFacts
) -> tuple[tuple[str, str, str], float] | None:
    """The labels and seconds of a stage result, from the package record as it was before
    (running that stage and attempt); None for other events or when the start is unknown."""
    if isinstance(event, events.StageSucceeded):
        outcome = "succeeded"
    elif isinstance(event, events.StageFailed):
        outcome = "failed"
    else:
        return None
    labels = (event.package, event.stage, outcome)
    if event.started is not None:
        # Said by the event itself: a stage after the first of its pod starts without a
        # record of its own.
        return labels, max((event.at - event.started).total_seconds(), 0.0)
    rec = before.executor.packages.get(event.package)
    if (
        rec is None
        or rec.state != "running"
        or rec.stage != event.stage
        or rec.attempt != event.attempt
        or rec.version != event.version
    ):
        return None
    return labels, max((event.at - rec.updated).total_seconds(), 0.0)


def drain_seconds(event: events.Event, before: progress.NodeFacts) -> tuple[str, float] | None:
    """The outcome and seconds of a drain's end, from when the drain record says it began."""
    if isinstance(event, events.NodeDrained):
        outcome = "drained"
    elif isinstance(event, events.DrainFailed):
        outcome = "failed"
    else:
        return None
    if before.drain is None:
        return None
    return outcome, max((event.at - before.drain.started).total_seconds(), 0.0)
