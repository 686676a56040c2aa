"""Pinned node writes (``shared.nodepins`` through ``shared.nodeshell.KubeNodes``) against the
real API server: a status write since the decision lets them land, a change of what the
decision read refuses them (422, read as a conflict), strings the API server compares byte
for byte pass, and a write the node would not validate is still an error."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shared import nodepins
from shared.informer import Informer, slim_node
from shared.kube import ApiError, Kube, path_of
from shared.nodeshell import KubeNodes

# What Go's encoding/json escapes (<, >, &, U+2028), writes raw (é) or as \u00xx (\x01).
AWKWARD = 'a<b>&c é \u2028 \x01 \t "q"'


@pytest.fixture
async def node(kapi: Kube) -> AsyncIterator[str]:
    """A node no kubelet or kwok manages: only this test writes its status."""
    name = f"pins-{uuid.uuid4().hex[:8]}"
    await kapi.create(
        path_of(plural="nodes"),
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"pins": "yes"},
                "annotations": {"example.com/awkward": AWKWARD, "example.com/gone": "1"},
            },
            "spec": {"taints": [{"key": "example.com/t", "effect": "NoSchedule"}]},
        },
    )
    await _set_ready(kapi, name, "True", boot="boot-1")
    yield name
    await kapi.delete_if_present(path_of(plural="nodes", name=name))


async def _set_ready(kapi: Kube, name: str, ready: str, *, boot: str = "boot-1") -> None:
    """What a kubelet or the status service does: a write of the node's status."""
    await kapi.patch(
        path_of(plural="nodes", name=name) + "/status",
        {
            "status": {
                "conditions": [
                    {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasMemory"},
                    {"type": "Ready", "status": ready, "reason": "KubeletReady"},
                ],
                "nodeInfo": {"bootID": boot},
            }
        },
        kind="strategic",
    )


async def _cached(kapi: Kube, name: str) -> dict[str, Any]:
    """The node as a service's cache holds it."""
    return slim_node(await kapi.get(path_of(plural="nodes", name=name)))


def _port(kapi: Kube) -> KubeNodes:
    informer = Informer(kapi, path_of(plural="nodes"), on_change=lambda old, new: None)
    return KubeNodes(kapi, informer)


def _cordon(version: str, value: str = "{}") -> dict[str, Any]:
    return {
        "metadata": {
            "resourceVersion": version,
            "annotations": {"nodewright.nvidia.com/drainer.t": value, "example.com/gone": None},
        },
        "spec": {"unschedulable": True},
    }


async def test_a_status_write_since_the_decision_lets_the_write_land(kapi: Kube, node: str) -> None:
    decided_on = await _cached(kapi, node)
    pins = nodepins.of(decided_on, status=False)
    assert pins is not None
    await _set_ready(kapi, node, "False")  # the drainer reads no status
    port = _port(kapi)
    version = str(decided_on["metadata"]["resourceVersion"])
    assert await port.patch(node, _cordon(version, AWKWARD), pins)
    now = await kapi.get(path_of(plural="nodes", name=node))
    annotations = now["metadata"]["annotations"]
    assert annotations["nodewright.nvidia.com/drainer.t"] == AWKWARD
    assert annotations["example.com/awkward"] == AWKWARD
    assert "example.com/gone" not in annotations
    assert now["spec"]["unschedulable"] is True
    assert port.get(node) is not None, "written through to the cache"
    # The same write with the resourceVersion as precondition is what it replaces: 409.
    with pytest.raises(ApiError) as refused:
        await kapi.patch(path_of(plural="nodes", name=node), _cordon(version))
    assert refused.value.conflict


async def test_a_change_of_what_the_decision_read_refuses_the_write(kapi: Kube, node: str) -> None:
    decided_on = await _cached(kapi, node)
    pins = nodepins.of(decided_on, status=True)
    assert pins is not None
    port = _port(kapi)
    version = str(decided_on["metadata"]["resourceVersion"])
    await _set_ready(kapi, node, "Unknown")  # the executor reads Ready
    assert not await port.patch(node, _cordon(version), pins)
    assert not await port.confirm(node, version, pins)
    await _set_ready(kapi, node, "True")
    assert await port.confirm(node, version, pins), "Ready as decided on again"
    await kapi.patch(
        path_of(plural="nodes", name=node),
        {"metadata": {"annotations": {"nodewright.nvidia.com/executor.t": "{}"}}},
    )
    assert not await port.confirm(node, version, pins)
    fresh = await _cached(kapi, node)
    fresh_pins = nodepins.of(fresh, status=True)
    assert fresh_pins is not None
    assert await port.patch(node, _cordon(str(fresh["metadata"]["resourceVersion"])), fresh_pins)


async def test_pins_the_api_server_refuses_without_a_change_fall_back_to_the_version(
    kapi: Kube, node: str
) -> None:
    """A refusal the node's resourceVersion does not explain (an API server comparing some
    string otherwise than ``nodepins.encode`` writes it) must not repeat forever: the next
    write of a decision on that same node carries the resourceVersion."""
    decided_on = await _cached(kapi, node)
    pins = nodepins.of(decided_on, status=False)
    assert pins is not None
    # Pins of a node the API server does not have (as a mis-encoded string would be).
    wrong = nodepins.of(
        {**decided_on, "metadata": {**decided_on["metadata"], "labels": {"pins": "no"}}},
        status=False,
    )
    assert wrong is not None
    port = _port(kapi)
    version = str(decided_on["metadata"]["resourceVersion"])
    assert not await port.patch(node, _cordon(version), wrong)
    assert await port.patch(node, _cordon(version), wrong), "the resourceVersion serves"
    now = await _cached(kapi, node)
    again = nodepins.of(now, status=False)
    assert again is not None
    assert await port.patch(node, _cordon(str(now["metadata"]["resourceVersion"]), "2"), again)


async def test_a_write_the_node_would_not_validate_is_an_error(kapi: Kube, node: str) -> None:
    decided_on = await _cached(kapi, node)
    pins = nodepins.of(decided_on, status=False)
    assert pins is not None
    body = {"spec": {"taints": [{"key": "example.com/t", "effect": "Sometimes"}]}}
    with pytest.raises(ApiError) as invalid:
        await _port(kapi).patch(node, body, pins)
    assert invalid.value.status == 422
    assert not invalid.value.patch_not_applicable
