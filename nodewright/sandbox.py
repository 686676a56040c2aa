"""``nodewright sandbox``: the whole system on this machine, on simulated nodes.

Starts the rig (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok,
nats-server) on loopback, creates simulated nodes, prints how to reach everything with
kubectl and the nats CLI, and stops it all on Ctrl-C. Nodes and package runs are simulated
by kwok: nothing touches this machine's own host configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import threading
from typing import Any

from kubernetes_asyncio import client, config

from nodewright.rig import Rig, RigError, nodes
from shared.kube import Kube

GPU_LABELS = {"nodepool": "gpu", "nvidia.com/gpu.present": "true"}
CPU_LABELS = {"nodepool": "cpu"}


def add_parser(sub: Any) -> None:
    p = sub.add_parser("sandbox", help="run NodeWright locally on simulated nodes")
    p.add_argument("--gpu-nodes", type=int, default=30, help="simulated nodepool=gpu nodes")
    p.add_argument("--cpu-nodes", type=int, default=10, help="simulated nodepool=cpu nodes")
    p.add_argument(
        "--exit-when-ready",
        action="store_true",
        help="stop everything once the sandbox is up (for scripts and CI)",
    )
    p.set_defaults(handler=run)


async def _populate(rig: Rig, gpu: int, cpu: int) -> None:
    cfg = client.Configuration()
    await config.load_kube_config(
        config_file=str(rig.endpoints.kubeconfig), client_configuration=cfg
    )
    async with client.ApiClient(configuration=cfg) as raw:
        api = Kube(raw)
        names = await nodes.create_nodes(
            api, [f"gpu-node-{i:03d}" for i in range(gpu)], labels=GPU_LABELS
        )
        names += await nodes.create_nodes(
            api, [f"cpu-node-{i:03d}" for i in range(cpu)], labels=CPU_LABELS
        )
        await nodes.wait_ready(api, names)


def _say(text: str) -> None:
    print(text, flush=True)


def run(args: argparse.Namespace) -> int:
    rig = Rig()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        _say("Starting the local control plane and NATS (simulated nodes, nothing real) ...")
        rig.start()
        asyncio.run(_populate(rig, args.gpu_nodes, args.cpu_nodes))
    except RigError as exc:
        print(f"sandbox: {exc}", file=sys.stderr)
        rig.stop()
        return 1
    except BaseException:
        rig.stop()
        raise
    ep = rig.endpoints
    _say(
        f"""
NodeWright sandbox is up. NODES AND PACKAGE RUNS ARE SIMULATED (kwok); nothing on this
machine is changed.

  {args.gpu_nodes} simulated nodes labelled nodepool=gpu, {args.cpu_nodes} labelled nodepool=cpu
  control plane started in {rig.timings["total"]:.1f}s; logs in {rig.dir}

Inspect it:
  export KUBECONFIG={ep.kubeconfig}
  kubectl get nodes -L nodepool
  nats --server {ep.nats_url} stream ls

Press Ctrl-C to stop everything.
"""
    )
    try:
        while not stop.is_set() and not args.exit_when_ready:
            rig.check_alive()
            stop.wait(1.0)
    except KeyboardInterrupt:
        pass
    except RigError as exc:
        print(f"sandbox: {exc}", file=sys.stderr)
        return 1
    finally:
        _say("Stopping the sandbox ...")
        rig.stop()
    return 0
