"""A rollout under faults, measured by observers the faults cannot touch.

    .venv/bin/python -m bench.faults --nodes 1000 [--compare]

Starts a rig of its own (its API server is restarted and its nats-server killed, so no
other user may share it), a fault proxy (nodewright.rig.faults) in front of the API server
and NATS that only the services go through, and every service with ``--replicas`` replicas.
Creates N ``nodepool=gpu`` kwok nodes and applies a NodeWright with ``--packages`` packages
(apply + config stages, each checked in its own pod: 2 simulated pods of 2 s per package and
node) under a 10 % budget. While it rolls out:

- a random replica is SIGKILLed every 1 to 3 s and started again 0 to 2 s later;
- nats-server is killed (SIGKILL) and kept down 10 s, twice;
- the API server is restarted once;
- every API call of the services waits 2 s more for 60 s;
- the services lose NATS for 30 s (a partition: connections cut, new ones refused).

It then reports, from the rig directly: stage pods created more than once by each of two
independent ledgers (a pod watch, and an etcd watch on the pod keys, which sees every
creation even while the API server is away), nodes disrupted (cordoned or admitted) at
every change and in 100 ms samples against the budget, nodes left cordoned, every
transition on the event stream counted per node (exactly once each, nothing missing), how
long after Ready the consumers still had a backlog, and the time to Ready (``--compare``
first runs the same rollout without faults). One JSON object on stdout.

tests/e2e/test_reliability.py runs this at 200 nodes and asserts on the report; the
1,000-node run is this script's.

Not this module's job: the faults' mechanics (nodewright.rig, nodewright.rig.faults).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import math
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import nats

from bench.rollout import consumer_backlog
from nodewright import manifests
from nodewright.rig import Rig, nodes
from nodewright.rig.faults import FaultProxy
from nodewright.rig.fleet import SERVICES, Fleet
from shared import events, nodestate
from shared.config import KubeSettings
from shared.informer import Informer
from shared.kube import ApiError, Kube, connect, path_of
from shared.records.scheduler import Selection

CR = "faults"
NAMESPACE = "nodewright-system"
STAGES = ("apply", "config")
"""Per package, the stages that run (each with its check)."""
PER_PACKAGE_KINDS = ("stage.started", "stage.succeeded", "stage.validated")
PER_NODE_KINDS = (
    "node.selected",
    "node.cordoned",
    "node.drained",
    "node.validated",
    "node.uncordoned",
    "node.completed",
)


@dataclass
class Plan:
    nodes: int = 200
    packages: int = 2
    replicas: int = 2
    budget_percent: int = 10
    faults: bool = True
    seed: int = 1
    kill_every_s: tuple[float, float] = (1.0, 3.0)
    restart_after_s: tuple[float, float] = (0.0, 2.0)
    nats_down_s: float = 10.0
    latency_ms: int = 2000
    latency_s: float = 60.0
    partition_s: float = 30.0
    timeout_s: float = 1800.0
    stage_duration: str = "1s"
    steady_latency_ms: int = 0
    """Added to every API call of the services for the whole run (before they start)."""

    @property
    def budget(self) -> int:
        return max(1, math.floor(self.nodes * self.budget_percent / 100))


@dataclass
class Report:
    nodes: int
    packages: int
    replicas: int
    budget: int
    faults: bool
    ready: bool = False
    time_to_ready_s: float = 0.0
    kills: int = 0
    nats_kills: int = 0
    api_restarts: int = 0
    latency_window_s: float = 0.0
    partition_window_s: float = 0.0
    fault_log: list[str] = field(default_factory=list)
    stage_pods: int = 0
    duplicates_pod_watch: dict[str, int] = field(default_factory=dict)
    duplicates_etcd: dict[str, int] = field(default_factory=dict)
    etcd_creations: int = 0
    max_disrupted: int = 0
    samples: int = 0
    samples_over_budget: int = 0
    changes_over_budget: int = 0
    left_cordoned: list[str] = field(default_factory=list)
    stream_messages: int = 0
    events_missing: dict[str, int] = field(default_factory=dict)
    events_repeated: dict[str, int] = field(default_factory=dict)
    events_unexpected: dict[str, int] = field(default_factory=dict)
    """Transitions a clean rollout has none of (a failed stage, a waiting node ...), by kind."""
    msg_ids_repeated: int = 0
    backlog_cleared_after_s: float | None = None
    backlog_at_end: dict[str, int] = field(default_factory=dict)
    unclean_stops: dict[str, int] = field(default_factory=dict)
    """Replicas that did not exit 0 on SIGTERM within the 30 s grace period (-9: killed
    after it), or that had exited on their own before."""
    stop_s: float = 0.0
    log_tracebacks: int = 0
    """Tracebacks the services logged (expected faults are one warning each, no traceback)."""
    log_errors: dict[str, int] = field(default_factory=dict)
    """Error-level log lines by message."""
    log_warnings: dict[str, int] = field(default_factory=dict)
    """Warnings by message, all replicas together (an outage should be two per replica)."""
    load_start: tuple[float, ...] = ()
    load_end: tuple[float, ...] = ()


def _cr(plan: Plan) -> dict[str, Any]:
    packages = {
        f"pkg{i}": {"version": "1.0.0", "image": f"registry.example/pkg{i}"}
        for i in range(plan.packages)
    }
    return {
        "apiVersion": "nodewright.nvidia.com/v1alpha1",
        "kind": "NodeWright",
        "metadata": {"name": CR},
        "spec": {
            "nodeSelectors": {"matchLabels": {"nodepool": "gpu"}},
            "interruptionBudget": {"percent": plan.budget_percent},
            "packages": packages,
        },
    }


def _load() -> tuple[float, ...]:
    return tuple(float(x) for x in Path("/proc/loadavg").read_text().split()[:3])


# ---- observers ---------------------------------------------------------------------------


@dataclass
class PodWatch:
    """Every NodeWright pod ever seen through a watch: name -> UIDs."""

    uids: dict[str, set[str]] = field(default_factory=dict)

    def on_change(self, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is not None:
            self.uids.setdefault(new["metadata"]["name"], set()).add(new["metadata"]["uid"])


@dataclass
class EtcdWatch:
    """Every creation of a pod key in etcd (create_revision == mod_revision), through etcd's
    own watch: independent of the API server, its caches and its restarts."""

    url: str
    prefix: str
    creations: Counter[str] = field(default_factory=Counter)
    started: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        key = self.prefix.encode()
        end = key[:-1] + bytes([key[-1] + 1])
        body = {
            "create_request": {
                "key": base64.b64encode(key).decode(),
                "range_end": base64.b64encode(end).decode(),
            }
        }
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(f"{self.url}/v3/watch", json=body) as resp,
        ):
            resp.raise_for_status()
            async for line in resp.content:
                if not line.strip():
                    continue
                result = json.loads(line).get("result") or {}
                if result.get("created"):
                    self.started.set()
                for ev in result.get("events") or []:
                    kv = ev.get("kv") or {}
                    if ev.get("type", "PUT") != "PUT":
                        continue
                    if kv.get("create_revision") == kv.get("mod_revision"):
                        name = base64.b64decode(kv["key"]).decode().rsplit("/", 1)[1]
                        self.creations[name] += 1


@dataclass
class Disruption:
    """Target nodes cordoned or admitted by the scheduler, recounted at every node change
    (and sampled every 100 ms)."""

    budget: int
    disrupted: set[str] = field(default_factory=set)
    max_seen: int = 0
    changes_over: int = 0
    samples: list[int] = field(default_factory=list)

    def on_change(self, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        node = new if new is not None else old
        assert node is not None
        name = node["metadata"]["name"]
        if new is not None and (
            (new.get("spec") or {}).get("unschedulable")
            or nodestate.read(new, nodestate.SCHEDULER, CR, Selection) is not None
        ):
            self.disrupted.add(name)
        else:
            self.disrupted.discard(name)
        self.max_seen = max(self.max_seen, len(self.disrupted))
        if len(self.disrupted) > self.budget:
            self.changes_over += 1

    async def sample(self) -> None:
        while True:
            self.samples.append(len(self.disrupted))
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def _running(*coros: Any) -> AsyncIterator[list[asyncio.Task[Any]]]:
    tasks = [asyncio.create_task(c) for c in coros]
    try:
        yield tasks
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# ---- faults ------------------------------------------------------------------------------


@dataclass
class Faults:
    rig: Rig
    fleet: Fleet
    proxy: FaultProxy
    plan: Plan
    report: Report
    rng: random.Random
    t0: float = 0.0
    _restarts: set[asyncio.Task[Any]] = field(default_factory=set)

    def _log(self, what: str) -> None:
        line = f"{time.monotonic() - self.t0:7.1f}s {what}"
        self.report.fault_log.append(line)
        print(f"bench.faults: {line}", file=sys.stderr, flush=True)

    async def killer(self) -> None:
        """SIGKILL a random replica every 1 to 3 s; start a new one 0 to 2 s later."""
        while True:
            await asyncio.sleep(self.rng.uniform(*self.plan.kill_every_s))
            alive = [r for reps in self.fleet.replicas.values() for r in reps if r.alive()]
            if not alive:
                continue
            victim = self.rng.choice(alive)
            self.fleet.kill(victim.service, victim.index)
            self.report.kills += 1
            task = asyncio.create_task(self._restart(victim.service))
            self._restarts.add(task)
            task.add_done_callback(self._restarts.discard)

    async def _restart(self, service: str) -> None:
        await asyncio.sleep(self.rng.uniform(*self.plan.restart_after_s))
        # Not waited for: during an API or NATS outage a new replica is not ready for a while.
        await asyncio.to_thread(self.fleet.start, service, wait=False)

    async def schedule(self) -> None:
        """The one-off faults, spaced over about 205 s: a run that tests them all must last longer
        (the schedule stops when the rollout is Ready)."""
        await asyncio.sleep(15)
        await self._nats_kill()
        await asyncio.sleep(15)
        self._log("kube-apiserver restart")
        await asyncio.to_thread(self.rig.restart_apiserver)
        self.report.api_restarts += 1
        self._log("kube-apiserver ready again")
        await asyncio.sleep(15)
        self._log(f"API latency +{self.plan.latency_ms} ms on")
        t = time.monotonic()
        self.proxy.add_latency("kube-apiserver", self.plan.latency_ms)
        await asyncio.sleep(self.plan.latency_s)
        self.proxy.remove_latency("kube-apiserver")
        self.report.latency_window_s = round(time.monotonic() - t, 1)
        self._log("API latency off")
        await asyncio.sleep(15)
        self._log("NATS partition on")
        t = time.monotonic()
        self.proxy.cut("nats")
        await asyncio.sleep(self.plan.partition_s)
        self.proxy.restore("nats")
        self.report.partition_window_s = round(time.monotonic() - t, 1)
        self._log("NATS partition off")
        await asyncio.sleep(15)
        await self._nats_kill()

    async def _nats_kill(self) -> None:
        self._log("nats-server SIGKILL")
        await asyncio.to_thread(self.rig.restart_nats, down_s=self.plan.nats_down_s, crash=True)
        self.report.nats_kills += 1
        self._log("nats-server up again")

    async def stop(self) -> None:
        for task in list(self._restarts):
            with contextlib.suppress(Exception):
                await task


# ---- the stream --------------------------------------------------------------------------


async def _stream(url: str) -> tuple[list[events.AnyEvent], list[str]]:
    """Every event on the stream and every message's Nats-Msg-Id."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info("NODEWRIGHT")
        total = int(info.state.messages)
        sub = await js.subscribe("nw.ev.>", ordered_consumer=True, deliver_policy=None)
        got: list[events.AnyEvent] = []
        ids: list[str] = []
        seen = 0
        while seen < total:
            try:
                msg = await sub.next_msg(timeout=10)
            except nats.errors.TimeoutError:
                break
            seen += 1
            ids.append((msg.headers or {}).get("Nats-Msg-Id", ""))
            with contextlib.suppress(Exception):
                got.append(events.decode(msg.data))
        await sub.unsubscribe()
        return got, ids
    finally:
        await nc.close()


def _expected(node: str, packages: int) -> Counter[str]:
    want: Counter[str] = Counter({f"{node} {k}": 1 for k in PER_NODE_KINDS})
    for i in range(packages):
        for stage in STAGES:
            for k in PER_PACKAGE_KINDS:
                want[f"{node} {k} pkg{i}/{stage}"] = 1
    return want


def _identity(ev: events.AnyEvent) -> str:
    """ "node kind [package/stage]": what a transition is about (the attempt aside: every
    stage should run once)."""
    stage = getattr(ev, "stage", None)
    return f"{ev.node} {ev.kind}" + (f" {getattr(ev, 'package', '')}/{stage}" if stage else "")


# ---- the run -----------------------------------------------------------------------------


async def run(plan: Plan, rig: Rig) -> Report:
    report = Report(
        nodes=plan.nodes,
        packages=plan.packages,
        replicas=plan.replicas,
        budget=plan.budget,
        faults=plan.faults,
        load_start=_load(),
    )
    proxy = FaultProxy(rig).start()
    api = proxy.api_link()
    bus = proxy.nats_link()
    kubeconfig = proxy.kubeconfig_through(api, rig.dir / "kubeconfig-through-proxy")
    if plan.steady_latency_ms:
        proxy.add_latency(api.name, plan.steady_latency_ms)
    fleet = Fleet(
        rig,
        namespace=NAMESPACE,
        extra_env={
            "NODEWRIGHT_KUBE_KUBECONFIG": str(kubeconfig),
            "NODEWRIGHT_NATS_URL": f"nats://{bus.listen}",
            "NODEWRIGHT_PODS_SIM_STAGE_DURATION": plan.stage_duration,
        },
    )
    try:
        async with connect(KubeSettings(kubeconfig=str(rig.endpoints.kubeconfig))) as kube:
            await manifests.install_crds(kube)
            await manifests.ensure_namespace(kube, NAMESPACE)
            names = [f"gpu-{i:05d}" for i in range(plan.nodes)]
            await nodes.create_nodes(kube, names, labels={"nodepool": "gpu"})
            await nodes.wait_ready(kube, names, timeout_s=600)
            await asyncio.to_thread(fleet.start_all, replicas=plan.replicas)
            await _rollout(plan, rig, fleet, proxy, kube, report)
    finally:
        t = time.monotonic()
        codes = await asyncio.to_thread(fleet.stop, 30.0)
        report.stop_s = round(time.monotonic() - t, 1)
        report.unclean_stops = {name: code for name, code in sorted(codes.items()) if code != 0}
        proxy.stop()
    _read_logs(rig, report)
    report.load_end = _load()
    return report


async def _rollout(
    plan: Plan, rig: Rig, fleet: Fleet, proxy: FaultProxy, kube: Kube, report: Report
) -> None:
    pod_watch = PodWatch()
    etcd = EtcdWatch(rig.endpoints.etcd_url, f"/registry/pods/{NAMESPACE}/")
    disruption = Disruption(budget=plan.budget)
    pods_informer = Informer(
        kube=kube,
        path=path_of(plural="pods", namespace=NAMESPACE),
        on_change=pod_watch.on_change,
        label_selector="app.kubernetes.io/managed-by=nodewright",
        name="ledger",
    )
    nodes_informer = Informer(
        kube=kube,
        path=path_of(plural="nodes"),
        on_change=disruption.on_change,
        label_selector="nodepool=gpu",
        name="disruption",
    )
    faults = Faults(rig, fleet, proxy, plan, report, random.Random(plan.seed))
    async with _running(etcd.run(), pods_informer.run(), nodes_informer.run()):
        await asyncio.wait_for(etcd.started.wait(), 30)
        await asyncio.wait_for(pods_informer.synced.wait(), 30)
        await asyncio.wait_for(nodes_informer.synced.wait(), 30)
        t0 = faults.t0 = time.monotonic()
        await manifests.apply(kube, _cr(plan))
        chaos = (faults.killer(), faults.schedule()) if plan.faults else ()
        async with _running(disruption.sample(), *chaos) as tasks:
            while not await _ready(kube):
                if time.monotonic() - t0 > plan.timeout_s:
                    break
                for t in tasks:
                    if t.done() and not t.cancelled() and t.exception() is not None:
                        raise t.exception()  # type: ignore[misc]
                await asyncio.sleep(0.5)
        await faults.stop()
        report.ready = await _ready(kube)
        report.time_to_ready_s = round(time.monotonic() - t0, 1)
        # The consumers' backlog: how long after Ready until every consumer is caught up.
        ready_at = time.monotonic()
        while time.monotonic() - ready_at < 120:
            backlog = await consumer_backlog(rig.endpoints.nats_url)
            if not any(backlog.values()):
                report.backlog_cleared_after_s = round(time.monotonic() - ready_at, 1)
                break
            await asyncio.sleep(1)
        report.backlog_at_end = {
            k: v for k, v in (await consumer_backlog(rig.endpoints.nats_url)).items() if v
        }
        await asyncio.sleep(2)  # the last pod writes reach both ledgers
    report.samples = len(disruption.samples)
    report.samples_over_budget = sum(s > plan.budget for s in disruption.samples)
    report.changes_over_budget = disruption.changes_over
    report.max_disrupted = max([disruption.max_seen, *disruption.samples])
    report.stage_pods = len(pod_watch.uids)
    report.duplicates_pod_watch = {n: len(u) for n, u in pod_watch.uids.items() if len(u) > 1}
    report.etcd_creations = sum(etcd.creations.values())
    report.duplicates_etcd = {n: c for n, c in etcd.creations.items() if c > 1}
    listed = await kube.get(path_of(plural="nodes"), labelSelector="nodepool=gpu")
    report.left_cordoned = sorted(
        n["metadata"]["name"] for n in listed["items"] if (n.get("spec") or {}).get("unschedulable")
    )
    got, ids = await _stream(rig.endpoints.nats_url)
    report.stream_messages = len(ids)
    report.msg_ids_repeated = sum(c - 1 for c in Counter(ids).values() if c > 1)
    seen = Counter(_identity(e) for e in got if e.cr == CR and e.node)
    want: Counter[str] = Counter()
    for n in listed["items"]:
        want.update(_expected(n["metadata"]["name"], plan.packages))
    report.events_missing = _by_kind(want - seen)
    report.events_repeated = _by_kind(
        Counter({k: c - 1 for k, c in seen.items() if c > 1 and k in want})
    )
    report.events_unexpected = _by_kind(Counter({k: c for k, c in seen.items() if k not in want}))


def _read_logs(rig: Rig, report: Report) -> None:
    errors: Counter[str] = Counter()
    warnings: Counter[str] = Counter()
    for service in SERVICES:
        for log in sorted(rig.dir.glob(f"{service}-*.log")):
            for line in log.read_text(errors="replace").splitlines():
                report.log_tracebacks += line.count("Traceback (most recent call last)")
                for level, counts in (("error", errors), ("warning", warnings)):
                    if f'"level":"{level}"' in line:
                        with contextlib.suppress(ValueError):
                            counts[f"{service}: {json.loads(line).get('msg', '?')}"] += 1
    report.log_errors = dict(errors.most_common())
    report.log_warnings = dict(warnings.most_common())


def _by_kind(counts: Counter[str]) -> dict[str, int]:
    out: Counter[str] = Counter()
    for key, c in counts.items():
        out[key.split(" ")[1]] += c
    return dict(sorted(out.items()))


async def _ready(kube: Kube) -> bool:
    """The CR is Ready (False while the API server is being restarted)."""
    try:
        obj = await kube.get(f"{manifests.NODEWRIGHTS}/{CR}")
    except ApiError as exc:
        if exc.transient:
            return False
        raise
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def one_run(plan: Plan, *, keep: bool = False) -> Report:
    """A rig of its own for one run: started, used and stopped (its directory, with every
    component's and replica's log, kept with ``keep``)."""
    rig = Rig(keep_work_dir=keep)
    rig.start()
    if keep:
        print(f"bench.faults: logs in {rig.dir}", file=sys.stderr, flush=True)
    try:
        return asyncio.run(run(plan, rig))
    finally:
        rig.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.faults", description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--packages", type=int, default=2)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--budget-percent", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--compare", action="store_true", help="first run it without faults")
    p.add_argument("--keep", action="store_true", help="keep the rigs' directories (logs)")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    plan = Plan(
        nodes=args.nodes,
        packages=args.packages,
        replicas=args.replicas,
        budget_percent=args.budget_percent,
        seed=args.seed,
        timeout_s=args.timeout,
    )
    out: dict[str, Any] = {}
    if args.compare:
        out["fault_free"] = asdict(
            one_run(Plan(**{**asdict(plan), "faults": False}), keep=args.keep)
        )
    out["faults"] = asdict(one_run(plan, keep=args.keep))
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
