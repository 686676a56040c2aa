"""The chart's optional image policy (values imagePolicy.*): a ValidatingAdmissionPolicy the
real API server enforces on NodeWrights, and its plain-manifest copy in deploy/policies."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodewright import manifests
from nodewright.rig import Rig
from shared import api
from shared.kube import ApiError, Kube, path_of
from tests.deploy.helm import CHART, render, template_error
from tests.helpers.waiting import eventually

PLAIN = CHART.parents[2] / "deploy" / "policies" / "package-images.yaml"
ADMISSION = "admissionregistration.k8s.io"
VAPS = path_of(group=ADMISSION, plural="validatingadmissionpolicies")
BINDINGS = path_of(group=ADMISSION, plural="validatingadmissionpolicybindings")
LABEL = "test.nodewright.nvidia.com/image-policy"
ALLOWED = "registry.example/allowed/"
DIGEST = "sha256:" + "a" * 64
POLICY_VALUES = (
    "--set",
    "imagePolicy.enabled=true",
    "--set-json",
    f'imagePolicy.allowedRegistries=["{ALLOWED}"]',
    "--set",
    "imagePolicy.requireDigest=true",
)


def _without_labels(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**d, "metadata": {"name": d["metadata"]["name"]}} for d in docs]


async def _policy_docs(*values: str, bin_dir: Path | None = None) -> list[dict[str, Any]]:
    return await render(*values, "-s", "templates/image-policy.yaml", bin_dir=bin_dir)


async def test_the_policy_is_off_by_default() -> None:
    kinds = {d["kind"] for d in await render()}
    assert "ValidatingAdmissionPolicy" not in kinds
    assert "ValidatingAdmissionPolicyBinding" not in kinds


async def test_the_chart_inlines_the_values_into_the_policy() -> None:
    policy, binding = await _policy_docs(
        "--set",
        "imagePolicy.enabled=true",
        "--set-json",
        'imagePolicy.allowedRegistries=["ghcr.io/nvidia/","my.registry:5000/a\\"b/"]',
        "--set-json",
        'imagePolicy.validationActions=["Warn","Audit"]',
    )
    assert [policy["kind"], binding["kind"]] == [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert variables["allowedPrefixes"] == '["ghcr.io/nvidia/","my.registry:5000/a\\"b/"]'
    assert variables["requireDigest"] == "false"
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Warn", "Audit"],
    }


async def test_the_chart_refuses_a_policy_that_restricts_nothing_or_a_bad_prefix() -> None:
    err = await template_error("--set", "imagePolicy.enabled=true")
    assert (
        "imagePolicy.enabled needs imagePolicy.allowedRegistries, imagePolicy.requireDigest or both"
    ) in err
    bad = ("--set", "imagePolicy.enabled=true", "--set-json", "imagePolicy.allowedRegistries=[5]")
    # values.schema.json refuses it first; without the schema the template still does.
    err = await template_error(*bad)
    assert "- at '/imagePolicy/allowedRegistries/0': got number, want string" in err
    err = await template_error("--skip-schema-validation", *bad)
    assert (
        "imagePolicy.allowedRegistries: 5 is not a string "
        '(an image prefix such as "ghcr.io/nvidia/")'
    ) in err


async def test_the_plain_manifest_is_the_chart_policy_with_its_example_values() -> None:
    rendered = await _policy_docs(
        "--set",
        "imagePolicy.enabled=true",
        "--set-json",
        'imagePolicy.allowedRegistries=["ghcr.io/nvidia/"]',
    )
    plain = [d for d in yaml.safe_load_all(PLAIN.read_text()) if d]
    assert _without_labels(plain) == _without_labels(rendered)


@dataclass(frozen=True)
class Installed:
    """The rendered policy and binding, installed under unique names."""

    kube: Kube
    policy: str
    binding: str
    label: str
    """Value of :data:`LABEL` that the binding selects: only this test's NodeWrights."""

    def nodewright(
        self, name: str, packages: dict[str, Any], *, selected: bool = True
    ) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": f"{name}-{self.label}"}
        if selected:
            metadata["labels"] = {LABEL: self.label}
        return {
            "apiVersion": api.API_VERSION,
            "kind": "NodeWright",
            "metadata": metadata,
            "spec": {"packages": packages},
        }

    def denial(self, manifest: dict[str, Any], message: str) -> str:
        """The API server's whole message when this policy refuses ``manifest``."""
        return (
            f'nodewrights.nodewright.nvidia.com "{manifest["metadata"]["name"]}" is forbidden: '
            f"ValidatingAdmissionPolicy '{self.policy}' with binding '{self.binding}' "
            f"denied request: {message}"
        )


@pytest.fixture
async def installed(rig: Rig, kapi: Kube) -> AsyncIterator[Installed]:
    """The chart's policy (prefix :data:`ALLOWED`, digest required) and binding, created for
    real on the rig's API server. The binding selects only NodeWrights labelled with this
    test's :data:`LABEL` value, so the cluster-wide policy never meets another test's objects,
    not even in the moments after its deletion; both are deleted afterwards, with every
    NodeWright made here."""
    await manifests.install_crds(kapi)
    policy, binding = await _policy_docs(*POLICY_VALUES, bin_dir=rig.bin_dir)
    suffix = uuid.uuid4().hex[:10]
    policy["metadata"]["name"] = f"{policy['metadata']['name']}-{suffix}"
    binding["metadata"]["name"] = f"{binding['metadata']['name']}-{suffix}"
    binding["spec"]["policyName"] = policy["metadata"]["name"]
    binding["spec"]["matchResources"] = {"objectSelector": {"matchLabels": {LABEL: suffix}}}
    made = Installed(kapi, policy["metadata"]["name"], binding["metadata"]["name"], suffix)
    try:
        await kapi.create(VAPS, policy)
        await kapi.create(BINDINGS, binding)
        yield made
    finally:
        await kapi.delete_if_present(f"{BINDINGS}/{made.binding}")
        await kapi.delete_if_present(f"{VAPS}/{made.policy}")
        found = await kapi.get(manifests.NODEWRIGHTS)
        for item in found["items"]:
            if item["metadata"]["name"].endswith(f"-{suffix}"):
                await kapi.delete_if_present(f"{manifests.NODEWRIGHTS}/{item['metadata']['name']}")


def _package(image: str, *, digest: str | None = None) -> dict[str, Any]:
    package = {"version": "1.0.0", "image": image}
    if digest:
        package["digest"] = digest
    return package


async def _refusal(kube: Kube, manifest: dict[str, Any], *, dry_run: bool = False) -> str:
    """The API server's message refusing ``manifest``; "" when it accepts it."""
    try:
        if dry_run:
            await kube.create(manifests.NODEWRIGHTS, manifest, dryRun="All")
        else:
            await kube.create(manifests.NODEWRIGHTS, manifest)
    except ApiError as exc:
        if exc.status != 403:  # refused for another reason than a policy
            raise
        return exc.message
    return ""


async def _in_force(p: Installed) -> None:
    """Wait until the API server enforces the policy (it loads and compiles it
    asynchronously). A dry run: it creates nothing while the policy is not in force yet."""
    probe = p.nodewright("probe", {"x": _package("elsewhere.example/x", digest=DIGEST)})
    await eventually(
        lambda: _refusal(p.kube, probe, dry_run=True), timeout_s=60, what="the policy in force"
    )


async def test_an_allowed_pinned_image_is_accepted_and_others_refused_naming_the_package(
    installed: Installed,
) -> None:
    p = installed
    await _in_force(p)

    off_registry = p.nodewright(
        "off-registry",
        {
            "good": _package(f"{ALLOWED}good", digest=DIGEST),
            "tools": _package("evil.example/allowed/tools", digest=DIGEST),
        },
    )
    assert await _refusal(p.kube, off_registry) == p.denial(
        off_registry,
        "spec.packages[tools].image: evil.example/allowed/tools is not under an allowed prefix "
        f"(allowed: {ALLOWED})",
    )

    # A prefix is a string prefix: end it with "/" ("registry.example/allowed-not/" is not in).
    sibling = p.nodewright("sibling", {"s": _package(ALLOWED[:-1] + "-not/s", digest=DIGEST)})
    assert await _refusal(p.kube, sibling) == p.denial(
        sibling,
        "spec.packages[s].image: registry.example/allowed-not/s is not under an allowed prefix "
        f"(allowed: {ALLOWED})",
    )

    tag_only = p.nodewright("tag-only", {"tuned": _package(f"{ALLOWED}tuned")})
    assert await _refusal(p.kube, tag_only) == p.denial(
        tag_only,
        f"spec.packages[tuned].digest: required (image {ALLOWED}tuned:1.0.0 is not pinned "
        "by digest)",
    )

    good = p.nodewright(
        "good",
        {
            "tuned": _package(f"{ALLOWED}tuned", digest=DIGEST),
            "driver": _package(f"{ALLOWED}nested/driver", digest="sha512:" + "b" * 128),
        },
    )
    assert await _refusal(p.kube, good) == ""
    stored = await p.kube.get(f"{manifests.NODEWRIGHTS}/{good['metadata']['name']}")
    assert stored["spec"]["packages"]["tuned"]["digest"] == DIGEST


async def test_updates_are_checked_only_for_the_packages_they_add_or_repoint(
    installed: Installed,
) -> None:
    p = installed
    await _in_force(p)
    # Admitted while the binding did not select it (as a NodeWright from before the policy).
    older = p.nodewright("older", {"legacy": _package("old.example/legacy")}, selected=False)
    assert await _refusal(p.kube, older) == ""
    path = f"{manifests.NODEWRIGHTS}/{older['metadata']['name']}"

    # Updates that leave its packages alone pass: labels (now selected), finalizers, pause.
    await p.kube.patch(path, {"metadata": {"labels": {LABEL: p.label}, "finalizers": ["x/y"]}})
    pause = {"metadata": {"finalizers": None, "annotations": {api.PAUSE_ANNOTATION: "true"}}}
    await p.kube.patch(path, pause)

    # Repointing the old package, or bumping its version, is checked ...
    for change, message in (
        (
            {"image": "old.example/other"},
            "spec.packages[legacy].image: old.example/other is not under an allowed prefix "
            f"(allowed: {ALLOWED})",
        ),
        (
            {"version": "1.0.1"},
            "spec.packages[legacy].image: old.example/legacy is not under an allowed prefix "
            f"(allowed: {ALLOWED})",
        ),
    ):
        with pytest.raises(ApiError) as refused:
            await p.kube.patch(path, {"spec": {"packages": {"legacy": change}}})
        assert refused.value.status == 403
        assert refused.value.message == p.denial(older, message)

    # ... and so is a package it adds, alone.
    with pytest.raises(ApiError) as refused:
        await p.kube.patch(path, {"spec": {"packages": {"new": _package(f"{ALLOWED}new")}}})
    assert refused.value.message == p.denial(
        older,
        f"spec.packages[new].digest: required (image {ALLOWED}new:1.0.0 is not pinned by digest)",
    )
    added = await p.kube.patch(
        path, {"spec": {"packages": {"new": _package(f"{ALLOWED}new", digest=DIGEST)}}}
    )
    assert sorted(added["spec"]["packages"]) == ["legacy", "new"]
