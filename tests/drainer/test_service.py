"""The drainer service against the real rig: a real API server (PDB status from the real
disruption controller), kwok nodes, and nats-server.

The drainer runs in-process through ``shared.runtime.serve``; the scheduler is simulated by
writing its annotation on the node, the executor and validator by writing theirs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import nats
import pytest
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from nodewright.manifests import NODEWRIGHTS, install_crds
from nodewright.rig import Rig, nodes
from services.drainer import service
from services.drainer.config import DrainerSettings, Settings
from shared import api, events, nodestate, progress, runtime, streaming, subjects
from shared.config import HealthSettings, KubeSettings, NatsSettings
from shared.kube import JSON, ApiError, Kube, path_of
from shared.records.drainer import DrainRecord
from shared.records.executor import ExecutorRecord, PackageRecord
from shared.records.scheduler import Selection
from shared.records.validator import ValidatorRecord
from tests.helpers.waiting import eventually

SIM = "sim.nodewright.nvidia.com"
Record = Selection | ExecutorRecord | ValidatorRecord
IMAGE = "registry.example/app:1"


@dataclass
class Harness:
    """One in-process drainer plus builders of the objects a test needs; cleans up after."""

    kapi: Kube
    namespace: str
    run: str
    rig: Rig
    js: JetStreamContext
    seen: list[events.AnyEvent] = field(default_factory=list)
    crs: list[str] = field(default_factory=list)
    node_names: list[str] = field(default_factory=list)

    @property
    def stream(self) -> str:
        return f"DRAINER{self.run.upper()}"

    async def stored(self, kind: str, cr: api.NodeWright, node: str) -> int:
        """How many events of ``kind`` the stream holds (duplicates by id are stored once)."""
        subject = subjects.event(cr=cr.metadata.name, node=node, kind=kind)
        info = await self.js.stream_info(self.stream, subjects_filter=subject)
        return int((info.state.subjects or {}).get(subject, 0))

    @property
    def target(self) -> dict[str, str]:
        return {"drain-test": self.run}

    async def nodes(
        self,
        *suffixes: str,
        target: bool = True,
        labels: dict[str, str] | None = None,
        **kw: Any,
    ) -> list[str]:
        names = [f"dr-{self.run}-{s}" for s in suffixes]
        labels = {**(labels or {}), **(self.target if target else {})}
        await nodes.create_nodes(self.kapi, names, labels=labels, **kw)
        self.node_names += names
        await nodes.wait_ready(self.kapi, names, timeout_s=30)
        return names

    async def nodewright(self, suffix: str = "cr", **spec: Any) -> api.NodeWright:
        name = f"dr-{self.run}-{suffix}"
        body = {
            "apiVersion": api.API_VERSION,
            "kind": "NodeWright",
            "metadata": {"name": name},
            "spec": {
                "nodeSelectors": {"matchLabels": self.target},
                "packages": {"tool": {"version": "1.0.0", "image": "registry.example/tool"}},
                **spec,
            },
        }
        created = await self.kapi.create(NODEWRIGHTS, body)
        self.crs.append(name)
        return api.from_dict(created, api.NodeWright)

    async def select(self, cr: api.NodeWright, node: str) -> None:
        """What the scheduler does when it admits the node."""
        selection = Selection(
            generation=cr.metadata.generation,
            compartment="default",
            batch=1,
            selected_at=datetime.now(UTC),
            disruptive=True,
            target=progress.target_digest(cr),
        )
        await self.annotate(node, nodestate.SCHEDULER, cr.metadata.name, selection)

    async def finish(self, cr: api.NodeWright, node: str) -> None:
        """What the executor and validator record once every package is done."""
        d = progress.desired(cr)["tool"]
        done = ExecutorRecord(
            packages={
                "tool": PackageRecord(
                    version=d.version,
                    stage="config",
                    state="succeeded",
                    installed=d.version,
                    config=d.config_digest,
                    updated=datetime.now(UTC),
                )
            }
        )
        await self.annotate(node, nodestate.EXECUTOR, cr.metadata.name, done)
        validated = ValidatorRecord(validated=progress.target_digest(cr))
        await self.annotate(node, nodestate.VALIDATOR, cr.metadata.name, validated)

    async def annotate(self, node: str, owner: str, cr: str, record: Record | None) -> None:
        await self.kapi.patch(
            path_of(plural="nodes", name=node), nodestate.patch(owner, cr, record)
        )

    async def node(self, name: str) -> dict[str, Any]:
        return await self.kapi.get(path_of(plural="nodes", name=name))

    async def record(self, node: str, cr: api.NodeWright) -> DrainRecord | None:
        return nodestate.read(
            await self.node(node), nodestate.DRAINER, cr.metadata.name, DrainRecord
        )

    async def phase(
        self, node: str, cr: api.NodeWright, phase: str, *, timeout_s: float = 30
    ) -> DrainRecord:
        async def probe() -> DrainRecord | None:
            rec = await self.record(node, cr)
            return rec if rec is not None and rec.phase == phase else None

        found = await eventually(
            probe, timeout_s=timeout_s, what=f"drain phase {phase} of {node} for {cr.metadata.name}"
        )
        assert found is not None
        return found

    async def released(self, node: str, cr: api.NodeWright) -> dict[str, Any]:
        async def probe() -> dict[str, Any] | None:
            obj = await self.node(node)
            key = nodestate.key(nodestate.DRAINER, cr.metadata.name)
            return None if key in nodestate.annotations_of(obj) else obj

        found = await eventually(probe, timeout_s=30, what=f"release of {node}")
        assert found is not None
        return found

    async def event(self, kind: str, cr: api.NodeWright, node: str) -> events.AnyEvent:
        async def probe() -> events.AnyEvent | None:
            for e in self.seen:
                if (e.kind, e.cr, e.node) == (kind, cr.metadata.name, node):
                    return e
            return None

        found = await eventually(probe, timeout_s=30, what=f"event {kind} for {node}")
        assert found is not None
        return found

    # ---- workloads ----------------------------------------------------------------------

    def path(self, plural: str, name: str | None = None, group: str = "") -> str:
        return path_of(group=group, plural=plural, namespace=self.namespace, name=name)

    async def pod(
        self,
        name: str,
        node: str,
        *,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        owner: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": name,
            "labels": labels or {"app": name},
            "annotations": annotations or {},
        }
        if owner is not None:
            meta["ownerReferences"] = [owner]
        return await self.kapi.create(
            self.path("pods"),
            {
                "metadata": meta,
                "spec": {
                    "nodeName": node,
                    "containers": [{"name": "main", "image": IMAGE}],
                },
            },
        )

    async def deployment(
        self, name: str, *, replicas: int, node_selector: dict[str, str], **template: Any
    ) -> None:
        labels = {"app": name}
        await self.kapi.create(
            self.path("deployments", group="apps"),
            {
                "metadata": {"name": name},
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "nodeSelector": node_selector,
                            "terminationGracePeriodSeconds": 0,
                            "containers": [{"name": "main", "image": IMAGE}],
                            **template,
                        },
                    },
                },
            },
        )

    async def pods_on(self, node: str, app: str | None = None) -> list[dict[str, Any]]:
        query: dict[str, str] = {"fieldSelector": f"spec.nodeName={node}"}
        if app:
            query["labelSelector"] = f"app={app}"
        listed = await self.kapi.get(self.path("pods"), **query)
        return list(listed.get("items") or [])

    async def running(self, node: str, app: str, count: int) -> None:
        async def probe() -> bool:
            pods = await self.pods_on(node, app)
            return len(pods) == count and all(
                (p.get("status") or {}).get("phase") == "Running" for p in pods
            )

        await eventually(probe, timeout_s=30, what=f"{count} {app} pods running on {node}")

    # ---- cleanup ------------------------------------------------------------------------

    async def cleanup(self) -> None:
        for name in self.crs:
            await _delete(self.kapi, f"{NODEWRIGHTS}/{name}")
        for name in self.node_names:
            await _delete(self.kapi, path_of(plural="nodes", name=name))


async def _delete(kapi: Kube, path: str) -> None:
    try:
        await kapi.delete(path)
    except ApiError as exc:
        if not exc.not_found:
            raise


@contextlib.asynccontextmanager
async def running_drainer(settings: Settings) -> AsyncIterator[runtime.ServiceContext]:
    """One drainer replica served in this process until the context ends."""
    contexts: list[runtime.ServiceContext] = []

    async def build(ctx: runtime.ServiceContext) -> None:
        contexts.append(ctx)
        await service.build(ctx)

    task = asyncio.create_task(
        runtime.serve(name=service.NAME, settings=settings, build=build),
        name=f"drainer-{settings.identity}",
    )

    async def started() -> bool:
        if task.done():
            task.result()  # raise what stopped it
        return bool(contexts)

    try:
        await eventually(started, timeout_s=30, what="the drainer to start")
        yield contexts[0]
    finally:
        if contexts:
            contexts[0].supervisor.request_stop("test finished")
        else:
            task.cancel()
        (outcome,) = await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 30)
    assert outcome == 0, f"the drainer did not stop cleanly: {outcome!r}"


def settings_for(rig: Rig, *, run: str, namespace: str, replica: str = "0") -> Settings:
    return Settings(
        # A stream of its own (deleted afterwards): streams may not overlap in subjects.
        nats=NatsSettings(url=rig.endpoints.nats_url, stream=f"DRAINER{run.upper()}"),
        kube=KubeSettings(kubeconfig=str(rig.endpoints.kubeconfig)),
        health=HealthSettings(host="127.0.0.1", port=0),
        graceful_timeout_s=2.0,
        resync_interval_s=30.0,
        identity=f"drainer-{run}-{replica}",
        namespace=namespace,
        drainer=DrainerSettings(eviction_retry_s=1.0, deletion_poll_s=1.0),
    )


@pytest.fixture
async def drainer(
    rig: Rig, kapi: Kube, namespace: str, caplog: pytest.LogCaptureFixture
) -> AsyncIterator[Harness]:
    """The drainer service running in this process against the rig, and a harness."""
    async with serving(rig, kapi, namespace, caplog) as harness:
        yield harness


class PodWatchLag:
    """Holds back what the API server sends on the drainer's pod watch (events and bookmarks
    alike) between :meth:`hold` and :meth:`release`: a watch that lags behind, as one does
    on a loaded API server. Nothing is lost; it arrives late."""

    def __init__(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self.held = 0

    def hold(self) -> None:
        self._flowing.clear()

    def release(self) -> None:
        self._flowing.set()

    async def lagging(self, stream: AsyncIterator[JSON]) -> AsyncIterator[JSON]:
        async for event in stream:
            if not self._flowing.is_set():
                self.held += 1
                await self._flowing.wait()
            yield event


@pytest.fixture
async def lagging_drainer(
    rig: Rig,
    kapi: Kube,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[Harness, PodWatchLag]]:
    """The drainer, its watch of bound pods able to lag (:class:`PodWatchLag`)."""
    lag = PodWatchLag()
    watch = Kube.watch

    def lagging_watch(self: Kube, path: str, **kw: Any) -> AsyncIterator[JSON]:
        stream = watch(self, path, **kw)
        bound_pods = path == service.PODS and kw.get("fieldSelector") == "spec.nodeName!="
        return lag.lagging(stream) if bound_pods else stream

    monkeypatch.setattr(Kube, "watch", lagging_watch)
    async with serving(rig, kapi, namespace, caplog) as harness:
        try:
            yield harness, lag
        finally:
            lag.release()


@contextlib.asynccontextmanager
async def serving(
    rig: Rig, kapi: Kube, namespace: str, caplog: pytest.LogCaptureFixture
) -> AsyncIterator[Harness]:
    """One drainer replica and its harness; fails if the drainer logged an error."""
    await install_crds(kapi)
    run = uuid.uuid4().hex[:6]
    settings = settings_for(rig, run=run, namespace=namespace)
    nc = await nats.connect(rig.endpoints.nats_url)
    harness = Harness(kapi=kapi, namespace=namespace, run=run, rig=rig, js=nc.jetstream())
    await streaming.ensure_stream(harness.js, settings.nats)

    async def collect(msg: Msg) -> None:
        harness.seen.append(events.decode(msg.data))

    sub = await nc.subscribe("nw.ev.>", cb=collect)
    try:
        async with running_drainer(settings):
            yield harness
    finally:
        await harness.cleanup()
        await sub.unsubscribe()
        await harness.js.delete_stream(settings.nats.stream)
        await nc.close()
    failures = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR and r.name.startswith("nodewright.")
    ]
    assert failures == [], "the drainer logged errors"


# ---- tests --------------------------------------------------------------------------------------


async def test_a_node_is_cordoned_drained_and_uncordoned_when_done(drainer: Harness) -> None:
    (node,) = await drainer.nodes("a")
    await drainer.deployment("web", replicas=2, node_selector={"kubernetes.io/hostname": node})
    await drainer.running(node, "web", 2)
    cr = await drainer.nodewright()
    await drainer.select(cr, node)

    drained = await drainer.phase(node, cr, "drained")
    assert (drained.cordoned, drained.preexisting) == (True, False)
    assert (await drainer.node(node))["spec"].get("unschedulable") is True
    assert await drainer.pods_on(node, "web") == [], "evicted, and gone before drained"
    cordoned = await drainer.event("node.cordoned", cr, node)
    assert isinstance(cordoned, events.NodeCordoned)
    assert cordoned.preexisting is False
    done = await drainer.event("node.drained", cr, node)
    assert isinstance(done, events.NodeDrained)
    assert done.evicted == 2

    await drainer.finish(cr, node)
    obj = await drainer.released(node, cr)
    assert not obj["spec"].get("unschedulable")
    uncordoned = await drainer.event("node.uncordoned", cr, node)
    assert isinstance(uncordoned, events.NodeUncordoned)
    assert uncordoned.still_cordoned_by == ()


async def test_a_pdb_at_zero_blocks_with_its_name_until_relaxed(drainer: Harness) -> None:
    # The workload runs on `target` and may move to `spare` once that is uncordoned.
    pool = {"guarded-pool": drainer.run}
    (target,) = await drainer.nodes("a", labels=pool)
    (empty,) = await drainer.nodes("b")
    (spare,) = await drainer.nodes("spare", target=False, labels=pool, unschedulable=True)
    await drainer.deployment("guarded", replicas=2, node_selector=pool)
    await drainer.running(target, "guarded", 2)
    pdb = drainer.path("poddisruptionbudgets", group="policy")
    await drainer.kapi.create(
        pdb,
        {
            "metadata": {"name": "guard"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "guarded"}}},
        },
    )

    async def pdb_at_zero() -> bool:
        st = (await drainer.kapi.get(f"{pdb}/guard")).get("status") or {}
        return (st.get("currentHealthy"), st.get("disruptionsAllowed")) == (2, 0)

    await eventually(pdb_at_zero, timeout_s=30, what="the PDB to allow no disruption")
    cr = await drainer.nodewright()
    await drainer.select(cr, target)
    await drainer.select(cr, empty)

    blocked = await drainer.phase(target, cr, "blocked")
    assert blocked.reason is not None
    assert blocked.reason.code == "PodDisruptionBudgetBlocking"
    guard = events.ObjectRef(kind="PodDisruptionBudget", namespace=drainer.namespace, name="guard")
    assert blocked.reason.objects[0] == guard
    assert blocked.reason.details["allowedDisruptions"] == "0"
    said = await drainer.event("node.drain-blocked", cr, target)
    assert isinstance(said, events.DrainBlocked)
    assert said.reason.objects[0] == guard
    # One stuck node does not hold up another.
    await drainer.phase(empty, cr, "drained")
    assert len(await drainer.pods_on(target, "guarded")) == 2, "the PDB was respected"

    # Relax the PDB (and give the workload somewhere to go): the drain finishes by itself.
    await drainer.kapi.patch(
        path_of(plural="nodes", name=spare), {"spec": {"unschedulable": False}}
    )
    await drainer.kapi.patch(f"{pdb}/guard", {"spec": {"minAvailable": 1}})
    drained = await drainer.phase(target, cr, "drained", timeout_s=45)
    assert drained.reason is None
    assert await drainer.pods_on(target, "guarded") == []
    assert len(await drainer.pods_on(spare, "guarded")) == 2


async def test_a_protected_pod_holds_the_node_until_it_ends(drainer: Harness) -> None:
    (node,) = await drainer.nodes("a")
    training = {"workload": "long-running-training"}
    await drainer.pod("train", node, labels=training, annotations={f"{SIM}/succeed-after": "6s"})
    await drainer.deployment("web", replicas=1, node_selector={"kubernetes.io/hostname": node})
    await drainer.running(node, "web", 1)
    cr = await drainer.nodewright(podNonInterruptLabels={"matchLabels": training})
    await drainer.select(cr, node)

    waiting = await drainer.phase(node, cr, "waiting")
    assert waiting.reason is not None
    assert waiting.reason.code == "ProtectedPodRunning"
    assert waiting.reason.objects == (
        events.ObjectRef(kind="Pod", namespace=drainer.namespace, name="train"),
    )
    said = await drainer.event("node.waiting", cr, node)
    assert isinstance(said, events.NodeWaiting)
    assert said.reason == waiting.reason
    (web,) = await drainer.pods_on(node, "web")
    assert not web["metadata"].get("deletionTimestamp"), "nothing is evicted while waiting"
    assert (await drainer.node(node))["spec"].get("unschedulable") is True

    drained = await drainer.phase(node, cr, "drained")
    assert drained.started > waiting.since, "the drain began after the wait"
    assert await drainer.pods_on(node, "web") == []
    (train,) = await drainer.pods_on(node)
    assert train["metadata"]["name"] == "train"
    assert train["status"]["phase"] == "Succeeded", "it ended by itself, never evicted"


async def test_pods_are_handled_as_the_drain_options_say(drainer: Harness) -> None:
    (node,) = await drainer.nodes("a")
    ds = await drainer.kapi.create(
        drainer.path("daemonsets", group="apps"),
        {
            "metadata": {"name": "agent"},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {
                    "metadata": {"labels": {"app": "agent"}},
                    "spec": {"containers": [{"name": "main", "image": IMAGE}]},
                },
            },
        },
    )
    owner = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "name": "agent",
        "uid": ds["metadata"]["uid"],
        "controller": True,
    }
    # No DaemonSet controller runs on the rig: the daemon pod is created by hand.
    await drainer.pod("agent-x", node, labels={"app": "agent"}, owner=owner)
    await drainer.pod("static", node, annotations={"kubernetes.io/config.mirror": "hash"})
    await drainer.pod("bare", node)
    await drainer.pod("ours", node, labels={"app.kubernetes.io/managed-by": "nodewright"})
    await drainer.deployment(
        "cache",
        replicas=1,
        node_selector={"kubernetes.io/hostname": node},
        volumes=[{"name": "scratch", "emptyDir": {}}],
    )
    await drainer.running(node, "cache", 1)
    # Deleting a bare pod bypasses PDBs (that is what unmanagedPods: Delete means).
    await drainer.kapi.create(
        drainer.path("poddisruptionbudgets", group="policy"),
        {
            "metadata": {"name": "bare"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "bare"}}},
        },
    )
    cr = await drainer.nodewright(
        drain={"ignoreDaemonSets": False, "deleteEmptyDirData": False, "unmanagedPods": "Block"}
    )
    await drainer.select(cr, node)

    blocked = await drainer.phase(node, cr, "blocked")
    assert blocked.reason is not None
    assert blocked.reason.code == "UnmanagedPod"
    named = {o.name for o in blocked.reason.objects}
    (cache,) = await drainer.pods_on(node, "cache")
    assert named == {"agent-x", "bare", cache["metadata"]["name"]}
    assert not cache["metadata"].get("deletionTimestamp"), "nothing evicted while blocked"

    await drainer.kapi.patch(
        f"{NODEWRIGHTS}/{cr.metadata.name}",
        {
            "spec": {
                "drain": {
                    "ignoreDaemonSets": True,
                    "deleteEmptyDirData": True,
                    "unmanagedPods": "Delete",
                }
            }
        },
    )
    await drainer.phase(node, cr, "drained")
    left = sorted(p["metadata"]["name"] for p in await drainer.pods_on(node))
    assert left == ["agent-x", "ours", "static"]


async def test_a_drain_timeout_fails_the_node_and_keeps_it_cordoned(drainer: Harness) -> None:
    (node,) = await drainer.nodes("a")
    await drainer.pod("bare", node)
    cr = await drainer.nodewright(drain={"timeoutSeconds": 3})
    await drainer.select(cr, node)

    await drainer.phase(node, cr, "blocked")
    failed = await drainer.phase(node, cr, "failed")
    assert failed.reason is not None
    assert failed.reason.code == "DrainTimeout"
    assert events.ObjectRef(kind="Pod", namespace=drainer.namespace, name="bare") in (
        failed.reason.objects
    )
    assert failed.reason.details["lastReason"] == "UnmanagedPod"
    said = await drainer.event("node.drain-failed", cr, node)
    assert isinstance(said, events.DrainFailed)
    assert said.reason == failed.reason
    assert (await drainer.node(node))["spec"].get("unschedulable") is True
    assert len(await drainer.pods_on(node, "bare")) == 1


async def test_a_cordon_found_before_the_rollout_stays_after_it(drainer: Harness) -> None:
    (node,) = await drainer.nodes("a", unschedulable=True)
    cr = await drainer.nodewright()
    await drainer.select(cr, node)

    drained = await drainer.phase(node, cr, "drained")
    assert (drained.cordoned, drained.preexisting) == (True, True)
    # The scheduler lets the node go (e.g. a reset): the record goes, the cordon stays.
    await drainer.annotate(node, nodestate.SCHEDULER, cr.metadata.name, None)
    obj = await drainer.released(node, cr)
    assert obj["spec"].get("unschedulable") is True
    said = await drainer.event("node.uncordoned", cr, node)
    assert isinstance(said, events.NodeUncordoned)


async def test_two_crs_on_one_node_release_it_only_when_both_are_done(drainer: Harness) -> None:
    (node,) = await drainer.nodes("a")
    first = await drainer.nodewright("first")
    second = await drainer.nodewright("second")
    await drainer.select(first, node)
    await drainer.phase(node, first, "drained")
    await drainer.select(second, node)
    joined = await drainer.phase(node, second, "drained")
    assert (joined.cordoned, joined.preexisting) == (True, False)

    # Deleting a CR mid-rollout releases its cordon, but the other CR still holds the node.
    await drainer.kapi.delete(f"{NODEWRIGHTS}/{first.metadata.name}")
    obj = await drainer.released(node, first)
    assert obj["spec"].get("unschedulable") is True
    said = await drainer.event("node.uncordoned", first, node)
    assert isinstance(said, events.NodeUncordoned)
    assert said.still_cordoned_by == (second.metadata.name,)

    await drainer.finish(second, node)
    obj = await drainer.released(node, second)
    assert not obj["spec"].get("unschedulable")


async def test_two_replicas_drain_a_node_once_without_stepping_on_each_other(
    drainer: Harness,
) -> None:
    (node,) = await drainer.nodes("a")
    await drainer.deployment("web", replicas=6, node_selector={"kubernetes.io/hostname": node})
    await drainer.running(node, "web", 6)
    second = settings_for(drainer.rig, run=drainer.run, namespace=drainer.namespace, replica="1")
    async with running_drainer(second):
        cr = await drainer.nodewright()
        await drainer.select(cr, node)
        drained = await drainer.phase(node, cr, "drained")
        assert drained.cordoned
        assert await drainer.pods_on(node, "web") == []
        await drainer.finish(cr, node)
        obj = await drainer.released(node, cr)
        assert not obj["spec"].get("unschedulable")
        await drainer.event("node.uncordoned", cr, node)
    for kind in ("node.cordoned", "node.drained", "node.uncordoned"):
        assert await drainer.stored(kind, cr, node) == 1, kind


async def test_a_pod_bound_before_the_cordon_is_evicted_though_the_cache_lags_behind(
    lagging_drainer: tuple[Harness, PodWatchLag],
) -> None:
    """The drainer's pod cache had not yet seen pods bound just before its cordon: it read
    the node's pods from the API server before recording the node drained, and evicted them
    (before, it recorded the node drained with the pods running through the apply)."""
    drainer, lag = lagging_drainer
    (node,) = await drainer.nodes("a")
    cr = await drainer.nodewright()
    lag.hold()
    await drainer.deployment("late", replicas=2, node_selector={"kubernetes.io/hostname": node})
    await drainer.running(node, "late", 2)
    await drainer.select(cr, node)

    drained = await drainer.phase(node, cr, "drained")
    assert drained.cordoned
    assert await drainer.pods_on(node, "late") == [], "evicted, and gone before drained"
    done = await drainer.event("node.drained", cr, node)
    assert isinstance(done, events.NodeDrained)
    assert done.evicted == 2
    assert lag.held > 0, "the pod watch lagged behind the whole drain"
