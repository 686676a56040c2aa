"""The Helm chart lints, renders, is accepted by the real API server, and configures each
service only with settings that service knows."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from nodewright import manifests
from nodewright.rig import Rig
from services import __main__ as one_process
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


ONE_PROCESS = ("--set", "layout=oneProcess", "--set", "nats.auth.secretName=nw-nats")


def _named(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


async def test_the_one_process_layout_is_one_deployment_running_the_five_services(
    rig: Rig,
) -> None:
    docs = await render(*ONE_PROCESS, bin_dir=rig.bin_dir)
    (deployment,) = _named(docs, "Deployment").values()
    assert deployment["metadata"]["name"] == "nodewright-services"
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["args"] == ["-m", "services"]
    assert pod["spec"]["serviceAccountName"] == "nodewright-services"
    assert {p["name"] for p in container["ports"]} == {"http", "webhook"}
    env = {e["name"]: e.get("value", "from-field") for e in container["env"]}
    # Every variable is one some service knows, and each service gets what it gets alone.
    loaded = config.load_many([s.settings_type for s in one_process.SERVICES.values()], env)
    by_name = dict(zip(one_process.SERVICES, loaded, strict=True))
    assert by_name["validator"].webhook.cert_owner == "nodewright-services"  # type: ignore[attr-defined]
    assert by_name["executor"].pods.agent_image  # type: ignore[attr-defined]
    assert by_name["status"].status.ui is True  # type: ignore[attr-defined]
    assert env["NODEWRIGHT_NATS_USER"] == "nodewright-services"
    (auth,) = [v for v in pod["spec"]["volumes"] if v["name"] == "nats-auth"]
    assert auth["secret"]["items"] == [{"key": "services", "path": "password"}]

    # The Services in front of the webhook, the web page and the metrics select its pods.
    services = _named(docs, "Service")
    assert set(services) == {
        "nodewright-validator", "nodewright-status-ui", "nodewright-services-metrics"
    }  # fmt: skip
    for service in services.values():
        labels = pod["metadata"]["labels"]
        assert all(labels[k] == v for k, v in service["spec"]["selector"].items()), service
    assert "PodDisruptionBudget" not in {d["kind"] for d in docs}, "one replica: no PDB"
    two = await render(*ONE_PROCESS, "--set", "oneProcess.replicas=2", bin_dir=rig.bin_dir)
    assert set(_named(two, "PodDisruptionBudget")) == {"nodewright-services"}
    assert _named(two, "Deployment")["nodewright-services"]["spec"]["replicas"] == 2


async def test_the_one_process_account_is_bound_to_the_five_services_roles(rig: Rig) -> None:
    one = await render(*ONE_PROCESS, bin_dir=rig.bin_dir)
    per = await render(bin_dir=rig.bin_dir)
    assert set(_named(one, "ServiceAccount")) == {"nodewright-services"}
    for kind in ("ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding"):
        assert set(_named(one, kind)) == set(_named(per, kind)), kind
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        for name, binding in _named(one, kind).items():
            assert binding["subjects"] == [
                {
                    "kind": "ServiceAccount",
                    "name": "nodewright-services",
                    "namespace": "nodewright-system",
                }
            ], name
            assert binding["roleRef"] == _named(per, kind)[name]["roleRef"]
    for name, role in _named(one, "ClusterRole").items():
        assert role["rules"] == _named(per, "ClusterRole")[name]["rules"], name
    # The same rules, but the validator reads its certificate's owner: the one Deployment.
    for name, role in _named(one, "Role").items():
        expected = _named(per, "Role")[name]["rules"]
        if name == "nodewright-validator":
            expected = [
                {**r, "resourceNames": ["nodewright-services"]} if "resourceNames" in r else r
                for r in expected
            ]
        assert role["rules"] == expected, name


async def test_the_one_process_layout_is_accepted_by_the_api_server_and_scraped_once(
    rig: Rig, kapi: Kube
) -> None:
    await manifests.ensure_namespace(kapi, "nodewright-system")
    text = await template(*ONE_PROCESS, bin_dir=rig.bin_dir)
    applied = await server_dry_run(rig.bin_dir, rig.endpoints.kubeconfig, text)
    assert "deployment.apps/nodewright-services serverside-applied (server dry run)" in applied
    assert "serviceaccount/nodewright-services serverside-applied (server dry run)" in applied
    for value, monitor in (("serviceMonitor", "servicemonitor"), ("podMonitor", "podmonitor")):
        docs = await render(
            *ONE_PROCESS,
            "--set", f"metrics.{value}.enabled=true",
            "-s", f"templates/{monitor}.yaml",
            bin_dir=rig.bin_dir,
        )  # fmt: skip
        (doc,) = docs
        (expression,) = doc["spec"]["selector"]["matchExpressions"]
        assert expression["values"] == ["services"], monitor
