"""The CR models: decoding, encoding, versions and the strategies' validity (no I/O)."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings, strategies as st

from services.validator import admission
from shared import api
from tests.api import crds, strategies

EXAMPLE: dict[str, Any] = {
    "apiVersion": "nodewright.nvidia.com/v1alpha1",
    "kind": "NodeWright",
    "metadata": {"name": "gpu-node-tuning"},
    "spec": {
        "nodeSelectors": {"matchLabels": {"nodepool": "gpu"}},
        "interruptionBudget": {"percent": 33},
        "podNonInterruptLabels": {"matchLabels": {"workload": "long-running-training"}},
        "packages": {
            "nvidia-tuned": {
                "version": "0.9.0",
                "image": "ghcr.io/nvidia/nodewright-packages/nvidia-tuned",
            }
        },
    },
}


def test_the_announcement_example_is_a_sample_unchanged() -> None:
    found = dict(crds.samples())
    assert found["nodewright-gpu-node-tuning.yaml"] == EXAMPLE


def test_the_announcement_example_decodes_with_defaults_filled_in() -> None:
    nw = api.from_dict(EXAMPLE, api.NodeWright)
    assert nw.spec.interruption_budget == api.Budget(percent=33)
    assert nw.spec.packages["nvidia-tuned"].version == "0.9.0"
    assert nw.spec.priority == 200
    assert nw.spec.drain.unmanaged_pods == "Block"
    assert not nw.spec.drain.only_for_interrupts
    assert nw.status.complete_nodes == "0/0"


@pytest.mark.parametrize(("name", "manifest"), crds.samples(), ids=[n for n, _ in crds.samples()])
def test_every_sample_decodes_and_round_trips(name: str, manifest: dict[str, Any]) -> None:
    if manifest["kind"] == "NodeWright":
        _round_trips(manifest, api.NodeWright)
    else:
        _round_trips(manifest, api.DeploymentPolicy)


def _round_trips(manifest: dict[str, Any], kind: type[api.Resource]) -> None:
    obj = api.from_dict(manifest, kind)
    assert api.decode(api.encode(obj), kind) == obj
    assert api.from_dict(api.to_dict(obj), kind) == obj


def test_encoding_leaves_defaults_out_but_keeps_apiversion_and_kind() -> None:
    nw = api.NodeWright(
        metadata=api.ObjectMeta(name="x"),
        spec=api.NodeWrightSpec(packages={"a": api.Package(version="1", image="r/a")}),
    )
    out = api.to_dict(nw)
    assert out["apiVersion"] == api.API_VERSION
    assert out["kind"] == "NodeWright"
    assert out["spec"]["packages"] == {"a": {"version": "1", "image": "r/a"}}
    assert "priority" not in out["spec"]
    assert "interruptionBudget" not in out["spec"]


def test_wire_names_are_camel_case() -> None:
    window = api.MaintenanceWindow(start="01:00", end="02:00", time_zone="UTC", days=["Mon"])
    assert api.to_dict(window) == {"start": "01:00", "end": "02:00", "days": ["Mon"]}
    rollout = api.Rollout(
        budget=api.Budget(count=1),
        batch_success_percent=90,
        stop_after_consecutive_failed_batches=2,
    )
    assert api.to_dict(rollout) == {
        "budget": {"count": 1},
        "batchSuccessPercent": 90,
        "stopAfterConsecutiveFailedBatches": 2,
    }


def test_pause_and_disable_are_read_from_annotations() -> None:
    meta = api.ObjectMeta(
        name="x", annotations={api.PAUSE_ANNOTATION: "true", api.DISABLE_ANNOTATION: "false"}
    )
    nw = api.NodeWright(metadata=meta, spec=api.from_dict(EXAMPLE["spec"], api.NodeWrightSpec))
    assert nw.paused
    assert not nw.disabled


def _with(path: list[str | int], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(EXAMPLE)
    target: Any = doc
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return doc


PKG = ["spec", "packages", "nvidia-tuned"]


@pytest.mark.parametrize(
    ("path", "value", "where"),
    [
        pytest.param([*PKG, "version"], "latest", "$.spec.packages[...].version", id="version"),
        pytest.param([*PKG, "version"], "1.02", "$.spec.packages[...].version", id="leading-0"),
        pytest.param([*PKG, "image"], "ghcr.io/a/b:1.0", "$.spec.packages[...].image", id="tag"),
        pytest.param([*PKG, "digest"], "sha256:abc", "$.spec.packages[...].digest", id="digest"),
        pytest.param(["spec", "priority"], 0, "$.spec.priority", id="priority"),
        pytest.param(["spec", "interruptionBudget"], {"percent": 0}, "percent", id="percent"),
        pytest.param(["spec", "sequencing"], "some", "$.spec.sequencing", id="sequencing"),
        pytest.param(["spec", "packages"], {}, "$.spec.packages", id="no-packages"),
    ],
)
def test_decoding_rejects_what_the_crd_rejects(
    path: list[str | int], value: Any, where: str
) -> None:
    with pytest.raises(msgspec.ValidationError, match=r"at `\$") as err:
        api.from_dict(_with(path, value), api.NodeWright)
    assert where.split("[...]")[0].removeprefix("$.") in str(err.value)


@pytest.mark.parametrize(
    "image",
    [
        "ghcr.io/nvidia/nodewright-packages/nvidia-tuned",
        "registry.local:5000/org/name",
        "localhost:5000/name",
        "busybox",
        "a/b__c/d-e.f",
        "10.0.0.1:443/x",
    ],
)
def test_image_references_without_tag_are_accepted(image: str) -> None:
    nw = api.from_dict(_with([*PKG, "image"], image), api.NodeWright)
    assert [p.image for p in nw.spec.packages.values()] == [image]


@pytest.mark.parametrize(
    "image",
    ["ghcr.io/a/b:1.0", "ghcr.io/a/b@sha256:00", "Ghcr.io/A/B", "a//b", "-a/b", "a/b/", ""],
)
def test_image_references_with_tag_digest_or_bad_syntax_are_refused(image: str) -> None:
    with pytest.raises(msgspec.ValidationError):
        api.from_dict(_with([*PKG, "image"], image), api.NodeWright)


@pytest.mark.parametrize(
    ("lower", "higher"),
    [
        ("1", "1.0.1"),
        ("1.2", "v1.10"),
        ("1.0.0-rc.1", "1.0.0"),
        ("1.0.0-rc.2", "1.0.0-rc.10"),
        ("1.0.0-1", "1.0.0-alpha"),
        ("1.0.0-alpha", "1.0.0-alpha.1"),
        ("2024.7.1", "2024.12.0"),
    ],
)
def test_versions_order_by_semver_precedence(lower: str, higher: str) -> None:
    assert api.parse_version(lower) < api.parse_version(higher)


def test_missing_version_parts_count_as_zero() -> None:
    assert api.parse_version("v1") == api.parse_version("1.0.0")


@pytest.mark.parametrize("bad", ["", "v", "1.", "01", "1.2.3.4", "1.0.0+build", "x1", "1.0\n"])
def test_parse_version_refuses_non_versions(bad: str) -> None:
    with pytest.raises(ValueError, match="not a version"):
        api.parse_version(bad)


@pytest.mark.parametrize(
    ("key", "valid"),
    [
        ("nodepool", True),
        ("example.com/pool", True),
        ("a.b-c.d/x_y.z", True),
        ("x" * 63, True),
        ("x" * 64, False),
        ("example.com/" + "x" * 64, False),
        ("Example.com/x", False),
        ("/x", False),
        ("a/", False),
        ("a/b/c", False),
        ("-x", False),
        ("pool\n", False),
    ],
)
def test_label_keys_are_qualified_names(key: str, valid: bool) -> None:
    assert api.is_qualified_name(key) is valid


@settings(max_examples=60, deadline=None)
@given(spec=strategies.nodewright_specs(policies=["p1", "p2"]))
def test_generated_nodewright_specs_round_trip_and_pass_admission(spec: api.NodeWrightSpec) -> None:
    nw = api.NodeWright(metadata=api.ObjectMeta(name="x"), spec=spec)
    # Decoding checks every constraint the models carry (patterns, ranges, enums).
    assert api.decode(api.encode(nw), api.NodeWright) == nw
    verdict = admission.review_nodewright(
        operation="CREATE",
        old=None,
        new=nw,
        existing_policies=frozenset({"p1", "p2"}),
        inventory={},
    )
    assert verdict.allowed, verdict.message


@settings(max_examples=60, deadline=None)
@given(spec=strategies.deployment_policy_specs())
def test_generated_policy_specs_round_trip_and_pass_admission(
    spec: api.DeploymentPolicySpec,
) -> None:
    dp = api.DeploymentPolicy(metadata=api.ObjectMeta(name="x"), spec=spec)
    assert api.decode(api.encode(dp), api.DeploymentPolicy) == dp
    verdict = admission.review_deployment_policy(
        operation="CREATE", old=None, new=dp, referenced_by=[]
    )
    assert verdict.allowed, verdict.message


@given(st.data())
def test_status_round_trips(data: st.DataObject) -> None:
    status = api.NodeWrightStatus(
        observed_generation=data.draw(st.integers(0, 10)),
        state=data.draw(st.sampled_from(["Complete", "Stopped"])),
        complete_nodes="3/5",
        package_list="a:1",
        packages=[api.PackageStatus(name="a", version="1", present_nodes=3)],
        compartments=[
            api.CompartmentStatus(name="__default__", batch=api.BatchState(stopped=True))
        ],
        node_details=[api.NodeDetail(node="n1", state="Failed", reason="StageFailed")],
    )
    assert api.decode(api.encode(status), api.NodeWrightStatus) == status
