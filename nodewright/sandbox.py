"""``nodewright sandbox``: the whole system on this machine, on simulated nodes.

Starts the rig (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok,
nats-server) on loopback, installs the CRDs, starts the five services as processes, creates
simulated nodes (default 30 ``nodepool=gpu`` + 10 ``nodepool=cpu``), applies the example
NodeWright (deploy/samples/nodewright-gpu-node-tuning.yaml), and shows the rollout live
until the NodeWright is Ready. Then it prints how to look around with kubectl and how to
follow the event stream, and keeps running until Ctrl-C, when it stops everything.

Nodes and package runs are SIMULATED by kwok: nothing on this machine is changed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from collections import Counter
from typing import Any

import msgspec
from kubernetes_asyncio import client, config

from nodewright import manifests
from nodewright.rig import Rig, RigError, nodes
from nodewright.rig.fleet import Fleet
from shared import api, progress
from shared.kube import Kube, path_of

GPU_LABELS = {"nodepool": "gpu", "nvidia.com/gpu.present": "true"}
CPU_LABELS = {"nodepool": "cpu"}
EXAMPLE = "nodewright-gpu-node-tuning.yaml"
NAMESPACE = "nodewright-system"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("sandbox", help="run NodeWright locally on simulated nodes")
    p.add_argument("--gpu-nodes", type=int, default=30, help="simulated nodepool=gpu nodes")
    p.add_argument("--cpu-nodes", type=int, default=10, help="simulated nodepool=cpu nodes")
    p.add_argument(
        "--stage-duration", default="2s", help="how long each simulated package stage runs"
    )
    p.add_argument(
        "--exit-when-ready",
        action="store_true",
        help="stop everything once the example NodeWright is Ready (for scripts and CI)",
    )
    p.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds")
    p.set_defaults(handler=run)


def _say(text: str = "") -> None:
    print(text, flush=True)


async def _client(rig: Rig) -> client.ApiClient:
    cfg = client.Configuration()
    await config.load_kube_config(
        config_file=str(rig.endpoints.kubeconfig), client_configuration=cfg
    )
    return client.ApiClient(configuration=cfg)


def summary(cr: api.NodeWright, all_nodes: list[dict[str, Any]]) -> tuple[str, bool]:
    """One progress line computed from the nodes themselves, and whether all are done."""
    states: Counter[str] = Counter()
    batches: Counter[int] = Counter()
    cordoned = 0
    targets = 0
    for node in all_nodes:
        facts = progress.facts(node, cr.metadata.name)
        if not progress.selector_matches(cr.spec.node_selectors, facts.labels):
            continue
        targets += 1
        turn = progress.turn(cr, facts)
        bucket = {
            "scheduler": "waiting",
            "done": "done",
            "failed": "failed",
        }.get(turn, "in progress")
        states[bucket] += 1
        if facts.selection is not None and bucket == "in progress":
            batches[facts.selection.batch] += 1
        if facts.unschedulable:
            cordoned += 1
    batch = ",".join(f"{b}:{n}" for b, n in sorted(batches.items())) or "-"
    line = (
        f"waiting {states['waiting']:>3} | in progress {states['in progress']:>3} "
        f"(by batch {batch}) | done {states['done']:>3} | failed {states['failed']:>3} "
        f"| cordoned {cordoned:>3}/{targets}"
    )
    return line, targets > 0 and states["done"] == targets


def _ready(raw: dict[str, Any]) -> bool:
    conditions = (raw.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


async def _rollout(rig: Rig, fleet: Fleet, args: argparse.Namespace, stop: asyncio.Event) -> bool:
    async with await _client(rig) as raw:
        kube = Kube(raw)
        await manifests.install_crds(kube)
        await manifests.ensure_namespace(kube, NAMESPACE)
        names = await nodes.create_nodes(
            kube, [f"gpu-node-{i:03d}" for i in range(args.gpu_nodes)], labels=GPU_LABELS
        )
        names += await nodes.create_nodes(
            kube, [f"cpu-node-{i:03d}" for i in range(args.cpu_nodes)], labels=CPU_LABELS
        )
        await nodes.wait_ready(kube, names)
        _say(f"Created {args.gpu_nodes} simulated GPU nodes and {args.cpu_nodes} CPU nodes.")
        _say("Starting the five services (scheduler, drainer, executor, validator, status) ...")
        await asyncio.to_thread(fleet.start_all)
        example = manifests.sample(EXAMPLE)
        await manifests.apply(kube, example)
        name = example["metadata"]["name"]
        _say(f"Applied NodeWright {name} (deploy/samples/{EXAMPLE}); rolling out:")
        t0 = time.monotonic()
        last = ""
        while not stop.is_set():
            fleet.check_alive()
            rig.check_alive()
            raw_cr = await kube.get(f"{manifests.NODEWRIGHTS}/{name}")
            cr = api.from_dict(raw_cr, api.NodeWright)
            listed = await kube.get(path_of(plural="nodes"))
            line, done = summary(cr, listed["items"])
            if line != last:
                _say(f"  [{time.monotonic() - t0:6.1f}s] {line}")
                last = line
            if done and _ready(raw_cr):
                _say(f"NodeWright {name} is Ready after {time.monotonic() - t0:.1f}s.")
                return True
            if time.monotonic() - t0 > args.timeout:
                _say(f"NodeWright {name} not Ready after {args.timeout:.0f}s; logs: {rig.dir}")
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
    return False


async def _main(rig: Rig, fleet: Fleet, args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    ok = await _rollout(rig, fleet, args, stop)
    ep = rig.endpoints
    _say(
        f"""
Look around (nodes and package runs are SIMULATED by kwok; nothing on this machine changed):
  export KUBECONFIG={ep.kubeconfig}
  kubectl get nodewrights
  kubectl wait --for=condition=Ready nodewright/gpu-node-tuning
  kubectl get nodes -L nodepool
  kubectl get node gpu-node-000 -o jsonpath='{{.metadata.annotations}}'
  kubectl get events -A --sort-by=.lastTimestamp

Follow the event stream:
  .venv/bin/nodewright events --server {ep.nats_url} --all
  nats --server {ep.nats_url} sub 'nw.ev.>'     (with the nats CLI, if installed)

Logs of every component: {rig.dir}
"""
    )
    if args.exit_when_ready or stop.is_set():
        return 0 if ok else 1
    _say("Press Ctrl-C to stop everything.")
    while not stop.is_set():
        try:
            fleet.check_alive()
            rig.check_alive()
        except RigError as exc:
            print(f"sandbox: {exc}", file=sys.stderr)
            return 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
    return 0 if ok else 1


def run(args: argparse.Namespace) -> int:
    rig = Rig(keep_work_dir=not args.exit_when_ready)
    fleet = Fleet(
        rig,
        namespace=NAMESPACE,
        extra_env={"NODEWRIGHT_PODS_SIM_STAGE_DURATION": args.stage_duration},
    )
    _say("Starting a local control plane and NATS on loopback (simulated nodes, nothing real) ...")
    try:
        rig.start()
        _say(f"Control plane and NATS up in {rig.timings['total']:.1f}s.")
        return asyncio.run(_main(rig, fleet, args))
    except RigError as exc:
        print(f"sandbox: {exc}", file=sys.stderr)
        return 1
    except msgspec.ValidationError as exc:
        print(f"sandbox: unexpected NodeWright content: {exc}", file=sys.stderr)
        return 1
    finally:
        _say("Stopping the sandbox ...")
        fleet.stop()
        rig.stop()
