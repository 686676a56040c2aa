"""Fixtures of the CLI tests on the rig: the CRDs installed, objects with names of their own
(so tests never see each other's), and the real command line run as a process.

The five services are not running: the tests write the services' records themselves, with
the services' own encoders (``shared.nodestate``), and look at what the CLI prints and
changes.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from nodewright import manifests
from nodewright.rig import Rig, nodes
from shared import api, nodestate
from shared.kube import ApiError, Kube, path_of
from shared.records.drainer import DrainRecord
from shared.records.executor import ExecutorRecord
from shared.records.scheduler import Selection
from shared.records.validator import ValidatorRecord
from tests.helpers.cli import Result, cli

__all__ = ["Objects", "Result", "cli"]

NODES = path_of(plural="nodes")
Record = Selection | DrainRecord | ExecutorRecord | ValidatorRecord


@dataclass
class Objects:
    """Cluster-scoped objects of one test, all named with its own suffix; deleted after it."""

    kapi: Kube
    suffix: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    crs: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)

    def name(self, base: str) -> str:
        return f"{base}-{self.suffix}"

    async def nodewright(
        self, base: str, packages: dict[str, Any], *, annotations: dict[str, str] | None = None
    ) -> api.NodeWright:
        """A NodeWright selecting the nodes labelled ``pool=<its name>``."""
        name = self.name(base)
        body = {
            "apiVersion": api.API_VERSION,
            "kind": "NodeWright",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"nodeSelectors": {"matchLabels": {"pool": name}}, "packages": packages},
        }
        created = await self.kapi.create(manifests.NODEWRIGHTS, body)
        self.crs.append(name)
        return api.from_dict(created, api.NodeWright)

    async def node(self, base: str, pool: str) -> str:
        """A kwok-managed node labelled ``pool=<pool>``."""
        name = self.name(base)
        await nodes.create_nodes(self.kapi, [name], labels={"pool": pool})
        self.nodes.append(name)
        return name

    async def record(self, node: str, owner: str, cr: str, record: Record) -> None:
        """Write a service's record on the node as that service does (shared.nodestate)."""
        await self.kapi.patch(f"{NODES}/{node}", nodestate.patch(owner, cr, record))

    async def report(self, node: str, condition: dict[str, Any]) -> None:
        """Write the status service's node condition (tests.helpers.facts.reported) as it
        does."""
        await self.kapi.patch(
            path_of(plural="nodes", name=node, subresource="status"),
            {"status": {"conditions": [condition]}},
            kind="strategic",
        )

    async def annotations(self, cr: str) -> dict[str, str]:
        got = await self.kapi.get(f"{manifests.NODEWRIGHTS}/{cr}")
        return dict(got["metadata"].get("annotations") or {})

    async def delete(self) -> None:
        for cr in self.crs:
            with contextlib.suppress(ApiError):
                await self.kapi.delete_if_present(f"{manifests.NODEWRIGHTS}/{cr}")
        for n in self.nodes:
            with contextlib.suppress(ApiError):
                await self.kapi.delete_if_present(f"{NODES}/{n}")


@pytest.fixture
async def objects(rig: Rig, kapi: Kube) -> AsyncIterator[Objects]:
    await manifests.install_crds(kapi)
    made = Objects(kapi)
    try:
        yield made
    finally:
        await made.delete()
