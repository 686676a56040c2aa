"""Benchmark: roll one package across N simulated nodes and compare with the minimum.

    .venv/bin/python -m bench.rollout --nodes 100 [--budget-percent 10] [--stage-duration 1s]

Starts the rig and the five services, creates N ``nodepool=gpu`` kwok nodes, applies a
NodeWright with one package (apply + config, each followed by its check: four simulated
pods of ``--stage-duration`` per node) under a percent budget, and waits until it is Ready.
Prints one JSON object:

- ``wall_s``: from applying the CR to Ready;
- ``theoretical_min_s``: ceil(N / budget) waves x 4 sequential pods x stage duration
  (zero overhead: every wave starts the instant the previous one ends);
- ``overhead_ratio``: wall / minimum;
- ``api_requests``: API server requests during the rollout by verb and resource, read from
  the API server's own ``apiserver_request_total`` metric (after minus before);
- ``api_requests_by_service``: the same split by the service that made them, from each
  replica's ``nodewright_kube_requests_total`` (watches and the baseline's reads included);
- ``events_published``: messages added to the event stream;
- ``peak_rss_mb``: peak resident memory per service process (VmHWM).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import signal
import ssl
import sys
import time
import urllib.request
from collections import Counter
from typing import Any

import nats
from kubernetes_asyncio import client, config

from nodewright import manifests
from nodewright.rig import Rig, nodes
from nodewright.rig.fleet import SERVICES, Fleet
from shared.kube import Kube, path_of

_METRIC = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>[0-9.e+]+)$")


def api_requests(rig: Rig) -> Counter[str]:
    """apiserver_request_total summed by "VERB resource" (scraped from /metrics)."""
    ctx = ssl.create_default_context(cafile=str(rig.endpoints.ca_file))
    req = urllib.request.Request(f"{rig.endpoints.api_url}/metrics")
    req.add_header("Authorization", f"Bearer {rig.endpoints.token}")
    with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
        text = resp.read().decode()
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        m = _METRIC.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group("labels")))
        key = f"{labels.get('verb', '?')} {labels.get('resource', '?')}"
        if labels.get("subresource"):
            key += f"/{labels['subresource']}"
        counts[key] += int(float(m.group("value")))
    return counts


_OWN_METRIC = re.compile(
    r"^nodewright_kube_requests_total\{(?P<labels>[^}]*)\} (?P<value>[0-9.e+]+)$"
)


def service_requests(fleet: Fleet) -> dict[str, Counter[str]]:
    """Per service, its requests by "VERB resource" (every replica's /metrics summed)."""
    out: dict[str, Counter[str]] = {}
    for service, replicas in fleet.replicas.items():
        counts = out.setdefault(service, Counter())
        for r in replicas:
            url = f"http://127.0.0.1:{r.health_port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as resp:
                text = resp.read().decode()
            for line in text.splitlines():
                m = _OWN_METRIC.match(line)
                if m:
                    labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group("labels")))
                    key = f"{labels['verb']} {labels['resource']}"
                    counts[key] += int(float(m.group("value")))
    return out


async def stream_messages(url: str) -> int:
    nc = await nats.connect(url)
    try:
        info = await nc.jetstream().stream_info("NODEWRIGHT")
        return int(info.state.messages)
    finally:
        await nc.close()


def parse_duration(text: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", text)
    if not m:
        raise SystemExit(f"--stage-duration must look like 500ms, 2s or 1m, not {text!r}")
    return float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[m.group(2)]


async def run(args: argparse.Namespace, rig: Rig, fleet: Fleet) -> dict[str, Any]:
    cfg = client.Configuration()
    await config.load_kube_config(
        config_file=str(rig.endpoints.kubeconfig), client_configuration=cfg
    )
    async with client.ApiClient(configuration=cfg) as raw:
        kube = Kube(raw)
        await manifests.install_crds(kube)
        await manifests.ensure_namespace(kube, "nodewright-system")
        names = [f"bench-{i:05d}" for i in range(args.nodes)]
        await nodes.create_nodes(kube, names, labels={"nodepool": "gpu"})
        await nodes.wait_ready(kube, names, timeout_s=600)
        await asyncio.to_thread(fleet.start_all)
        await asyncio.sleep(2)  # let the services' caches settle before measuring
        before_api = api_requests(rig)
        before_own = service_requests(fleet)
        before_events = await stream_messages(rig.endpoints.nats_url)
        cr = {
            "apiVersion": "nodewright.nvidia.com/v1alpha1",
            "kind": "NodeWright",
            "metadata": {"name": "bench"},
            "spec": {
                "nodeSelectors": {"matchLabels": {"nodepool": "gpu"}},
                "interruptionBudget": {"percent": args.budget_percent},
                "packages": {"tuning": {"version": "1.0.0", "image": "registry.example/tuning"}},
            },
        }
        t0 = time.monotonic()
        await manifests.apply(kube, cr)
        path = f"{manifests.NODEWRIGHTS}/bench"
        while True:
            obj = await kube.get(path)
            conditions = (obj.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
                break
            if time.monotonic() - t0 > args.timeout:
                raise SystemExit(f"not Ready after {args.timeout}s; logs in {rig.dir}")
            fleet.check_alive()
            await asyncio.sleep(0.5)
        wall = time.monotonic() - t0
        after_api = api_requests(rig)
        after_own = service_requests(fleet)
        after_events = await stream_messages(rig.endpoints.nats_url)
        listed = await kube.get(path_of(plural="nodes"), labelSelector="nodepool=gpu")
        assert len(listed["items"]) == args.nodes
    budget = max(1, math.floor(args.nodes * args.budget_percent / 100))
    stage = parse_duration(args.stage_duration)
    minimum = math.ceil(args.nodes / budget) * 4 * stage
    delta = after_api - before_api
    return {
        "nodes": args.nodes,
        "budget": budget,
        "stage_duration_s": stage,
        "wall_s": round(wall, 2),
        "theoretical_min_s": round(minimum, 2),
        "overhead_ratio": round(wall / minimum, 2),
        "api_requests_total": sum(delta.values()),
        "api_requests": dict(sorted(delta.items(), key=lambda kv: -kv[1])),
        "api_requests_by_service": {
            service: {
                "total": sum((after_own[service] - before_own.get(service, Counter())).values()),
                **dict((after_own[service] - before_own.get(service, Counter())).most_common(8)),
            }
            for service in sorted(after_own)
        },
        "events_published": after_events - before_events,
        "peak_rss_mb": {
            r.name: round(r.peak_rss_bytes() / 2**20, 1)
            for s in SERVICES
            for r in fleet.replicas.get(s, [])
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.rollout", description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--budget-percent", type=int, default=10)
    p.add_argument("--stage-duration", default="1s")
    p.add_argument("--timeout", type=float, default=3600)
    args = p.parse_args(argv)
    # SIGTERM (timeout, Ctrl-C from a wrapper) must still run the cleanup below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rig = Rig()
    fleet = Fleet(rig, extra_env={"NODEWRIGHT_PODS_SIM_STAGE_DURATION": args.stage_duration})
    rig.start()
    try:
        result = asyncio.run(run(args, rig, fleet))
    finally:
        fleet.stop()
        rig.stop()
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
