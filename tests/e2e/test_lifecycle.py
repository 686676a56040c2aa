"""Issue 7 end to end, on the real rig with the five services as processes: a package's
whole lifecycle as the executor and validator run it on simulated (kwok) nodes.

A version bump runs ``upgrade`` (from the installed version), a configMap change re-runs
``config`` (and the interrupt only when a configInterrupt matches the changed key),
interrupts of several packages on a node merge into one pod, a reboot counts only once the
node's boot ID changed, ``dependsOn`` orders packages on a node, and the runtime-required
taint goes per node, only after the node was validated.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from typing import Any

import pytest

from nodewright import manifests
from nodewright.rig import nodes
from services.validator import core as vcore
from shared import api, events, pods, podspec, progress
from shared.kube import Kube, path_of
from shared.records.executor import ExecutorRecord
from tests.e2e.conftest import NODES, Sampler, Services, read_cr
from tests.helpers.bus import stream_events
from tests.helpers.podlog import PodLog, pod_log
from tests.helpers.waiting import eventually

pytestmark = pytest.mark.timeout(400)

SIM = "sim.nodewright.nvidia.com"
GPU = {"nodepool": "gpu"}
TAINT = {"key": progress.RUNTIME_REQUIRED_TAINT, "effect": "NoSchedule"}


def _cr(name: str, packages: dict[str, Any], count: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "NodeWright",
        "metadata": {"name": name},
        "spec": {
            "nodeSelectors": {"matchLabels": GPU},
            "interruptionBudget": {"count": count},
            "packages": packages,
            **spec,
        },
    }


async def _gpu_nodes(kapi: Kube) -> list[dict[str, Any]]:
    return list((await kapi.get(NODES, labelSelector="nodepool=gpu"))["items"])


async def _turns(kapi: Kube, cr: str) -> dict[str, str]:
    obj = await read_cr(kapi, cr)
    return {
        n["metadata"]["name"]: progress.turn(obj, progress.facts(n, cr))
        for n in await _gpu_nodes(kapi)
    }


async def _wait_done(kapi: Kube, cr: str, what: str, timeout_s: float = 120) -> None:
    last: dict[str, Any] = {}

    async def done() -> bool:
        turns = await _turns(kapi, cr)
        annotations = [n["metadata"].get("annotations") for n in await _gpu_nodes(kapi)]
        last.update(turns=turns, nodes=annotations)
        return bool(turns) and set(turns.values()) == {"done"}

    t0 = time.monotonic()
    try:
        await eventually(done, timeout_s=timeout_s, interval_s=0.5, what=what)
    except BaseException:
        print(json.dumps(last, indent=1), file=sys.stderr)
        raise
    print(f"{what}: {time.monotonic() - t0:.1f}s", file=sys.stderr)


async def _patch_cr(kapi: Kube, name: str, spec: dict[str, Any]) -> None:
    await kapi.patch(f"{manifests.NODEWRIGHTS}/{name}", {"spec": spec})


async def _executor(kapi: Kube, node: str, cr: str) -> ExecutorRecord:
    """The executor's record as the services read it (a cycle ends with its last check)."""
    return progress.facts(await kapi.get(f"{NODES}/{node}"), cr).executor


async def _start(kapi: Kube, services: Services, names: list[str], **kw: Any) -> None:
    await nodes.create_nodes(kapi, names, labels=GPU, **kw)
    await nodes.wait_ready(kapi, names)
    await asyncio.to_thread(services.fleet.start_all)


def _stage_pods(log: PodLog, since: int, node: str) -> list[tuple[str, str, str]]:
    """(role, package, stage) of the pods created on ``node`` after event ``since``."""
    return [(e.role, e.package, e.stage) for e in log.created(since, node=node)]


async def _config_maps(kapi: Kube, services: Services, cr: str) -> set[str]:
    """The names of the package ConfigMaps of ``cr``."""
    listed = await kapi.get(
        path_of(plural="configmaps", namespace=services.namespace),
        labelSelector=f"{pods.LABEL_CR}={cr}",
    )
    return {i["metadata"]["name"] for i in listed.get("items") or ()}


async def _cordons(services: Services, cr: str, node: str) -> int:
    """How many times the drainer cordoned ``node`` for ``cr`` so far (its events)."""
    found = await stream_events(services.fleet.rig.endpoints.nats_url, cr=cr, node=node)
    return sum(isinstance(e, events.NodeCordoned) for e in found)


async def test_a_version_bump_upgrades_and_config_changes_rerun_config_and_matching_interrupts(
    cluster: Kube, services: Services
) -> None:
    """With ``drain.onlyForInterrupts``, only the cycle that runs an interrupt (the config
    change a configInterrupt matches) cordons and drains the nodes first."""
    kapi, names = cluster, ["gpu-00", "gpu-01"]
    await _start(kapi, services, names)
    tuning = {
        "version": "1.0.0",
        "image": "registry.example/tuning",
        "configMap": {"sysctl.conf": "vm.swappiness=10", "containerd.toml": "a"},
        "configInterrupts": {"containerd*": {"type": "service", "services": ["containerd"]}},
    }
    async with pod_log(kapi, services.namespace) as log:
        only = {"onlyForInterrupts": True}
        await manifests.apply(kapi, _cr("life", {"tuning": tuning}, 2, drain=only))
        await _wait_done(kapi, "life", "the install to finish")
        for n in names:
            # An install: apply then config, each checked; no interrupt for an install of a
            # package without one (configInterrupts are about changes).
            assert _stage_pods(log, 0, n) == [
                ("stage", "tuning", "apply"),
                ("check", "tuning", "apply"),
                ("stage", "tuning", "config"),
                ("check", "tuning", "config"),
            ]
            rec = (await _executor(kapi, n, "life")).packages["tuning"]
            assert (rec.installed, rec.cycle) == ("1.0.0", "install")
        installed_with = await _config_maps(kapi, services, "life")
        assert len(installed_with) == 1

        # 1. The version bump runs upgrade from the installed version, never apply.
        mark = len(log.events)
        await _patch_cr(kapi, "life", {"packages": {"tuning": {"version": "1.1.0"}}})
        await _wait_done(kapi, "life", "the upgrade to finish")
        for n in names:
            assert _stage_pods(log, mark, n) == [
                ("stage", "tuning", "upgrade"),
                ("check", "tuning", "upgrade"),
                ("stage", "tuning", "config"),
                ("check", "tuning", "config"),
            ]
            upgrade = log.created(mark, node=n, role="stage", stage="upgrade")[0]
            assert upgrade.env["NODEWRIGHT_FROM_VERSION"] == "1.0.0"
            assert upgrade.env["NODEWRIGHT_TO_VERSION"] == "1.1.0"
            check = log.created(mark, node=n, role="check", stage="upgrade")[0]
            assert check.env["NODEWRIGHT_FROM_VERSION"] == "1.0.0"
            rec = (await _executor(kapi, n, "life")).packages["tuning"]
            assert (rec.installed, rec.cycle, rec.previous) == ("1.1.0", "upgrade", "")

        # 2. A key no configInterrupt matches: only config runs again, no interrupt.
        mark = len(log.events)
        await _patch_cr(
            kapi,
            "life",
            {"packages": {"tuning": {"configMap": {"sysctl.conf": "vm.swappiness=5"}}}},
        )
        await _wait_done(kapi, "life", "the config change to finish")
        for n in names:
            assert _stage_pods(log, mark, n) == [
                ("stage", "tuning", "config"),
                ("check", "tuning", "config"),
            ]
            rec = (await _executor(kapi, n, "life")).packages["tuning"]
            assert (rec.cycle, rec.interrupt) == ("config", "")
            # Install, upgrade and this change ran no interrupt: never cordoned.
            assert await _cordons(services, "life", n) == 0

        # 3. A key a configInterrupt matches: config, then the interrupt, then post-interrupt.
        mark = len(log.events)
        await _patch_cr(
            kapi, "life", {"packages": {"tuning": {"configMap": {"containerd.toml": "b"}}}}
        )
        await _wait_done(kapi, "life", "the config change with its interrupt to finish")
        for n in names:
            assert _stage_pods(log, mark, n) == [
                ("stage", "tuning", "config"),
                ("check", "tuning", "config"),
                ("interrupt", "", "interrupt"),
                ("stage", "tuning", "post-interrupt"),
                ("check", "tuning", "post-interrupt"),
            ]
            intr = log.created(mark, node=n, role="interrupt")[0]
            assert json.loads(intr.env["NODEWRIGHT_INTERRUPT"]) == {
                "type": "service",
                "services": ["containerd"],
            }
            whole = await _executor(kapi, n, "life")
            assert whole.interrupt is not None
            assert whole.interrupt.state == "succeeded"
            assert whole.packages["tuning"].installed == "1.1.0"
            assert await _cordons(services, "life", n) == 1, "drained for the interrupt"

        # 4. Three configurations made three ConfigMaps: only the current one stays.
        current = progress.desired(await read_cr(kapi, "life"))["tuning"]
        wanted = {podspec.config_map_name("life", "tuning", current.config_digest)}
        assert not installed_with & wanted

        async def swept() -> bool:
            return await _config_maps(kapi, services, "life") == wanted

        await eventually(swept, timeout_s=60, what="the unwanted ConfigMaps to go")


async def test_service_interrupts_of_two_packages_merge_into_one_pod_per_node(
    cluster: Kube, services: Services
) -> None:
    kapi, names = cluster, ["gpu-00", "gpu-01"]
    await _start(kapi, services, names)
    packages = {
        "runtime": {
            "version": "1.0.0",
            "image": "registry.example/runtime",
            "interrupt": {"type": "service", "services": ["containerd"]},
        },
        "agent": {
            "version": "2.0.0",
            "image": "registry.example/agent",
            "interrupt": {"type": "service", "services": ["kubelet", "containerd"]},
        },
    }
    async with pod_log(kapi, services.namespace) as log:
        await manifests.apply(kapi, _cr("merge", packages, 2))
        await _wait_done(kapi, "merge", "both packages with their interrupt")
    for n in names:
        interrupts = log.created(node=n, role="interrupt")
        assert len(interrupts) == 1, interrupts
        assert json.loads(interrupts[0].env["NODEWRIGHT_INTERRUPT"]) == {
            "type": "service",
            "services": ["containerd", "kubelet"],
        }
        # Both packages' config stages ran before it, and both post-interrupts after it.
        at = log.index(lambda e, n=n: e.added and e.node == n and e.role == "interrupt")
        for pkg in ("runtime", "agent"):
            config = log.index(
                lambda e, n=n, p=pkg: (
                    e.node == n
                    and (e.role, e.package, e.stage) == ("check", p, "config")
                    and e.phase == "Succeeded"
                )
            )
            post = log.index(
                lambda e, n=n, p=pkg: (
                    e.added
                    and e.node == n
                    and (e.role, e.package, e.stage) == ("stage", p, "post-interrupt")
                )
            )
            assert config < at < post


async def test_a_reboot_merges_and_counts_only_once_the_boot_id_changed(
    cluster: Kube, services: Services
) -> None:
    kapi, names = cluster, ["gpu-00", "gpu-01"]
    await _start(kapi, services, names)
    packages = {
        "runtime": {
            "version": "1.0.0",
            "image": "registry.example/runtime",
            "interrupt": {"type": "service", "services": ["containerd"]},
        },
        "driver": {
            "version": "1.0.0",
            "image": "registry.example/driver",
            "interrupt": {"type": "reboot"},
        },
        "agent": {
            "version": "1.0.0",
            "image": "registry.example/agent",
            "interrupt": {"type": "service", "services": ["kubelet"]},
        },
    }
    async with pod_log(kapi, services.namespace) as log:
        # reapplyOnReboot too: NodeWright's own reboot must not count as an unplanned one.
        await manifests.apply(kapi, _cr("reboot", packages, 2, reapplyOnReboot=True))

        async def interrupt_pods_succeeded() -> bool:
            return all(
                any(
                    e.node == n and e.role == "interrupt" and e.phase == "Succeeded"
                    for e in log.events
                )
                for n in names
            )

        await eventually(interrupt_pods_succeeded, what="both interrupt pods to exit 0")
        # The container exited 0, but the boot ID is the same: the reboot did not happen.
        await asyncio.sleep(4)
        for n in names:
            rec = await _executor(kapi, n, "reboot")
            assert rec.interrupt is not None
            assert rec.interrupt.state == "running"
            assert rec.interrupt.type == "reboot"
            assert {p.stage for p in rec.packages.values()} == {"interrupt"}
        assert set((await _turns(kapi, "reboot")).values()) == {"executor"}

        # gpu-00 reboots (its boot ID changes); gpu-01 never does.
        await kapi.patch(
            f"{NODES}/gpu-00/status", {"status": {"nodeInfo": {"bootID": str(uuid.uuid4())}}}
        )

        async def gpu00_done() -> bool:
            return (await _turns(kapi, "reboot"))["gpu-00"] == "done"

        await eventually(gpu00_done, what="gpu-00 to finish after its reboot")
        await asyncio.sleep(2)
        rec = await _executor(kapi, "gpu-01", "reboot")
        assert rec.interrupt is not None
        assert rec.interrupt.state == "running"
        assert (await _turns(kapi, "reboot"))["gpu-01"] == "executor"
    for n in names:
        interrupts = log.created(node=n, role="interrupt")
        assert len(interrupts) == 1, interrupts
        assert json.loads(interrupts[0].env["NODEWRIGHT_INTERRUPT"]) == {"type": "reboot"}
    assert not log.created(node="gpu-01", stage="post-interrupt")
    assert {
        e.package for e in log.created(node="gpu-00", role="stage", stage="post-interrupt")
    } == {
        "runtime",
        "driver",
        "agent",
    }
    done = await _executor(kapi, "gpu-00", "reboot")
    assert done.interrupt is not None
    assert done.interrupt.state == "succeeded"
    raw = await kapi.get(f"{NODES}/gpu-00")
    assert done.boot_id == raw["status"]["nodeInfo"]["bootID"], "recorded after the reboot"
    for p in packages:
        applies = log.created(node="gpu-00", role="stage", package=p, stage="apply")
        assert len(applies) == 1, "our own reboot re-applied nothing"


async def test_reapply_on_reboot_runs_every_package_again_on_a_node_that_rebooted(
    cluster: Kube, services: Services
) -> None:
    kapi, names = cluster, ["gpu-00", "gpu-01"]
    await _start(kapi, services, names)
    packages = {
        "tuning": {"version": "1.0.0", "image": "registry.example/tuning"},
        "agent": {
            "version": "1.0.0",
            "image": "registry.example/agent",
            "dependsOn": {"tuning": "1.0.0"},
        },
    }
    # runtimeRequired + autoTaintNewNodes: the nodes existed before the NodeWright, so they are
    # not tainted when it comes, but a rebooted one is, until its packages are back.
    spec = {"reapplyOnReboot": True, "runtimeRequired": True, "autoTaintNewNodes": True}

    async def tainted() -> dict[str, bool]:
        listed = (await kapi.get(NODES, labelSelector="nodepool=gpu"))["items"]
        return {
            n["metadata"]["name"]: any(
                t.get("key") == TAINT["key"] for t in (n.get("spec") or {}).get("taints") or ()
            )
            for n in listed
        }

    async with pod_log(kapi, services.namespace) as log, Sampler(tainted, 0.1) as taints:
        await manifests.apply(kapi, _cr("ephemeral", packages, 1, **spec))
        await _wait_done(kapi, "ephemeral", "the install")
        before_reboot = len(taints.samples)
        mark = len(log.events)
        boot = str(uuid.uuid4())
        await kapi.patch(f"{NODES}/gpu-00/status", {"status": {"nodeInfo": {"bootID": boot}}})

        async def reapplied() -> bool:
            return len(log.created(mark, node="gpu-00", role="stage", stage="config")) == 2

        await eventually(reapplied, timeout_s=120, what="gpu-00's packages to run again")
        await _wait_done(kapi, "ephemeral", "the re-apply")

        async def untainted() -> bool:
            return not any((await tainted()).values())

        await eventually(untainted, what="the taint to leave the re-validated node")
        await taints.stop()
    assert before_reboot > 0
    assert not any(any(t.values()) for t in taints.samples[:before_reboot]), "nodes that existed"
    assert any(t["gpu-00"] for t in taints.samples[before_reboot:]), "tainted after its reboot"
    assert not any(t["gpu-01"] for t in taints.samples), "a node that did not reboot"
    raw = await kapi.get(f"{NODES}/gpu-00")
    assert raw["metadata"]["annotations"][vcore.AUTO_TAINTED_BOOT] == boot
    assert [(e.package, e.stage) for e in log.created(mark, node="gpu-00", role="stage")] == [
        ("tuning", "apply"),
        ("tuning", "config"),
        ("agent", "apply"),
        ("agent", "config"),
    ]
    assert not log.created(mark, node="gpu-01"), "a node that did not reboot is left alone"
    assert (await _executor(kapi, "gpu-00", "ephemeral")).boot_id == boot

    # The reboot is on the stream (a Kubernetes Event only in verbose mode: docs/events.md).
    rebooted = [
        e
        for e in await stream_events(
            services.fleet.rig.endpoints.nats_url, cr="ephemeral", node="gpu-00"
        )
        if isinstance(e, events.NodeRebooted)
    ]
    assert [e.boot_id for e in rebooted] == [boot]


async def test_depends_on_orders_packages_on_a_node_and_independent_ones_run_in_parallel(
    cluster: Kube, services: Services
) -> None:
    kapi, names = cluster, ["gpu-00", "gpu-01"]
    await _start(kapi, services, names)
    packages = {
        "base": {"version": "1.0.0", "image": "registry.example/base"},
        "app": {
            "version": "2.0.0",
            "image": "registry.example/app",
            "dependsOn": {"base": "1.0.0"},
        },
        "solo": {"version": "1.0.0", "image": "registry.example/solo"},
    }
    async with pod_log(kapi, services.namespace) as log:
        await manifests.apply(kapi, _cr("deps", packages, 2))
        await _wait_done(kapi, "deps", "three packages with a dependency")
    for n in names:

        def first(n: str = n, **m: str) -> int:
            return log.index(
                lambda e: e.node == n and all(getattr(e, k) == v for k, v in m.items())
            )

        app_apply = first(role="stage", package="app", stage="apply")
        base_done = first(role="check", package="base", stage="config", phase="Succeeded")
        assert base_done < app_apply, "app started before base was done on the node"
        # solo does not wait for anything: it starts with base, long before base is done
        # (base's config starts in base's pod as soon as kwok runs it: all init containers
        # at once, which may come before solo's pod was made).
        assert first(role="stage", package="solo", stage="apply") < base_done


async def test_the_runtime_required_taint_goes_per_node_only_after_validation(
    cluster: Kube, services: Services
) -> None:
    kapi, names = cluster, ["gpu-00", "gpu-01", "gpu-02"]
    await nodes.create_nodes(kapi, names, labels=GPU, taints=[TAINT])
    await nodes.wait_ready(kapi, names)
    await kapi.patch(
        f"{NODES}/gpu-02", {"metadata": {"annotations": {f"{SIM}/fail": "tuning/config"}}}
    )
    await asyncio.to_thread(services.fleet.start_all)
    packages = {"tuning": {"version": "1.0.0", "image": "registry.example/tuning"}}

    async def taints_and_validation() -> dict[str, tuple[bool, bool]]:
        obj = await read_cr(kapi, "ready")
        target = progress.target_digest(obj)
        out = {}
        for n in await _gpu_nodes(kapi):
            f = progress.facts(n, "ready")
            tainted = any(t.get("key") == TAINT["key"] for t in f.taints)
            out[f.name] = (tainted, f.validator.validated == target)
        return out

    async def settled() -> bool:
        turns = await _turns(kapi, "ready")
        return turns == {"gpu-00": "done", "gpu-01": "done", "gpu-02": "failed"}

    await manifests.apply(kapi, _cr("ready", packages, 3, runtimeRequired=True))
    async with Sampler(taints_and_validation, interval_s=0.1) as samples:
        await eventually(settled, timeout_s=120, what="two nodes done, gpu-02 failed")

        async def untainted() -> bool:
            now = await taints_and_validation()
            return not now["gpu-00"][0] and not now["gpu-01"][0]

        await eventually(untainted, what="the taint to leave the validated nodes")
        await asyncio.sleep(2)
    final = await taints_and_validation()
    assert final["gpu-02"] == (True, False), "the failed node lost its taint"
    # Never untainted before validated, on any node, at any sample.
    for sample in samples.samples:
        for node, (tainted, validated) in sample.items():
            assert tainted or validated, f"{node} untainted before validation: {sample}"
    # And the taint really was there while the nodes worked.
    assert any(s["gpu-00"] == (True, False) for s in samples.samples)
