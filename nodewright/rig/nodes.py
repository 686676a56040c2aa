"""Simulated nodes for the rig: create N kwok-managed Nodes with labels and taints, and
wait until kwok has made them Ready.

Only Node objects are created here; what runs on them is decided by kwok's stage config
(``kwok.yaml`` next to this module) and by whoever creates pods.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nodewright.rig import KWOK_NODE_ANNOTATION
from shared.kube import ApiError, Kube, path_of

# Concurrent creates; enough to hide request latency, few enough for a 2-core API server.
_CONCURRENCY = 32


def node_manifest(
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
    unschedulable: bool = False,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **(labels or {}),
            },
        },
        "spec": {"taints": [dict(t) for t in taints], "unschedulable": unschedulable},
        # kwok keeps a bootID it finds and the node-initialize stage copies it; a fresh one per
        # node lets reboot detection compare IDs like on a real kubelet.
        "status": {"nodeInfo": {"bootID": str(uuid.uuid4())}},
    }


async def create_nodes(
    api: Kube,
    names: Iterable[str],
    *,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
    unschedulable: bool = False,
) -> list[str]:
    """Create the named nodes (an existing one is left as it is); return the names."""
    sem = asyncio.Semaphore(_CONCURRENCY)
    created: list[str] = []

    async def one(name: str) -> None:
        body = node_manifest(name, labels=labels, taints=taints, unschedulable=unschedulable)
        async with sem:
            try:
                await api.create(path_of(plural="nodes"), body)
            except ApiError as exc:
                if not exc.conflict:
                    raise
        created.append(name)

    await asyncio.gather(*(one(n) for n in names))
    return sorted(created)


def is_ready(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


async def wait_ready(api: Kube, names: Iterable[str], *, timeout_s: float = 120.0) -> None:
    """Wait until every named node reports Ready=True; raise TimeoutError naming the laggards."""
    pending = set(names)
    deadline = time.monotonic() + timeout_s
    while pending:
        listed = await api.get(path_of(plural="nodes"))
        for node in listed.get("items") or []:
            if is_ready(node):
                pending.discard(node["metadata"]["name"])
        if not pending:
            return
        if time.monotonic() > deadline:
            sample = ", ".join(sorted(pending)[:10])
            raise TimeoutError(f"{len(pending)} nodes not Ready after {timeout_s:.0f}s: {sample}")
        await asyncio.sleep(0.5)
