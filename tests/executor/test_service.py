"""The executor service against the real rig: the stage pod it creates carries the node's
metadata (an annotation of its own, mounted with the downward API), as the API server
stores it, and nothing else is written for it.

The executor runs in-process through ``shared.runtime.serve``; the scheduler is simulated by
writing its annotation on the node (a non-disruptive admission: no drain needed). The stage
pods are not simulated, so on the kwok node they run until deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import nats
import pytest
from nats.js import JetStreamContext

from nodewright.manifests import NODEWRIGHTS, install_crds
from nodewright.rig import Rig, nodes
from services.executor import service
from services.executor.config import Settings
from shared import api, nodemetadata, nodestate, pods, progress, runtime, streaming
from shared.config import HealthSettings, KubeSettings, NatsSettings, PodSettings
from shared.kube import Kube, path_of
from shared.records.scheduler import Selection
from tests.helpers.waiting import eventually

A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"
GPU_LABEL = "nvidia.com/gpu.product"


@dataclass
class Harness:
    kapi: Kube
    namespace: str
    run: str
    settings: Settings
    js: JetStreamContext
    crs: list[str] = field(default_factory=list)
    node_names: list[str] = field(default_factory=list)

    async def node(self, suffix: str) -> str:
        # Dotted, like cloud node names: the ConfigMap name must be made valid from it.
        name = f"ex-{self.run}-{suffix}.gpu.example.internal"
        labels = {"executor-test": self.run, GPU_LABEL: A100}
        await nodes.create_nodes(self.kapi, [name], labels=labels)
        self.node_names.append(name)
        await nodes.wait_ready(self.kapi, [name], timeout_s=30)
        await self.patch_node(name, {"metadata": {"annotations": {"example.com/rack": "r12"}}})
        return name

    async def nodewright(self) -> api.NodeWright:
        name = f"ex-{self.run}"
        body = {
            "apiVersion": api.API_VERSION,
            "kind": "NodeWright",
            "metadata": {"name": name},
            "spec": {
                "nodeSelectors": {"matchLabels": {"executor-test": self.run}},
                "packages": {"tool": {"version": "1.0.0", "image": "registry.example/tool"}},
            },
        }
        created = await self.kapi.create(NODEWRIGHTS, body)
        self.crs.append(name)
        return api.from_dict(created, api.NodeWright)

    async def select(self, cr: api.NodeWright, node: str) -> None:
        """What the scheduler does when it admits the node (non-disruptively)."""
        selection = Selection(
            generation=cr.metadata.generation,
            compartment="default",
            batch=1,
            selected_at=datetime.now(UTC),
            disruptive=False,
            target=progress.target_digest(cr),
        )
        await self.patch_node(
            node, nodestate.patch(nodestate.SCHEDULER, cr.metadata.name, selection)
        )

    async def release(self, cr: api.NodeWright, node: str) -> None:
        """What the scheduler does when it releases the admission."""
        await self.patch_node(node, nodestate.patch(nodestate.SCHEDULER, cr.metadata.name, None))

    async def patch_node(self, node: str, body: dict[str, Any]) -> None:
        await self.kapi.patch(path_of(plural="nodes", name=node), body)

    def config_maps(self) -> str:
        return path_of(plural="configmaps", namespace=self.namespace)

    async def stage_pods(self, cr: api.NodeWright) -> list[dict[str, Any]]:
        listed = await self.kapi.get(
            path_of(plural="pods", namespace=self.namespace),
            labelSelector=f"{pods.LABEL_CR}={cr.metadata.name},{pods.LABEL_ROLE}=stage",
        )
        return [p for p in listed["items"] if not p["metadata"].get("deletionTimestamp")]

    async def cleanup(self) -> None:
        for name in self.crs:
            await self.kapi.delete_if_present(f"{NODEWRIGHTS}/{name}")
        for name in self.node_names:
            await self.kapi.delete_if_present(path_of(plural="nodes", name=name))


@contextlib.asynccontextmanager
async def running_executor(settings: Settings) -> AsyncIterator[None]:
    """One executor replica served in this process until the context ends."""
    contexts: list[runtime.ServiceContext] = []

    async def build(ctx: runtime.ServiceContext) -> None:
        contexts.append(ctx)
        service.Executor(ctx, settings).controller.register()

    task = asyncio.create_task(
        runtime.serve(name=service.NAME, settings=settings, build=build),
        name=f"executor-{settings.identity}",
    )

    async def started() -> bool:
        if task.done():
            task.result()  # raise what stopped it
        return bool(contexts)

    try:
        await eventually(started, timeout_s=30, what="the executor to start")
        yield
    finally:
        if contexts:
            contexts[0].supervisor.request_stop("test finished")
        else:
            task.cancel()
        (outcome,) = await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 30)
    assert outcome == 0, f"the executor did not stop cleanly: {outcome!r}"


@contextlib.asynccontextmanager
async def watching(kapi: Kube, path: str, selector: str) -> AsyncIterator[list[dict[str, Any]]]:
    """Every watch event (type, object) of ``path`` matching ``selector`` while the context
    lasts, in the API server's order."""
    seen: list[dict[str, Any]] = []
    listed = await kapi.get(path, labelSelector=selector)
    assert listed["items"] == [], "the namespace is fresh"
    start = str(listed["metadata"]["resourceVersion"])

    async def collect() -> None:
        rv = start
        while True:
            async for event in kapi.watch(
                path, resource_version=rv, timeout_s=60, labelSelector=selector
            ):
                rv = str(event["object"]["metadata"].get("resourceVersion") or rv)
                if event["type"] != "BOOKMARK":
                    seen.append(event)

    task = asyncio.create_task(collect(), name=f"watch {path}")
    try:
        yield seen
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _ours(key: str) -> bool:
    prefix = key.rpartition("/")[0]
    return prefix == nodestate.DOMAIN or prefix.endswith("." + nodestate.DOMAIN)


@pytest.fixture
async def executor(
    rig: Rig, kapi: Kube, namespace: str, caplog: pytest.LogCaptureFixture
) -> AsyncIterator[Harness]:
    """What an executor needs on the rig (CRDs, a stream, its settings), and cleanup."""
    await install_crds(kapi)
    run = uuid.uuid4().hex[:6]
    settings = Settings(
        # A stream of its own (deleted afterwards): streams may not overlap in subjects.
        nats=NatsSettings(url=rig.endpoints.nats_url, stream=f"EXECUTOR{run.upper()}"),
        kube=KubeSettings(kubeconfig=str(rig.endpoints.kubeconfig)),
        health=HealthSettings(host="127.0.0.1", port=0),
        graceful_timeout_s=2.0,
        # Long: what a test sees must come from events, not from a periodic pass over all.
        resync_interval_s=600.0,
        identity=f"executor-{run}",
        namespace=namespace,
        pods=PodSettings(agent_image="registry.example/agent:1"),
    )
    nc = await nats.connect(rig.endpoints.nats_url)
    harness = Harness(kapi=kapi, namespace=namespace, run=run, settings=settings, js=nc.jetstream())
    await streaming.ensure_stream(harness.js, settings.nats)
    try:
        yield harness
    finally:
        await harness.cleanup()
        await harness.js.delete_stream(settings.nats.stream)
        await nc.close()
    failures = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR and r.name.startswith("nodewright.")
    ]
    assert failures == [], "the executor logged errors"


async def test_the_stage_pod_carries_the_nodes_metadata_and_nothing_else_is_written_for_it(
    executor: Harness,
) -> None:
    h = executor
    node = await h.node("a")
    cr = await h.nodewright()
    selector = f"{pods.LABEL_CR}={cr.metadata.name}"
    async with (
        watching(h.kapi, h.config_maps(), selector) as cm_events,
        running_executor(h.settings),
    ):
        # NodeWright's own annotations are left out; a label set before the pod is in.
        await h.patch_node(node, {"metadata": {"annotations": {f"{nodestate.DOMAIN}/x": "1"}}})
        await h.patch_node(node, {"metadata": {"labels": {GPU_LABEL: H100}}})
        await h.select(cr, node)
        (pod,) = await eventually(lambda: h.stage_pods(cr), timeout_s=30, what="the apply pod")

        # Mounted read-only by the stage pod, from its own annotation (as stored: the
        # API server fills in the defaults).
        (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "node-metadata"]
        field_path = f"metadata.annotations['{nodemetadata.ANNOTATION}']"
        assert volume["downwardAPI"] == {
            "items": [
                {"path": "node.json", "fieldRef": {"apiVersion": "v1", "fieldPath": field_path}}
            ],
            "defaultMode": 0o644,
        }
        mount = {
            "name": "node-metadata",
            "mountPath": "/nodewright-node-metadata",
            "readOnly": True,
        }
        assert mount in pod["spec"]["containers"][0]["volumeMounts"]

        # The node's labels and foreign annotations, the CR's packages.
        obj = await h.kapi.get(path_of(plural="nodes", name=node))
        meta = obj["metadata"]
        text = pod["metadata"]["annotations"][nodemetadata.ANNOTATION]
        assert json.loads(text) == {
            "name": node,
            "labels": meta["labels"],
            "annotations": {k: v for k, v in meta["annotations"].items() if not _ours(k)},
            "nodewright": cr.metadata.name,
            "packages": {
                "tool": {
                    "name": "tool",
                    "version": "1.0.0",
                    "image": "registry.example/tool:1.0.0",
                }
            },
        }
        assert meta["labels"][GPU_LABEL] == H100
        assert meta["annotations"]["example.com/rack"] == "r12"
        assert f"{nodestate.DOMAIN}/x" in meta["annotations"]
    # Stopped: every write it was going to make is made (the stop waits for them).
    listed = await h.kapi.get(h.config_maps(), labelSelector=selector)
    assert (listed["items"], cm_events) == ([], []), "nothing but the pod for the metadata"
