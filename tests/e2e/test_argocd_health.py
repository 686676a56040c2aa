"""The Argo CD health check (deploy/argocd/health-nodewright.lua) on what real rollouts wrote:
the services run on the rig, each NodeWright is read from the API server at the moments that
matter (and sampled throughout), and every object is handed to lua5.1 and lua5.4 as Argo CD
hands it to its interpreter.

Covered: no status yet, in progress, a failed node while others progress and once the rest
finished, ready, a generation the status service has not observed, paused, disabled, stopped
at a failure gate, a deletion uninstalling, a deletion waiting for a pause, a deletion blocked
by a failed uninstall."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from nodewright import manifests
from nodewright.rig import Rig, nodes
from shared import api
from shared.kube import ApiError, Kube
from tests.deploy.argocd import health_everywhere
from tests.e2e.conftest import NODES, Sampler, Services
from tests.e2e.test_lifecycle import _cr
from tests.helpers.cli import cli
from tests.helpers.waiting import eventually

pytestmark = pytest.mark.timeout(400)

SIM = "sim.nodewright.nvidia.com"
GPU = {"nodepool": "gpu"}
Obj = dict[str, Any]


def _tuning(version: str = "1.0.0", *, uninstall: bool = False) -> dict[str, Any]:
    pkg: dict[str, Any] = {"version": version, "image": "registry.example/tuning"}
    if uninstall:
        pkg["uninstall"] = {"enabled": True}
    return pkg


@pytest.fixture(autouse=True)
async def _remove_crs_while_the_webhook_runs(
    cluster: Kube, services: Services
) -> AsyncIterator[None]:
    """NodeWrights and DeploymentPolicies go while the validator still runs: the shared
    teardown runs after the services stopped, when the webhook refuses deleting a policy."""
    yield
    for path in (manifests.NODEWRIGHTS, manifests.POLICIES):
        for obj in (await cluster.get(path))["items"]:
            name = obj["metadata"]["name"]
            with contextlib.suppress(ApiError):
                await cluster.patch(f"{path}/{name}", {"metadata": {"finalizers": None}})
            with contextlib.suppress(ApiError):
                await cluster.delete_if_present(f"{path}/{name}")


async def _raw(kapi: Kube, name: str) -> Obj:
    return dict(await kapi.get(f"{manifests.NODEWRIGHTS}/{name}"))


async def _until(kapi: Kube, name: str, pred: Callable[[Obj], bool], what: str, **kw: Any) -> Obj:
    """The NodeWright once ``pred`` holds for it (as read from the API server)."""

    async def probe() -> Obj | None:
        obj = await _raw(kapi, name)
        return obj if pred(obj) else None

    found = await eventually(probe, what=f"{name}: {what}", **kw)
    assert found is not None
    return found


def _status(obj: Obj) -> Obj:
    return dict(obj.get("status") or {})


def _state(obj: Obj) -> str:
    return str(_status(obj).get("state", ""))


def _counts(obj: Obj) -> Obj:
    return dict(_status(obj).get("nodeCounts") or {})


def _condition(obj: Obj, ctype: str) -> Obj | None:
    return next((c for c in _status(obj).get("conditions") or [] if c["type"] == ctype), None)


def _current(obj: Obj) -> bool:
    return bool(_status(obj).get("observedGeneration") == obj["metadata"]["generation"])


async def _annotate_node(kapi: Kube, node: str, key: str, value: str | None) -> None:
    await kapi.patch(f"{NODES}/{node}", {"metadata": {"annotations": {f"{SIM}/{key}": value}}})


async def _annotate_cr(kapi: Kube, name: str, key: str, value: str | None) -> None:
    await kapi.patch(f"{manifests.NODEWRIGHTS}/{name}", {"metadata": {"annotations": {key: value}}})


@contextlib.asynccontextmanager
async def _sampled(kapi: Kube, name: str) -> AsyncIterator[list[Obj]]:
    """Every read of the NodeWright every 0.2 s while inside."""
    samples: list[Obj] = []

    async def probe() -> Obj:
        obj = await _raw(kapi, name)
        samples.append(obj)
        return obj

    async with Sampler(probe):
        yield samples


def _distinct(samples: list[Obj]) -> list[Obj]:
    """One sample per distinct status (the health depends on nothing else here)."""
    seen: set[str] = set()
    out = []
    for obj in samples:
        key = repr(
            (obj["metadata"].get("generation"), obj["metadata"].get("deletionTimestamp"),
             sorted((obj["metadata"].get("annotations") or {}).items()), _status(obj))
        )  # fmt: skip
        if key not in seen:
            seen.add(key)
            out.append(obj)
    return out


async def test_health_from_first_write_through_a_failed_node_to_ready_and_suspended(
    rig: Rig, cluster: Kube, services: Services
) -> None:
    kapi, name = cluster, "health"
    names = ["gpu-00", "gpu-01", "gpu-02", "gpu-03"]
    await nodes.create_nodes(kapi, names, labels=GPU)
    await nodes.wait_ready(kapi, names)
    for n in names:  # slow enough that "in progress" is seen
        await _annotate_node(kapi, n, "stage-duration", "3s")
    await _annotate_node(kapi, "gpu-00", "fail", "tuning/apply")

    # Created before any service runs: no status at all.
    await manifests.apply(kapi, _cr(name, {"tuning": _tuning()}, 2))
    fresh = await _raw(kapi, name)
    assert "status" not in fresh or not _status(fresh).get("conditions")
    assert health_everywhere(fresh) == (
        "Progressing",
        "Waiting for NodeWright to observe generation 1",
    )

    await asyncio.to_thread(services.fleet.start_all)
    async with _sampled(kapi, name) as samples:
        moving = await _until(
            kapi, name, lambda o: _current(o) and _state(o) == "InProgress", "in progress"
        )
        failed = await _until(
            kapi,
            name,
            lambda o: _state(o) == "Failed" and _counts(o).get("complete") == 3,
            "three complete, gpu-00 failed",
            timeout_s=150,
        )
    status, message = health_everywhere(moving)
    assert status in ("Progressing", "Degraded")  # Degraded once gpu-00 has failed
    assert message.startswith("InProgress: ")
    assert "nodes complete" in message
    assert health_everywhere(failed) == (
        "Degraded",
        f"Failed: {_condition(failed, 'Ready')['message']}",  # type: ignore[index]
    )
    assert "gpu-00: StageFailed" in health_everywhere(failed)[1]
    # Throughout: a failed node is Degraded at once, even while others progress; while
    # nothing failed and nodes move it is Progressing; it was never Healthy.
    seen = {"Degraded-while-progressing": 0, "Progressing": 0}
    for obj in _distinct(samples):
        status, message = health_everywhere(obj)
        if not _current(obj):
            assert status == "Progressing", message
        elif _counts(obj).get("failed"):
            assert status == "Degraded", message
            if _state(obj) == "InProgress":
                seen["Degraded-while-progressing"] += 1
        elif _state(obj) in ("InProgress", "Waiting"):
            assert (status, message.split(":")[0]) == ("Progressing", _state(obj))
            seen["Progressing"] += 1
        assert status != "Healthy", message
    print(f"distinct samples by health: {seen}")
    assert seen["Progressing"] >= 1, seen

    # Fixed and retried: every node complete, Ready.
    await _annotate_node(kapi, "gpu-00", "fail", None)
    retried = await cli(rig, "node", "retry", "gpu-00", "--nodewright", name)
    assert retried.code == 0, retried.err
    ready = await _until(
        kapi, name, lambda o: (_condition(o, "Ready") or {}).get("status") == "True", "Ready",
        timeout_s=120,
    )  # fmt: skip
    assert health_everywhere(ready) == ("Healthy", "4/4 nodes complete")

    # A new generation the status service has not observed yet (it is stopped): Progressing.
    services.fleet.kill("status")
    await _annotate_cr(kapi, name, api.PAUSE_ANNOTATION, "true")
    await kapi.patch(
        f"{manifests.NODEWRIGHTS}/{name}", {"spec": {"packages": {"tuning": _tuning("1.1.0")}}}
    )
    unseen = await _raw(kapi, name)
    assert (unseen["metadata"]["generation"], _status(unseen)["observedGeneration"]) == (2, 1)
    assert (_condition(unseen, "Ready") or {}).get("status") == "True"  # gen 1's, still
    assert health_everywhere(unseen) == (
        "Progressing",
        "Waiting for NodeWright to observe generation 2",
    )

    # Paused with a new version to roll out: Suspended.
    await asyncio.to_thread(services.fleet.start, "status")
    paused = await _until(kapi, name, lambda o: _current(o) and _state(o) == "Paused", "Paused")
    status, message = health_everywhere(paused)
    assert status == "Suspended"
    assert message == f"Paused: {_condition(paused, 'Ready')['message']}"  # type: ignore[index]

    # Disabled instead: Suspended too.
    await _annotate_cr(kapi, name, api.DISABLE_ANNOTATION, "true")
    await _annotate_cr(kapi, name, api.PAUSE_ANNOTATION, None)
    disabled = await _until(kapi, name, lambda o: _state(o) == "Disabled", "Disabled")
    status, message = health_everywhere(disabled)
    assert (status, message.split(":")[0]) == ("Suspended", "Disabled")

    # Enabled: it rolls 1.1.0 out and is Healthy again.
    await _annotate_cr(kapi, name, api.DISABLE_ANNOTATION, None)
    again = await _until(
        kapi, name,
        lambda o: _current(o) and (_condition(o, "Ready") or {}).get("status") == "True",
        "Ready with 1.1.0", timeout_s=150,
    )  # fmt: skip
    assert health_everywhere(again) == ("Healthy", "4/4 nodes complete")


async def test_health_of_a_stopped_rollout(cluster: Kube, services: Services) -> None:
    kapi, name = cluster, "gated"
    names = ["bad-0", "bad-1", "bad-2"]
    await nodes.create_nodes(kapi, names, labels={"nodepool": "mix"})
    await nodes.wait_ready(kapi, names)
    for n in names:
        await _annotate_node(kapi, n, "fail", "tuning/apply")
    await manifests.apply(
        kapi,
        {
            "apiVersion": api.API_VERSION,
            "kind": "DeploymentPolicy",
            "metadata": {"name": name},
            "spec": {
                "default": {
                    "budget": {"count": 1},
                    "strategy": {"fixed": {"batchSize": 1}},
                    "stopAfterConsecutiveFailedBatches": 1,
                },
            },
        },
    )
    cr = _cr(name, {"tuning": _tuning()}, 1)
    del cr["spec"]["interruptionBudget"]
    cr["spec"]["nodeSelectors"] = {"matchLabels": {"nodepool": "mix"}}
    cr["spec"]["deploymentPolicy"] = name
    await manifests.apply(kapi, cr)
    await asyncio.to_thread(services.fleet.start_all)
    stopped = await _until(
        kapi, name, lambda o: _current(o) and _state(o) == "Stopped", "Stopped", timeout_s=120
    )
    rollout_stopped = _condition(stopped, "RolloutStopped")
    assert rollout_stopped is not None
    assert rollout_stopped["status"] == "True"
    assert health_everywhere(stopped) == ("Degraded", f"Stopped: {rollout_stopped['message']}")
    assert "nodewright reset-batches" in rollout_stopped["message"]


async def _gone(kapi: Kube, name: str) -> bool:
    try:
        await _raw(kapi, name)
    except ApiError as exc:
        if exc.not_found:
            return True
        raise
    return False


async def test_health_of_deletions_uninstalling_waiting_for_a_pause_and_blocked(
    cluster: Kube, services: Services
) -> None:
    kapi = cluster
    names = ["gpu-00", "gpu-01"]
    await nodes.create_nodes(kapi, names, labels=GPU)
    await nodes.wait_ready(kapi, names)
    await asyncio.to_thread(services.fleet.start_all)
    for name in ("held", "broken"):
        await manifests.apply(kapi, _cr(name, {"tuning": _tuning(uninstall=True)}, 2))
    for name in ("held", "broken"):
        ready = await _until(
            kapi, name, lambda o: (_condition(o, "Ready") or {}).get("status") == "True", "Ready",
            timeout_s=120,
        )  # fmt: skip
        assert health_everywhere(ready) == ("Healthy", "2/2 nodes complete")

    # Paused, then deleted: the deletion waits for the pause (Suspended).
    await _annotate_cr(kapi, "held", api.PAUSE_ANNOTATION, "true")
    await kapi.delete(f"{manifests.NODEWRIGHTS}/held")

    def waits(o: Obj) -> bool:
        return (_condition(o, "DeletionBlocked") or {}).get(
            "reason"
        ) == "PausedWithPendingUninstall"

    waiting = await _until(kapi, "held", waits, "DeletionBlocked PausedWithPendingUninstall")
    blocked = _condition(waiting, "DeletionBlocked")
    assert blocked is not None
    assert health_everywhere(waiting) == ("Suspended", f"Deletion waits: {blocked['message']}")

    # Resumed: it uninstalls (Progressing, naming the uninstall) until it is gone.
    for n in names:
        await _annotate_node(kapi, n, "stage-duration", "3s")
    async with _sampled(kapi, "held") as samples:
        await _annotate_cr(kapi, "held", api.PAUSE_ANNOTATION, None)
        await eventually(lambda: _gone(kapi, "held"), timeout_s=120, what="held to be gone")
    deleting = [
        o
        for o in _distinct(samples)
        if _current(o)
        and (_condition(o, "UninstallInProgress") or {}).get("status") == "True"
        and not o["metadata"].get("annotations", {}).get(api.PAUSE_ANNOTATION)
        and _condition(o, "DeletionBlocked") is None
    ]
    assert deleting, "no sample while the deletion uninstalled"
    for obj in deleting:
        message = _condition(obj, "UninstallInProgress")["message"]  # type: ignore[index]
        assert health_everywhere(obj) == ("Progressing", f"Deleting: {message}")
        assert "uninstall pending on" in message

    # A node whose uninstall fails blocks the deletion: Degraded, naming it.
    await _annotate_node(kapi, "gpu-01", "fail", "tuning/uninstall")
    await kapi.delete(f"{manifests.NODEWRIGHTS}/broken")

    def blocked_by_failure(o: Obj) -> bool:
        return (_condition(o, "DeletionBlocked") or {}).get("reason") == "UninstallFailed"

    failing = await _until(
        kapi, "broken", blocked_by_failure, "DeletionBlocked UninstallFailed", timeout_s=120
    )
    blocked = _condition(failing, "DeletionBlocked")
    assert blocked is not None
    assert "gpu-01" in blocked["message"]
    assert health_everywhere(failing) == ("Degraded", f"Deletion blocked: {blocked['message']}")
