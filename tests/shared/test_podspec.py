"""How a stage pod gets its package's files and its host root: an image volume, or two init
containers copying the image's files (for runtimes without image volumes); and how a pod the
runtime cannot create is judged (``shared.pods.start_failure``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from shared import config, pods, podspec, progress
from shared.podspec import PodRequest
from tests.helpers.facts import T0, nodewright

AGENT = "registry.example/agent:1"


def _stage_pod(settings: podspec.PodSettings) -> dict[str, Any]:
    cr = nodewright()
    (d,) = progress.desired(cr).values()
    req = PodRequest(
        role="stage",
        package=d.name,
        stage="apply",
        version=d.version,
        attempt=1,
        desired=d,
        name="p",
    )
    return podspec.stage_pod(
        req, cr=cr, node="n1", node_annotations={}, settings=settings, node_metadata="{}"
    )


def _volumes(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod["spec"]["volumes"]}


def test_image_volume_staging_mounts_the_package_image_at_the_package_dir() -> None:
    pod = _stage_pod(podspec.PodSettings(namespace="nw", agent_image=AGENT))
    vols = _volumes(pod)
    assert vols["package"]["image"]["reference"].endswith(":0.9.0")
    assert "initContainers" not in pod["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["package"] == "/nodewright-package"
    assert vols["host"]["hostPath"] == {"path": "/", "type": "Directory"}


def test_copy_staging_copies_the_image_files_with_the_agents_busybox_no_shell_needed() -> None:
    pod = _stage_pod(
        podspec.PodSettings(
            namespace="nw", agent_image=AGENT, package_staging="copy", host_root="/srv/host"
        )
    )
    vols = _volumes(pod)
    assert "image" not in vols["package"]
    assert vols["package"]["emptyDir"] == {}
    tools, package = pod["spec"]["initContainers"]
    assert tools["image"] == AGENT
    assert tools["command"][0] == podspec.AGENT_BUSYBOX
    # The package image's container runs the busybox the first init container staged.
    assert package["image"].endswith(":0.9.0")
    assert package["command"][:3] == ["/nodewright-tools/busybox", "sh", "-c"]
    assert "config.json steps root" in package["command"][3]
    staged = {m["name"]: m for m in package["volumeMounts"]}
    assert staged["package"]["mountPath"] == "/nodewright-staging"
    agent_mounts = {m["name"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert agent_mounts["package"] == {
        "name": "package",
        "mountPath": "/nodewright-package",
        "readOnly": True,
    }
    assert vols["host"]["hostPath"]["path"] == "/srv/host"


def test_pod_settings_come_from_the_service_settings() -> None:
    cfg = config.PodSettings(host_root="/x", package_staging="copy", agent_image=AGENT)
    s = podspec.PodSettings.of(namespace="nw", config=cfg)
    assert (s.host_root, s.package_staging, s.agent_image, s.namespace) == (
        "/x",
        "copy",
        AGENT,
        "nw",
    )


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        pytest.param({"NODEWRIGHT_PODS_PACKAGE_STAGING": "rsync"}, "package_staging", id="staging"),
        pytest.param({"NODEWRIGHT_PODS_HOST_ROOT": "relative"}, "host_root", id="host-root"),
    ],
)
def test_bad_pod_settings_are_refused_naming_the_variable(
    env: dict[str, str], problem: str
) -> None:
    from services.executor.config import Settings

    with pytest.raises(config.ConfigError, match=problem.upper()):
        config.load(Settings, env)


def _pod(reason: str, message: str, *, image_volume: bool, age_s: float = 1.0) -> pods.PodView:
    return pods.PodView(
        name="p", cr="cr", node="real-1", role="stage", package="pkg", stage="apply",
        version="1.0.0", attempt=1, phase="Pending", deleting=False,
        created=T0 - timedelta(seconds=age_s), waiting_reason=reason, waiting_message=message,
        image_volume=image_volume,
    )  # fmt: skip


CONTAINERD_16 = (
    'failed to generate container spec: failed to mkdir "": mkdir : no such file or directory'
)


def test_a_runtime_without_image_volumes_fails_at_once_naming_the_setting() -> None:
    pod = _pod("CreateContainerError", CONTAINERD_16, image_volume=True)
    reason = pods.start_failure(pod, now=T0, grace_s=120)
    assert reason is not None
    assert reason.code == "ImageVolumeUnsupported"
    assert "packageStaging: copy" in reason.message
    assert "real-1" in reason.message
    assert reason.details["setting"] == "packageStaging: copy"


def test_other_create_errors_fail_only_after_the_grace_period() -> None:
    young = _pod("CreateContainerError", "boom", image_volume=False, age_s=10)
    assert pods.start_failure(young, now=T0, grace_s=120) is None
    old = _pod("CreateContainerError", "boom", image_volume=False, age_s=200)
    reason = pods.start_failure(old, now=T0, grace_s=120)
    assert reason is not None
    assert reason.code == "ContainerCreateFailed"
    assert "boom" in reason.message
    # The same runtime message without an image volume in the pod is not blamed on it.
    plain = _pod("CreateContainerError", CONTAINERD_16, image_volume=False, age_s=200)
    assert pods.start_failure(plain, now=T0, grace_s=120).code == "ContainerCreateFailed"  # type: ignore[union-attr]


def test_view_sees_whether_a_pod_mounts_an_image_volume() -> None:
    pod = _stage_pod(podspec.PodSettings(namespace="nw", agent_image=AGENT))
    assert pods.view(pod).image_volume
    copy = _stage_pod(
        podspec.PodSettings(namespace="nw", agent_image=AGENT, package_staging="copy")
    )
    assert not pods.view(copy).image_volume
