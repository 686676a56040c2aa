"""``bench.rollout``'s work-queue and scheduler-pass figures: what a service's queue, and the
scheduler's passes, did between two readings of its metrics (the figures themselves are
judged by running the benchmark)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from bench.rollout import QueueSamples, pass_figures, pass_samples, queue_figures, queue_samples
from services.scheduler.service import pass_histogram, release_counter
from shared.workqueue import QueueMetrics


def _read(registry: CollectorRegistry) -> QueueSamples:
    """What ``bench.rollout.work_queues`` reads from one replica's /metrics."""
    return queue_samples(generate_latest(registry).decode())


def test_the_figures_are_the_difference_between_two_readings() -> None:
    registry = CollectorRegistry()
    m = QueueMetrics.make(registry)
    m.adds.labels("executor", "normal").inc(5)
    m.queue_seconds.labels("executor", "normal").observe(1.0)
    before = _read(registry)
    m.adds.labels("executor", "normal").inc(2)
    m.adds.labels("executor", "low").inc(10)
    m.queue_seconds.labels("executor", "normal").observe(0.5)
    m.queue_seconds.labels("executor", "normal").observe(0.25)
    m.queue_seconds.labels("executor", "low").observe(3.0)
    m.work_seconds.labels("executor").observe(0.25)
    m.retries.labels("executor").inc()
    assert queue_figures(before, _read(registry)) == {
        "executor": {
            "adds": {"normal": 2, "low": 10},
            "wait_mean_s": {"normal": 0.375, "low": 3.0},
            "reconciles": 1,
            "work_s": 0.25,
            "retries": 1,
        }
    }


def test_the_pass_figures_are_per_phase_between_two_readings() -> None:
    registry = CollectorRegistry()
    h, released = pass_histogram(registry), release_counter(registry)
    h.labels("decide").observe(0.5)
    released.labels("fast").inc(3)
    before = pass_samples(generate_latest(registry).decode())
    h.labels("decide").observe(0.1)
    h.labels("decide").observe(0.3)
    h.labels("admissions").observe(2.0)
    released.labels("fast").inc(5)
    released.labels("pass").inc()
    after = pass_samples(generate_latest(registry).decode())
    assert pass_figures(before, after) == {
        "admissions": {"n": 1, "mean_s": 2.0, "sum_s": 2.0},
        "decide": {"n": 2, "mean_s": 0.2, "sum_s": 0.4},
        "released_via": {"fast": 5, "pass": 1},
    }
