"""The real node as a node: real pods drained (Eviction API, a PDB, a non-interruptible pod
waited for) with kubelet really stopping them, interrupts judged as on any node, pods
reaching the API server through the ``kubernetes`` Service, ``kubectl logs``, a node behind
the runtime-required taint running workloads only once validated, the interrupts of two
packages merged into one reboot, a deleted NodeWright uninstalling through a reboot, and the
rig leaving nothing behind on the machine."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from nodewright import manifests
from nodewright.rig import Rig
from nodewright.rig.realnode import PAUSE_IMAGE, RealNode
from shared import api, nodestate, progress
from shared.kube import ApiError, Kube, path_of
from shared.records.executor import ExecutorRecord
from tests.e2e.conftest import NODES, Services, read_cr, wait_for_default_service_account
from tests.e2e.realnode.conftest import kubectl
from tests.e2e.realnode.test_packages import (
    SYSCTL_A,
    TARGET,
    _cr,
    _host,
    _load,
    _one_step,
    _package,
    _sysctl,
    _wait_ready,
)
from tests.helpers.waiting import Pending, eventually

pytestmark = pytest.mark.timeout(600)

AGENT_IMAGE = "ghcr.io/nvidia/nodewright/agent:0.1.0"
PROTECTED = {"workload": "long-running-training"}


def _pod(
    name: str, *, labels: dict[str, str], command: list[str], image: str = AGENT_IMAGE, **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeSelector": TARGET,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {"name": "c", "image": image, "imagePullPolicy": "IfNotPresent", "command": command}
            ],
            **spec,
        },
    }


async def _phase(kapi: Kube, ns: str, name: str) -> str:
    try:
        pod = await kapi.get(path_of(plural="pods", namespace=ns, name=name))
    except ApiError as exc:
        if exc.not_found:
            return "Gone"
        raise
    return str((pod.get("status") or {}).get("phase") or "")


async def _detail(kapi: Kube, cr: str, node: str) -> api.NodeDetail | None:
    obj = await read_cr(kapi, cr)
    return next((d for d in obj.status.node_details if d.node == node), None)


async def _reason(kapi: Kube, cr: str, node: str, code: str, what: str) -> api.NodeDetail:
    """The node's detail in the NodeWright's status, once its reason is ``code``."""

    async def says() -> api.NodeDetail | Pending:
        d = await _detail(kapi, cr, node)
        if d is not None and d.reason == code:
            return d
        return Pending(f"detail {d}")

    return await eventually(says, timeout_s=90, what=what)


def _recorded(node: RealNode) -> str:
    """What the host root's reboot and systemctl stand-ins recorded (``hostroot.CALLS_DIR``)."""
    calls = _host(node, "/var/tmp/nodewright-test-calls")
    return "".join(p.read_text() for p in calls.glob("*.log"))


async def _with_post_interrupt(node: RealNode, tmp: Any, name: str, marker: str) -> None:
    """Package ``name`` 1.0.0 as ``registry.example/<name>``, loaded into ``node``: an apply
    stage that does nothing and a post-interrupt stage that writes "ran" to ``marker`` on the
    host, each with a passing check."""
    ok = "#!/bin/sh\nexit 0\n"
    stages = {
        "apply": {
            "steps": [{"name": "s", "path": "ok.sh"}],
            "check": [{"name": "c", "path": "ok.sh"}],
        },
        "post-interrupt": {
            "steps": [{"name": "after", "path": "after.sh"}],
            "check": [{"name": "c", "path": "ok.sh"}],
        },
    }
    after = f"#!/bin/sh\necho ran > {marker}\n"
    pkg = _package(tmp, name, "1.0.0", stages=stages, steps={"ok.sh": ok, "after.sh": after})
    await _load(node, pkg, f"registry.example/{name}:1.0.0", tmp)


async def _reboot_called(node: RealNode) -> None:
    async def called() -> bool:
        return "reboot" in _recorded(node)

    await eventually(called, timeout_s=180, what="the agent to call reboot on the host")


async def test_a_real_drain_waits_for_protected_pods_respects_the_pdb_and_uncordons(
    rig: Rig, cluster: Kube, services: Services, real_node: RealNode
) -> None:
    kapi, ns, node = cluster, services.namespace, real_node.name
    pods_path = path_of(plural="pods", namespace=ns)
    # A training pod that must not be interrupted: it runs until the test tells it (through
    # `kubectl exec`, which goes API server -> kubelet -> containerd) that training is over.
    training = "import os, time\nwhile not os.path.exists('/tmp/done'):\n    time.sleep(0.5)\n"
    await kapi.create(
        pods_path,
        _pod("training", labels=PROTECTED, command=["python3", "-c", training]),
    )
    # A workload behind a PDB that allows no disruption.
    await kapi.create(
        path_of(group="apps", plural="deployments", namespace=ns),
        {
            "metadata": {"name": "guarded"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "guarded"}},
                "template": {
                    "metadata": {"labels": {"app": "guarded"}},
                    "spec": {
                        "nodeSelector": TARGET,
                        "terminationGracePeriodSeconds": 5,
                        "containers": [
                            {"name": "c", "image": PAUSE_IMAGE, "imagePullPolicy": "IfNotPresent"}
                        ],
                    },
                },
            },
        },
    )
    pdb_path = path_of(group="policy", plural="poddisruptionbudgets", namespace=ns, name="guarded")
    await kapi.create(
        path_of(group="policy", plural="poddisruptionbudgets", namespace=ns),
        {
            "metadata": {"name": "guarded"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
        },
    )

    async def running() -> bool:
        listed = await kapi.get(pods_path, labelSelector="app=guarded")
        phases = [(p.get("status") or {}).get("phase") for p in listed["items"]]
        pdb = await kapi.get(pdb_path)
        return (
            phases == ["Running"]
            and await _phase(kapi, ns, "training") == "Running"
            and (pdb.get("status") or {}).get("disruptionsAllowed") == 0
        )

    await eventually(running, timeout_s=120, what="the workloads to run on the real node")
    guarded_uid = (await kapi.get(pods_path, labelSelector="app=guarded"))["items"][0]["metadata"][
        "uid"
    ]

    await asyncio.to_thread(services.fleet.start_all)
    await manifests.apply(
        kapi,
        _cr("drain", _sysctl("1.0.0", SYSCTL_A), podNonInterruptLabels={"matchLabels": PROTECTED}),
    )

    detail = await _reason(
        kapi, "drain", node, "ProtectedPodRunning", "the node to wait for the training pod"
    )
    assert f"{ns}/training" in detail.message
    assert (await kapi.get(f"{NODES}/{node}"))["spec"].get("unschedulable") is True

    await asyncio.sleep(5)  # whatever the services do meanwhile, the training pod is left alone
    assert await _phase(kapi, ns, "training") == "Running"
    still = await _detail(kapi, "drain", node)
    assert still is not None
    assert still.reason == "ProtectedPodRunning"
    finish = ["python3", "-c", "open('/tmp/done', 'w').close()"]
    done = await kubectl(rig, "exec", "-n", ns, "training", "--", *finish)
    assert done.returncode == 0, done.stderr

    # The training pod ends; then the eviction meets the PDB.
    detail = await _reason(
        kapi, "drain", node, "PodDisruptionBudgetBlocking", "the PDB to block the drain"
    )
    assert f"{ns}/guarded" in detail.message
    assert await _phase(kapi, ns, "training") == "Succeeded", "waited for, never evicted"

    await kapi.patch(pdb_path, {"spec": {"minAvailable": 0}})
    await _wait_ready(kapi, "drain", "the rollout after the PDB was relaxed")
    raw = await kapi.get(f"{NODES}/{node}")
    assert not raw["spec"].get("unschedulable"), "uncordoned at the end"

    async def replaced_and_running() -> bool:
        listed = await kapi.get(pods_path, labelSelector="app=guarded")
        return any(
            p["metadata"]["uid"] != guarded_uid
            and (p.get("status") or {}).get("phase") == "Running"
            for p in listed["items"]
        )

    # Evicted for real (kubelet stopped it), replaced, and back on the node once uncordoned.
    await eventually(replaced_and_running, timeout_s=120, what="the evicted workload to run again")


async def test_interrupts_run_the_hosts_commands_and_a_reboot_counts_when_the_boot_id_changes(
    rig: Rig, cluster: Kube, services: Services, real_node: RealNode, tmp_path: Any
) -> None:
    """No systemd and no real reboot here: the host root's ``systemctl`` and ``reboot`` are
    stand-ins that record their calls, and a reboot is judged, as on every node, by the boot
    ID kubelet reports; the rig changes it (``RealNode.simulate_reboot``)."""
    kapi, node = cluster, real_node.name
    stages = {
        "apply": {
            "steps": [{"name": "s", "path": "ok.sh"}],
            "check": [{"name": "c", "path": "ok.sh"}],
        }
    }
    for name in ("svc", "rb"):
        pkg = _package(
            tmp_path, name, "1.0.0", stages=stages, steps={"ok.sh": "#!/bin/sh\nexit 0\n"}
        )
        await _load(real_node, pkg, f"registry.example/{name}:1.0.0", tmp_path)
    await asyncio.to_thread(services.fleet.start_all)

    svc = {
        "svc": {
            "version": "1.0.0",
            "image": "registry.example/svc",
            "interrupt": {"type": "service", "services": ["containerd"]},
        }
    }
    await manifests.apply(kapi, _cr("svc", svc))
    await _wait_ready(kapi, "svc", "the service-restart interrupt")
    assert "systemctl restart containerd" in _recorded(real_node)

    boot_before = (await kapi.get(f"{NODES}/{node}"))["status"]["nodeInfo"]["bootID"]
    rb = {
        "rb": {"version": "1.0.0", "image": "registry.example/rb", "interrupt": {"type": "reboot"}}
    }
    # reapplyOnReboot: the executor records the boot its packages completed in, and our own
    # reboot must not count as one "outside NodeWright" (the packages would run again).
    await manifests.apply(kapi, _cr("rb", rb, reapplyOnReboot=True))

    await _reboot_called(real_node)
    await asyncio.sleep(0)  # the interrupt pod has exited 0, but nothing rebooted:
    raw = await kapi.get(f"{NODES}/{node}")
    cr = await read_cr(kapi, "rb")
    assert progress.turn(cr, progress.facts(raw, "rb")) == "executor", (
        "not done before the boot ID changes"
    )
    new_boot = await asyncio.to_thread(real_node.simulate_reboot, rig._spawn)
    assert new_boot != boot_before
    await _wait_ready(kapi, "rb", "the rollout after the boot ID changed")

    async def boot_recorded() -> ExecutorRecord | Pending:
        # Written once the packages are complete, beside their validation (not before it).
        raw = await kapi.get(f"{NODES}/{node}")
        rec = nodestate.read(raw, nodestate.EXECUTOR, "rb", ExecutorRecord)
        if rec is None or rec.boot_id != new_boot:
            return Pending(f"boot ID recorded: {rec.boot_id if rec else None}")
        return rec

    rec = await eventually(boot_recorded, timeout_s=30, what="the boot the packages completed in")
    assert isinstance(rec, ExecutorRecord)
    assert not rec.reset_boot, "our own reboot reset nothing"
    raw = await kapi.get(f"{NODES}/{node}")
    assert progress.turn(await read_cr(kapi, "rb"), progress.facts(raw, "rb")) == "done"


async def test_pods_reach_the_api_server_through_the_kubernetes_service_and_logs_work(
    rig: Rig, cluster: Kube, namespace: str, real_node: RealNode
) -> None:
    kapi = cluster
    await wait_for_default_service_account(kapi, namespace)
    script = "\n".join(
        [
            "import json, os, ssl, urllib.request",
            "env = os.environ",
            "url = f\"https://{env['KUBERNETES_SERVICE_HOST']}:{env['KUBERNETES_SERVICE_PORT']}\"",
            "ca = '/var/run/secrets/kubernetes.io/serviceaccount/ca.crt'",
            "ctx = ssl.create_default_context(cafile=ca)",
            "answer = urllib.request.urlopen(url + '/version', context=ctx, timeout=10)",
            "version = json.load(answer)",
            "print('via', url, 'server', version['gitVersion'])",
        ]
    )
    await kapi.create(
        path_of(plural="pods", namespace=namespace),
        _pod("probe", labels={}, command=["python3", "-c", script]),
    )

    async def finished() -> str | Pending:
        phase = await _phase(kapi, namespace, "probe")
        return phase if phase in ("Succeeded", "Failed") else Pending(phase)

    phase = await eventually(finished, timeout_s=120, what="the probe pod to finish")
    logs = await kubectl(rig, "logs", "-n", namespace, "probe")
    assert logs.returncode == 0, logs.stderr
    assert phase == "Succeeded", logs.stdout
    assert rig.real is not None
    assert rig.real.network is not None
    service = rig.real.network.kubernetes_service_ip
    assert f"via https://{service}:443 server v1.36" in logs.stdout


async def test_a_real_drain_leaves_daemonset_pods_and_evicts_emptydir_pods_only_when_allowed(
    rig: Rig, cluster: Kube, services: Services, real_node: RealNode
) -> None:
    """``spec.drain`` on pods the real controllers made: the DaemonSet controller's pod
    stays through the whole rollout (``ignoreDaemonSets``, the default); a Deployment's pod
    with an emptyDir volume blocks the drain, named, until ``deleteEmptyDirData`` lets it be
    evicted (the kubelet then really stops it)."""
    kapi, ns, node = cluster, services.namespace, real_node.name
    pods_path = path_of(plural="pods", namespace=ns)
    container: dict[str, Any] = {
        "name": "c",
        "image": PAUSE_IMAGE,
        "imagePullPolicy": "IfNotPresent",
    }
    template = {
        "nodeSelector": TARGET,
        "terminationGracePeriodSeconds": 5,
        "containers": [container],
    }
    await kapi.create(
        path_of(group="apps", plural="daemonsets", namespace=ns),
        {
            "metadata": {"name": "agentd"},
            "spec": {
                "selector": {"matchLabels": {"app": "agentd"}},
                "template": {"metadata": {"labels": {"app": "agentd"}}, "spec": template},
            },
        },
    )
    scratch = {
        **template,
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        "containers": [
            {
                **container,
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
            }
        ],
    }
    await kapi.create(
        path_of(group="apps", plural="deployments", namespace=ns),
        {
            "metadata": {"name": "cache"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "cache"}},
                "template": {"metadata": {"labels": {"app": "cache"}}, "spec": scratch},
            },
        },
    )

    async def running(app: str) -> list[str]:
        listed = await kapi.get(pods_path, labelSelector=f"app={app}")
        return [
            p["metadata"]["uid"]
            for p in listed["items"]
            if (p.get("status") or {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        ]

    async def both_running() -> bool:
        return len(await running("agentd")) == 1 and len(await running("cache")) == 1

    await eventually(both_running, timeout_s=120, what="the DaemonSet and the cache to run")
    (daemon,) = await running("agentd")
    (cache,) = await running("cache")

    await asyncio.to_thread(services.fleet.start_all)
    await manifests.apply(kapi, _cr("scratch", _sysctl("1.0.0", SYSCTL_A)))

    detail = await _reason(
        kapi, "scratch", node, "EmptyDirData", "the emptyDir pod to block the drain"
    )
    assert f"{ns}/cache-" in detail.message
    assert await running("cache") == [cache], "nothing was evicted"

    await kapi.patch(
        f"{manifests.NODEWRIGHTS}/scratch", {"spec": {"drain": {"deleteEmptyDirData": True}}}
    )
    await _wait_ready(kapi, "scratch", "the rollout once emptyDir data may be lost")
    assert await running("agentd") == [daemon], "the DaemonSet's pod ran through the rollout"

    async def replaced() -> bool:
        now = await running("cache")
        return len(now) == 1 and now != [cache]

    await eventually(replaced, timeout_s=120, what="the evicted cache pod to be replaced")


async def test_a_reboot_that_takes_the_node_away_holds_its_slot_and_completes_once_it_is_back(
    rig: Rig, cluster: Kube, services: Services, real_node: RealNode, tmp_path: Any
) -> None:
    """A reboot as a cluster sees one: the node goes away (kubelet, containerd and every
    container stop: ``RealNode.power_off``) long enough for the node lifecycle controller to
    mark it NotReady and taint it unreachable, NoExecute. Meanwhile the node says Rebooting,
    nothing fails and it keeps its place in the budget; once it is back with a new boot ID,
    its post-interrupt stage runs there and the rollout completes, the node uncordoned.
    The interrupt's pod dies with the machine: the reboot is judged by the boot ID alone."""
    kapi, node = cluster, real_node.name
    # Its post-interrupt runs after the reboot: a pod on the node that was just NotReady and
    # tainted.
    await _with_post_interrupt(real_node, tmp_path, "rb", "/var/tmp/after-reboot")
    # A machine goes down under a reboot before the command returns: the interrupt's pod
    # never reports an exit, and dies with everything else (power_off).
    reboot = _host(real_node, "/usr/local/sbin/reboot")
    reboot.write_text(reboot.read_text() + "exec sleep 600\n")
    await asyncio.to_thread(rig.start_node_lifecycle, grace_s=20)
    try:
        await asyncio.to_thread(services.fleet.start_all)
        rb = {
            "rb": {
                "version": "1.0.0",
                "image": "registry.example/rb",
                "interrupt": {"type": "reboot"},
            }
        }
        await manifests.apply(kapi, _cr("rb", rb))

        await _reboot_called(real_node)
        new_boot = await asyncio.to_thread(real_node.power_off)

        async def away() -> dict[str, Any] | Pending:
            raw = await kapi.get(f"{NODES}/{node}")
            ready = next(c for c in raw["status"]["conditions"] if c["type"] == "Ready")
            taints = {(t["key"], t["effect"]) for t in raw["spec"].get("taints") or []}
            if ready["status"] == "Unknown" and (
                ("node.kubernetes.io/unreachable", "NoExecute") in taints
            ):
                return raw
            return Pending(f"Ready={ready['status']}, taints {sorted(taints)}")

        await eventually(away, timeout_s=90, what="the node lifecycle controller to see it gone")
        await _reason(kapi, "rb", node, "Rebooting", "the node to say it reboots")
        await asyncio.sleep(10)  # a while away, as a machine takes to boot
        cr = await read_cr(kapi, "rb")
        detail = await _detail(kapi, "rb", node)
        assert detail is not None
        assert detail.reason == "Rebooting", detail
        assert cr.status.node_counts.failed == 0, cr.status.node_counts
        assert cr.status.node_counts.in_progress == 1, "it keeps its place in the budget"
        assert not (_host(real_node, "/var/tmp/after-reboot")).exists(), "not before it is back"

        await asyncio.to_thread(real_node.power_on, rig._spawn)
        await _wait_ready(kapi, "rb", "the rollout once the node is back", timeout_s=300)
        assert _host(real_node, "/var/tmp/after-reboot").read_text() == "ran\n", "post-interrupt"
        raw = await kapi.get(f"{NODES}/{node}")
        assert raw["status"]["nodeInfo"]["bootID"] == new_boot
        assert not raw["spec"].get("unschedulable"), "uncordoned"
        keys = {t["key"] for t in raw["spec"].get("taints") or []}
        assert "node.kubernetes.io/unreachable" not in keys, keys
    finally:
        rig.stop_component("node-lifecycle")


async def test_a_node_behind_the_runtime_required_taint_runs_workloads_only_once_validated(
    rig: Rig, cluster: Kube, services: Services, real_node: RealNode, tmp_path: Path
) -> None:
    """A node joins with the runtime-required taint (its provisioning adds it); a workload
    aimed at it waits unscheduled while NodeWright's own pods run there (they tolerate the
    taint), and once the node is validated the taint goes and kube-scheduler and the kubelet
    run the workload."""
    kapi, ns, node = cluster, services.namespace, real_node.name
    taint = {"key": progress.RUNTIME_REQUIRED_TAINT, "value": "true", "effect": "NoSchedule"}
    await kapi.patch(f"{NODES}/{node}", {"spec": {"taints": [taint]}})
    step = "#!/bin/sh\necho ran > /etc/gate.ran\nsleep 3\n"
    image = await _one_step(real_node, tmp_path, "gate", step)
    pods_path = path_of(plural="pods", namespace=ns)
    await wait_for_default_service_account(kapi, ns)
    await kapi.create(pods_path, _pod("workload", labels={}, command=[], image=PAUSE_IMAGE))

    async def held_by_the_taint() -> bool | Pending:
        status = (await kapi.get(f"{pods_path}/workload")).get("status") or {}
        said = [c.get("message", "") for c in status.get("conditions") or []]
        return any("untolerated taint" in m for m in said) or Pending(str(said))

    # Before NodeWright does anything (no cordon yet; the node's one taint is this one).
    await eventually(held_by_the_taint, timeout_s=60, what="the scheduler to find the taint")
    await asyncio.to_thread(services.fleet.start_all)
    package = {"version": "1.0.0", "image": image}
    await manifests.apply(kapi, _cr("gate", {"gate": package}, runtimeRequired=True))

    async def step_ran() -> bool:
        return _host(real_node, "/etc/gate.ran").exists()

    await eventually(step_ran, timeout_s=120, interval_s=0.2, what="the package's step")
    workload = await kapi.get(f"{pods_path}/workload")
    assert not workload["spec"].get("nodeName"), "the workload was scheduled onto the node"
    assert (workload.get("status") or {}).get("phase") == "Pending"
    await _wait_ready(kapi, "gate", "the node validated")
    taints = (await kapi.get(f"{NODES}/{node}"))["spec"].get("taints") or []
    assert all(t["key"] != progress.RUNTIME_REQUIRED_TAINT for t in taints), taints

    async def running() -> bool | Pending:
        phase = await _phase(kapi, ns, "workload")
        return phase == "Running" or Pending(phase)

    await eventually(running, timeout_s=90, interval_s=0.5, what="the workload to run")
    assert (await kapi.get(f"{pods_path}/workload"))["spec"]["nodeName"] == node


async def test_a_reboot_and_a_service_restart_of_two_packages_merge_into_one_reboot(
    rig: Rig, cluster: Kube, services: Services, real_node: RealNode, tmp_path: Any
) -> None:
    """Two packages on one node: one restarts containerd, the other reboots. Their interrupts
    run as one pod, and a reboot restarts every service, so the host sees one ``reboot`` and
    no ``systemctl restart``; once the boot ID changes, both packages' post-interrupt stages
    run and the rollout completes."""
    kapi = cluster
    for name in ("svc", "rb"):
        await _with_post_interrupt(real_node, tmp_path, name, f"/var/tmp/after-{name}")
    before = _recorded(real_node)
    await asyncio.to_thread(services.fleet.start_all)
    packages = {
        "svc": {
            "version": "1.0.0",
            "image": "registry.example/svc",
            "interrupt": {"type": "service", "services": ["containerd"]},
        },
        "rb": {"version": "1.0.0", "image": "registry.example/rb", "interrupt": {"type": "reboot"}},
    }
    await manifests.apply(kapi, _cr("both", packages))
    await _reboot_called(real_node)
    await asyncio.to_thread(real_node.simulate_reboot, rig._spawn)
    await _wait_ready(kapi, "both", "both packages after one reboot")
    calls = _recorded(real_node)[len(before) :]
    assert calls.count("reboot") == 1, calls
    assert "systemctl" not in calls, calls
    for name in ("svc", "rb"):
        assert _host(real_node, f"/var/tmp/after-{name}").read_text() == "ran\n", name


async def test_deleting_a_nodewright_uninstalls_its_package_through_a_reboot_then_it_is_gone(
    rig: Rig, cluster: Kube, services: Services, real_node: RealNode, tmp_path: Any
) -> None:
    """A package that needs a reboot, installed, then its NodeWright deleted: the finalizer
    holds it while the node runs the package's ``uninstall`` (removing what ``apply`` put on
    the host), its check, and the reboot again; the reboot counts once the boot ID changes,
    then the package is forgotten, the node uncordoned and the NodeWright gone."""
    kapi, node = cluster, real_node.name
    marker = "/var/tmp/rbu-installed"
    stages = {
        "apply": {
            "steps": [{"name": "put", "path": "put.sh"}],
            "check": [{"name": "there", "path": "there.sh"}],
        },
        "uninstall": {
            "steps": [{"name": "remove", "path": "remove.sh"}],
            "check": [{"name": "gone", "path": "gone.sh"}],
        },
    }
    steps = {
        "put.sh": f"#!/bin/sh\necho 1.0.0 > {marker}\n",
        "there.sh": f"#!/bin/sh\ntest -s {marker}\n",
        "remove.sh": f"#!/bin/sh\nrm -f {marker}\n",
        "gone.sh": f"#!/bin/sh\ntest ! -e {marker}\n",
    }
    pkg = _package(tmp_path, "rbu", "1.0.0", stages=stages, steps=steps)
    await _load(real_node, pkg, "registry.example/rbu:1.0.0", tmp_path)
    await asyncio.to_thread(services.fleet.start_all)
    before = _recorded(real_node).count("reboot")

    async def reboots(n: int) -> None:
        async def called() -> bool:
            return _recorded(real_node).count("reboot") - before >= n

        await eventually(called, timeout_s=180, what=f"reboot number {n} on the host")

    package = {
        "version": "1.0.0",
        "image": "registry.example/rbu",
        "interrupt": {"type": "reboot"},
        "uninstall": {"enabled": True},
    }
    await manifests.apply(kapi, _cr("rbu", {"rbu": package}))
    await reboots(1)
    await asyncio.to_thread(real_node.simulate_reboot, rig._spawn)
    await _wait_ready(kapi, "rbu", "the install through its reboot")
    assert _host(real_node, marker).read_text() == "1.0.0\n"

    await kapi.delete(f"{manifests.NODEWRIGHTS}/rbu")
    await reboots(2)
    assert not _host(real_node, marker).exists(), "uninstall ran before its reboot"
    held = await read_cr(kapi, "rbu")
    assert held.metadata.deletion_timestamp is not None, "the finalizer holds it meanwhile"
    await asyncio.to_thread(real_node.simulate_reboot, rig._spawn)

    async def gone() -> bool:
        try:
            await kapi.get(f"{manifests.NODEWRIGHTS}/rbu")
        except ApiError as exc:
            if exc.not_found:
                return True
            raise
        return False

    await eventually(gone, timeout_s=180, what="the NodeWright gone after its uninstall")
    raw = await kapi.get(f"{NODES}/{node}")
    assert not raw["spec"].get("unschedulable"), "uncordoned"
    rec = nodestate.read(raw, nodestate.EXECUTOR, "rbu", ExecutorRecord)
    assert rec is None or "rbu" not in rec.packages, rec
    assert _recorded(real_node).count("reboot") - before == 2
