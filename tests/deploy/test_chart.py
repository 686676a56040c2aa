"""The Helm chart lints, renders, is accepted by the real API server, and configures each
service only with settings that service knows."""

from __future__ import annotations

import importlib

import pytest

from nodewright import manifests
from nodewright.rig import Rig
from shared import api, config
from shared.kube import Kube
from tests.deploy.helm import CHART, render, run, server_dry_run, template
from tests.helpers.waiting import eventually

SERVICES = ("scheduler", "drainer", "executor", "validator", "status")


async def test_the_chart_lints(rig: Rig) -> None:
    out = await run(str(rig.bin_dir / "helm"), "lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in out


async def test_the_chart_renders_every_service_with_its_own_account(rig: Rig) -> None:
    docs = await render(bin_dir=rig.bin_dir)
    kinds: dict[str, list[str]] = {}
    for d in docs:
        kinds.setdefault(d["kind"], []).append(d["metadata"]["name"])
    assert sorted(kinds["Deployment"]) == sorted(f"nodewright-{s}" for s in SERVICES)
    assert sorted(kinds["ServiceAccount"]) == sorted(f"nodewright-{s}" for s in SERVICES)
    assert kinds["ValidatingWebhookConfiguration"] == ["nodewright-validator"]
    assert len(kinds["PodDisruptionBudget"]) == 5
    for d in docs:
        if d["kind"] == "Deployment":
            pod = d["spec"]["template"]["spec"]
            assert pod["serviceAccountName"] == d["metadata"]["name"]
            assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("service", SERVICES)
async def test_every_setting_the_chart_sets_is_one_the_service_knows(
    rig: Rig, service: str
) -> None:
    docs = await render(bin_dir=rig.bin_dir)
    (deployment,) = [
        d
        for d in docs
        if d["kind"] == "Deployment" and d["metadata"]["name"] == f"nodewright-{service}"
    ]
    env = {
        e["name"]: e.get("value", "from-field")
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    settings_type = importlib.import_module(f"services.{service}.config").Settings
    settings = config.load(settings_type, env)  # raises on an unknown or invalid variable
    assert settings.namespace == "nodewright-system"


async def test_the_rendered_chart_is_accepted_by_the_api_server(rig: Rig, kapi: Kube) -> None:
    await manifests.ensure_namespace(kapi, "nodewright-system")
    text = await template("--include-crds", bin_dir=rig.bin_dir)
    out = await run(
        str(rig.bin_dir / "kubectl"),
        "--kubeconfig",
        str(rig.endpoints.kubeconfig),
        "apply",
        "--dry-run=server",
        "-f",
        "-",
        stdin=text,
    )
    assert "deployment.apps/nodewright-executor created (server dry run)" in out
    assert "validatingwebhookconfiguration.admissionregistration.k8s.io/nodewright-validator" in out


async def test_the_optional_pieces_are_accepted_by_the_api_server(rig: Rig, kapi: Kube) -> None:
    await manifests.ensure_namespace(kapi, "nodewright-system")
    text = await template(
        "--set",
        "imagePolicy.enabled=true",
        "--set-json",
        'imagePolicy.allowedRegistries=["ghcr.io/nvidia/"]',
        "--set",
        "dashboards.enabled=true",
        "-s",
        "templates/image-policy.yaml",
        "-s",
        "templates/dashboards.yaml",
        bin_dir=rig.bin_dir,
    )
    applied = await server_dry_run(rig.bin_dir, rig.endpoints.kubeconfig, text)
    assert applied == [
        "configmap/nodewright-dashboards serverside-applied (server dry run)",
        "validatingadmissionpolicy.admissionregistration.k8s.io/nodewright-package-images "
        "serverside-applied (server dry run)",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/nodewright-package-images "
        "serverside-applied (server dry run)",
    ]


@pytest.mark.parametrize("service", ["executor", "validator"])
async def test_package_staging_host_root_and_pull_secrets_reach_the_services_that_build_pods(
    rig: Rig, service: str
) -> None:
    docs = await render(
        "--set", "packageStaging=copy",
        "--set", "hostRoot=/srv/host",
        "--set", "packageImagePullSecrets[0].name=regcred",
        "--set", "packageImagePullSecrets[1].name=nvcr.io",
        bin_dir=rig.bin_dir,
    )  # fmt: skip
    (deployment,) = [
        d
        for d in docs
        if d["kind"] == "Deployment" and d["metadata"]["name"] == f"nodewright-{service}"
    ]
    env = {
        e["name"]: e.get("value", "from-field")
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    settings = config.load(importlib.import_module(f"services.{service}.config").Settings, env)
    assert settings.pods.package_staging == "copy"
    assert settings.pods.host_root == "/srv/host"
    assert settings.pods.image_pull_secrets == "regcred,nvcr.io"


async def test_the_web_page_is_a_service_of_the_status_pods_and_can_be_turned_off(
    rig: Rig,
) -> None:
    docs = await render(bin_dir=rig.bin_dir)
    (ui,) = [
        d
        for d in docs
        if d["kind"] == "Service" and d["metadata"]["name"] == "nodewright-status-ui"
    ]
    (status,) = [
        d
        for d in docs
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "nodewright-status"
    ]
    pod = status["spec"]["template"]
    assert ui["spec"]["type"] == "ClusterIP"
    assert ui["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http"}]
    assert all(pod["metadata"]["labels"][k] == v for k, v in ui["spec"]["selector"].items())
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert (env["NODEWRIGHT_STATUS_UI"], env["NODEWRIGHT_STATUS_VERBOSE_EVENTS"]) == (
        "true",
        "false",
    )
    off = await render(
        "--set", "ui.enabled=false", "--set", "events.verbose=true", bin_dir=rig.bin_dir
    )
    assert not [d for d in off if d["metadata"]["name"] == "nodewright-status-ui"]
    (status,) = [
        d for d in off if d["kind"] == "Deployment" and d["metadata"]["name"] == "nodewright-status"
    ]
    env = {
        e["name"]: e.get("value")
        for e in status["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert (env["NODEWRIGHT_STATUS_UI"], env["NODEWRIGHT_STATUS_VERBOSE_EVENTS"]) == (
        "false",
        "true",
    )


RBAC = "rbac.authorization.k8s.io"
GROUP = api.GROUP


async def _allowed(kapi: Kube, user: str, verb: str, resource: str, group: str) -> bool:
    review = await kapi.create(
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "resourceAttributes": {"group": group, "resource": resource, "verb": verb},
            },
        },
    )
    return bool(review.get("status", {}).get("allowed"))


async def test_people_read_with_view_and_the_viewer_role_and_write_with_edit_and_the_editor(
    rig: Rig, kapi: Kube
) -> None:
    """The user ClusterRoles, applied to the real API server: the built-in view, edit and
    admin roles take them in (the controller-manager's aggregation), and neither grants what
    the services' own roles do (Nodes)."""
    roles = [d for d in await render(bin_dir=rig.bin_dir) if d["kind"] == "ClusterRole"]
    mine = {
        d["metadata"]["name"]: d
        for d in roles
        if d["metadata"]["name"] in ("nw-viewer", "nw-editor")
    }
    assert set(mine) == {"nw-viewer", "nw-editor"}
    off = await render("--set", "userRoles.enabled=false", bin_dir=rig.bin_dir)
    assert not [d for d in off if d["metadata"]["name"] in mine]
    bound = {"nw-test-viewer": "view", "nw-test-editor": "nw-editor", "nw-test-admin": "admin"}
    made: list[str] = []
    try:
        for role in mine.values():
            await kapi.create(f"/apis/{RBAC}/v1/clusterroles", role)
            made.append(f"/apis/{RBAC}/v1/clusterroles/{role['metadata']['name']}")
        for user, role_name in bound.items():
            await kapi.create(
                f"/apis/{RBAC}/v1/clusterrolebindings",
                {
                    "metadata": {"name": user},
                    "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": role_name},
                    "subjects": [{"apiGroup": RBAC, "kind": "User", "name": user}],
                },
            )
            made.append(f"/apis/{RBAC}/v1/clusterrolebindings/{user}")

        async def aggregated() -> bool:
            return await _allowed(kapi, "nw-test-viewer", "list", "nodewrights", GROUP) and (
                await _allowed(kapi, "nw-test-admin", "delete", "deploymentpolicies", GROUP)
            )

        await eventually(aggregated, timeout_s=60, what="view and admin to take the roles in")
        expected = {
            ("nw-test-viewer", "watch", "deploymentpolicies", GROUP): True,
            ("nw-test-viewer", "create", "nodewrights", GROUP): False,
            ("nw-test-editor", "create", "nodewrights", GROUP): True,
            ("nw-test-editor", "update", "deploymentpolicies", GROUP): True,
            ("nw-test-editor", "patch", "nodes", ""): False,
            ("nw-test-editor", "update", "nodewrights/status", GROUP): False,
        }
        seen = {case: await _allowed(kapi, *case) for case in expected}
        assert seen == expected
    finally:
        for path in reversed(made):
            await kapi.delete_if_present(path)
