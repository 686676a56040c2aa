"""The services' node caches keep what they read and drop what they do not: the slimmed
node gives every service the same answers as the whole one."""

from __future__ import annotations

import copy
import json
from typing import Any

import msgspec

from services.status import service as status_service
from shared import nodemetadata, nodestate, progress
from shared.informer import LAST_APPLIED, slim_node
from shared.records.drainer import DrainRecord
from shared.records.scheduler import Selection
from tests.helpers.facts import T0, node, nodewright

CR = "gpu-node-tuning"  # the NodeWright of tests.helpers.facts.node's records


def _kubelet_node() -> dict[str, Any]:
    """A GPU node as a kubelet reports it: tens of images, capacities, addresses."""
    raw = node(
        "gpu-07",
        labels={"nvidia.com/gpu.present": "true"},
        records={
            nodestate.SCHEDULER: Selection(
                generation=1,
                compartment="default",
                batch=1,
                selected_at=T0,
                disruptive=True,
                target="t",
            ),
            nodestate.DRAINER: DrainRecord(phase="cordoned", cordoned=True, started=T0, since=T0),
        },
        taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
    )
    raw["metadata"]["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}] * 6
    raw["metadata"]["annotations"][LAST_APPLIED] = json.dumps({"metadata": {"labels": {}}})
    raw["metadata"]["annotations"]["team"] = "ml-infra"
    raw["metadata"]["uid"] = "0b5c2a4e"
    raw["status"].update(
        {
            "capacity": {"cpu": "96", "memory": "1056335012Ki", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "95", "memory": "1055000000Ki", "nvidia.com/gpu": "8"},
            "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "images": [
                {
                    "names": [f"nvcr.io/nvidia/image-{i}@sha256:{'a' * 64}", f"image-{i}:24.{i}"],
                    "sizeBytes": 10_000_000_000 + i,
                }
                for i in range(40)
            ],
            "volumesInUse": [f"kubernetes.io/csi/driver^vol-{i}" for i in range(8)],
        }
    )
    raw["status"]["nodeInfo"].update(
        {"kernelVersion": "6.8.0-45-generic", "osImage": "Ubuntu 24.04", "kubeletVersion": "v1.34"}
    )
    return raw


def test_a_slim_node_answers_every_service_as_the_whole_one() -> None:
    whole = _kubelet_node()
    slim = slim_node(copy.deepcopy(whole))
    assert progress.facts(slim, CR) == progress.facts(whole, CR), "the scheduler, drainer, ..."
    unapplied = copy.deepcopy(whole)
    del unapplied["metadata"]["annotations"][LAST_APPLIED]  # read by nobody
    assert status_service._signature(slim) == status_service._signature(unapplied)
    cr = nodewright()
    assert nodemetadata.document(cr, slim) == nodemetadata.document(cr, whole), "what packages see"
    assert slim["spec"] == whole["spec"]
    assert slim["metadata"]["labels"] == whole["metadata"]["labels"]
    kept = dict(whole["metadata"]["annotations"])
    del kept[LAST_APPLIED]
    assert slim["metadata"]["annotations"] == kept
    # What goes: the image list, capacities and managedFields, most of a real node.
    before, after = len(msgspec.json.encode(whole)), len(msgspec.json.encode(slim))
    assert after < before / 4, (before, after)


def test_a_node_without_status_or_annotations_is_kept_as_it_is() -> None:
    bare = {"metadata": {"name": "n"}, "spec": {}}
    assert slim_node(copy.deepcopy(bare)) == bare
