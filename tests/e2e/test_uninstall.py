"""Uninstall end to end, on the real rig with the five services as processes: an uninstall
request runs ``uninstall``, its check and the package's interrupt on every node, then the
package is absent; cancelling while the uninstall stage runs installs it again; deleting a
NodeWright uninstalls its uninstall-enabled packages (its finalizer), within its budget,
then the NodeWright is gone and leaves nothing of itself on the nodes but the record of
packages it could not uninstall; a paused deletion says why and finishes once resumed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from nodewright import manifests
from services.scheduler.core import FINALIZER
from shared import api, nodestate
from shared.kube import JSON, ApiError, Kube
from shared.rollout.book import BATCHES_ANNOTATION
from tests.e2e.conftest import NODES, Sampler, Services, read_cr
from tests.e2e.test_lifecycle import _cr, _executor, _patch_cr, _start, _wait_done
from tests.helpers.podlog import pod_log
from tests.helpers.waiting import Pending, eventually

pytestmark = pytest.mark.timeout(400)
SIM = "sim.nodewright.nvidia.com"


def _tuning(requested: bool) -> dict[str, object]:
    return {
        "version": "1.0.0",
        "image": "registry.example/tuning",
        "interrupt": {"type": "service", "services": ["containerd"]},
        "uninstall": {"enabled": True, "requested": requested},
    }


async def test_an_uninstall_request_runs_uninstall_its_check_and_interrupt_then_the_package_is_gone(
    cluster: Kube, services: Services
) -> None:
    kapi, names = cluster, ["gpu-00", "gpu-01"]
    await _start(kapi, services, names)
    async with pod_log(kapi, services.namespace) as log:
        await manifests.apply(kapi, _cr("gone", {"tuning": _tuning(False)}, 2))
        await _wait_done(kapi, "gone", "the install")
        mark = len(log.events)
        await _patch_cr(kapi, "gone", {"packages": {"tuning": {"uninstall": {"requested": True}}}})
        await _wait_done(kapi, "gone", "the uninstall")
    for n in names:
        assert [(e.role, e.package, e.stage) for e in log.created(mark, node=n)] == [
            ("stage", "tuning", "uninstall"),
            ("check", "tuning", "uninstall"),
            ("interrupt", "", "interrupt"),
        ]
        intr = log.created(mark, node=n, role="interrupt")[0]
        assert json.loads(intr.env["NODEWRIGHT_INTERRUPT"]) == {
            "type": "service",
            "services": ["containerd"],
        }
        rec = await _executor(kapi, n, "gone")
        assert "tuning" not in rec.packages


async def test_cancelling_an_uninstall_before_its_interrupt_installs_the_package_again(
    cluster: Kube, services: Services
) -> None:
    kapi, names = cluster, ["gpu-00"]
    await _start(kapi, services, names)
    async with pod_log(kapi, services.namespace) as log:
        await manifests.apply(kapi, _cr("back", {"tuning": _tuning(False)}, 1))
        await _wait_done(kapi, "back", "the install")
        # Slow stages from now on, so the uninstall stage is still running when cancelled.
        await kapi.patch(
            f"{NODES}/gpu-00", {"metadata": {"annotations": {f"{SIM}/stage-duration": "8s"}}}
        )
        mark = len(log.events)
        await _patch_cr(kapi, "back", {"packages": {"tuning": {"uninstall": {"requested": True}}}})

        async def uninstalling() -> bool:
            return bool(log.created(mark, role="stage", stage="uninstall"))

        await eventually(uninstalling, what="the uninstall stage pod")
        await _patch_cr(kapi, "back", {"packages": {"tuning": {"uninstall": {"requested": False}}}})
        await _wait_done(kapi, "back", "the reinstall", timeout_s=180)
    stages = [(e.role, e.stage) for e in log.created(mark) if e.role != "check"]
    assert stages == [
        ("stage", "uninstall"),
        ("stage", "apply"),
        ("stage", "config"),
        ("interrupt", "interrupt"),
        ("stage", "post-interrupt"),
    ]
    rec = (await _executor(kapi, "gpu-00", "back")).packages["tuning"]
    assert (rec.installed, rec.cycle, rec.state) == ("1.0.0", "install", "succeeded")


async def _gone(kapi: Kube, name: str) -> bool:
    try:
        await kapi.get(f"{manifests.NODEWRIGHTS}/{name}")
    except ApiError as exc:
        if exc.not_found:
            return True
        raise
    return False


@contextlib.asynccontextmanager
async def _versions(kapi: Kube, name: str) -> AsyncIterator[list[JSON]]:
    """Every version of NodeWright ``name`` written while inside, in order."""
    since = str((await kapi.get(manifests.NODEWRIGHTS))["metadata"]["resourceVersion"])
    seen: list[JSON] = []

    async def follow() -> None:
        async for event in kapi.watch(
            manifests.NODEWRIGHTS, resource_version=since, fieldSelector=f"metadata.name={name}"
        ):
            if event["type"] in ("ADDED", "MODIFIED"):
                seen.append(event["object"])

    task = asyncio.create_task(follow())
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _ours(node: dict[str, Any], cr: str) -> list[str]:
    """This CR's annotations on the node."""
    return sorted(k for k in nodestate.annotations_of(node) if k.endswith(f"/{cr}"))


async def _left(kapi: Kube, node: str, cr: str, expected: list[str]) -> None:
    """Only ``expected`` of the CR's annotations stay on the node, and no node condition of
    it (the status service removes its own once the CR is gone)."""

    async def clean() -> bool | Pending:
        raw = await kapi.get(f"{NODES}/{node}")
        conditions = [
            c["type"]
            for c in raw["status"].get("conditions") or []
            if c["type"] == f"{nodestate.DOMAIN}/{cr}"
        ]
        if _ours(raw, cr) == expected and not conditions:
            return True
        return Pending(f"annotations {_ours(raw, cr)}, conditions {conditions}")

    await eventually(clean, timeout_s=30, what=f"{node} clean of {cr}")


async def test_deleting_a_nodewright_uninstalls_what_it_can_within_its_budget_then_it_is_gone(
    cluster: Kube, services: Services
) -> None:
    kapi, names = cluster, ["gpu-00", "gpu-01", "gpu-02"]
    await _start(kapi, services, names)
    packages = {
        "tuning": _tuning(False),
        # No uninstall steps: stays installed (and tracked) when the NodeWright goes.
        "driver": {"version": "2.0.0", "image": "registry.example/driver"},
    }
    async with pod_log(kapi, services.namespace) as log:
        async with _versions(kapi, "bye") as versions:
            await manifests.apply(kapi, _cr("bye", packages, 2))
            await _wait_done(kapi, "bye", "the install")
        assert FINALIZER in (await read_cr(kapi, "bye")).metadata.finalizers
        # The finalizer came in the write of the first batch book, before any admission.
        first = next(v for v in versions if FINALIZER in v["metadata"].get("finalizers", []))
        assert BATCHES_ANNOTATION in first["metadata"].get("annotations", {}), first["metadata"]
        mark = len(log.events)

        async def cordoned() -> int:
            listed = await kapi.get(NODES, labelSelector="nodepool=gpu")
            return sum(bool(n["spec"].get("unschedulable")) for n in listed["items"])

        async with Sampler(cordoned) as sampler:
            await kapi.delete(f"{manifests.NODEWRIGHTS}/bye")
            await eventually(
                lambda: _gone(kapi, "bye"), timeout_s=180, what="the NodeWright to be gone"
            )
    assert max(sampler.samples) <= 2, "the uninstalls stay within the budget"
    assert max(sampler.samples) >= 1, "the uninstall's interrupt ran on a drained node"
    for n in names:
        assert [(e.role, e.package, e.stage) for e in log.created(mark, node=n)] == [
            ("stage", "tuning", "uninstall"),
            ("check", "tuning", "uninstall"),
            ("interrupt", "", "interrupt"),
        ]
        raw = await kapi.get(f"{NODES}/{n}")
        assert not raw["spec"].get("unschedulable")
        await _left(kapi, n, "bye", [nodestate.key(nodestate.EXECUTOR, "bye")])
        rec = await _executor(kapi, n, "bye")
        assert set(rec.packages) == {"driver"}
        assert rec.packages["driver"].installed == "2.0.0"


async def test_a_paused_deletion_says_why_and_finishes_once_resumed(
    cluster: Kube, services: Services
) -> None:
    kapi, names = cluster, ["gpu-00"]
    await _start(kapi, services, names)
    async with pod_log(kapi, services.namespace) as log:
        await manifests.apply(kapi, _cr("held", {"tuning": _tuning(False)}, 1))
        await _wait_done(kapi, "held", "the install")
        path = f"{manifests.NODEWRIGHTS}/held"
        await kapi.patch(path, {"metadata": {"annotations": {api.PAUSE_ANNOTATION: "true"}}})
        mark = len(log.events)
        await kapi.delete(path)

        async def blocked() -> api.Condition | None:
            cr = await read_cr(kapi, "held")
            return next(
                (c for c in cr.status.conditions if c.type == api.ConditionType.DELETION_BLOCKED),
                None,
            )

        condition = await eventually(blocked, what="the DeletionBlocked condition")
        assert condition is not None
        assert condition.reason == "PausedWithPendingUninstall"
        assert api.PAUSE_ANNOTATION in condition.message
        assert not log.created(mark), "nothing runs while paused"
        assert not await _gone(kapi, "held")
        await kapi.patch(path, {"metadata": {"annotations": {api.PAUSE_ANNOTATION: None}}})
        await eventually(lambda: _gone(kapi, "held"), timeout_s=120, what="the deletion")
    assert [(e.role, e.stage) for e in log.created(mark)] == [
        ("stage", "uninstall"),
        ("check", "uninstall"),
        ("interrupt", "interrupt"),
    ]
    await _left(kapi, "gpu-00", "held", [])
