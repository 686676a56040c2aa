"""The node metadata ConfigMap: its name, what it holds for a node and a NodeWright, when it
is rewritten, and how the stage and check pods mount it."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import msgspec
import pytest

from services.executor import metadata
from shared import api, nodestate, podspec, progress
from shared.podspec import PodRequest
from shared.records.executor import ExecutorRecord
from shared.records.scheduler import Selection
from tests.helpers.facts import T0, node, nodewright

CR = "gpu-node-tuning"
LONG_NODE = "ip-10-0-0-1." + "a" * 200 + ".compute.internal"
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


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


def _cm(obj: dict[str, Any] | None = None, **cr: Any) -> dict[str, Any]:
    return metadata.config_map(cr=nodewright(**cr), node=obj or _node(), namespace="nw")


def _stored(desired: dict[str, Any]) -> dict[str, Any]:
    """``desired`` as the API server returns it (with the fields it adds)."""
    stored = copy.deepcopy(desired)
    stored["metadata"].update(
        {"uid": "cm-uid", "resourceVersion": "42", "creationTimestamp": "2026-01-01T00:00:00Z"}
    )
    return stored


# ---- names ----------------------------------------------------------------------------------


def test_the_name_is_the_cr_and_node_with_a_hash_of_both() -> None:
    assert podspec.node_metadata_name(CR, "n1") == "gpu-node-tuning-n1-metadata-4db717d4b1"
    assert podspec.node_metadata_name(CR, LONG_NODE) == (
        "gpu-node-tuning-ip-10-0-0-1-aaaaaaaaaaaaaaa-metadata-426e8bfab2"
    )


@pytest.mark.parametrize(
    ("cr", "node_name"),
    [
        pytest.param(CR, "gpu-7.example.internal", id="dotted"),
        pytest.param(CR, LONG_NODE, id="253-long-node"),
        pytest.param("x" * 63, "y" * 253, id="longest-both"),
        pytest.param("a", "b", id="shortest"),
    ],
)
def test_names_are_valid_dns_labels_whatever_the_node_name(cr: str, node_name: str) -> None:
    name = podspec.node_metadata_name(cr, node_name)
    assert len(name) <= 63
    assert DNS_LABEL.fullmatch(name), name
    label = podspec.node_label(node_name)
    assert len(label) <= 63
    assert LABEL_VALUE.fullmatch(label), label


def test_names_of_nodes_sharing_a_long_prefix_differ() -> None:
    a, b = LONG_NODE + "-1", LONG_NODE + "-2"
    assert podspec.node_metadata_name(CR, a) != podspec.node_metadata_name(CR, b)
    assert podspec.node_label(a) != podspec.node_label(b)
    # Not the same as a package ConfigMap's name either (<cr>-<package>-<digest>).
    assert podspec.node_metadata_name(CR, "n1") != podspec.config_map_name(CR, "n1", "metadata")


def test_the_node_label_is_the_node_name_when_it_is_a_valid_label_value() -> None:
    assert podspec.node_label("gpu-7.example.internal") == "gpu-7.example.internal"
    assert podspec.node_label(LONG_NODE) == (
        "ip-10-0-0-1.aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-65dbe245d7"
    )


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

    assert metadata.document(cr, _node()) == {
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


def test_the_config_map_is_owned_by_the_node_and_labelled_for_its_cr_and_node() -> None:
    cm = _cm()
    text = cm["data"].pop("node.json")

    assert cm == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": podspec.node_metadata_name(CR, "gpu-7.example.internal"),
            "namespace": "nw",
            "labels": {
                "app.kubernetes.io/managed-by": "nodewright",
                "nodewright.nvidia.com/role": "node-metadata",
                "nodewright.nvidia.com/nodewright": CR,
                "nodewright.nvidia.com/node": "gpu-7.example.internal",
            },
            "annotations": {"nodewright.nvidia.com/node": "gpu-7.example.internal"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": "gpu-7.example.internal",
                    "uid": "node-uid-1",
                }
            ],
        },
        "data": {},
    }
    # One sorted, indented entry per line: readable, diffable, greppable without jq.
    assert (
        text
        == json.dumps(metadata.document(nodewright(), _node()), indent=2, sort_keys=True) + "\n"
    )
    assert '\n    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"' in text
    assert metadata.key_of(_stored(_cm())) == (CR, "gpu-7.example.internal")


def test_other_config_maps_are_not_node_metadata() -> None:
    package_cm = podspec.config_map(nodewright(), "nvidia-tuned", "d1", {"a": "1"}, "nw")
    assert metadata.key_of(package_cm) is None


# ---- when it is written ---------------------------------------------------------------------


def _with_records_changed() -> dict[str, Any]:
    """The node after the services wrote their records and the node reported status."""
    obj = _node(boot_id="boot-2", ready=False)
    ann = obj["metadata"]["annotations"]
    ann[nodestate.key(nodestate.EXECUTOR, CR)] = msgspec.json.encode(ExecutorRecord()).decode()
    ann[nodestate.key(nodestate.REQUESTS, CR)] = "{}"
    ann["sim.nodewright.nvidia.com/stage-duration"] = "1h"
    obj["metadata"]["resourceVersion"] = "99"
    return obj


def _relabelled() -> dict[str, Any]:
    obj = _node()
    obj["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-H100-80GB-HBM3"
    return obj


def _recreated() -> dict[str, Any]:
    obj = _node()
    obj["metadata"]["uid"] = "node-uid-2"
    return obj


def _annotated() -> dict[str, Any]:
    obj = _node()
    obj["metadata"]["annotations"]["example.com/rack"] = "r13"
    return obj


@pytest.mark.parametrize(
    ("now", "rewritten"),
    [
        pytest.param(_node, False, id="unchanged"),
        pytest.param(_with_records_changed, False, id="nodewright-records-and-status"),
        pytest.param(_relabelled, True, id="label-changed"),
        pytest.param(_annotated, True, id="foreign-annotation-changed"),
        pytest.param(_recreated, True, id="node-recreated-new-uid"),
    ],
)
def test_it_is_rewritten_only_when_its_content_differs(now: Any, rewritten: bool) -> None:
    current = _stored(_cm())
    desired = _cm(now())

    body = metadata.replacement(desired, current)

    if not rewritten:
        assert body is None
        return
    assert body is not None
    assert body["metadata"] == {**desired["metadata"], "resourceVersion": "42"}
    assert body["data"] == desired["data"]


@pytest.mark.parametrize(
    "now",
    [
        pytest.param(_with_records_changed, id="nodewright-records-and-status"),
        pytest.param(_relabelled, id="label-changed"),
        pytest.param(_annotated, id="foreign-annotation-changed"),
        pytest.param(_recreated, id="node-recreated-new-uid"),
    ],
)
def test_the_fingerprint_changes_exactly_when_the_config_map_would(now: Any) -> None:
    """The shell skips building the document while the fingerprint and the ConfigMap's
    resourceVersion are unchanged: it must change whenever the ConfigMap would."""
    cr = nodewright()
    before, after = _node(), now()
    differs = metadata.config_map(cr=cr, node=before, namespace="nw") != metadata.config_map(
        cr=cr, node=after, namespace="nw"
    )
    assert (metadata.fingerprint(cr, before) != metadata.fingerprint(cr, after)) == differs
    assert metadata.fingerprint(cr, before) == metadata.fingerprint(cr, _node())
    bumped = nodewright(packages={"nvidia-tuned": {"version": "1.0.0", "image": "ghcr.io/x"}})
    assert metadata.fingerprint(bumped, before) != metadata.fingerprint(cr, before)


def test_a_package_change_in_the_cr_rewrites_it() -> None:
    current = _stored(_cm())
    bumped = _cm(packages={"nvidia-tuned": {"version": "1.0.0", "image": "ghcr.io/x"}})
    body = metadata.replacement(bumped, current)
    assert body is not None
    assert json.loads(body["data"]["node.json"])["packages"] == {
        "nvidia-tuned": {"name": "nvidia-tuned", "version": "1.0.0", "image": "ghcr.io/x:1.0.0"}
    }


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda cm: cm["data"].update({"extra": "x"}), id="key-added"),
        pytest.param(lambda cm: cm.update({"binaryData": {"b": "eA=="}}), id="binary-data"),
        pytest.param(
            lambda cm: cm["metadata"]["labels"].pop("nodewright.nvidia.com/node"),
            id="label-removed",
        ),
        pytest.param(lambda cm: cm["metadata"].pop("ownerReferences"), id="owner-removed"),
        pytest.param(lambda cm: cm["metadata"]["annotations"].clear(), id="annotation-removed"),
    ],
)
def test_an_edit_by_someone_else_is_undone(edit: Any) -> None:
    desired = _cm()
    current = _stored(desired)
    edit(current)
    body = metadata.replacement(desired, current)
    assert body is not None
    assert body["data"] == desired["data"]
    assert "binaryData" not in body


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
        req, cr=cr, node="gpu-7.example.internal", node_annotations={}, settings=settings
    )


def _metadata_mount(pod: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    spec = pod["spec"]
    volumes = [v for v in spec["volumes"] if v["name"] == "node-metadata"]
    mounts = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "node-metadata"]
    return volumes, mounts


def test_stage_pods_mount_it_read_only_and_wait_for_it() -> None:
    name = podspec.node_metadata_name(CR, "gpu-7.example.internal")
    assert _metadata_mount(_pod("stage")) == (
        [{"name": "node-metadata", "configMap": {"name": name}}],
        [{"name": "node-metadata", "mountPath": "/nodewright-node-metadata", "readOnly": True}],
    )


def test_check_pods_mount_it_too_but_do_not_wait_for_it() -> None:
    name = podspec.node_metadata_name(CR, "gpu-7.example.internal")
    volumes, mounts = _metadata_mount(_pod("check"))
    assert volumes == [{"name": "node-metadata", "configMap": {"name": name, "optional": True}}]
    assert mounts[0]["mountPath"] == podspec.NODE_METADATA_MOUNT


def test_the_interrupt_pod_does_not_mount_it() -> None:
    assert _metadata_mount(_pod("interrupt")) == ([], [])
