"""Regression guard for issue 15: how many times the five services write a Node per node
of a small rollout, counted by their own request counters (never timed). The ceiling is
documented in docs/metrics.md ("Writes per node"); lower it as the writes come down, never
raise it without saying why there."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from bench.rollout import service_requests
from nodewright import manifests
from nodewright.rig import nodes
from shared import pods
from shared.kube import Kube, path_of
from tests.e2e.conftest import Services, cr_ready
from tests.e2e.test_rollout import _small_cr
from tests.helpers.waiting import eventually

pytestmark = pytest.mark.timeout(600)

NODES = 10
NODE_WRITES_PER_NODE_CEILING = 10.0
"""Node PATCHes/PUTs (nodes and nodes/status) by all five services, per node of a one-package
rollout until its last pod is deleted (docs/metrics.md)."""


def _node_writes(counts: dict[str, Counter[str]]) -> dict[str, int]:
    return {
        service: sum(
            v
            for key, v in c.items()
            if key.split(" ")[0] in ("PATCH", "PUT")
            and key.split(" ")[1] in ("nodes", "nodes/status")
        )
        for service, c in sorted(counts.items())
    }


async def _rollout(kapi: Kube, services: Services, cr: dict[str, Any]) -> dict[str, Counter[str]]:
    """Roll ``cr`` out on NODES new nodes until its last pod is deleted; the requests each
    service made meanwhile, by verb and resource."""
    names = await nodes.create_nodes(
        kapi, [f"gpu-{i:02d}" for i in range(NODES)], labels={"nodepool": "gpu"}
    )
    await nodes.wait_ready(kapi, names)
    await asyncio.to_thread(services.fleet.start_all)
    before = service_requests(services.fleet)
    name = cr["metadata"]["name"]
    await manifests.apply(kapi, cr)
    await eventually(lambda: cr_ready(kapi, name), timeout_s=300, interval_s=1, what="Ready")

    async def pods_cleaned_up() -> bool:
        # The finished pods go MIN_POD_AGE_S after they started: their deletes (and any
        # Node write they ask for) belong to the rollout's count.
        listed = await kapi.get(
            path_of(plural="pods", namespace=services.namespace),
            labelSelector=f"{pods.LABEL_MANAGED}={pods.MANAGED_BY}",
        )
        return not listed["items"]

    await eventually(pods_cleaned_up, timeout_s=120, interval_s=1, what="pods deleted")
    await asyncio.sleep(3)  # the status service's last pass
    after = service_requests(services.fleet)
    spent = {s: after[s] - before.get(s, Counter()) for s in after}
    for service in sorted(spent):
        print(service, dict(spent[service].most_common()))
    return spent


async def test_a_small_rollout_writes_each_node_at_most_the_documented_number_of_times(
    cluster: Kube, services: Services
) -> None:
    by_service = _node_writes(
        await _rollout(cluster, services, _small_cr("writes", {"percent": 30}))
    )
    per_node = sum(by_service.values()) / NODES
    print(f"Node writes per node: {per_node:.1f} (by service: {by_service})")
    assert per_node <= NODE_WRITES_PER_NODE_CEILING, by_service
    assert per_node >= 4, "cordon, two records and uncordon at the least: is anything counted?"


async def test_a_package_configmap_is_created_once_not_once_per_pod(
    cluster: Kube, services: Services
) -> None:
    """Every stage pod of a package with a ``configMap`` mounts the same ConfigMap; the
    executor creates it once, instead of a POST answered 409 for each pod of each node
    (issue 15). The validator, which judges the checks in those pods, creates and deletes
    nothing."""
    cr = _small_cr("configured", {"percent": 30})
    cr["spec"]["packages"]["tuning"]["configMap"] = {"tuning.conf": "level=3\n"}
    spent = await _rollout(cluster, services, cr)
    creates = {s: c["POST configmaps"] for s, c in spent.items() if c["POST configmaps"]}
    assert spent["executor"]["POST pods"] == NODES, "one pod runs apply and config"
    # Once, or once per node of the first batch whose pods raced the first create (a worker
    # each) before the cache held it: never once per pod.
    assert set(creates) == {"executor"}, creates
    assert 1 <= creates["executor"] <= 3, creates
    writes = ("POST", "PUT", "PATCH", "DELETE")
    validator = {k: v for k, v in spent["validator"].items() if k.split(" ")[0] in writes}
    assert set(validator) <= {"PATCH nodes"}, validator
