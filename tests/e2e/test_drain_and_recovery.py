"""Issue 6 end to end, on the real rig with the five services as processes: drains that
explain themselves (a PDB at zero, the drain timeout, an unpullable image), pods handled as
spec.drain says, cordons of others respected, and failed nodes recovered by command
(``nodewright node retry|reset``), never by editing annotations."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from nodewright import manifests
from nodewright.rig import Rig, nodes
from shared import api, nodestate, pods, progress
from shared.kube import ApiError, Kube, path_of
from tests.e2e.conftest import NODES, Sampler, Services, pod_ledger, read_cr
from tests.helpers.cli import cli
from tests.helpers.waiting import eventually

# End-to-end runs take minutes on 2 cores; the suite-wide 120 s limit is for unit tests.
pytestmark = pytest.mark.timeout(600)

SIM = "sim.nodewright.nvidia.com"
GPU = {"nodepool": "gpu"}


def _cr(name: str, count: int, *, packages: dict[str, Any] | None = None, **spec: Any) -> Any:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "NodeWright",
        "metadata": {"name": name},
        "spec": {
            "nodeSelectors": {"matchLabels": GPU},
            "interruptionBudget": {"count": count},
            "packages": packages
            or {"tuning": {"version": "1.0.0", "image": "registry.example/tuning"}},
            **spec,
        },
    }


async def _node(kapi: Kube, name: str) -> dict[str, Any]:
    return await kapi.get(f"{NODES}/{name}")


async def _turns(kapi: Kube, cr: str) -> dict[str, str]:
    obj = await read_cr(kapi, cr)
    listed = await kapi.get(NODES, labelSelector="nodepool=gpu")
    return {
        n["metadata"]["name"]: progress.turn(obj, progress.facts(n, cr)) for n in listed["items"]
    }


async def _detail(kapi: Kube, cr: str, node: str) -> api.NodeDetail | None:
    obj = await read_cr(kapi, cr)
    return next((d for d in obj.status.node_details if d.node == node), None)


async def _condition(kapi: Kube, node: str, cr: str) -> dict[str, Any] | None:
    raw = await _node(kapi, node)
    return next(
        (
            c
            for c in (raw.get("status") or {}).get("conditions") or []
            if c.get("type") == f"{nodestate.DOMAIN}/{cr}"
        ),
        None,
    )


async def _cli(rig: Rig, *args: str) -> str:
    """Run the real command line against the rig; return its output (it must succeed)."""
    done = await cli(rig, *args)
    assert done.code == 0, (args, done.out, done.err)
    return done.out


async def _unannotate(kapi: Kube, node: str, key: str) -> None:
    await kapi.patch(f"{NODES}/{node}", {"metadata": {"annotations": {key: None}}})


async def _pod_uid(kapi: Kube, ns: str, name: str) -> str | None:
    try:
        pod = await kapi.get(path_of(plural="pods", namespace=ns, name=name))
    except ApiError as exc:
        if exc.not_found:
            return None
        raise
    return None if pod["metadata"].get("deletionTimestamp") else str(pod["metadata"]["uid"])


async def _pods_of(kapi: Kube, ns: str, selector: str) -> list[dict[str, Any]]:
    listed = await kapi.get(path_of(plural="pods", namespace=ns), labelSelector=selector)
    return [p for p in listed["items"] if not p["metadata"].get("deletionTimestamp")]


def _deployment(
    name: str, labels: dict[str, str], node_selector: dict[str, str], **pod: Any
) -> Any:
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": node_selector,
                    "containers": [{"name": "c", "image": "registry.example/app:1"}],
                    **pod,
                },
            },
        },
    }


async def test_a_pdb_at_zero_blocks_naming_it_relaxing_it_continues_and_pods_follow_the_options(
    cluster: Kube, services: Services
) -> None:
    kapi, ns = cluster, services.namespace
    await nodes.create_nodes(kapi, ["gpu-00"], labels={**GPU, "pin": "guarded"})
    await nodes.create_nodes(kapi, ["gpu-01"], labels={**GPU, "pin": "mixed"})
    await nodes.wait_ready(kapi, ["gpu-00", "gpu-01"])
    deployments = path_of(group="apps", plural="deployments", namespace=ns)
    # gpu-00: one replica guarded by a PDB that allows no disruption.
    await kapi.create(deployments, _deployment("guarded", {"app": "guarded"}, {"pin": "guarded"}))
    await kapi.create(
        path_of(group="policy", plural="poddisruptionbudgets", namespace=ns),
        {
            "metadata": {"name": "guarded"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
        },
    )
    # gpu-01: an emptyDir pod (evicted: deleteEmptyDirData), a bare pod (deleted:
    # unmanagedPods Delete) and a DaemonSet pod (left alone: ignoreDaemonSets).
    await kapi.create(
        deployments,
        _deployment(
            "scratch",
            {"app": "scratch"},
            {"pin": "mixed"},
            volumes=[{"name": "tmp", "emptyDir": {}}],
        ),
    )
    await kapi.create(
        path_of(plural="pods", namespace=ns),
        {
            "metadata": {"name": "bare"},
            "spec": {
                "nodeName": "gpu-01",
                "containers": [{"name": "c", "image": "registry.example/app:1"}],
            },
        },
    )
    ds = await kapi.create(
        path_of(group="apps", plural="daemonsets", namespace=ns),
        {
            "metadata": {"name": "agent"},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {
                    "metadata": {"labels": {"app": "agent"}},
                    "spec": {"containers": [{"name": "c", "image": "registry.example/agent:1"}]},
                },
            },
        },
    )
    # No DaemonSet controller runs on the rig: its pod is created by hand, owned by it. A
    # mirror pod (the API copy of a static pod) is skipped like kubectl drain does.
    owner = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "name": "agent",
        "uid": ds["metadata"]["uid"],
        "controller": True,
    }
    for name, meta in (
        ("agent-x", {"labels": {"app": "agent"}, "ownerReferences": [owner]}),
        ("static", {"annotations": {"kubernetes.io/config.mirror": "hash"}}),
    ):
        await kapi.create(
            path_of(plural="pods", namespace=ns),
            {
                "metadata": {"name": name, **meta},
                "spec": {
                    "nodeName": "gpu-01",
                    "containers": [{"name": "c", "image": "registry.example/app:1"}],
                },
            },
        )

    async def workloads_running() -> dict[str, str] | None:
        found: dict[str, str] = {}
        for app in ("guarded", "scratch"):
            pods = [
                p
                for p in await _pods_of(kapi, ns, f"app={app}")
                if (p.get("status") or {}).get("phase") == "Running"
            ]
            if len(pods) != 1:
                return None
            found[app] = pods[0]["metadata"]["uid"]
        for name in ("bare", "agent-x", "static"):
            uid = await _pod_uid(kapi, ns, name)
            if uid is None:
                return None
            found[name] = uid
        return found

    before = await eventually(workloads_running, timeout_s=60, what="the workloads to run")

    async def pdb_at_zero() -> bool:
        pdb = await kapi.get(
            path_of(group="policy", plural="poddisruptionbudgets", namespace=ns, name="guarded")
        )
        status = pdb.get("status") or {}
        return status.get("currentHealthy") == 1 and status.get("disruptionsAllowed") == 0

    await eventually(pdb_at_zero, what="the disruption controller to report the PDB at zero")

    await asyncio.to_thread(services.fleet.start_all)
    drain = {"unmanagedPods": "Delete", "deleteEmptyDirData": True, "ignoreDaemonSets": True}
    await manifests.apply(kapi, _cr("pdb", 1, drain=drain))

    async def blocked_by_the_pdb() -> api.NodeDetail | None:
        d = await _detail(kapi, "pdb", "gpu-00")
        ok = d is not None and d.state == "Blocked" and d.reason == "PodDisruptionBudgetBlocking"
        return d if ok else None

    detail = await eventually(
        blocked_by_the_pdb, timeout_s=90, what="gpu-00 Blocked by the PDB in CR status"
    )
    assert detail is not None
    assert f"{ns}/guarded" in detail.message
    assert "0 disruptions allowed" in detail.message
    condition = await _condition(kapi, "gpu-00", "pdb")
    assert condition is not None
    assert condition["reason"] == "Blocked"
    assert condition["message"].startswith("PodDisruptionBudgetBlocking:")
    assert f"{ns}/guarded" in condition["message"]
    # The node stays blocked while the PDB allows nothing; gpu-01 waits for the budget.
    await asyncio.sleep(8)
    turns = await _turns(kapi, "pdb")
    assert turns == {"gpu-00": "drainer", "gpu-01": "scheduler"}

    # Relax the PDB: the rollout continues with nobody touching NodeWright.
    await kapi.patch(
        path_of(group="policy", plural="poddisruptionbudgets", namespace=ns, name="guarded"),
        {"spec": {"minAvailable": 0}},
    )

    async def all_done() -> bool:
        return set((await _turns(kapi, "pdb")).values()) == {"done"}

    await eventually(all_done, timeout_s=180, interval_s=1, what="the rollout to finish")
    assert before is not None

    async def replaced(app: str) -> bool:
        pods = await _pods_of(kapi, ns, f"app={app}")
        return bool(pods) and all(p["metadata"]["uid"] != before[app] for p in pods)

    for app in ("guarded", "scratch"):
        # Evicted (the PDB-guarded pod and the emptyDir pod: deleteEmptyDirData) and replaced.
        assert await replaced(app), app
    assert await _pod_uid(kapi, ns, "agent-x") == before["agent-x"], "DaemonSet pod left alone"
    assert await _pod_uid(kapi, ns, "static") == before["static"], "mirror pod left alone"
    assert await _pod_uid(kapi, ns, "bare") is None, "the bare pod was deleted"
    for name in ("gpu-00", "gpu-01"):
        assert not (await _node(kapi, name))["spec"].get("unschedulable")


async def test_a_drain_timeout_fails_its_node_others_complete_and_retry_recovers_it(
    rig: Rig, cluster: Kube, services: Services
) -> None:
    kapi, ns = cluster, services.namespace
    names = await nodes.create_nodes(kapi, ["gpu-00", "gpu-01", "gpu-02"], labels=GPU)
    await nodes.wait_ready(kapi, names)
    # An unmanaged pod on gpu-00 blocks its drain (unmanagedPods: Block, the default).
    await kapi.create(
        path_of(plural="pods", namespace=ns),
        {
            "metadata": {"name": "pet"},
            "spec": {
                "nodeName": "gpu-00",
                "containers": [{"name": "c", "image": "registry.example/app:1"}],
            },
        },
    )
    await asyncio.to_thread(services.fleet.start_all)
    await manifests.apply(kapi, _cr("timeout", 2, drain={"timeoutSeconds": 5}))

    async def settled() -> bool:
        turns = await _turns(kapi, "timeout")
        return turns == {"gpu-00": "failed", "gpu-01": "done", "gpu-02": "done"}

    await eventually(settled, timeout_s=180, interval_s=1, what="gpu-00 failed, the others done")

    async def failed_detail() -> api.NodeDetail | None:
        d = await _detail(kapi, "timeout", "gpu-00")
        return d if d is not None and d.state == "Failed" else None

    detail = await eventually(failed_detail, what="gpu-00 Failed in CR status")
    assert detail is not None
    assert detail.reason == "DrainTimeout"
    assert "within 5s" in detail.message
    assert f"{ns}/pet" in detail.message
    raw = await _node(kapi, "gpu-00")
    assert raw["spec"].get("unschedulable"), "a failed node stays cordoned"
    status = await _cli(rig, "node", "status", "gpu-00")
    assert "DrainTimeout" in status
    assert "holds the cordon" in status

    # Fix the cause and retry by command: the drain starts again and the node completes.
    await kapi.delete(path_of(plural="pods", namespace=ns, name="pet"))
    out = await _cli(rig, "node", "retry", "gpu-00")
    assert "Requested retry #1 of NodeWright timeout on node gpu-00" in out
    assert "the drain (DrainTimeout) starts again" in out

    async def recovered() -> bool:
        return set((await _turns(kapi, "timeout")).values()) == {"done"}

    await eventually(recovered, timeout_s=120, interval_s=1, what="gpu-00 to complete")
    raw = await _node(kapi, "gpu-00")
    assert not raw["spec"].get("unschedulable")
    facts = progress.facts(raw, "timeout")
    assert facts.executor.packages["tuning"].installed == "1.0.0"
    assert facts.executor.honoured == 1
    # Retrying a node where nothing failed changes nothing and says so.
    again = await _cli(rig, "node", "retry", "gpu-01")
    assert "nothing failed, nothing to retry" in again


async def test_failed_and_unpullable_nodes_say_why_and_recover_by_retry_and_reset(
    rig: Rig, cluster: Kube, services: Services
) -> None:
    kapi = cluster
    names = await nodes.create_nodes(kapi, ["gpu-00", "gpu-01", "gpu-02", "gpu-03"], labels=GPU)
    await nodes.wait_ready(kapi, names)
    fail, pull = f"{SIM}/fail", f"{SIM}/image-pull-error"
    for node in ("gpu-00", "gpu-01"):
        await kapi.patch(f"{NODES}/{node}", {"metadata": {"annotations": {fail: "tuning/apply"}}})
    await kapi.patch(f"{NODES}/gpu-02", {"metadata": {"annotations": {pull: "tuning"}}})
    services.fleet.extra_env["NODEWRIGHT_PODS_IMAGE_PULL_GRACE_S"] = "3"
    await asyncio.to_thread(services.fleet.start_all)
    t0 = time.monotonic()
    await manifests.apply(kapi, _cr("recover", 4))

    async def image_failure() -> api.NodeDetail | None:
        d = await _detail(kapi, "recover", "gpu-02")
        return d if d is not None and d.state == "Failed" else None

    detail = await eventually(image_failure, timeout_s=60, what="gpu-02 failed on its image")
    assert time.monotonic() - t0 < 60
    assert detail is not None
    assert detail.reason == "ImagePullFailed"
    assert "registry.example/tuning:1.0.0" in detail.message

    async def settled() -> bool:
        turns = await _turns(kapi, "recover")
        return turns == {
            "gpu-00": "failed",
            "gpu-01": "failed",
            "gpu-02": "failed",
            "gpu-03": "done",
        }

    await eventually(settled, timeout_s=120, interval_s=1, what="three nodes failed, one done")
    for node in ("gpu-00", "gpu-01"):
        await _unannotate(kapi, node, fail)
    await _unannotate(kapi, "gpu-02", pull)

    out = await _cli(rig, "node", "retry", "gpu-00", "--nodewright", "recover")
    assert (
        "package tuning 1.0.0 stage apply (it failed: StageFailed) runs again as attempt 2" in out
    )
    out = await _cli(rig, "node", "retry", "gpu-02")
    assert "runs again as attempt 2" in out
    out = await _cli(rig, "node", "reset", "gpu-01")
    assert "Requested reset #1 of NodeWright recover on node gpu-01" in out

    async def all_done() -> bool:
        return set((await _turns(kapi, "recover")).values()) == {"done"}

    await eventually(all_done, timeout_s=180, interval_s=1, what="every node to recover")
    for node in names:
        facts = progress.facts(await _node(kapi, node), "recover")
        assert facts.executor.packages["tuning"].installed == "1.0.0", node
        # Every node with a request honoured it (request #1 of its own).
        assert facts.executor.honoured == (0 if node == "gpu-03" else 1), node
    for node in names:
        assert not (await _node(kapi, node))["spec"].get("unschedulable"), node
    obj = await read_cr(kapi, "recover")
    assert not [d for d in obj.status.node_details if d.state == "Failed"]

    status = await _cli(rig, "node", "status", "gpu-00")
    assert "package tuning: version 1.0.0, stage config succeeded" in status
    assert "last request: #1 retry" in status
    assert "honoured" in status


async def test_node_abort_fails_a_slow_stage_at_once_says_why_and_retry_completes_it(
    rig: Rig, cluster: Kube, services: Services
) -> None:
    """A stage that would run an hour (its timeout is the default half hour): ``nodewright
    node abort`` fails it at once with reason StageAborted, in the CR status and as a
    NodeFailed Event on the node; its pod is stopped (the kwok rig ends it as a kubelet
    would, DeadlineExceeded) and kept; the other node is not touched, and a retry, once the
    cause is gone, completes the rollout."""
    kapi, ns = cluster, services.namespace
    names = await nodes.create_nodes(kapi, ["gpu-00", "gpu-01"], labels=GPU)
    await nodes.wait_ready(kapi, names)
    slow = f"{SIM}/stage-duration"
    await kapi.patch(f"{NODES}/gpu-00", {"metadata": {"annotations": {slow: "1h"}}})
    await asyncio.to_thread(services.fleet.start_all)
    await manifests.apply(kapi, _cr("abort", 2))

    def runs(pod: dict[str, Any]) -> bool:
        status = pod.get("status") or {}
        statuses = [
            *(status.get("initContainerStatuses") or ()),
            *(status.get("containerStatuses") or ()),
        ]
        return any("running" in (c.get("state") or {}) for c in statuses)

    async def running() -> list[dict[str, Any]]:
        found = await _pods_of(kapi, ns, f"{pods.LABEL_CR}=abort")
        # Once kwok runs its first container: apply, for an hour.
        return [p for p in found if p["spec"].get("nodeName") == "gpu-00" and runs(p)]

    (pod,) = await eventually(running, timeout_s=60, what="gpu-00's stage pod running")
    out = await _cli(rig, "node", "abort", "gpu-00", "-n", ns)
    assert "Requested abort #1 of NodeWright abort on node gpu-00:" in out
    # kwok runs a segment pod's containers in turn, as a kubelet does: the pod is in apply.
    assert "package tuning 1.0.0 stage apply (attempt 1) fails" in out, out

    async def aborted() -> api.NodeDetail | None:
        d = await _detail(kapi, "abort", "gpu-00")
        return d if d is not None and d.state == "Failed" else None

    detail = await eventually(aborted, timeout_s=30, what="gpu-00 failed, aborted")
    assert detail is not None
    assert detail.reason == "StageAborted"
    assert "nodewright node retry" in detail.message

    async def ended() -> dict[str, Any] | None:
        got = await kapi.get(path_of(plural="pods", namespace=ns, name=pod["metadata"]["name"]))
        return got if got["status"].get("reason") == "DeadlineExceeded" else None

    stopped = await eventually(ended, timeout_s=30, what="the pod stopped and kept")
    assert stopped is not None
    assert stopped["status"]["phase"] == "Failed"
    assert stopped["metadata"]["uid"] == pod["metadata"]["uid"]

    async def said() -> list[str]:
        listed = await kapi.get(
            path_of(plural="events", namespace="default"),
            fieldSelector="involvedObject.kind=Node,involvedObject.name=gpu-00",
        )
        # gpu-00 is a name the other tests on this module's rig use too.
        mine = [e for e in listed["items"] if e["reason"] == "NodeFailed"]
        return [m for e in mine if (m := e.get("message", "")).startswith("NodeWright abort:")]

    (message,) = await eventually(said, timeout_s=30, what="a NodeFailed Event on gpu-00")
    assert "node gpu-00 failed: StageAborted: stage apply of tuning 1.0.0 stopped by" in message
    assert (await _turns(kapi, "abort"))["gpu-01"] in ("executor", "validator", "done")

    await _unannotate(kapi, "gpu-00", slow)
    out = await _cli(rig, "node", "retry", "gpu-00")
    assert "package tuning 1.0.0 stage apply (it failed: StageAborted) runs again as attempt 2" in (
        out
    )

    async def all_done() -> bool:
        return set((await _turns(kapi, "abort")).values()) == {"done"}

    await eventually(all_done, timeout_s=120, interval_s=1, what="both nodes done")

    async def dropped() -> bool:
        return await _pod_uid(kapi, ns, pod["metadata"]["name"]) is None

    # Once no replica can be about to create it any more (MIN_POD_AGE_S).
    await eventually(dropped, timeout_s=60, what="the retry to drop the aborted pod")


async def test_cordons_of_others_survive_and_two_crs_do_not_uncordon_each_others_work(
    rig: Rig, cluster: Kube, services: Services
) -> None:
    kapi = cluster
    await nodes.create_nodes(kapi, ["gpu-00"], labels=GPU, unschedulable=True)
    await nodes.create_nodes(kapi, ["gpu-01", "gpu-02"], labels=GPU)
    names = ["gpu-00", "gpu-01", "gpu-02"]
    await nodes.wait_ready(kapi, names)
    assert (await _node(kapi, "gpu-00"))["spec"].get("unschedulable")
    await asyncio.to_thread(services.fleet.start_all)

    violations: list[str] = []

    async def probe() -> None:
        listed = await kapi.get(NODES, labelSelector="nodepool=gpu")
        for n in listed["items"]:
            cordoned = bool((n.get("spec") or {}).get("unschedulable"))
            for cr in ("quick", "slow"):
                rec = progress.facts(n, cr).drain
                # Drained for a CR whose packages run: the node must be cordoned.
                if rec is not None and rec.phase == "drained" and not cordoned:
                    violations.append(f"{n['metadata']['name']} uncordoned under {cr}")

    sampler = Sampler(probe, interval_s=0.1)
    slow_packages = {
        "first": {"version": "1.0.0", "image": "registry.example/first"},
        "second": {
            "version": "1.0.0",
            "image": "registry.example/second",
            "dependsOn": {"first": "1.0.0"},
        },
    }
    async with sampler:
        await manifests.apply(kapi, _cr("quick", 3))
        await manifests.apply(kapi, _cr("slow", 3, packages=slow_packages))

        async def both_done() -> bool:
            quick = set((await _turns(kapi, "quick")).values())
            slow = set((await _turns(kapi, "slow")).values())
            return quick == slow == {"done"}

        await eventually(both_done, timeout_s=240, interval_s=1, what="both rollouts to finish")
        await sampler.stop()
    assert not violations, violations[:5]
    assert len(sampler.samples) > 20
    assert (await _node(kapi, "gpu-00"))["spec"].get("unschedulable"), (
        "a node cordoned before NodeWright came stays cordoned"
    )
    for name in ("gpu-01", "gpu-02"):
        assert not (await _node(kapi, name))["spec"].get("unschedulable"), name
    status = await _cli(rig, "node", "status", "gpu-00")
    assert "someone else cordoned it" in status


async def test_pre_pulled_images_come_before_the_drain_and_one_that_does_not_pull_evicts_nothing(
    rig: Rig, cluster: Kube, services: Services
) -> None:
    """``spec.drain.prePullImages``: each admitted node gets a pod that pulls its package
    images; the drain waits for it. On gpu-01 the image does not pull (the kwok rig's
    pull-error wish): the node fails with ImagePullFailed naming the image while its
    workload pod still runs, evicted by nothing; gpu-00 completes. Once the image pulls,
    ``nodewright node retry`` completes gpu-01, and no pull pod is left."""
    kapi, ns = cluster, services.namespace
    names = await nodes.create_nodes(kapi, ["gpu-00", "gpu-01"], labels=GPU)
    await nodes.wait_ready(kapi, names)
    for node in names:
        await kapi.create(
            path_of(plural="pods", namespace=ns),
            {
                "metadata": {"name": f"work-{node}"},
                "spec": {
                    "nodeName": node,
                    "containers": [{"name": "c", "image": "registry.example/app:1"}],
                },
            },
        )
    pull = f"{SIM}/image-pull-error"
    await kapi.patch(f"{NODES}/gpu-01", {"metadata": {"annotations": {pull: "tuning"}}})
    # gpu-00's pods (its pull too) take 8 s: long enough to see it wait for the pull.
    slow = {f"{SIM}/stage-duration": "8s"}
    await kapi.patch(f"{NODES}/gpu-00", {"metadata": {"annotations": slow}})
    work_01 = await _pod_uid(kapi, ns, "work-gpu-01")
    assert work_01 is not None
    services.fleet.extra_env["NODEWRIGHT_DRAINER_IMAGE_PULL_GRACE_S"] = "3"
    await asyncio.to_thread(services.fleet.start_all)
    async with pod_ledger(kapi, ns) as ledger:
        await manifests.apply(
            kapi, _cr("prepull", 2, drain={"prePullImages": True, "unmanagedPods": "Evict"})
        )

        async def pulling() -> api.NodeDetail | None:
            d = await _detail(kapi, "prepull", "gpu-00")
            return d if d is not None and d.reason == "ImagesPulling" else None

        # What a person sees meanwhile: the node waits, saying for what, and nothing left.
        waits = await eventually(pulling, timeout_s=60, what="gpu-00 to wait for its pull")
        assert waits is not None
        assert "registry.example/tuning:1.0.0" in waits.message
        assert await _pod_uid(kapi, ns, "work-gpu-00") is not None
        status = await _cli(rig, "node", "status", "gpu-00", "--nodewright", "prepull")
        assert "ImagesPulling" in status, status

        async def failed_on_its_image() -> api.NodeDetail | None:
            d = await _detail(kapi, "prepull", "gpu-01")
            return d if d is not None and d.state == "Failed" else None

        detail = await eventually(failed_on_its_image, timeout_s=90, what="gpu-01 to fail")
        assert detail is not None
        assert detail.reason == "ImagePullFailed"
        assert "registry.example/tuning:1.0.0" in detail.message
        facts = progress.facts(await _node(kapi, "gpu-01"), "prepull")
        assert facts.drain is not None
        assert facts.drain.phase == "failed", "the drain failed, before evicting"
        assert await _pod_uid(kapi, ns, "work-gpu-01") == work_01, "its workload still runs"

        async def gpu00_done() -> bool:
            return (await _turns(kapi, "prepull"))["gpu-00"] == "done"

        await eventually(gpu00_done, timeout_s=120, interval_s=1, what="gpu-00 to complete")
        assert await _pod_uid(kapi, ns, "work-gpu-00") is None, "gpu-00 was drained"
        assert await _pod_uid(kapi, ns, "work-gpu-01") == work_01
        assert {p.node for p in ledger.of_role("pull", "pull")} == {"gpu-00", "gpu-01"}
        assert {p.node for p in ledger.of_role("stage")} == {"gpu-00"}, "gpu-01 ran nothing"

        await _unannotate(kapi, "gpu-01", pull)
        out = await _cli(rig, "node", "retry", "gpu-01")
        assert "the drain (ImagePullFailed) starts again with a fresh timeout" in out

        async def all_done() -> bool:
            return set((await _turns(kapi, "prepull")).values()) == {"done"}

        await eventually(all_done, timeout_s=120, interval_s=1, what="gpu-01 to recover")
    assert await _pod_uid(kapi, ns, "work-gpu-01") is None, "drained once its image pulled"

    async def no_pull_pods() -> bool:
        return await _pods_of(kapi, ns, f"{pods.LABEL_ROLE}=pull") == []

    await eventually(no_pull_pods, timeout_s=60, what="the pull pods to go")
