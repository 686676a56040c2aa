"""The node's metadata a package's pods see: what ``node.json`` holds for a node and a
NodeWright, and how the stage pods carry it (an annotation of their own, mounted
with the downward API)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from shared import api, nodemetadata, nodestate, podspec, progress
from shared.podspec import PodRequest
from shared.records.executor import ExecutorRecord
from shared.records.scheduler import Selection
from tests.helpers.facts import T0, node, nodewright

CR = "gpu-node-tuning"


def _node(**kw: Any) -> dict[str, Any]:
    """A GPU node with user annotations, NodeWright's own records and look-alikes."""
    record = Selection(
        generation=1, compartment="default", batch=1, selected_at=T0, disruptive=True, target="t"
    )
    obj = node(
        "gpu-7.example.internal",
        labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
        records={nodestate.SCHEDULER: record},
        **kw,
    )
    obj["metadata"]["uid"] = "node-uid-1"
    obj["metadata"]["annotations"].update(
        {
            "example.com/rack": "r12",
            "notnodewright.nvidia.com/kept": "yes",  # not NodeWright's domain
            "nodewright.nvidia.com/ignore-reason": "mine",
            "readiness.validator.nodewright.nvidia.com/auto-tainted": CR,
            "sim.nodewright.nvidia.com/stage-duration": "5s",
            "kubectl.kubernetes.io/last-applied-configuration": '{"huge": true}',
        }
    )
    return obj


# ---- content --------------------------------------------------------------------------------


def test_the_document_has_the_labels_the_foreign_annotations_and_every_package() -> None:
    cr = nodewright(
        packages={
            "nvidia-tuned": {"version": "0.9.0", "image": "ghcr.io/nvidia/nvidia-tuned"},
            "driver": {
                "version": "v2.1",
                "image": "registry.example:5000/driver",
                "digest": "sha256:" + "a" * 64,
            },
        }
    )

    assert nodemetadata.document(cr, _node()) == {
        "name": "gpu-7.example.internal",
        "labels": {"nodepool": "gpu", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
        "annotations": {"example.com/rack": "r12", "notnodewright.nvidia.com/kept": "yes"},
        "nodewright": CR,
        "packages": {
            "driver": {
                "name": "driver",
                "version": "v2.1",
                "image": "registry.example:5000/driver@sha256:" + "a" * 64,
            },
            "nvidia-tuned": {
                "name": "nvidia-tuned",
                "version": "0.9.0",
                "image": "ghcr.io/nvidia/nvidia-tuned:0.9.0",
            },
        },
    }


def test_the_text_is_the_document_sorted_and_indented_with_a_final_newline() -> None:
    text = nodemetadata.text(nodewright(), _node())
    # One sorted, indented entry per line: readable, diffable, greppable without jq.
    assert (
        text
        == json.dumps(nodemetadata.document(nodewright(), _node()), indent=2, sort_keys=True) + "\n"
    )
    assert '\n    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"' in text


def test_nodewright_records_and_node_status_do_not_change_it() -> None:
    """A pod made after the services wrote their records says the same as one made before."""
    changed = _node(boot_id="boot-2", ready=False)
    ann = changed["metadata"]["annotations"]
    ann[nodestate.key(nodestate.EXECUTOR, CR)] = msgspec.json.encode(ExecutorRecord()).decode()
    ann[nodestate.key(nodestate.REQUESTS, CR)] = "{}"
    ann["sim.nodewright.nvidia.com/stage-duration"] = "1h"
    changed["metadata"]["resourceVersion"] = "99"
    assert nodemetadata.text(nodewright(), changed) == nodemetadata.text(nodewright(), _node())


# ---- the pods -------------------------------------------------------------------------------


def _pod(role: str, stage: str = "apply") -> dict[str, Any]:
    cr = nodewright()
    settings = podspec.PodSettings(namespace="nw", agent_image="registry.example/agent:1")
    if role == "interrupt":
        req = PodRequest(
            role="interrupt",
            package="",
            stage="interrupt",
            version="i1",
            attempt=1,
            interrupt=msgspec.convert({"type": "reboot"}, api.Interrupt),
            name="p",
        )
        return podspec.interrupt_pod(
            req, cr=cr, node="gpu-7.example.internal", node_annotations={}, settings=settings
        )
    d = progress.desired(cr)["nvidia-tuned"]
    req = PodRequest(
        role="stage" if role == "stage" else "check",
        package=d.name,
        stage=stage,
        version=d.version,
        attempt=1,
        image=d.image,
        desired=d,
        name="p",
    )
    return podspec.stage_pod(
        req,
        cr=cr,
        node="gpu-7.example.internal",
        node_annotations={},
        settings=settings,
        node_metadata=nodemetadata.text(cr, _node()),
    )


def _metadata_mount(pod: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    spec = pod["spec"]
    volumes = [v for v in spec["volumes"] if v["name"] == "node-metadata"]
    mounts = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "node-metadata"]
    return volumes, mounts


@pytest.mark.parametrize("role", ["stage", "check"])
def test_stage_and_check_pods_carry_it_and_mount_it_read_only(role: str) -> None:
    """The pod's own annotation, presented as ``node.json`` by the downward API: nothing to
    create before the pod, and nothing the pod could start without."""
    pod = _pod(role)
    text = pod["metadata"]["annotations"][nodemetadata.ANNOTATION]
    assert json.loads(text) == nodemetadata.document(nodewright(), _node())
    item = {
        "path": "node.json",
        "fieldRef": {"fieldPath": f"metadata.annotations['{nodemetadata.ANNOTATION}']"},
    }
    assert _metadata_mount(pod) == (
        [{"name": "node-metadata", "downwardAPI": {"items": [item]}}],
        [{"name": "node-metadata", "mountPath": "/nodewright-node-metadata", "readOnly": True}],
    )
    assert not any(
        "configMap" in v and "metadata" in v["configMap"]["name"] for v in pod["spec"]["volumes"]
    )


@pytest.mark.parametrize("role", ["stage", "interrupt"])
def test_stage_and_interrupt_pods_run_in_the_hosts_process_and_network_namespaces(
    role: str,
) -> None:
    """A step's `sysctl -w net.*`, iptables or `ip link` changes the node, not a network
    namespace of the pod's own (tests/e2e/realnode checks it on a real kubelet)."""
    spec = _pod(role)["spec"]
    assert (spec["hostPID"], spec["hostNetwork"]) == (True, True)


def test_the_interrupt_pod_does_not_mount_it() -> None:
    pod = _pod("interrupt")
    assert _metadata_mount(pod) == ([], [])
    assert nodemetadata.ANNOTATION not in pod["metadata"]["annotations"]


def test_a_node_with_annotations_too_large_for_a_pod_gets_the_document_without_them() -> None:
    """The API server refuses a pod whose annotations exceed 256 KiB; a node's own may come
    close. The stage must still run: the node's annotations are left out, and said so."""
    big = _node()
    big["metadata"]["annotations"]["example.com/blob"] = "x" * (200 * 1024)
    said = nodemetadata.text(nodewright(), big)
    doc = json.loads(said)
    assert len(said.encode()) <= nodemetadata.MAX_TEXT
    assert doc["annotations"] == {}
    assert doc["annotationsOmitted"] is True
    assert doc["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert "annotationsOmitted" not in json.loads(nodemetadata.text(nodewright(), _node()))
