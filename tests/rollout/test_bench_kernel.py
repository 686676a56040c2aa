"""``bench.kernel`` keeps working as the kernel changes (its figures are not judged here:
performance is measured by running it, never by a timed test)."""

from __future__ import annotations

from bench import kernel as bench


def test_the_kernel_benchmark_reports_both_ways_of_reading_the_nodewright() -> None:
    out = bench.run(nodes=40, passes=3)
    assert out["nodes"] == 40
    for way in ("same_object", "status_changed"):
        figures = out[way]
        assert set(figures) == {
            "decide_ms",
            "schedule_ms",
            "assess_ms",
            "decide_ms_per_1000_nodes",
            "schedule_ms_per_1000_nodes",
            "assess_ms_per_1000_nodes",
        }
        assert all(v >= 0 for v in figures.values())
