"""Fixtures of the real-node tests: a rig of their own with one real node (containerd 2.x,
kubelet and kube-proxy: ``nodewright.rig.realnode``) beside kwok, and a clean node per test.

The real node is never deleted between tests (its kubelet registers it once): each test
instead gets it back as it was after start (labels, no taints, schedulable, no NodeWright
records), a fresh throwaway host root, and no pods. Everything else (the services as
processes, samplers, the CLI) is the ordinary e2e machinery of ``tests/e2e/conftest.py``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from nodewright import manifests
from nodewright.rig import Rig, hostroot
from nodewright.rig.realnode import NodeSpec, RealNode
from shared.kube import Kube
from tests.e2e import conftest as e2e

pytestmark = pytest.mark.timeout(600)

NODES = (
    NodeSpec(labels={"nodepool": "real"}),
    NodeSpec(labels={"nodepool": "legacy"}, runtime="containerd-1.6"),
)
"""real-1 (containerd 2.2: image volumes), targeted with ``nodepool=real``; real-2 (Debian's
containerd 1.6: no image volumes), targeted with ``nodepool=legacy``."""


# Package scope: a session fixture would outlive the package and run beside the next
# package's rig (and its real nodes) until the very end of the run.
@pytest.fixture(scope="package")
def rig() -> Iterator[Rig]:
    """A rig with one real node, started once for the real-node tests."""
    keep = os.environ.get("NW_TEST_KEEP_RIG") == "1"
    the_rig = Rig(keep_work_dir=keep, real_nodes=NODES)
    the_rig.start()
    try:
        yield the_rig
    finally:
        the_rig.stop()
        if keep:
            print(f"rig directory kept: {the_rig.dir}")


async def kubectl(rig: Rig, *args: str) -> subprocess.CompletedProcess[str]:
    """The rig's own kubectl (the API server's version), with the rig's kubeconfig."""
    argv = [str(rig.bin_dir / "kubectl"), "--kubeconfig", str(rig.endpoints.kubeconfig), *args]
    return await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, check=False
    )


@pytest.fixture(scope="session")
def host_root_base() -> Path:
    return hostroot.build_base()


@pytest.fixture
def real_node(rig: Rig) -> RealNode:
    """real-1: containerd 2.2."""
    assert rig.real is not None
    return rig.real.nodes[0]


@pytest.fixture
def legacy_node(rig: Rig) -> RealNode:
    """real-2: containerd 1.6, no image volumes."""
    assert rig.real is not None
    return rig.real.nodes[1]


def _is_ours(key: str) -> bool:
    domain = key.split("/", 1)[0]
    return domain == "nodewright.nvidia.com" or domain.endswith(".nodewright.nvidia.com")


async def reset_node(kapi: Kube, node: RealNode) -> None:
    """The real node as it was after start: its labels, no NodeWright records or conditions,
    no taints, schedulable."""
    raw = await kapi.get(f"{e2e.NODES}/{node.name}")
    meta = raw["metadata"]
    labels: dict[str, Any] = {
        k: None
        for k in meta.get("labels") or {}
        if k not in node.labels and not k.startswith(("kubernetes.io/", "beta.kubernetes.io/"))
    }
    labels.update(node.labels)
    annotations = {k: None for k in meta.get("annotations") or {} if _is_ours(k)}
    await kapi.patch(
        f"{e2e.NODES}/{node.name}",
        {
            "metadata": {"labels": labels, "annotations": annotations},
            "spec": {"unschedulable": None, "taints": None},
        },
    )
    conditions = [
        c for c in (raw.get("status") or {}).get("conditions") or [] if not _is_ours(c["type"])
    ]
    await kapi.patch(f"{e2e.NODES}/{node.name}/status", {"status": {"conditions": conditions}})


@pytest.fixture
async def cluster(rig: Rig, kapi: Kube, host_root_base: Path) -> AsyncIterator[Kube]:
    """The CRDs installed, no NodeWright, policy, kwok node or stream; the real nodes clean."""
    assert rig.real is not None
    await manifests.install_crds(kapi)
    await e2e.delete_all(kapi)
    await e2e.delete_stream(rig)
    for node in rig.real.nodes:
        await reset_node(kapi, node)
        await asyncio.to_thread(node.reset_host_root, host_root_base)
    yield kapi
    await e2e.delete_all(kapi)
    await e2e.delete_stream(rig)
