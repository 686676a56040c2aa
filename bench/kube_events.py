"""Benchmark: how many Kubernetes Events the README's example rollout writes.

    .venv/bin/python -m bench.kube_events [--gpu-nodes 30] [--cpu-nodes 10] [--stage-duration 1s]

Starts the rig and the five services as the sandbox does, creates the sandbox's nodes (30
``nodepool=gpu`` and 10 ``nodepool=cpu``), applies the README's example NodeWright
(deploy/samples/nodewright-gpu-node-tuning.yaml), waits until it is Ready and a few seconds
more (Events of the last transitions), and prints one JSON object:

- ``events``: Event objects NodeWright wrote (reporting component or controller
  ``nodewright-status``, any API group or namespace), ``per_target_node``: that per target;
- ``events_by_reason`` and ``events_about``: by reason and by the kind of object they are
  about (Node, NodeWright ...);
- ``event_writes``: create/update/patch requests on Events the API server counted
  (``apiserver_request_total``, after minus before);
- ``wall_s``: from applying the example to Ready.

It measures whatever code is importable: run it with ``PYTHONPATH`` pointing at another
checkout to measure that one (the services are started with the same environment).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from typing import Any

from bench.rollout import api_requests
from nodewright import manifests
from nodewright.rig import Rig, nodes
from nodewright.rig.fleet import Fleet
from shared.config import KubeSettings
from shared.kube import connect, path_of

COMPONENT = "nodewright-status"
EXAMPLE = "nodewright-gpu-node-tuning.yaml"


def ours(event: dict[str, Any]) -> bool:
    return COMPONENT in (
        event.get("reportingComponent"),
        event.get("reportingController"),
        (event.get("source") or {}).get("component"),
    )


async def run(args: argparse.Namespace, rig: Rig, fleet: Fleet) -> dict[str, Any]:
    async with connect(KubeSettings(kubeconfig=str(rig.endpoints.kubeconfig))) as kube:
        await manifests.install_crds(kube)
        await manifests.ensure_namespace(kube, fleet.namespace)
        names = await nodes.create_nodes(
            kube, [f"gpu-node-{i:03d}" for i in range(args.gpu_nodes)], labels={"nodepool": "gpu"}
        )
        names += await nodes.create_nodes(
            kube, [f"cpu-node-{i:03d}" for i in range(args.cpu_nodes)], labels={"nodepool": "cpu"}
        )
        await nodes.wait_ready(kube, names)
        await asyncio.to_thread(fleet.start_all)
        before = api_requests(rig)
        example = manifests.sample(EXAMPLE)
        name = example["metadata"]["name"]
        t0 = time.monotonic()
        await manifests.apply(kube, example)
        while True:
            raw = await kube.get(f"{manifests.NODEWRIGHTS}/{name}")
            conditions = (raw.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
                break
            if time.monotonic() - t0 > args.timeout:
                raise SystemExit(f"{name} not Ready after {args.timeout:.0f}s; logs: {rig.dir}")
            await asyncio.sleep(1.0)
        wall = time.monotonic() - t0
        await asyncio.sleep(args.settle)
        after = api_requests(rig)
        listed = (await kube.get(path_of(plural="events")))["items"]
    mine = [e for e in listed if ours(e)]
    writes = {
        k: after[k] - before.get(k, 0)
        for k in after
        if k.split(" ")[1] == "events" and k.split(" ")[0] in ("POST", "PUT", "PATCH")
    }
    return {
        "example": EXAMPLE,
        "target_nodes": args.gpu_nodes,
        "events": len(mine),
        "per_target_node": round(len(mine) / max(args.gpu_nodes, 1), 2),
        "events_by_reason": dict(Counter(str(e.get("reason")) for e in mine).most_common()),
        "events_about": dict(
            Counter(str((e.get("involvedObject") or {}).get("kind")) for e in mine).most_common()
        ),
        "event_writes": {k: v for k, v in sorted(writes.items()) if v},
        "wall_s": round(wall, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kube_events", description=__doc__)
    parser.add_argument("--gpu-nodes", type=int, default=30)
    parser.add_argument("--cpu-nodes", type=int, default=10)
    parser.add_argument("--stage-duration", default="1s")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds to wait after Ready")
    args = parser.parse_args(argv)
    with Rig() as rig:
        fleet = Fleet(
            rig,
            namespace="nodewright-system",
            extra_env={"NODEWRIGHT_PODS_SIM_STAGE_DURATION": args.stage_duration},
        )
        try:
            result = asyncio.run(run(args, rig, fleet))
        finally:
            fleet.stop()
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
