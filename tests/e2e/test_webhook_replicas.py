"""Every validator replica serves the one endpoint the webhook configuration names: none
rewrites it to point at itself, and losing any replica leaves admission working (with
failurePolicy Fail, a configuration pointing at a dead replica refuses every NodeWright)."""

from __future__ import annotations

import asyncio

import pytest

from nodewright import manifests
from shared.kube import ApiError, Kube, path_of
from tests.e2e.conftest import Services
from tests.e2e.test_rollout import _small_cr
from tests.helpers.waiting import Pending, eventually

pytestmark = pytest.mark.timeout(300)

VWC = path_of(
    group="admissionregistration.k8s.io",
    plural="validatingwebhookconfigurations",
    name="nodewright-validator",
)


async def test_two_validators_register_one_endpoint_and_either_can_go(
    cluster: Kube, services: Services
) -> None:
    kapi = cluster
    fleet = services.fleet
    await asyncio.to_thread(fleet.start, "validator", count=2)
    first = await kapi.get(VWC)
    urls = {h["clientConfig"]["url"] for h in first["webhooks"]}
    assert len(urls) == 2, urls  # the NodeWright and DeploymentPolicy paths
    assert len({u.rsplit("/", 1)[0] for u in urls}) == 1, "one endpoint"
    await asyncio.sleep(3)
    again = await kapi.get(VWC)
    assert again["metadata"]["generation"] == first["metadata"]["generation"] == 1, (
        "a replica rewrote the configuration"
    )
    for index in (1, 0):
        survivor = 1 - index
        fleet.kill("validator", index)
        cr = _small_cr(f"after-validator-{index}-went", {"count": 1})

        async def admitted(cr: dict[str, object] = cr) -> bool | Pending:
            try:
                await manifests.apply(kapi, cr)
            except ApiError as exc:
                return Pending(str(exc))
            return True

        await eventually(admitted, timeout_s=20, what=f"admission by validator-{survivor}")
        if index == 1:
            # Start it again, so the second round kills the other one.
            await asyncio.to_thread(fleet.start, "validator")
    final = await kapi.get(VWC)
    assert final["metadata"]["generation"] == 1
