"""Fixtures of the install tests: NodeWright installed the way a user installs it.

A rig of their own with two real nodes (``nodepool=system``) for the cluster's own pods:
CoreDNS, a three-server JetStream cluster from the official NATS chart (unmodified, from
../shared/vendor, its nats-server image built here, sidecars off, emptyDir storage), and
NodeWright from deploy/chart/nodewright with the images `make images` built. Every service
runs as a pod and reaches the API server and NATS through Services. Rollouts target kwok
nodes (the chart's ``simulatedNodes``: their stage pods carry kwok's annotations).

The NATS cluster is installed once per package; NodeWright per test (:func:`install`). How
both are installed is ``nodewright.rig.helminstall``'s, which ``make sandbox-helm`` uses too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS

from nodewright import manifests
from nodewright.rig import Rig, helminstall
from shared.config import KubeSettings
from shared.kube import Kube, connect, path_of
from tests.e2e import conftest as e2e

pytestmark = pytest.mark.timeout(900)

REPO = helminstall.REPO
CHART = helminstall.CHART
NAMESPACE = helminstall.NAMESPACE
IMAGES = helminstall.IMAGES
NATS_PODS = helminstall.NATS_PODS
USERS_SECRET = helminstall.USERS_SECRET
ADMIN = helminstall.ADMIN


# Package scope: a session fixture would outlive the package and run beside the next
# package's rig (and its real nodes) until the very end of the run.
@pytest.fixture(scope="package")
def rig() -> Iterator[Rig]:
    """A rig with two real nodes for the cluster's own pods."""
    keep = os.environ.get("NW_TEST_KEEP_RIG") == "1"
    the_rig = Rig(
        keep_work_dir=keep,
        real_nodes=helminstall.system_nodes(2),
        real_node_images=IMAGES,
    )
    the_rig.start()
    try:
        yield the_rig
    finally:
        the_rig.stop()
        if keep:
            print(f"rig directory kept: {the_rig.dir}")


async def tool(rig: Rig, name: str, *args: str, stdin: str = "", check: bool = True) -> str:
    """Run the rig's ``helm`` or ``kubectl`` as a user would (KUBECONFIG = the rig's)."""
    proc = await asyncio.create_subprocess_exec(
        str(rig.bin_dir / name),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "KUBECONFIG": str(rig.endpoints.kubeconfig)},
    )
    out, _ = await proc.communicate(stdin.encode())
    text = out.decode()
    if check and proc.returncode != 0:
        context = await _cluster_state(rig) if name == "helm" else ""
        raise AssertionError(f"{name} {' '.join(args[:4])} failed:\n{text}{context}")
    return text


async def _cluster_state(rig: Rig) -> str:
    """What a failed ``helm --wait`` waited for: the pods, the recent Events, and the last log
    lines of every NodeWright pod that is not ready."""

    async def run(*argv: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            str(rig.bin_dir / "kubectl"), *argv,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "KUBECONFIG": str(rig.endpoints.kubeconfig)},
        )  # fmt: skip
        out, _ = await proc.communicate()
        return out.decode()

    events = await run("get", "events", "-A", "--sort-by=.lastTimestamp")
    parts = [
        "\n--- kubectl get pods -A -o wide\n" + await run("get", "pods", "-A", "-o", "wide"),
        "--- events\n" + "\n".join(events.splitlines()[-25:]),
    ]
    listed = json.loads(await run("get", "pods", "-n", NAMESPACE, "-o", "json") or "{}")
    unready = [
        p["metadata"]["name"]
        for p in listed.get("items", [])
        if not all(c.get("ready") for c in (p.get("status") or {}).get("containerStatuses") or [{}])
    ]
    for pod in unready[:4]:
        logs = await run("logs", "-n", NAMESPACE, pod, "--tail", "15")
        parts.append(f"--- logs of {pod}\n{logs}")
    return "\n".join(parts)


@dataclass
class NatsCluster:
    """The official chart's three servers, each service and the reader a user of their own
    (``nodewright nats-users``); the test reaches them at their pod addresses (the rig routes
    the pod networks to the machine)."""

    rig: Rig
    pods: dict[str, str] = field(default_factory=dict)
    admin_password: str = ""
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    """The Secrets `nodewright nats-users` wrote: name -> data."""

    async def refresh(self, kapi: Kube) -> None:
        listed = await kapi.get(
            path_of(plural="pods", namespace="nats"),
            labelSelector=NATS_PODS,
        )
        self.pods = {
            p["metadata"]["name"]: p["status"].get("podIP", "")
            for p in listed["items"]
            if (p.get("status") or {}).get("podIP")
        }

    @property
    def urls(self) -> list[str]:
        return [f"nats://{ip}:4222" for ip in self.pods.values()]

    @contextlib.asynccontextmanager
    async def client(
        self, user: str = ADMIN, password: str = "", **options: Any
    ) -> AsyncIterator[NATS]:
        """A client of the servers as they are now (a replaced pod has a new address), as
        ``user`` (the harness's admin by default)."""
        async with e2e_kube(self.rig) as kapi:
            await self.refresh(kapi)
        nc = await nats.connect(
            servers=self.urls,
            user=user,
            password=password or self.admin_password,
            max_reconnect_attempts=10,
            connect_timeout=5,
            **options,
        )
        try:
            yield nc
        finally:
            await nc.close()


# Package scope: a session fixture would outlive the package and run beside the next
# package's rig (and its real nodes) until the very end of the run.
@pytest.fixture(scope="package")
def nats_cluster(rig: Rig, tmp_path_factory: pytest.TempPathFactory) -> NatsCluster:
    """The official NATS chart, three servers with JetStream and NodeWright's users, installed
    once; the users' Secrets applied in NodeWright's namespace, as docs/install.md says."""
    installed = helminstall.install_nats(
        rig, helminstall.find_nats_chart(), tmp_path_factory.mktemp("nats-users")
    )
    return NatsCluster(
        rig,
        pods=installed.pods,
        admin_password=installed.admin_password,
        secrets=installed.secrets,
    )


@contextlib.asynccontextmanager
async def e2e_kube(rig: Rig) -> AsyncIterator[Kube]:
    async with connect(KubeSettings(kubeconfig=str(rig.endpoints.kubeconfig))) as kube:
        yield kube


async def install(rig: Rig, *extra: str, name: str = "nodewright") -> str:
    """``helm install`` of NodeWright as docs/install.md says, plus the rig's values."""
    return await tool(rig, "helm", *helminstall.install_args(*extra, name=name))


async def service_pods(kapi: Kube) -> list[dict[str, Any]]:
    listed = await kapi.get(
        path_of(plural="pods", namespace=NAMESPACE),
        labelSelector="app.kubernetes.io/name=nodewright",
    )
    return [p for p in listed["items"] if not p["metadata"].get("deletionTimestamp")]


@pytest.fixture
async def clean(rig: Rig, kapi: Kube, nats_cluster: NatsCluster) -> AsyncIterator[Kube]:
    """No NodeWright release, CR, policy, kwok node or stream before and after the test."""

    async def wipe() -> None:
        releases = await tool(rig, "helm", "list", "-n", NAMESPACE, "-q")
        for release in releases.split():
            await tool(rig, "helm", "uninstall", release, "-n", NAMESPACE, "--no-hooks", "--wait")
        await manifests.install_crds(kapi)
        await e2e.delete_all(kapi)
        async with nats_cluster.client() as nc:
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await nc.jetstream().delete_stream("NODEWRIGHT")

    await wipe()
    yield kapi
    await wipe()
