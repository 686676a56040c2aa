"""A node relabelled out of a NodeWright's selector while it is being worked on.

Someone takes a node out of the pool mid-rollout (it is needed elsewhere, or it was labelled
by mistake): NodeWright must not leave it cordoned, nor hold a budget slot for it, and the
rest of the pool goes on."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nodewright import manifests
from nodewright.rig import nodes
from shared import api, nodestate, pods, podspec
from shared.kube import Kube, path_of
from tests.e2e.conftest import NODES, Services, cr_ready
from tests.helpers.waiting import Pending, eventually

pytestmark = pytest.mark.timeout(400)


def _cr() -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "NodeWright",
        "metadata": {"name": "rl"},
        "spec": {
            "nodeSelectors": {"matchLabels": {"nodepool": "rl"}},
            "interruptionBudget": {"count": 1},
            "packages": {"tuning": {"version": "1.0.0", "image": "registry.example/tuning"}},
        },
    }


async def test_a_node_relabelled_out_mid_stage_is_released_and_the_pool_goes_on(
    cluster: Kube, services: Services
) -> None:
    kapi = cluster
    names = await nodes.create_nodes(kapi, ["rl-0", "rl-1"], labels={"nodepool": "rl"})
    await nodes.wait_ready(kapi, names)
    for name in names:
        await kapi.patch(
            f"{NODES}/{name}", {"metadata": {"annotations": {podspec.SIM_STAGE_DURATION: "20s"}}}
        )
    await asyncio.to_thread(services.fleet.start_all)
    await manifests.apply(kapi, _cr())
    stage_pods = path_of(plural="pods", namespace=services.namespace)

    async def working() -> str | Pending:
        listed = await kapi.get(stage_pods, labelSelector=f"{pods.LABEL_CR}=rl")
        on = {pods.view(p).node for p in listed["items"]}
        for n in names:
            raw = await kapi.get(f"{NODES}/{n}")
            if raw["spec"].get("unschedulable") and n in on:
                return n
        return Pending(f"stage pods on {sorted(on)}")

    taken = await eventually(working, timeout_s=60, what="a node cordoned with its stage running")
    assert isinstance(taken, str)
    other = next(n for n in names if n != taken)
    await kapi.patch(f"{NODES}/{taken}", {"metadata": {"labels": {"nodepool": None}}})

    async def released() -> bool | Pending:
        raw = await kapi.get(f"{NODES}/{taken}")
        sel = nodestate.crs_with(raw, nodestate.SCHEDULER)
        listed = await kapi.get(stage_pods, labelSelector=f"{pods.LABEL_CR}=rl")
        left = [p["metadata"]["name"] for p in listed["items"] if pods.view(p).node == taken]
        if raw["spec"].get("unschedulable") or sel or left:
            return Pending(
                f"cordoned={raw['spec'].get('unschedulable')}, admitted by {sel}, pods {left}"
            )
        return True

    await eventually(released, timeout_s=90, interval_s=0.5, what="the relabelled node released")
    await eventually(lambda: cr_ready(kapi, "rl"), timeout_s=120, what="the rest of the pool")
    raw = await kapi.get(f"{NODES}/{other}")
    assert not raw["spec"].get("unschedulable")
