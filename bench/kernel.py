"""Benchmark: one rollout-kernel decision over N cached nodes, without a rig.

    .venv/bin/python -m bench.kernel --nodes 1000 [--passes 50]

Builds N ``nodepool=gpu`` nodes in the middle of a rollout under a 10 % budget (a tenth
admitted, the rest waiting for their batch), caches their facts as the scheduler does
(``shared.rollout.fleet.FactsCache``) and times ``fleet.decide`` and the status service's
use of the same plan (``services.status.assessing.assess``) over them, and the scheduler's
decision (``schedule``: the same without the waiting nodes' reasons), in two ways:

- ``same_object``: every pass reads the same NodeWright object (nothing changed);
- ``status_changed``: every pass reads a new object of the same NodeWright, as after each
  write of its status or batch book (every second or two in a rollout).

Prints one JSON object: CPU milliseconds per decision and per assessment (median over the
passes), per 1,000 nodes, and the machine's load. A loaded machine still moves them (caches,
frequency); compare runs made back to back.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import msgspec

from services.status import assessing
from shared import api, nodestate, progress
from shared.records.scheduler import Selection
from shared.rollout import fleet, kernel

CR = "bench"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _nodewright(resource_version: int) -> api.NodeWright:
    body = {
        "apiVersion": api.API_VERSION,
        "kind": "NodeWright",
        "metadata": {
            "name": CR,
            "uid": "uid-bench",
            "generation": 1,
            "resourceVersion": str(resource_version),
        },
        "spec": {
            "nodeSelectors": {"matchLabels": {"nodepool": "gpu"}},
            "interruptionBudget": {"percent": 10},
            "packages": {"tuning": {"version": "1.0.0", "image": "registry.example/tuning"}},
        },
        "status": {"observedGeneration": 1, "nodesInProgress": resource_version},
    }
    return api.from_dict(body, api.NodeWright)


def _nodes(n: int, target: str) -> list[dict[str, Any]]:
    admitted = max(1, n // 10)
    out = []
    for i in range(n):
        annotations = {}
        if i < admitted:
            sel = Selection(
                generation=1,
                compartment="__default__",
                batch=1,
                selected_at=T0,
                disruptive=True,
                target=target,
            )
            annotations[nodestate.key(nodestate.SCHEDULER, CR)] = msgspec.json.encode(sel).decode()
        out.append(
            {
                "metadata": {
                    "name": f"node-{i:05d}",
                    "labels": {"nodepool": "gpu"},
                    "annotations": annotations,
                    "creationTimestamp": "2026-01-01T00:00:00Z",
                    "resourceVersion": str(i + 1),
                },
                "spec": {"unschedulable": i < admitted, "taints": []},
                "status": {
                    "conditions": [{"type": "Ready", "status": "True"}],
                    "nodeInfo": {"bootID": "boot-1"},
                },
            }
        )
    return out


def _median_ms(calls: list[Callable[[], object]]) -> float:
    times = []
    for call in calls:
        # CPU time, not wall: on a machine shared with a rig, waiting for a core is not
        # the kernel's cost.
        t = time.process_time()
        call()
        times.append((time.process_time() - t) * 1000)
    return round(statistics.median(times), 2)


def run(nodes: int, passes: int) -> dict[str, Any]:
    load_start = os.getloadavg()
    first = _nodewright(1)
    raw = _nodes(nodes, progress.target_digest(first))
    facts_of = fleet.FactsCache()
    observed_of = assessing.ObservedCache(facts_of)
    observed = [observed_of(n, CR) for n in raw]
    now = T0

    def decide(cr: api.NodeWright, explain_waits: bool = True) -> Callable[[], object]:
        world = fleet.Fleet(
            crs=[cr], policies={}, nodes=raw, settings=fleet.Settings(), facts_of=facts_of
        )
        return functools.partial(fleet.decide, world, cr, now, explain_waits=explain_waits)

    plan = decide(first)()  # warms the facts cache, as a running service has it
    assert isinstance(plan, kernel.Plan)

    def assess(cr: api.NodeWright) -> Callable[[], object]:
        return functools.partial(assessing.assess, cr, observed, now, plan)

    # Built before timing: decoding a NodeWright is the informer's cost, not the kernel's.
    crs = {
        "same_object": [first] * passes,
        "status_changed": [_nodewright(i + 2) for i in range(passes)],
    }
    out: dict[str, Any] = {}
    for name, objects in crs.items():
        decide_ms = _median_ms([decide(cr) for cr in objects])
        schedule_ms = _median_ms([decide(cr, explain_waits=False) for cr in objects])
        assess_ms = _median_ms([assess(cr) for cr in objects])
        out[name] = {
            "decide_ms": decide_ms,
            "schedule_ms": schedule_ms,
            "assess_ms": assess_ms,
            "decide_ms_per_1000_nodes": round(decide_ms * 1000 / nodes, 2),
            "schedule_ms_per_1000_nodes": round(schedule_ms * 1000 / nodes, 2),
            "assess_ms_per_1000_nodes": round(assess_ms * 1000 / nodes, 2),
        }
    return {
        "nodes": nodes,
        "passes": passes,
        **out,
        "load": {"start": [round(x, 2) for x in load_start], "end": list(os.getloadavg())},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.kernel", description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--passes", type=int, default=50)
    args = p.parse_args(argv)
    print(json.dumps(run(args.nodes, args.passes), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
