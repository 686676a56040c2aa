"""Benchmark: roll one package across N simulated nodes and compare with the minimum.

    .venv/bin/python -m bench.rollout --nodes 100 [--budget-percent 10] [--stage-duration 1s]

Starts the rig and the five services, creates N ``nodepool=gpu`` kwok nodes, applies a
NodeWright with one package (apply + config, each followed by its check: four simulated
pods of ``--stage-duration`` per node; kwok ends a pod's init containers at once, as it
did for the reference's run) under a percent budget, and waits until it is Ready.
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
- ``peak_rss_mb``: peak resident memory per service process (VmHWM);
- ``per_node``: API requests by the services, writes (POST/PUT/PATCH/DELETE) and Node
  writes of the whole rig, the services' own Node writes (``service_node_writes``), and
  the services' peak RSS, each divided by N;
- ``cpu_s``: CPU seconds (utime + stime) per service, summed over its replicas: since the
  process started, and during the rollout alone; ``rig_rollout``: the same of each rig
  component (API server, etcd, kwok ...) during the rollout, which shares the cores;
- ``conflicts``: 409 answers per service;
- ``pins_refused``: 422 answers per service: node writes whose pinned precondition no
  longer held (``shared.nodepins``; a node write the API server finds invalid is also 422,
  and is an error in the service's log);
- ``latency_s``: CR apply to the first cordon; per batch, its first admission to its last
  (``batch_admission``); per node, its uncordon to the scheduler's release of its slot
  (``release_lag``): p50, p90, p99 and max; ``per_step``: the same per step of a node
  (admission to cordon, cordon to the drainer's drained, to the executor's record of the
  package, to its stage pod, the pod's start and run, its end to the
  uncordon, the uncordon to the release) and between one batch's last release and the next
  batch's first admission;
- ``work_queues``: per service's work queue (``shared.workqueue``), during the rollout: keys
  queued per lane (``normal``: a change or an event; ``low``: the periodic resync), their
  mean wait for a worker, the reconciles, the seconds they took (waits included) and the
  retries;
- ``scheduler_pass``: per phase of the scheduler's passes (``rest``: waiting for its share
  of the time; ``decide``: computing the decisions; ``releases``, ``book``, ``admissions``:
  their writes, first sent to last answered), how many, their mean and sum in seconds;
  ``released_via``: the releases written as soon as due (``fast``) and by a pass (``pass``);
- ``consumer_backlog_at_ready`` and ``backlog_cleared_after_s``: every durable consumer's
  pending plus unacknowledged messages when the CR turned Ready, and how long until none;
- ``status_condition_changes``: the status service's node condition as the node watch saw
  it change, counted per ``from -> to`` (state and reason code; ``-`` before the first),
  which says where its writes per node above one per state go;
- ``node_writers_since_apply``: per field manager of the nodes (and subresource), how many
  nodes it last wrote after the CR was applied: whose the rig's Node writes beyond the
  services' own are (kwok's, the controllers');
- ``at_rest`` (with ``--rest-s S``): the rollout done and every consumer caught up, what
  the services cost over the next S seconds with nothing to do: CPU seconds per minute per
  service and per rig component, reconciles per queue, and the services' API requests
  (the periodic resyncs, the informers' replays, and the executor's deletion of finished
  stage pods with the pod events it makes);
- ``load``: the machine's load averages at the start and at the end.

``--profile DIR`` records each service replica with py-spy (when installed) into DIR.
``--together`` runs the five services in one process (``python -m services``): the figures
per service are then those of the one process, named ``all``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import nats
from prometheus_client.parser import text_string_to_metric_families

from nodewright import manifests
from nodewright.rig import Rig, nodes
from nodewright.rig.fleet import Fleet, Replica
from shared import nodestate, pods
from shared.config import KubeSettings
from shared.informer import Informer
from shared.kube import connect, path_of
from shared.records.drainer import DrainRecord
from shared.records.executor import ExecutorRecord
from shared.records.scheduler import Selection
from shared.records.status import find_condition, reported

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


def metrics_page(replica: Replica) -> str:
    """The replica's /metrics, as Prometheus would scrape it."""
    url = f"http://127.0.0.1:{replica.health_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text: str = resp.read().decode()
    return text


def service_requests(fleet: Fleet, *, by_code: bool = False) -> dict[str, Counter[str]]:
    """Per service, its requests by "VERB resource" (with ``by_code``: by HTTP code), every
    replica's /metrics summed."""
    out: dict[str, Counter[str]] = {}
    for service, replicas in fleet.replicas.items():
        counts = out.setdefault(service, Counter())
        for r in replicas:
            for line in metrics_page(r).splitlines():
                m = _OWN_METRIC.match(line)
                if m:
                    labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group("labels")))
                    key = labels["code"] if by_code else f"{labels['verb']} {labels['resource']}"
                    counts[key] += int(float(m.group("value")))
    return out


K = TypeVar("K")

QueueSamples = dict[tuple[str, str, str], float]
"""(sample name, queue name, lane or "") -> value."""


def _summed(fleet: Fleet, read: Callable[[str], dict[K, float]]) -> dict[K, float]:
    """What ``read`` takes from each replica's /metrics page, summed over the replicas."""
    out: dict[K, float] = {}
    for r in replicas(fleet):
        for key, value in read(metrics_page(r)).items():
            out[key] = out.get(key, 0.0) + value
    return out


def work_queues(fleet: Fleet) -> QueueSamples:
    """Every replica's ``nodewright_workqueue_*`` samples summed."""
    return _summed(fleet, queue_samples)


def queue_samples(text: str) -> QueueSamples:
    """The ``nodewright_workqueue_*`` samples of one /metrics page, without buckets."""
    out: QueueSamples = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("nodewright_workqueue_"):
            continue
        for sample in family.samples:
            if not sample.name.endswith(("_bucket", "_created")):
                key = (sample.name, sample.labels["name"], sample.labels.get("priority", ""))
                out[key] = out.get(key, 0.0) + sample.value
    return out


PassSamples = dict[tuple[str, str], float]
"""("count" or "sum", phase) -> value of ``nodewright_scheduler_pass_phase_seconds``."""


def scheduler_passes(fleet: Fleet) -> PassSamples:
    """Every replica's pass samples summed (only the leader's move)."""
    return _summed(fleet, pass_samples)


def pass_samples(text: str) -> PassSamples:
    """The scheduler's pass-phase counts and sums of one /metrics page."""
    out: PassSamples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.name == "nodewright_scheduler_pass_phase_seconds" and sample.name.endswith(
                ("_count", "_sum")
            ):
                key = (sample.name.rsplit("_", 1)[1], sample.labels["phase"])
            elif sample.name == "nodewright_scheduler_releases_total":
                key = ("released", sample.labels["via"])
            else:
                continue
            out[key] = out.get(key, 0.0) + sample.value
    return out


def pass_figures(before: PassSamples, after: PassSamples) -> dict[str, dict[str, float]]:
    """``scheduler_pass`` of the JSON: per phase of the scheduler's passes, how many there
    were between the two readings, their mean and their sum in seconds."""
    out: dict[str, dict[str, float]] = {}
    for (sample, phase), value in sorted(after.items()):
        if sample == "released":
            out.setdefault("released_via", {})[phase] = int(value - before.get((sample, phase), 0))
        if sample != "count":
            continue
        n = value - before.get(("count", phase), 0.0)
        total = after.get(("sum", phase), 0.0) - before.get(("sum", phase), 0.0)
        if n:
            out[phase] = {"n": int(n), "mean_s": round(total / n, 4), "sum_s": round(total, 2)}
    return out


def queue_figures(before: QueueSamples, after: QueueSamples) -> Any:
    """``work_queues`` of the JSON: per queue, what happened between the two readings."""
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    out: dict[str, dict[str, Any]] = {}
    for (sample, name, lane), value in sorted(delta.items()):
        q = out.setdefault(name, {"adds": {}, "wait_mean_s": {}})
        if sample == "nodewright_workqueue_adds_total":
            q["adds"][lane] = int(value)
        elif sample == "nodewright_workqueue_queue_duration_seconds_count" and value:
            waited = delta.get(("nodewright_workqueue_queue_duration_seconds_sum", name, lane), 0)
            q["wait_mean_s"][lane] = round(waited / value, 4)
        elif sample == "nodewright_workqueue_work_duration_seconds_count":
            q["reconciles"] = int(value)
        elif sample == "nodewright_workqueue_work_duration_seconds_sum":
            q["work_s"] = round(value, 2)
        elif sample == "nodewright_workqueue_retries_total":
            q["retries"] = int(value)
    return out


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(replica: Replica) -> float:
    """utime + stime of the replica's process so far (Linux /proc), 0 if it is gone."""
    return _cpu_of(replica.popen.pid)


def _cpu_of(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def cpu_by_component(rig: Rig) -> dict[str, float]:
    """utime + stime so far of each rig component (the API server, etcd, kwok ...)."""
    return {name: _cpu_of(p.popen.pid) for name, p in sorted(rig.processes.items())}


async def at_rest(rig: Rig, fleet: Fleet, seconds: float) -> dict[str, Any]:
    """``at_rest`` of the JSON: what ``seconds`` with nothing to do cost."""
    cpu, rig_cpu = cpu_by_service(fleet), cpu_by_component(rig)
    queues, own = work_queues(fleet), service_requests(fleet)
    await asyncio.sleep(seconds)
    per_min = 60 / seconds
    cpu_after, rig_after = cpu_by_service(fleet), cpu_by_component(rig)
    own_after = service_requests(fleet)
    return {
        "seconds": seconds,
        "cpu_s_per_min": {
            s: round((v - cpu.get(s, 0.0)) * per_min, 2) for s, v in cpu_after.items()
        },
        "rig_cpu_s_per_min": {
            c: round((v - rig_cpu.get(c, 0.0)) * per_min, 2) for c, v in rig_after.items()
        },
        "reconciles": {
            name: q.get("reconciles", 0)
            for name, q in queue_figures(queues, work_queues(fleet)).items()
        },
        "service_requests": {
            s: dict((own_after[s] - own.get(s, Counter())).most_common(8)) for s in own_after
        },
    }


def cpu_by_service(fleet: Fleet) -> dict[str, float]:
    return {s: sum(cpu_seconds(r) for r in reps) for s, reps in fleet.replicas.items()}


def replicas(fleet: Fleet) -> list[Replica]:
    return [r for reps in fleet.replicas.values() for r in reps]


def percentiles(values: list[float]) -> dict[str, float]:
    """p50, p90, p99 and max (nearest rank), rounded to ms; {} for no values."""
    if not values:
        return {}
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

    return {
        "n": len(ordered),
        "p50": round(rank(0.5), 3),
        "p90": round(rank(0.9), 3),
        "p99": round(rank(0.99), 3),
        "max": round(ordered[-1], 3),
    }


@dataclass
class Timeline:
    """When each target node was first cordoned, uncordoned and released, and when each
    batch's admissions were first seen, from a node watch of the benchmark's own (times
    are this process's monotonic clock)."""

    cr: str
    first_cordon: float | None = None
    cordoned: dict[str, float] = field(default_factory=dict)
    uncordoned: dict[str, float] = field(default_factory=dict)
    admitted: dict[str, float] = field(default_factory=dict)
    released: dict[str, float] = field(default_factory=dict)
    batch_of: dict[str, int] = field(default_factory=dict)
    condition: dict[str, str] = field(default_factory=dict)
    """Per node, the status service's condition last seen: ``state/reason code``."""
    condition_changes: Counter[str] = field(default_factory=Counter)
    pod_created: dict[str, float] = field(default_factory=dict)
    """Per node, when its (first) stage pod was first seen, and when it was first seen
    running and finished (Succeeded or Failed)."""
    pod_running: dict[str, float] = field(default_factory=dict)
    pod_done: dict[str, float] = field(default_factory=dict)
    drained: dict[str, float] = field(default_factory=dict)
    """Per node, when the drainer's record first said drained, and when the executor's
    first recorded a package."""
    started: dict[str, float] = field(default_factory=dict)

    def on_pod(self, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is None:
            return
        now = time.monotonic()
        node = str((new.get("spec") or {}).get("nodeName") or "")
        if not node:
            return
        self.pod_created.setdefault(node, now)
        phase = (new.get("status") or {}).get("phase")
        if phase == "Running":
            self.pod_running.setdefault(node, now)
        elif phase in ("Succeeded", "Failed"):
            self.pod_running.setdefault(node, now)
            self.pod_done.setdefault(node, now)

    def phases(self) -> dict[str, dict[str, float]]:
        """Where each node's time went, step by step (percentiles over the nodes), and the
        gap between one batch's last release and the next batch's first admission."""
        steps = [
            ("admit_to_cordon", self.admitted, self.cordoned),
            ("cordon_to_drained", self.cordoned, self.drained),
            ("drained_to_started", self.drained, self.started),
            ("started_to_pod", self.started, self.pod_created),
            ("pod_to_running", self.pod_created, self.pod_running),
            ("running_to_done", self.pod_running, self.pod_done),
            ("done_to_uncordon", self.pod_done, self.uncordoned),
            ("uncordon_to_release", self.uncordoned, self.released),
        ]
        out = {
            name: percentiles([end[n] - t for n, t in start.items() if n in end])
            for name, start, end in steps
        }
        batches: dict[int, list[str]] = {}
        for node, batch in self.batch_of.items():
            batches.setdefault(batch, []).append(node)
        order = sorted(batches)
        gaps = []
        for a, b in itertools.pairwise(order):
            last = max((self.released.get(n, 0.0) for n in batches[a]), default=0.0)
            first = min(self.admitted[n] for n in batches[b])
            if last:
                gaps.append(first - last)
        out["release_to_next_batch"] = percentiles(gaps)
        return out

    def on_change(self, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is None:
            return
        now = time.monotonic()
        name = new["metadata"]["name"]
        cordoned = bool((new.get("spec") or {}).get("unschedulable"))
        selection = nodestate.read(new, nodestate.SCHEDULER, self.cr, Selection)
        if selection is not None and name not in self.admitted:
            self.admitted[name] = now
            self.batch_of[name] = selection.batch
        if name not in self.drained:
            drain = nodestate.read(new, nodestate.DRAINER, self.cr, DrainRecord)
            if drain is not None and drain.phase == "drained":
                self.drained[name] = now
        if name not in self.started:
            ran = nodestate.read(new, nodestate.EXECUTOR, self.cr, ExecutorRecord)
            if ran is not None and ran.packages:
                self.started[name] = now
        if cordoned and name not in self.cordoned:
            self.cordoned[name] = now
            if self.first_cordon is None:
                self.first_cordon = now
        if not cordoned and name in self.cordoned and name not in self.uncordoned:
            self.uncordoned[name] = now
        if selection is None and name in self.admitted and name not in self.released:
            self.released[name] = now
        said = reported(find_condition(new, self.cr))
        if said is not None:
            seen = said.state + (f"/{said.reason.code}" if said.reason is not None else "")
            before = self.condition.get(name, "-")
            if seen != before:
                self.condition[name] = seen
                self.condition_changes[f"{before} -> {seen}"] += 1

    def release_lags(self) -> list[float]:
        return [self.released[n] - t for n, t in self.uncordoned.items() if n in self.released]

    def batch_admission(self) -> list[float]:
        """Per batch: its last admission seen minus its first."""
        spans: dict[int, list[float]] = {}
        for node, t in self.admitted.items():
            spans.setdefault(self.batch_of[node], []).append(t)
        return [max(ts) - min(ts) for ts in spans.values()]


async def consumer_backlog(url: str) -> dict[str, int]:
    """Every durable consumer's pending plus unacknowledged messages."""
    nc = await nats.connect(url)
    try:
        return {
            ci.name: int(ci.num_pending or 0) + int(ci.num_ack_pending or 0)
            for ci in await nc.jetstream().consumers_info("NODEWRIGHT")
        }
    finally:
        await nc.close()


def load() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


@contextlib.contextmanager
def profiled(fleet: Fleet, out: Path | None) -> Any:
    """py-spy record of every replica into ``out`` while the block runs (nothing without
    ``out``; a clear message when py-spy is not installed)."""
    if out is None:
        yield
        return
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise SystemExit("--profile needs py-spy: .venv/bin/pip install py-spy")
    out.mkdir(parents=True, exist_ok=True)
    procs = [
        subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(r.popen.pid),
                "--format",
                "speedscope",
                "--output",
                str(out / f"{r.name}.speedscope.json"),
                "--rate",
                "50",
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for reps in fleet.replicas.values()
        for r in reps
    ]
    try:
        yield
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(30)


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
    load_start = load()
    async with connect(KubeSettings(kubeconfig=str(rig.endpoints.kubeconfig))) as kube:
        await manifests.install_crds(kube)
        await manifests.ensure_namespace(kube, "nodewright-system")
        names = [f"bench-{i:05d}" for i in range(args.nodes)]
        await nodes.create_nodes(kube, names, labels={"nodepool": "gpu"})
        await nodes.wait_ready(kube, names, timeout_s=600)
        if args.together:
            await asyncio.to_thread(fleet.start_together)
        else:
            await asyncio.to_thread(fleet.start_all)
        await asyncio.sleep(2)  # let the services' caches settle before measuring
        idle_rss = {r.name: round(r.rss_bytes() / 2**20, 1) for r in replicas(fleet)}
        timeline = Timeline(cr="bench")
        watch = Informer(
            kube=kube,
            path=path_of(plural="nodes"),
            on_change=timeline.on_change,
            label_selector="nodepool=gpu",
            name="bench-timeline",
        )
        pod_watch = Informer(
            kube=kube,
            path=path_of(plural="pods", namespace="nodewright-system"),
            on_change=timeline.on_pod,
            label_selector=f"{pods.LABEL_MANAGED}={pods.MANAGED_BY}",
            name="bench-pods",
        )
        watcher = asyncio.create_task(watch.run(), name="bench-timeline")
        pod_watcher = asyncio.create_task(pod_watch.run(), name="bench-pods")
        await asyncio.wait_for(watch.synced.wait(), 60)
        await asyncio.wait_for(pod_watch.synced.wait(), 60)
        before_api = api_requests(rig)
        before_own = service_requests(fleet)
        before_codes = service_requests(fleet, by_code=True)
        before_queues = work_queues(fleet)
        before_passes = scheduler_passes(fleet)
        before_cpu = cpu_by_service(fleet)
        before_rig_cpu = cpu_by_component(rig)
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
        with profiled(fleet, args.profile):
            applied_at = datetime.now(UTC).replace(microsecond=0)
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
        after_codes = service_requests(fleet, by_code=True)
        after_queues = work_queues(fleet)
        after_passes = scheduler_passes(fleet)
        after_cpu = cpu_by_service(fleet)
        after_events = await stream_messages(rig.endpoints.nats_url)
        backlog_at_ready = await consumer_backlog(rig.endpoints.nats_url)
        cleared_after: float | None = None
        while time.monotonic() - t0 - wall < 300:
            if not any((await consumer_backlog(rig.endpoints.nats_url)).values()):
                cleared_after = round(time.monotonic() - t0 - wall, 1)
                break
            await asyncio.sleep(1)
        await asyncio.sleep(1)  # the last releases reach the timeline
        watcher.cancel()
        pod_watcher.cancel()
        await asyncio.gather(watcher, pod_watcher, return_exceptions=True)
        listed = await kube.get(path_of(plural="nodes"), labelSelector="nodepool=gpu")
        assert len(listed["items"]) == args.nodes
        writers = node_writers(listed["items"], since=applied_at)
        rest = await at_rest(rig, fleet, args.rest_s) if args.rest_s > 0 else None
    budget = max(1, math.floor(args.nodes * args.budget_percent / 100))
    stage = parse_duration(args.stage_duration)
    minimum = math.ceil(args.nodes / budget) * 4 * stage
    delta = after_api - before_api
    own = {s: after_own[s] - before_own.get(s, Counter()) for s in after_own}
    peak_rss = {r.name: round(r.peak_rss_bytes() / 2**20, 1) for r in replicas(fleet)}
    writes = sum(v for k, v in delta.items() if k.split(" ")[0] in _WRITES)
    node_writes = sum(
        v
        for k, v in delta.items()
        if k.split(" ")[0] in _WRITES and k.split(" ")[1] in ("nodes", "nodes/status")
    )
    service_node_writes = sum(
        v
        for counts in own.values()
        for k, v in counts.items()
        if k.split(" ")[0] in _WRITES and k.split(" ")[1] in ("nodes", "nodes/status")
    )
    n = args.nodes
    return {
        "nodes": args.nodes,
        "processes": "one (python -m services)" if args.together else "one per service",
        "budget": budget,
        "stage_duration_s": stage,
        "wall_s": round(wall, 2),
        "theoretical_min_s": round(minimum, 2),
        "overhead_ratio": round(wall / minimum, 2),
        "api_requests_total": sum(delta.values()),
        "api_requests": dict(sorted(delta.items(), key=lambda kv: -kv[1])),
        "api_requests_by_service": {
            service: {
                "total": sum(own[service].values()),
                **dict(own[service].most_common(8)),
            }
            for service in sorted(after_own)
        },
        "events_published": after_events - before_events,
        "peak_rss_mb": peak_rss,
        "idle_rss_mb": idle_rss,
        "per_node": {
            "service_requests": round(sum(sum(c.values()) for c in own.values()) / n, 2),
            "writes": round(writes / n, 2),
            "node_writes": round(node_writes / n, 2),
            "service_node_writes": round(service_node_writes / n, 2),
            "peak_rss_mib": round(sum(peak_rss.values()) / n, 3),
        },
        "cpu_s": {
            "total": {s: round(v, 2) for s, v in after_cpu.items()},
            "rollout": {s: round(after_cpu[s] - before_cpu.get(s, 0.0), 2) for s in after_cpu},
            "sum_total": round(sum(after_cpu.values()), 2),
            "sum_rollout": round(sum(after_cpu.values()) - sum(before_cpu.values()), 2),
            "rig_rollout": {
                c: round(v - before_rig_cpu.get(c, 0.0), 2)
                for c, v in cpu_by_component(rig).items()
            },
        },
        "conflicts": {
            s: after_codes[s]["409"] - before_codes.get(s, Counter())["409"]
            for s in sorted(after_codes)
        },
        "pins_refused": {
            s: after_codes[s]["422"] - before_codes.get(s, Counter())["422"]
            for s in sorted(after_codes)
        },
        "latency_s": {
            "apply_to_first_cordon": (
                round(timeline.first_cordon - t0, 3) if timeline.first_cordon else None
            ),
            "batch_admission": percentiles(timeline.batch_admission()),
            "release_lag": percentiles(timeline.release_lags()),
            "per_step": timeline.phases(),
        },
        "work_queues": queue_figures(before_queues, after_queues),
        "scheduler_pass": pass_figures(before_passes, after_passes),
        "consumer_backlog_at_ready": backlog_at_ready,
        "backlog_cleared_after_s": cleared_after,
        "status_condition_changes": dict(timeline.condition_changes.most_common()),
        "node_writers_since_apply": writers,
        "at_rest": rest,
        "load": {"start": load_start, "end": load()},
        "measured_at": datetime.now().astimezone().isoformat(timespec="seconds"),
    }


_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE", "APPLY"})


def node_writers(items: list[dict[str, Any]], *, since: datetime) -> dict[str, int]:
    """Who wrote the nodes during the rollout, from their managedFields: for each field
    manager (and subresource), the nodes whose last write by it came at or after ``since``.
    A lower bound of its writes (a manager's entry keeps only its last time), enough to
    say whose the API server's Node writes are beside the services' own count, which
    ``node_writes`` cannot: it is the API server's, every writer together."""
    found: Counter[str] = Counter()
    for item in items:
        for entry in item["metadata"].get("managedFields") or []:
            stamp = entry.get("time")
            if not stamp or datetime.fromisoformat(stamp.replace("Z", "+00:00")) < since:
                continue
            name = str(entry.get("manager") or "?")
            if entry.get("subresource"):
                name += f" ({entry['subresource']})"
            found[name] += 1
    return dict(found.most_common())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.rollout", description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--budget-percent", type=int, default=10)
    p.add_argument("--stage-duration", default="1s")
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--profile", type=Path, default=None, metavar="DIR")
    p.add_argument(
        "--rest-s",
        type=float,
        default=0.0,
        metavar="S",
        help="after the rollout, measure S seconds at rest (at_rest in the JSON)",
    )
    p.add_argument(
        "--together",
        action="store_true",
        help="run the five services in one process (python -m services) instead of five",
    )
    args = p.parse_args(argv)
    # SIGTERM (timeout, Ctrl-C from a wrapper) must still run the cleanup below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rig = Rig(keep_work_dir=bool(os.environ.get("NW_BENCH_KEEP_RIG")))
    # The simulated work of every earlier figure and of the reference's run: kwok ends a
    # stage pod's init containers at once (not in turn, which costs the rig three more pod
    # status writes per pod; docs/rig.md).
    sim = {"NODEWRIGHT_PODS_SIM_STAGE_DURATION": args.stage_duration}
    fleet = Fleet(rig, extra_env={**sim, "NODEWRIGHT_PODS_SIM_IN_TURN": "false"})
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
