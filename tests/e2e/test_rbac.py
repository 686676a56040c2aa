"""The services need no more than the Helm chart's RBAC grants: a rollout with a drain, a readiness
taint, the admission webhook and Kubernetes Events, every service running as its own
ServiceAccount."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nodewright import manifests
from nodewright.rig import nodes
from shared import api, pods, progress
from shared.kube import ApiError, Kube, path_of
from tests.e2e.conftest import NODES, Services, read_cr
from tests.helpers.waiting import eventually

# End-to-end runs take minutes on 2 cores; the suite-wide 120 s limit is for unit tests.
pytestmark = pytest.mark.timeout(600)

TAINT = {"key": progress.RUNTIME_REQUIRED_TAINT, "value": "true", "effect": "NoSchedule"}


def _cr(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "NodeWright",
        "metadata": {"name": name},
        "spec": {
            "nodeSelectors": {"matchLabels": {"nodepool": "gpu"}},
            "interruptionBudget": {"count": 2},
            "packages": {"tuning": {"version": "1.0.0", "image": "registry.example/tuning"}},
            **spec,
        },
    }


async def test_a_rollout_works_with_least_privilege_service_accounts(
    cluster: Kube, services: Services
) -> None:
    kapi = cluster
    names = await nodes.create_nodes(
        kapi, [f"gpu-{i}" for i in range(4)], labels={"nodepool": "gpu"}, taints=[TAINT]
    )
    await nodes.wait_ready(kapi, names)
    ns = services.namespace
    # A pod the drainer has to evict (a ReplicaSet-owned pod would be recreated; a bare pod
    # is enough with unmanagedPods: Evict).
    await kapi.create(
        path_of(plural="pods", namespace=ns),
        {
            "metadata": {"name": "workload"},
            "spec": {
                "nodeName": "gpu-0",
                "tolerations": [{"key": TAINT["key"], "operator": "Exists"}],
                "containers": [{"name": "w", "image": "registry.example/w:1"}],
            },
        },
    )
    services.fleet.rbac = True
    await asyncio.to_thread(services.fleet.start_all)

    # The webhook, registered by the validator under its own account, judges CRs.
    with pytest.raises(ApiError) as denied:
        await manifests.apply(
            kapi,
            _cr(
                "cycle",
                packages={
                    "a": {"version": "1.0.0", "image": "r/a", "dependsOn": {"b": "1.0.0"}},
                    "b": {"version": "1.0.0", "image": "r/b", "dependsOn": {"a": "1.0.0"}},
                },
            ),
        )
    assert "dependsOn" in denied.value.message

    package = {"version": "1.0.0", "image": "registry.example/tuning", "configMap": {"a": "1"}}
    await manifests.apply(
        kapi,
        _cr(
            "least",
            runtimeRequired=True,
            drain={"unmanagedPods": "Evict"},
            packages={"tuning": package},
        ),
    )

    async def finished() -> bool:
        obj = await read_cr(kapi, "least")
        ready = any(c.type == "Ready" and c.status == "True" for c in obj.status.conditions)
        listed = await kapi.get(NODES, labelSelector="nodepool=gpu")
        untainted = all(
            not any(t.get("key") == TAINT["key"] for t in (n.get("spec") or {}).get("taints") or [])
            for n in listed["items"]
        )
        # The status service's node condition (nodes/status) says the node is complete.
        conditions = all(
            any(
                c.get("type") == "nodewright.nvidia.com/least" and c.get("status") == "True"
                for c in (n.get("status") or {}).get("conditions") or []
            )
            for n in listed["items"]
        )
        return ready and untainted and conditions

    await eventually(
        finished, timeout_s=180, interval_s=1, what="Ready, taints lifted, node conditions True"
    )
    evicted = await kapi.get(
        path_of(plural="pods", namespace=ns), fieldSelector="metadata.name=workload"
    )
    assert not [p for p in evicted["items"] if not p["metadata"].get("deletionTimestamp")]
    events = await kapi.get(path_of(plural="events", namespace="default"))
    assert any(e.get("reason") == "RolloutComplete" for e in events["items"]), (
        "the status service wrote Events with its own account"
    )

    # A configuration change: the executor deletes the ConfigMap of the old one.
    first = await _config_maps(kapi, ns)
    assert len(first) == 1
    await kapi.patch(
        f"{manifests.NODEWRIGHTS}/least",
        {"spec": {"packages": {"tuning": {"configMap": {"a": "2"}}}}},
    )

    async def swept() -> bool:
        left = await _config_maps(kapi, ns)
        return len(left) == 1 and not left & first

    await eventually(swept, timeout_s=180, interval_s=1, what="the old ConfigMap to go")
    services.fleet.check_alive()


async def _config_maps(kapi: Kube, namespace: str) -> set[str]:
    listed = await kapi.get(
        path_of(plural="configmaps", namespace=namespace),
        labelSelector=f"{pods.LABEL_CR}=least",
    )
    return {i["metadata"]["name"] for i in listed.get("items") or ()}
