"""Issue 15: the executor's and the validator's pod caches keep a NodeWright pod slimmed
(``shared.pods.slim``). Every reading the services make of a cached pod (its parts, its view,
a delete's preconditions, its key, the ConfigMaps it mounts) must be the same for the
slimmed pod as for the whole one a kubelet reports, in every state a pod goes through."""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from services.executor import service as executor_service
from shared import nodemetadata, pods
from shared.controller import PodIndex
from shared.decisions import PodRef
from tests.shared.test_segments import SETTINGS, Node, _at, _ts, with_interrupt

IMAGE = "ghcr.io/nvidia/nodewright-packages/nvidia-tuned"


def _deep_size(obj: Any, seen: set[int] | None = None) -> int:
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(_deep_size(k, seen) + _deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, list):
        size += sum(_deep_size(v, seen) for v in obj)
    return size


def _as_the_api_server_sends_it(pod: dict[str, Any]) -> dict[str, Any]:
    """What the harness's pod lacks of one a kubelet reported: managedFields, the pod's
    conditions, addresses and QoS, and per container its IDs, readiness and restarts."""
    full = copy.deepcopy(pod)
    meta = full["metadata"]
    meta.setdefault("uid", "0b5f2c1e-uid")
    meta.setdefault("resourceVersion", "4711")
    meta["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}] * 3
    spec = full["spec"]
    spec.setdefault("nodeName", "n1")
    spec["tolerations"] = [{"operator": "Exists"}]
    status = full.setdefault("status", {})
    status.update(
        {
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": _ts(_at(0))}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
            "hostIP": "10.0.0.7",
            "podIP": "10.0.0.7",
            "podIPs": [{"ip": "10.0.0.7"}],
            "qosClass": "BestEffort",
            "startTime": _ts(_at(0)),
        }
    )
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or ():
            cs.update(
                {
                    "containerID": "containerd://" + "ab" * 32,
                    "imageID": IMAGE + "@sha256:" + "cd" * 32,
                    "lastState": {},
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                }
            )
            cs.setdefault("image", "registry.example/agent:1")
    return full


def _readings(pod: dict[str, Any]) -> tuple[Any, ...]:
    return (
        pods.parts(pod),
        pods.view(pod),
        PodRef.of(pod),
        PodIndex.key_of_pod(pod),
        executor_service._mounted_config_maps([pod]),
    )


def _states() -> list[tuple[str, Callable[[Node], None]]]:
    def failing_pull(n: Node) -> None:
        pod = n.the_pod()
        name = pod["spec"]["initContainers"][0]["name"]
        pod["status"] = {
            "phase": "Pending",
            "initContainerStatuses": [
                {
                    "name": name,
                    "image": "registry.example/agent:1",
                    "state": {
                        "waiting": {
                            "reason": "ErrImagePull",
                            "message": f'failed to pull and unpack image "{IMAGE}:0.9.0": '
                            "not found",
                        }
                    },
                }
            ],
        }

    def failed_with_a_result(n: Node) -> None:
        n.progress(7, at=_at(10))
        result = {
            "schema": pods.AGENT_RESULT_SCHEMA,
            "error": "step 'boom' (boom.sh) exited with code 7",
            "failed_step": "boom",
            "tail": ["one", "two"],
        }
        state = n.the_pod()["status"]["initContainerStatuses"][0]["state"]
        state["terminated"]["message"] = json.dumps(result)

    def stopping(n: Node) -> None:
        n.progress(None, at=_at(10))
        n.the_pod()["spec"]["activeDeadlineSeconds"] = 1

    def deleting(n: Node) -> None:
        n.progress(0, 0, 0, 0, at=_at(40))
        n.the_pod()["metadata"]["deletionTimestamp"] = _ts(_at(41))

    return [
        ("just created", lambda n: None),
        ("its image not pulled", failing_pull),
        ("its first stage running", lambda n: n.progress(None, at=_at(10))),
        ("its first check running", lambda n: n.progress(0, None, at=_at(10))),
        ("its second stage running", lambda n: n.progress(0, 0, None, at=_at(20))),
        ("its first stage failed", failed_with_a_result),
        ("its check failed", lambda n: n.progress(0, 3, at=_at(20))),
        ("done", lambda n: n.progress(0, 0, 0, 0, at=_at(40))),
        ("stopped by the executor", stopping),
        ("being deleted", deleting),
    ]


@pytest.mark.parametrize("staging", ["image-volume", "copy"])
@pytest.mark.parametrize(("state", "make"), _states(), ids=[s for s, _ in _states()])
def test_a_slimmed_stage_pod_reads_as_the_whole_one(
    staging: str, state: str, make: Callable[[Node], None]
) -> None:
    n = Node(settings=replace(SETTINGS, package_staging=staging))  # type: ignore[arg-type]
    n.run_executor(_at(0))
    make(n)
    full = _as_the_api_server_sends_it(n.the_pod())
    assert _readings(pods.slim(full)) == _readings(full), state
    assert pods.slim(pods.slim(full)) == pods.slim(full)


def test_a_slimmed_interrupt_pod_reads_as_the_whole_one() -> None:
    n = Node(cr=with_interrupt())
    n.run(_at(0))
    n.progress(0, 0, 0, 0, at=_at(40))
    n.run(_at(40))
    (interrupt,) = (
        p for p in n.pods.values() if p["metadata"]["labels"][pods.LABEL_ROLE] == "interrupt"
    )
    interrupt["status"] = {
        "phase": "Running",
        "containerStatuses": [{"name": pods.STAGE_CONTAINER, "state": {"running": {}}}],
    }
    full = _as_the_api_server_sends_it(interrupt)
    assert _readings(pods.slim(full)) == _readings(full)


def test_a_pod_mounting_a_config_map_keeps_its_name() -> None:
    """The executor's sweep keeps the package ConfigMaps a cached pod still mounts."""
    n = Node()
    n.run_executor(_at(0))
    full = _as_the_api_server_sends_it(n.the_pod())
    full["spec"]["volumes"].append({"name": "cfg", "configMap": {"name": "gpu-tuning-config"}})
    assert executor_service._mounted_config_maps([pods.slim(full)]) == {"gpu-tuning-config"}


def test_the_cache_keeps_a_fraction_of_a_stage_pod_and_neither_document_nor_managed_fields() -> (
    None
):
    """A stage pod of the 100-node benchmark (kwok's status) was 33.7 KB of Python objects
    whole and 9.1 KB slimmed; this one, without kwok's fields, 25 and 8.3."""
    n = Node()
    n.run_executor(_at(0))
    n.progress(0, 0, None, at=_at(20))
    full = _as_the_api_server_sends_it(n.the_pod())
    full["metadata"]["annotations"][nodemetadata.ANNOTATION] = json.dumps(
        {"labels": {f"feature.node.kubernetes.io/cpu-{i}": "true" for i in range(60)}}
    )
    slim = pods.slim(full)
    assert nodemetadata.ANNOTATION not in slim["metadata"]["annotations"]
    assert "managedFields" not in slim["metadata"]
    assert slim["metadata"]["annotations"][pods.ANN_VERSION] == "0.9.0"
    assert _deep_size(slim) * 5 <= _deep_size(full) * 2, (_deep_size(slim), _deep_size(full))
