"""The chart's optional pre-delete hook (``uninstallHook``): off by default; on, a Job running
``nodewright uninstall-all --wait`` as its own least-privilege ServiceAccount, whose RBAC Helm
creates first (hook weights); all of it accepted by the real API server."""

from __future__ import annotations

from typing import Any

from nodewright import manifests
from nodewright.rig import Rig
from shared.kube import Kube
from tests.deploy.helm import CHART, render, run, server_dry_run, template, template_error

ON = ("--set", "uninstallHook.enabled=true")
LABELS = {
    "app.kubernetes.io/name": "nodewright",
    "app.kubernetes.io/instance": "nw",
    "app.kubernetes.io/version": "0.1.0",
    "app.kubernetes.io/managed-by": "Helm",
    "helm.sh/chart": "nodewright-0.1.0",
    "app.kubernetes.io/component": "uninstall-hook",
}
NAME = "nodewright-uninstall-all"


def _hook(weight: str) -> dict[str, str]:
    return {
        "helm.sh/hook": "pre-delete",
        "helm.sh/hook-weight": weight,
        "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded",
    }


def _hooks(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if "helm.sh/hook" in (d["metadata"].get("annotations") or {})]


async def test_the_hook_is_off_by_default(rig: Rig) -> None:
    docs = await render(bin_dir=rig.bin_dir)
    assert _hooks(docs) == []
    assert [d for d in docs if d["metadata"]["name"] == NAME] == []
    assert [d["kind"] for d in docs if d["kind"] == "Job"] == []


async def test_the_hook_deletes_through_a_job_with_rbac_created_first(rig: Rig) -> None:
    docs = await render(*ON, bin_dir=rig.bin_dir)
    hooks = _hooks(docs)
    assert [(d["kind"], d["metadata"]["name"]) for d in hooks] == [
        ("ServiceAccount", NAME),
        ("ClusterRole", NAME),
        ("ClusterRoleBinding", NAME),
        ("Job", NAME),
    ]
    sa, role, binding, job = hooks
    assert sa["metadata"] == {
        "name": NAME,
        "namespace": "nodewright-system",
        "labels": LABELS,
        "annotations": _hook("-10"),
    }
    assert role["metadata"] == {"name": NAME, "labels": LABELS, "annotations": _hook("-10")}
    assert role["rules"] == [
        {
            "apiGroups": ["nodewright.nvidia.com"],
            "resources": ["nodewrights", "deploymentpolicies"],
            "verbs": ["get", "list", "watch", "delete"],
        }
    ]
    assert binding["metadata"] == {"name": NAME, "labels": LABELS, "annotations": _hook("-5")}
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": NAME,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": NAME, "namespace": "nodewright-system"}
    ]
    assert job["metadata"] == {
        "name": NAME,
        "namespace": "nodewright-system",
        "labels": LABELS,
        "annotations": _hook("0"),
    }
    assert {k: v for k, v in job["spec"].items() if k != "template"} == {
        "backoffLimit": 0,
        "activeDeadlineSeconds": 660,
    }
    pod = job["spec"]["template"]["spec"]
    assert job["spec"]["template"]["metadata"] == {"labels": LABELS}
    assert pod["serviceAccountName"] == NAME
    assert pod["restartPolicy"] == "Never"
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {}}]
    (container,) = pod["containers"]
    assert container == {
        "name": "uninstall-all",
        "image": "ghcr.io/nvidia/nodewright:0.1.0",
        "imagePullPolicy": "IfNotPresent",
        "args": ["-m", "nodewright.cli", "uninstall-all", "--wait", "--timeout", "600"],
        "env": [{"name": "HOME", "value": "/tmp"}],
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    # Everything else is what the chart renders without the hook.
    assert [d for d in docs if d not in hooks] == await render(bin_dir=rig.bin_dir)


async def test_the_timeout_sets_the_command_and_the_job_deadline(rig: Rig) -> None:
    docs = await render(*ON, "--set", "uninstallHook.timeoutSeconds=90", bin_dir=rig.bin_dir)
    (job,) = [d for d in docs if d["kind"] == "Job"]
    assert job["spec"]["activeDeadlineSeconds"] == 150
    assert job["spec"]["template"]["spec"]["containers"][0]["args"][-2:] == ["--timeout", "90"]
    zero = (*ON, "--set", "uninstallHook.timeoutSeconds=0")
    # values.schema.json refuses it first; without the schema the template still does.
    err = await template_error(*zero, bin_dir=rig.bin_dir)
    assert "- at '/uninstallHook/timeoutSeconds': minimum: got 0, want 1" in err
    err = await template_error("--skip-schema-validation", *zero, bin_dir=rig.bin_dir)
    assert "uninstallHook.timeoutSeconds must be a number of seconds above 0" in err


async def test_the_hook_is_accepted_by_the_api_server(rig: Rig, kapi: Kube) -> None:
    await manifests.ensure_namespace(kapi, "nodewright-system")
    text = await template(*ON, "-s", "templates/uninstall-hook.yaml", bin_dir=rig.bin_dir)
    applied = await server_dry_run(rig.bin_dir, rig.endpoints.kubeconfig, text)
    assert applied == [
        "clusterrole.rbac.authorization.k8s.io/nodewright-uninstall-all serverside-applied "
        "(server dry run)",
        "clusterrolebinding.rbac.authorization.k8s.io/nodewright-uninstall-all "
        "serverside-applied (server dry run)",
        "job.batch/nodewright-uninstall-all serverside-applied (server dry run)",
        "serviceaccount/nodewright-uninstall-all serverside-applied (server dry run)",
    ]


async def test_the_chart_lints_with_the_hook(rig: Rig) -> None:
    out = await run(str(rig.bin_dir / "helm"), "lint", "--strict", str(CHART), *ON)
    assert "0 chart(s) failed" in out
