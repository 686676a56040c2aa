"""The generated CRDs: in sync with the models, structural, documented, valid CEL (no I/O)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from nodewright import crdgen
from shared import api
from tests.api import crds

CRDS = {c["spec"]["names"]["kind"]: c for c in crds.crd_manifests()}


def _schema(kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = CRDS[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _nodes(s: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, s
    for name, child in s.get("properties", {}).items():
        yield from _nodes(child, f"{path}.{name}")
    if "items" in s:
        yield from _nodes(s["items"], f"{path}[]")
    if isinstance(s.get("additionalProperties"), dict):
        yield from _nodes(s["additionalProperties"], f"{path}[*]")


ALL_NODES = [(kind, path, node) for kind in CRDS for path, node in _nodes(_schema(kind))]


def test_committed_files_match_the_models() -> None:
    assert crdgen.main(["--check"]) == 0, "run: python -m nodewright.crdgen"


def test_the_drift_check_fails_when_a_committed_file_differs(tmp_path: Path) -> None:
    for rel in crdgen.expected_files():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(crdgen.REPO / rel, tmp_path / rel)
    assert crdgen.main(["--check", "--root", str(tmp_path)]) == 0
    crd = tmp_path / crdgen.CRD_DIR / "nodewright.nvidia.com_nodewrights.yaml"
    crd.write_text(crd.read_text().replace("default: 200", "default: 100"))
    assert crdgen.main(["--check", "--root", str(tmp_path)]) == 1


def test_generation_follows_a_changed_model() -> None:
    """A field added to a model shows up in the schema (so the drift test sees it)."""

    class Probe(api.Budget, frozen=True, kw_only=True):
        extra_nodes: int = 3
        """Documented."""

    info = msgspec.inspect.type_info(Probe)
    assert isinstance(info, msgspec.inspect.StructType)
    schema = crdgen._struct_schema(info)
    assert schema["properties"]["extraNodes"] == {
        "description": "Documented.",
        "type": "integer",
        "default": 3,
    }


def test_an_undocumented_field_is_refused() -> None:
    class Undocumented(api.Budget, frozen=True, kw_only=True):
        silent: int = 0

    info = msgspec.inspect.type_info(Undocumented)
    assert isinstance(info, msgspec.inspect.StructType)
    with pytest.raises(crdgen.ModelError, match="silent has no docstring"):
        crdgen._struct_schema(info)


@pytest.mark.parametrize(
    ("kind", "path", "node"), ALL_NODES, ids=[f"{k}{p}" for k, p, _ in ALL_NODES]
)
def test_every_field_is_structural_and_documented(
    kind: str, path: str, node: dict[str, Any]
) -> None:
    assert not {"$ref", "anyOf", "oneOf", "allOf", "nullable", "not"} & node.keys()
    if path.count(".") >= 1 and path != ".metadata" and not path.endswith(("[]", "[*]")):
        assert node.get("description"), f"{kind}{path} has no description for kubectl explain"
    if node.get("x-kubernetes-int-or-string"):
        assert "type" not in node
    elif path != "":
        assert node.get("type") in {"object", "array", "string", "integer", "boolean"}
    if node.get("type") == "object" and path != ".metadata":
        assert "properties" in node or "additionalProperties" in node


CEL_RULES = [
    (kind, path, rule)
    for kind, path, node in ALL_NODES
    for rule in node.get("x-kubernetes-validations", ())
]


@pytest.mark.parametrize(
    ("kind", "path", "rule"), CEL_RULES, ids=[f"{k}{p}:{r['rule'][:30]}" for k, p, r in CEL_RULES]
)
def test_every_cel_rule_has_a_message_and_valid_regexes(
    kind: str, path: str, rule: dict[str, Any]
) -> None:
    assert rule["message"]
    for pattern in re.findall(r"r'([^']*)'", rule["rule"]):
        re.compile(pattern)


def test_scalar_defaults_come_from_the_models() -> None:
    spec = _schema("NodeWright")["properties"]["spec"]["properties"]
    assert spec["priority"]["default"] == 200
    assert spec["sequencing"]["default"] == "node"
    assert spec["stageTimeoutSeconds"]["default"] == 1800
    assert spec["drain"]["default"] == {}
    assert spec["drain"]["properties"]["unmanagedPods"]["default"] == "Block"
    # "Unset" fields get no default: their absence is the meaning.
    assert "default" not in spec["interruptionBudget"]
    assert "default" not in spec["packages"]["additionalProperties"]["properties"]["digest"]
    rollout = _schema("DeploymentPolicy")["properties"]["spec"]["properties"]["default"]
    assert rollout["properties"]["batchSuccessPercent"]["default"] == 100
    assert "default" not in rollout["properties"]["stopAfterConsecutiveFailedBatches"]


def test_the_crds_are_cluster_scoped_with_status_columns_and_short_names() -> None:
    nw, dp = CRDS["NodeWright"]["spec"], CRDS["DeploymentPolicy"]["spec"]
    for spec in (nw, dp):
        assert spec["group"] == api.GROUP
        assert spec["scope"] == "Cluster"
        assert spec["names"]["categories"] == ["nodewright-all"]
        # A category named like a resource would shadow it in kubectl.
        assert not {"nodewright", "nodewrights", "nw", "dp"} & set(spec["names"]["categories"])
        version = spec["versions"][0]
        assert version["name"] == api.VERSION
        assert version["subresources"] == {"status": {}}
    assert nw["names"]["shortNames"] == ["nw"]
    assert dp["names"]["shortNames"] == ["dp"]
    columns = {c["name"]: c["jsonPath"] for c in nw["versions"][0]["additionalPrinterColumns"]}
    assert columns["Status"] == ".status.state"
    assert columns["Complete"] == ".status.completeNodes"
    assert columns["Packages"] == ".status.packageList"
    assert columns["Policy"] == ".spec.deploymentPolicy"
    assert columns["Age"] == ".metadata.creationTimestamp"


def test_status_carries_a_ready_condition_list_keyed_by_type() -> None:
    status = _schema("NodeWright")["properties"]["status"]["properties"]
    conditions = status["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert set(conditions["items"]["required"]) == {
        "type",
        "status",
        "lastTransitionTime",
        "reason",
    }
    assert status["nodeDetails"]["maxItems"] == api.MAX_NODE_DETAILS


def test_the_docs_reference_lists_every_spec_field() -> None:
    text = (crdgen.REPO / crdgen.DOCS).read_text()
    for kind in CRDS:
        for path, node in _nodes(_schema(kind)["properties"]["spec"], "spec"):
            if path == "spec" or path.endswith(("[]", "[*]")):
                continue  # list items and map values are documented with their field
            assert f"`{path}`" in text.replace("[name]", "[*]"), path
            assert node.get("description")


def test_webhook_manifest_is_generated() -> None:
    doc = yaml.safe_load((crdgen.REPO / crdgen.WEBHOOK_MANIFEST).read_text())
    assert [w["failurePolicy"] for w in doc["webhooks"]] == ["Fail", "Fail"]
    assert all(w["timeoutSeconds"] <= 10 for w in doc["webhooks"])
