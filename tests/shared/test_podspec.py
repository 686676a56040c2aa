"""How a stage pod gets its package's files and its host root: an image volume, or two init
containers copying the image's files (for runtimes without image volumes); and how a pod the
runtime cannot create is judged (``shared.pods.start_failure``)."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import pytest

from shared import config, pods, podspec, progress
from shared.podspec import PodRequest
from tests.helpers.facts import T0, nodewright

AGENT = "registry.example/agent:1"


def _stage_pod(
    settings: podspec.PodSettings,
    node_order: int | None = None,
    node_annotations: dict[str, str] | None = None,
    stages: tuple[str, ...] = (),
) -> dict[str, Any]:
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
        node_order=node_order,
        stages=stages,
    )
    return podspec.stage_pod(
        req,
        cr=cr,
        node="n1",
        node_annotations=node_annotations or {},
        settings=settings,
        node_metadata="{}",
    )


def _volumes(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod["spec"]["volumes"]}


def test_image_volume_staging_mounts_the_package_image_at_the_package_dir() -> None:
    pod = _stage_pod(podspec.PodSettings(namespace="nw", agent_image=AGENT))
    vols = _volumes(pod)
    assert vols["package"]["image"]["reference"].endswith(":0.9.0")
    (stage,) = pod["spec"]["initContainers"]
    (check,) = pod["spec"]["containers"]
    for container in (stage, check):
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
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
    tools, package, stage = pod["spec"]["initContainers"]
    assert (stage["name"], stage["args"]) == ("apply", ["apply"])
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
    ("names", "expected"),
    [
        pytest.param("", None, id="none"),
        pytest.param("regcred", [{"name": "regcred"}], id="one"),
        pytest.param("regcred,nvcr.io", [{"name": "regcred"}, {"name": "nvcr.io"}], id="two"),
    ],
)
@pytest.mark.parametrize("staging", ["image-volume", "copy"])
def test_every_package_pod_pulls_its_images_with_the_configured_secrets(
    names: str, expected: list[dict[str, str]] | None, staging: str
) -> None:
    """A package image on a private registry (nvcr.io and its kin) is pulled by the node's
    kubelet with the pod's imagePullSecrets, the agent image and the copy containers' too."""
    from services.executor.config import Settings

    env = {"NODEWRIGHT_PODS_PACKAGE_STAGING": staging}
    if names:
        env["NODEWRIGHT_PODS_IMAGE_PULL_SECRETS"] = names
    cfg = config.load(Settings, env).pods
    pod = _stage_pod(podspec.PodSettings.of(namespace="nw", config=cfg))
    assert pod["spec"].get("imagePullSecrets") == expected


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        pytest.param({"NODEWRIGHT_PODS_PACKAGE_STAGING": "rsync"}, "package_staging", id="staging"),
        pytest.param({"NODEWRIGHT_PODS_HOST_ROOT": "relative"}, "host_root", id="host-root"),
        pytest.param(
            {"NODEWRIGHT_PODS_IMAGE_PULL_SECRETS": "regcred, Other"},
            "image_pull_secrets",
            id="pull-secrets",
        ),
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


@pytest.mark.parametrize(("order", "env"), [(0, "0"), (3, "3"), (None, None)])
def test_a_stage_pod_runs_its_segment_each_stage_then_its_check_with_the_same_environment(
    order: int | None, env: str | None
) -> None:
    """Issue 15: one pod per segment of a cycle. The kubelet runs each container only once
    the one before it (an init container) exited 0: apply, its check, config, its check.
    All see the same package, config and node order; the pod says what it runs."""
    pod = _stage_pod(
        podspec.PodSettings(namespace="nw", agent_image=AGENT),
        node_order=order,
        stages=("apply", "config"),
    )
    inits = pod["spec"]["initContainers"]
    (last,) = pod["spec"]["containers"]
    runs = [(c["name"], c["args"]) for c in [*inits, last]]
    assert runs == [
        ("apply", ["apply"]),
        ("apply-check", ["apply-check"]),
        ("config", ["config"]),
        ("config-check", ["config-check"]),
    ]
    assert all(c["env"] == last["env"] for c in inits)
    assert all(c["volumeMounts"] == last["volumeMounts"] for c in inits)
    assert last["securityContext"] == {"privileged": True}
    values = {e["name"]: e.get("value") for e in last["env"]}
    assert values.get("NODEWRIGHT_NODE_ORDER") == env
    assert pod["metadata"]["labels"][pods.LABEL_ROLE] == "stage"
    assert pod["metadata"]["annotations"][pods.ANN_STAGES] == "apply,config"


def _status(init: dict[str, Any], main: dict[str, Any], phase: str) -> dict[str, Any]:
    return {
        "phase": phase,
        "initContainerStatuses": [{"name": "apply", "state": init}],
        "containerStatuses": [{"name": "apply-check", "state": main}],
    }


_T1 = "2026-01-01T00:00:05Z"


def _exited(code: int, message: str = "", at: str = _T1) -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "message": message, "finishedAt": at}}


_RUNNING = {"running": {"startedAt": _T1}}
_INITIALIZING = {"waiting": {"reason": "PodInitializing"}}


@pytest.mark.parametrize(
    ("init", "main", "phase", "stage", "check"),
    [
        pytest.param(_RUNNING, _INITIALIZING, "Pending", "Running", "Pending", id="stage-runs"),
        pytest.param(_exited(0), _RUNNING, "Running", "Succeeded", "Running", id="check-runs"),
        pytest.param(_exited(0), _exited(0), "Succeeded", "Succeeded", "Succeeded", id="passed"),
        pytest.param(_exited(0), _exited(2), "Failed", "Succeeded", "Failed", id="check-failed"),
        pytest.param(_exited(1), _INITIALIZING, "Failed", "Failed", "Pending", id="stage-failed"),
        pytest.param({}, {}, "Failed", "Failed", "Pending", id="evicted-before-the-stage-ended"),
    ],
)
def test_a_stage_pod_reads_as_its_stage_and_its_check(
    init: dict[str, Any], main: dict[str, Any], phase: str, stage: str, check: str
) -> None:
    pod = _stage_pod(podspec.PodSettings(namespace="nw", agent_image=AGENT))
    pod["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    pod["status"] = _status(init, main, phase)
    got_stage, got_check = pods.parts(pod)
    assert (got_stage.role, got_stage.phase) == ("stage", stage)
    assert (got_check.role, got_check.phase) == ("check", check)
    assert got_stage.key == got_check.key, "one pod, one attempt of one stage"
    assert (got_stage.container, got_check.container, got_check.then) == (
        "apply",
        "apply-check",
        "",
    )
    if stage == "Succeeded":
        assert got_stage.exit_code == 0
        # The check's clock starts when the stage ended.
        assert got_stage.created is not None
        assert got_check.created == got_stage.created + timedelta(seconds=5)


def _segment_status(*states: dict[str, Any], phase: str) -> dict[str, Any]:
    names = ["apply", "apply-check", "config", "config-check"]
    named = [{"name": n, "state": st} for n, st in zip(names, states, strict=False)]
    named += [{"name": n, "state": _INITIALIZING} for n in names[len(states) :]]
    return {"phase": phase, "initContainerStatuses": named[:3], "containerStatuses": named[3:]}


def _at(second: int) -> str:
    return f"2026-01-01T00:00:{second:02d}Z"


@pytest.mark.parametrize(
    ("states", "phase", "expected"),
    [
        pytest.param((_RUNNING,), "Pending", ["Running"] + ["Pending"] * 3, id="apply-runs"),
        pytest.param(
            (_exited(0, at=_at(5)), _exited(0, at=_at(7)), _RUNNING),
            "Pending",
            ["Succeeded", "Succeeded", "Running", "Pending"],
            id="config-runs",
        ),
        pytest.param(
            (_exited(0, at=_at(5)), _exited(3, at=_at(7))),
            "Failed",
            ["Succeeded", "Failed", "Pending", "Pending"],
            id="apply-check-failed",
        ),
        pytest.param(
            (_exited(0, at=_at(5)), _exited(0, at=_at(7)), _exited(1, at=_at(9))),
            "Failed",
            ["Succeeded", "Succeeded", "Failed", "Pending"],
            id="config-failed",
        ),
        pytest.param(
            tuple(_exited(0, at=_at(5 + 2 * i)) for i in range(4)),
            "Succeeded",
            ["Succeeded"] * 4,
            id="all-passed",
        ),
        pytest.param(
            (_exited(0, at=_at(5)), _RUNNING),
            "Failed",
            ["Succeeded", "Failed", "Pending", "Pending"],
            id="evicted-in-apply-check",
        ),
    ],
)
def test_a_segment_pod_reads_as_each_stage_and_check_in_turn(
    states: tuple[dict[str, Any], ...], phase: str, expected: list[str]
) -> None:
    """Each part starts when the one before it ended; a part after one that did not exit 0
    is pending whatever the runtime says (kwok marks every init container but a failing
    one as exited)."""
    pod = _stage_pod(
        podspec.PodSettings(namespace="nw", agent_image=AGENT), stages=("apply", "config")
    )
    pod["metadata"]["creationTimestamp"] = _at(0)
    pod["status"] = _segment_status(*states, phase=phase)
    got = pods.parts(pod)
    assert [(p.role, p.stage, p.then) for p in got] == [
        ("stage", "apply", "config"),
        ("check", "apply", "config"),
        ("stage", "config", ""),
        ("check", "config", ""),
    ]
    assert [p.phase for p in got] == expected
    assert {p.key[3] for p in got} == {1}, "every part is the pod's attempt"
    reached = [p for p in got if p.created is not None]
    passed = len(list(itertools.takewhile(lambda x: x == "Succeeded", expected)))
    assert len(reached) == min(4, passed + 1)
    for before, after in itertools.pairwise(reached):
        assert after.created == before.ended, "a part's clock starts at the end of the one before"


def test_a_stage_after_a_failed_one_is_pending_though_kwok_says_it_exited() -> None:
    pod = _stage_pod(
        podspec.PodSettings(namespace="nw", agent_image=AGENT), stages=("apply", "config")
    )
    pod["status"] = _segment_status(
        _exited(0), _exited(2, "vm.swappiness is 60"), _exited(0), _exited(0), phase="Failed"
    )
    _apply, check, config, config_check = pods.parts(pod)
    assert (check.phase, check.exit_code, check.message) == ("Failed", 2, "vm.swappiness is 60")
    assert (config.phase, config.exit_code, config.created) == ("Pending", None, None)
    assert config_check.phase == "Pending"


def test_a_failed_stage_and_a_failed_check_each_say_their_own_exit() -> None:
    pod = _stage_pod(podspec.PodSettings(namespace="nw", agent_image=AGENT))
    pod["status"] = _status(_exited(3, "modprobe failed"), _INITIALIZING, "Failed")
    stage = pods.part(pod, "stage")
    assert stage is not None
    assert (stage.exit_code, stage.message) == (3, "modprobe failed")
    pod["status"] = _status(_exited(0), _exited(2, "vm.swappiness is 60"), "Failed")
    stage, check = pods.parts(pod)
    assert (stage.exit_code, stage.message) == (0, "")
    assert (check.exit_code, check.message) == (2, "vm.swappiness is 60")


def test_a_stage_pod_of_an_earlier_version_reads_as_before() -> None:
    """A pod made before segments (init container ``agent``, container ``check``, no
    stages annotation) is still read as its stage and its check."""
    pod = _stage_pod(podspec.PodSettings(namespace="nw", agent_image=AGENT))
    del pod["metadata"]["annotations"][pods.ANN_STAGES]
    pod["spec"]["initContainers"][0]["name"] = "agent"
    pod["spec"]["containers"][0]["name"] = "check"
    pod["status"] = {
        "phase": "Running",
        "initContainerStatuses": [{"name": "agent", "state": _exited(0)}],
        "containerStatuses": [{"name": "check", "state": _RUNNING}],
    }
    stage, check = pods.parts(pod)
    assert (stage.phase, check.phase) == ("Succeeded", "Running")
    assert (stage.container, check.container, stage.then) == ("agent", "check", "")


def test_an_interrupt_pod_reads_as_one_view() -> None:
    pod = {
        "metadata": {"name": "i", "labels": {pods.LABEL_ROLE: "interrupt"}},
        "spec": {"containers": [{"name": "agent"}]},
        "status": {"phase": "Succeeded"},
    }
    (only,) = pods.parts(pod)
    assert (only.role, only.phase) == ("interrupt", "Succeeded")


@pytest.mark.parametrize(
    ("wish", "expected"),
    [
        pytest.param("", {"sim.nodewright.nvidia.com/succeed-after": "2s"}, id="both-pass"),
        pytest.param(
            "nvidia-tuned/apply",
            {
                "sim.nodewright.nvidia.com/fail-after": "2s",
                "sim.nodewright.nvidia.com/fail-init": "apply",
            },
            id="the-stage-fails",
        ),
        pytest.param(
            "nvidia-tuned/apply-check",
            {"sim.nodewright.nvidia.com/fail-after": "2s"},
            id="the-check-fails",
        ),
    ],
)
def test_simulated_stage_pods_fail_their_stage_or_their_check(
    wish: str, expected: dict[str, str]
) -> None:
    """kwok runs a segment pod's containers in turn, each for the stage duration
    (``part-duration``); the failing one is named when it is an init container, and its
    time, like the main container's, counts from its own start."""
    annotations = {"sim.nodewright.nvidia.com/stage-duration": "2s"}
    if wish:
        annotations["sim.nodewright.nvidia.com/fail"] = wish
    settings = podspec.PodSettings(namespace="nw", agent_image=AGENT, simulate=True)
    pod = _stage_pod(settings, node_annotations=annotations)
    got = {k: v for k, v in pod["metadata"]["annotations"].items() if k.startswith("sim.")}
    assert {k: got.get(k) for k in expected} == expected
    assert got["sim.nodewright.nvidia.com/part-duration"] == "2s"
    assert ("sim.nodewright.nvidia.com/fail-init" in got) == ("fail-init" in str(expected))


def test_without_in_turn_a_simulated_pod_takes_its_containers_time_together() -> None:
    """bench.rollout's simulation: kwok ends the init containers at once, so the pod's
    time is its stage's and its check's together, and a failing check's comes after both."""
    annotations = {"sim.nodewright.nvidia.com/stage-duration": "2s"}
    settings = podspec.PodSettings(
        namespace="nw", agent_image=AGENT, simulate=True, sim_in_turn=False
    )
    got = _stage_pod(settings, node_annotations=annotations)["metadata"]["annotations"]
    assert got["sim.nodewright.nvidia.com/succeed-after"] == "4s"
    assert "sim.nodewright.nvidia.com/part-duration" not in got
    failing = {**annotations, "sim.nodewright.nvidia.com/fail": "nvidia-tuned/apply-check"}
    got = _stage_pod(settings, node_annotations=failing)["metadata"]["annotations"]
    assert got["sim.nodewright.nvidia.com/fail-after"] == "4s"


PACKAGE = "registry.example/nowhere:1.0.0"
CONTAINERD_PULL = (
    f'failed to pull and unpack image "{PACKAGE}": failed to resolve image: failed to do '
    'request: Head "https://registry.example/v2/nowhere/manifests/1.0.0": dial tcp: lookup '
    "registry.example: network is unreachable"
)
CRIO_PULL = (
    "initializing source docker://registry.example/nowhere:1.0.0: pinging container registry "
    'registry.example: Get "https://registry.example/v2/": dial tcp: no such host'
)


@pytest.mark.parametrize(
    ("message", "named"),
    [
        pytest.param(CONTAINERD_PULL, PACKAGE, id="containerd-names-the-volume-image"),
        pytest.param(CRIO_PULL, PACKAGE, id="cri-o-names-its-repository"),
        pytest.param(
            f'failed to pull and unpack image "{AGENT}": not found', AGENT, id="the-agent-image"
        ),
        pytest.param("Back-off pulling image", AGENT, id="a-message-naming-none"),
    ],
)
def test_a_failed_pull_names_the_image_the_runtime_could_not_pull(message: str, named: str) -> None:
    """tests/e2e/realnode: a real kubelet reports the package's image volume it cannot pull
    on the agent's container, naming the volume's image in the message; the failure named
    the agent's image."""
    pod = _stage_pod(podspec.PodSettings(namespace="nw", agent_image=AGENT))
    assert pod["spec"]["volumes"][1]["image"]["reference"].startswith("ghcr.io/")
    pod["spec"]["volumes"][1]["image"]["reference"] = PACKAGE
    container = pod["spec"]["initContainers"][0]["name"]
    pod["metadata"]["creationTimestamp"] = T0.isoformat()
    pod["status"] = {
        "phase": "Pending",
        "initContainerStatuses": [
            {
                "name": container,
                "image": AGENT,
                "state": {"waiting": {"reason": "ErrImagePull", "message": message}},
            }
        ],
    }
    seen = pods.view(pod)
    assert seen.image_pull_failed
    assert seen.image == named
    reason = pods.image_pull_failure(seen, now=T0 + timedelta(days=1), grace_s=1.0)
    assert reason is not None
    assert reason.details["image"] == named
    assert reason.message.startswith(f"cannot pull image {named}: ErrImagePull")


def test_a_stage_pod_says_what_it_runs_of_its_package_and_its_view_reads_it() -> None:
    """The executor stops a stage running in a pod of a replaced image, env or resources
    (services/executor/core.py): the pod carries what it runs; a configuration change alone
    does not change it (a config cycle follows)."""
    pod = _stage_pod(podspec.PodSettings(namespace="nw", agent_image=AGENT))
    (d,) = progress.desired(nodewright()).values()
    assert pod["metadata"]["annotations"][pods.ANN_SPEC] == d.pod_digest != ""
    pod.setdefault("status", {})
    assert pods.view(pod).spec == d.pod_digest
    base = {"version": "0.9.0", "image": "registry.example/tuned"}

    def digest(**changes: Any) -> str:
        (one,) = progress.desired(nodewright(packages={"p": {**base, **changes}})).values()
        return one.pod_digest

    assert digest() == digest(configMap={"a": "1"}) == digest(timeoutSeconds=60)
    assert len({digest(), digest(image="other"), digest(env=[{"name": "A", "value": "1"}])}) == 3
