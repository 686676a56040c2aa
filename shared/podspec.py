"""Manifests of NodeWright's pods on a node: a package segment (executor), the node's
merged interrupt (executor), or the pull of its package images before its drain (executor,
:func:`pull_pod`).

A stage pod runs on its node (``spec.nodeName``, bypassing the scheduler) and runs a
*segment* of its package's cycle (``shared.pods.ANN_STAGES``: ``apply,config``, ``config``
...): per stage, a container running ``python -m agent <stage>`` and one running
``python -m agent <stage>-check``, all init containers but the last check, so the kubelet
starts each once the one before it exited 0 (the executor judges the stages, the validator
the checks, ``shared.pods.parts``). Every container has the host's ``/`` at ``/host``, the
*package* image mounted read-only at ``/nodewright-package`` as an image volume (so package
images need no shell: ``FROM scratch`` works; Kubernetes >= 1.35 with a runtime supporting
image volumes), the CR's configMap at ``/nodewright-config`` and the node's metadata (the
node's labels and annotations and the NodeWright's packages, :mod:`shared.nodemetadata`)
at ``/nodewright-node-metadata``, from an annotation of the pod itself (downward API).
The pod tolerates the cordon, the readiness taint, NotReady/unreachable (a reboot must not
evict it) and the CR's additional tolerations, and is owned by the NodeWright so deleting
the CR removes it.

In simulation (kwok) the node's ``sim.nodewright.nvidia.com/*`` wishes are copied onto the
pod as kwok stage annotations. Pure: returns dicts; creating them is the services' job.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared import api, config as shared_config, nodemetadata, pods
from shared.config import PackageStaging
from shared.progress import Desired

SIM = "sim.nodewright.nvidia.com"
SIM_STAGE_DURATION = f"{SIM}/stage-duration"
SIM_FAIL = f"{SIM}/fail"
SIM_IMAGE_PULL_ERROR = f"{SIM}/image-pull-error"
SIM_FAIL_INIT = f"{SIM}/fail-init"
"""kwok stage annotation: the failure is the init container's (the stage's, not its check's)."""
SIM_PART_DURATION = f"{SIM}/part-duration"
"""kwok stage annotation: a segment pod's containers run in turn, each this long."""
_SIM_SECONDS = re.compile(r"^(\d+(?:\.\d+)?)s$")

_PACKAGE_MOUNT = "/nodewright-package"
_CONFIG_MOUNT = "/nodewright-config"
NODE_METADATA_MOUNT = "/nodewright-node-metadata"
"""Where stage pods (their stage and their check) mount the node's metadata (the agent's default
``NODEWRIGHT_NODE_METADATA_DIR``)."""


@dataclass(frozen=True)
class PodRequest:
    """One pod to create on a node; ``name`` is deterministic (see shared.pods.pod_name)."""

    role: pods.Role
    package: str
    stage: str
    version: str
    attempt: int
    image: str = ""
    previous: str = ""
    interrupt: api.Interrupt | None = None
    desired: Desired | None = None
    name: str = ""
    node_order: int | None = None
    """The node's position in the rollout (``Selection.order``); None: unknown, not passed."""
    cycle: str = ""
    """The cycle the pod belongs to (``shared.pods.ANN_CYCLE``); part of its name."""
    stages: tuple[str, ...] = ()
    """The stages a stage pod runs, ``stage`` first (``shared.pods.ANN_STAGES``); () is
    ``stage`` alone."""
    pulls: tuple[tuple[str, str], ...] = ()
    """(package, image) of each image a pull pod pulls (``shared.progress.pull_images``)."""

    @property
    def segment(self) -> tuple[str, ...]:
        return self.stages or (self.stage,)

    @property
    def key(self) -> pods.PodKey:
        return (self.package, self.stage, self.version, self.attempt, self.cycle)


@dataclass(frozen=True)
class PodSettings:
    namespace: str
    agent_image: str
    simulate: bool = False
    sim_stage_duration: str = "1s"
    sim_in_turn: bool = True
    """A stage pod's containers one after the other (shared.config.PodSettings.sim_in_turn)."""
    host_root: str = "/"
    """The node path mounted at ``/host`` (shared.config.PodSettings.host_root)."""
    package_staging: PackageStaging = "image-volume"
    """``image-volume`` or ``copy`` (shared.config.PodSettings.package_staging)."""
    image_pull_secrets: tuple[str, ...] = ()
    """Secrets every pod pulls its images with (shared.config.PodSettings.image_pull_secrets)."""

    @classmethod
    def of(cls, *, namespace: str, config: shared_config.PodSettings) -> PodSettings:
        """The pod settings of a service's ``pods`` configuration group."""
        return cls(
            namespace=namespace,
            agent_image=config.agent_image,
            simulate=config.simulate,
            sim_stage_duration=config.sim_stage_duration,
            sim_in_turn=config.sim_in_turn,
            host_root=config.host_root,
            package_staging=config.package_staging,
            image_pull_secrets=tuple(n for n in config.image_pull_secrets.split(",") if n),
        )


AGENT_BUSYBOX = "/opt/nodewright/bin/busybox"
"""The static busybox in the agent image (agent/Containerfile), used only by ``copy``."""
_TOOLS_MOUNT = "/nodewright-tools"
_STAGING_MOUNT = "/nodewright-staging"
# Run by the package image's own container with the agent's static busybox: the package
# image needs no shell. It copies what the agent reads (config.json, steps/, root/) and a
# nested nodewright-package/ (the 0.1 layout), so the agent's error can name that mistake.
_COPY_SCRIPT = (
    "set -e; bb=" + _TOOLS_MOUNT + "/busybox; n=0; "
    "for f in config.json steps root nodewright-package; do "
    'if [ -e "/$f" ]; then "$bb" cp -a "/$f" ' + _STAGING_MOUNT + "/; n=$((n+1)); fi; done; "
    '[ "$n" -gt 0 ] || { echo "the package image has no config.json, steps/ or root/ '
    'at its root" >&2; exit 3; }'
)


def _tools_container(agent_image: str) -> dict[str, Any]:
    """The init container putting the agent image's static busybox where the containers
    after it, run from package images without a shell, find it."""
    return {
        "name": "stage-tools",
        "image": agent_image,
        "imagePullPolicy": "IfNotPresent",
        "command": [AGENT_BUSYBOX, "cp", AGENT_BUSYBOX, f"{_TOOLS_MOUNT}/busybox"],
        "volumeMounts": [{"name": "nodewright-tools", "mountPath": _TOOLS_MOUNT}],
    }


def _copy_staging(
    package_image: str, agent_image: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Init containers and volumes that copy the package image's files into an emptyDir
    mounted at the package directory (``packageStaging: copy``)."""
    volumes: list[dict[str, Any]] = [
        {"name": "nodewright-tools", "emptyDir": {}},
        {"name": "package", "emptyDir": {}},
    ]
    init: list[dict[str, Any]] = [
        _tools_container(agent_image),
        {
            "name": "stage-package",
            "image": package_image,
            "imagePullPolicy": "IfNotPresent",
            "command": [f"{_TOOLS_MOUNT}/busybox", "sh", "-c", _COPY_SCRIPT],
            "volumeMounts": [
                {"name": "nodewright-tools", "mountPath": _TOOLS_MOUNT, "readOnly": True},
                {"name": "package", "mountPath": _STAGING_MOUNT},
            ],
            "terminationMessagePolicy": "FallbackToLogsOnError",
        },
    ]
    return init, volumes


def config_map_name(cr: str, package: str, digest: str) -> str:
    return f"{cr}-{package}-{digest}"[:253]


def owner_reference(cr: api.NodeWright) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "NodeWright",
        "name": cr.metadata.name,
        "uid": cr.metadata.uid,
        "blockOwnerDeletion": False,
        "controller": True,
    }


def config_map(
    cr: api.NodeWright, package: str, digest: str, data: Mapping[str, str], namespace: str
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": config_map_name(cr.metadata.name, package, digest),
            "namespace": namespace,
            "labels": {
                pods.LABEL_MANAGED: pods.MANAGED_BY,
                pods.LABEL_CR: cr.metadata.name,
                pods.LABEL_PACKAGE: package,
            },
            "ownerReferences": [owner_reference(cr)],
        },
        "data": dict(data),
    }


def tolerations(cr: api.NodeWright) -> list[dict[str, Any]]:
    base: list[dict[str, Any]] = [
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "nodewright.nvidia.com/runtime-required", "operator": "Exists"},
        # A reboot makes the node NotReady/unreachable; without these the pod is evicted
        # after 300 s and the interrupt's outcome is lost.
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    ]
    return base + [api.to_dict(t) for t in cr.spec.additional_tolerations]


def _matches(wish: str, package: str, stage: str) -> bool:
    for item in wish.split(","):
        pkg, _, stg = item.strip().partition("/")
        if pkg in ("*", package) and stg in ("", "*", stage):
            return True
    return False


def simulation_annotations(
    node_annotations: Mapping[str, str],
    *,
    package: str,
    stage: str,
    default_duration: str,
    image: str = "",
    segment: tuple[str, ...] = (),
    in_turn: bool = True,
) -> dict[str, str]:
    """kwok stage annotations for a simulated pod, from the node's ``sim.*`` wishes. A stage
    pod running ``segment`` takes ``duration`` per stage and per check, its containers in
    turn as a kubelet runs them (``part-duration``: kwok ends one init container after the
    other, then the main one), and fails at the first of its containers a wish names:
    ``<package>/<stage>`` a stage, ``<package>/<stage>-check`` its check. Without
    ``segment``, a pod of one container (the interrupt). Without ``in_turn``, kwok ends the
    init containers at once and the pod's time is theirs together (``bench.rollout``: the
    simulated work its earlier figures and the reference's run had)."""
    duration = node_annotations.get(SIM_STAGE_DURATION) or default_duration
    pull = node_annotations.get(SIM_IMAGE_PULL_ERROR, "")
    runs = segment or (stage,)
    if pull and any(_matches(pull, package, s) for s in runs):
        return {f"{SIM}/image-pull-error": "ImagePullBackOff", f"{SIM}/image": image}
    fail = node_annotations.get(SIM_FAIL, "")
    if not segment:
        if fail and _matches(fail, package, stage):
            return {
                f"{SIM}/fail-after": duration,
                f"{SIM}/exit-code": "1",
                f"{SIM}/fail-message": f"simulated failure of {package or 'interrupt'} {stage}",
            }
        return {f"{SIM}/succeed-after": duration}
    containers = [
        (name, mode)
        for s in segment
        for name, mode in ((pods.stage_container(s), s), (pods.check_container(s), f"{s}-check"))
    ]
    # In turn, each container's time counts from its own start (kwok's pod-part-advance);
    # else the pod's from its start.
    parts = {SIM_PART_DURATION: duration} if in_turn else {}
    for i, (name, mode) in enumerate(containers):
        if fail and _matches(fail, package, mode):
            failed = {
                **parts,
                f"{SIM}/fail-after": duration if in_turn else _times(duration, i + 1),
                f"{SIM}/exit-code": "1",
                f"{SIM}/fail-message": f"simulated failure of {package} {mode}",
            }
            last = i == len(containers) - 1
            return failed if last else {**failed, SIM_FAIL_INIT: name}
    return {
        **parts,
        f"{SIM}/succeed-after": duration if in_turn else _times(duration, len(containers)),
    }


def _times(duration: str, n: int) -> str:
    """``3s`` for ``1s`` and 3; a duration in another form (an RFC 3339 time) as it is."""
    m = _SIM_SECONDS.match(duration)
    return f"{n * float(m.group(1)):g}s" if m else duration


def _identity(req: PodRequest, node: str) -> dict[str, str]:
    """The annotations saying what a pod of ours runs where (``shared.pods.view`` reads them)."""
    return {
        pods.ANN_NODE: node,
        pods.ANN_VERSION: req.version,
        pods.ANN_ATTEMPT: str(req.attempt),
    }


def _pod(
    req: PodRequest,
    *,
    cr: api.NodeWright,
    settings: PodSettings,
    annotations: Mapping[str, str],
    spec: dict[str, Any],
) -> dict[str, Any]:
    """A pod of ours: ``req``'s name and labels, owned by the NodeWright (gone with it)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": req.name,
            "namespace": settings.namespace,
            "labels": pods.labels(
                cr=cr.metadata.name, role=req.role, package=req.package, stage=req.stage
            ),
            "annotations": dict(annotations),
            "ownerReferences": [owner_reference(cr)],
        },
        "spec": spec,
    }


def manifest(
    req: PodRequest,
    *,
    cr: api.NodeWright,
    node: str,
    node_annotations: Mapping[str, str],
    settings: PodSettings,
    runs: list[tuple[str, list[str], list[dict[str, Any]]]],
    package_image: str,
    config_map_ref: str = "",
    node_metadata: str | None = None,
) -> dict[str, Any]:
    """The pod running the agent once per item of ``runs`` (container name, arguments,
    environment), in order: all but the last as init containers."""
    annotations = _identity(req, node)
    if req.cycle:
        annotations[pods.ANN_CYCLE] = req.cycle
    if req.role == "stage":
        annotations[pods.ANN_STAGES] = ",".join(req.segment)
        if req.desired is not None:
            annotations[pods.ANN_SPEC] = req.desired.pod_digest
    if node_metadata is not None:
        annotations[nodemetadata.ANNOTATION] = node_metadata
    if settings.simulate:
        annotations.update(
            simulation_annotations(
                node_annotations,
                package=req.package,
                stage=req.stage,
                default_duration=settings.sim_stage_duration,
                in_turn=settings.sim_in_turn,
                image=package_image or settings.agent_image,
                segment=req.segment if req.role == "stage" else (),
            )
        )
    volumes: list[dict[str, Any]] = [
        {"name": "host", "hostPath": {"path": settings.host_root, "type": "Directory"}}
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "host", "mountPath": "/host", "mountPropagation": "HostToContainer"},
    ]
    init_containers: list[dict[str, Any]] = []
    if package_image and settings.package_staging == "copy":
        init_containers, staging = _copy_staging(package_image, settings.agent_image)
        volumes += staging
        mounts.append({"name": "package", "mountPath": _PACKAGE_MOUNT, "readOnly": True})
    elif package_image:
        volumes.append(
            {"name": "package", "image": {"reference": package_image, "pullPolicy": "IfNotPresent"}}
        )
        mounts.append({"name": "package", "mountPath": _PACKAGE_MOUNT, "readOnly": True})
    if config_map_ref:
        volumes.append({"name": "config", "configMap": {"name": config_map_ref}})
        mounts.append({"name": "config", "mountPath": _CONFIG_MOUNT, "readOnly": True})
    if node_metadata is not None:
        volumes.append(nodemetadata.volume("node-metadata"))
        mounts.append({"name": "node-metadata", "mountPath": NODE_METADATA_MOUNT, "readOnly": True})

    def agent(name: str, args: list[str], env: list[dict[str, Any]]) -> dict[str, Any]:
        container: dict[str, Any] = {
            "name": name,
            "image": settings.agent_image,
            "imagePullPolicy": "IfNotPresent",
            "args": args,
            "env": env,
            "securityContext": {"privileged": True},
            "volumeMounts": mounts,
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }
        if req.desired is not None and req.desired.spec.resources is not None:
            container["resources"] = api.to_dict(req.desired.spec.resources)
        return container

    agents = [agent(*run) for run in runs]
    init_containers = [*init_containers, *agents[:-1]]
    containers = agents[-1:]
    spec: dict[str, Any] = {
        "nodeName": node,
        "restartPolicy": "Never",
        # The host's namespaces, not the pod's own: a step's `sysctl -w net.*`, iptables or
        # `ip link` must change the node, and a check must read it (the reference does too).
        "hostPID": True,
        "hostNetwork": True,
        "priorityClassName": "system-node-critical",
        "tolerations": tolerations(cr),
        "containers": containers,
        "volumes": volumes,
    }
    if init_containers:
        spec["initContainers"] = init_containers
    if settings.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": n} for n in settings.image_pull_secrets]
    if req.desired is not None and req.desired.spec.graceful_shutdown_seconds is not None:
        spec["terminationGracePeriodSeconds"] = req.desired.spec.graceful_shutdown_seconds
    return _pod(req, cr=cr, settings=settings, annotations=annotations, spec=spec)


def stage_pod(
    req: PodRequest,
    *,
    cr: api.NodeWright,
    node: str,
    node_annotations: Mapping[str, str],
    settings: PodSettings,
    node_metadata: str,
) -> dict[str, Any]:
    """A package's segment pod (``req.segment``: each stage of apply, upgrade, config,
    post-interrupt, uninstall, then its check, see the module). ``node_metadata`` is the
    ``node.json`` its steps see (:func:`shared.nodemetadata.text` of the node as decided on)."""
    assert req.desired is not None
    d = req.desired
    env: list[dict[str, Any]] = [api.to_dict(e) for e in d.spec.env]
    env += [
        {"name": "NODEWRIGHT_CR", "value": cr.metadata.name},
        {"name": "NODEWRIGHT_RUN_ID", "value": req.name},
        {"name": "NODEWRIGHT_TO_VERSION", "value": req.version},
    ]
    if req.node_order is not None:
        env.append({"name": "NODEWRIGHT_NODE_ORDER", "value": str(req.node_order)})
    runs: list[tuple[str, list[str], list[dict[str, Any]]]] = []
    for stage in req.segment:
        own = env
        if req.previous and stage == "upgrade":
            # The installed version, for upgrade and upgrade-check.
            own = [*env, {"name": "NODEWRIGHT_FROM_VERSION", "value": req.previous}]
        runs.append((pods.stage_container(stage), [stage], own))
        runs.append((pods.check_container(stage), [f"{stage}-check"], own))
    cm = config_map_name(cr.metadata.name, d.name, d.config_digest) if d.config else ""
    return manifest(
        req,
        cr=cr,
        node=node,
        node_annotations=node_annotations,
        settings=settings,
        runs=runs,
        package_image=d.image,
        config_map_ref=cm,
        node_metadata=node_metadata,
    )


def interrupt_pod(
    req: PodRequest,
    *,
    cr: api.NodeWright,
    node: str,
    node_annotations: Mapping[str, str],
    settings: PodSettings,
) -> dict[str, Any]:
    """The node's merged interrupt (reboot, service restarts ...), run by the agent alone."""
    assert req.interrupt is not None
    env = [
        {"name": "NODEWRIGHT_CR", "value": cr.metadata.name},
        {"name": "NODEWRIGHT_RUN_ID", "value": req.name},
        {"name": "NODEWRIGHT_INTERRUPT", "value": json.dumps(api.to_dict(req.interrupt))},
        {"name": "NODEWRIGHT_INTERRUPT_ID", "value": f"{cr.metadata.uid}-{req.version}"},
    ]
    return manifest(
        req,
        cr=cr,
        node=node,
        node_annotations=node_annotations,
        settings=settings,
        runs=[(pods.STAGE_CONTAINER, ["interrupt"], env)],
        package_image="",
    )


def _names_package(wish: str, package: str) -> bool:
    """A ``sim.*`` wish names ``package`` (at any stage) or every package."""
    return any(item.strip().partition("/")[0] in ("*", package) for item in wish.split(","))


def pull_pod(
    req: PodRequest,
    *,
    cr: api.NodeWright,
    node: str,
    node_annotations: Mapping[str, str],
    settings: PodSettings,
) -> dict[str, Any]:
    """The pod that pulls ``req.pulls``' images onto the node before its drain
    (``spec.drain.prePullImages``) and does nothing else: its one container, the agent's
    static busybox running ``true``, starts only once the kubelet has every image, which the
    pod mounts as image volumes (``image-volume``) or runs, each in an init container, with
    the agent's busybox (``copy``: a runtime without image volumes). Like the stage pods it
    is bound to the node, tolerates what they tolerate, pulls with the same secrets and
    needs no shell in a package image; unlike them it mounts nothing of the host, runs
    unprivileged and is done in the time the pulls take (the drainer waits for it)."""
    images = sorted({image for _, image in req.pulls})
    annotations = _identity(req, node)
    if settings.simulate:
        wish = node_annotations.get(SIM_IMAGE_PULL_ERROR, "")
        failing = [img for pkg, img in req.pulls if wish and _names_package(wish, pkg)]
        if failing:
            annotations.update(
                {f"{SIM}/image-pull-error": "ImagePullBackOff", f"{SIM}/image": failing[0]}
            )
        else:
            duration = node_annotations.get(SIM_STAGE_DURATION) or settings.sim_stage_duration
            annotations[f"{SIM}/succeed-after"] = duration
    unprivileged: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    init: list[dict[str, Any]] = []
    if settings.package_staging == "copy":
        volumes.append({"name": "nodewright-tools", "emptyDir": {}})
        init.append({**_tools_container(settings.agent_image), "securityContext": unprivileged})
        init += [
            {
                "name": f"pull-{i}",
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": [f"{_TOOLS_MOUNT}/busybox", "true"],
                "volumeMounts": [
                    {"name": "nodewright-tools", "mountPath": _TOOLS_MOUNT, "readOnly": True}
                ],
                "securityContext": unprivileged,
            }
            for i, image in enumerate(images)
        ]
    else:
        for i, image in enumerate(images):
            volumes.append(
                {"name": f"pull-{i}", "image": {"reference": image, "pullPolicy": "IfNotPresent"}}
            )
            mounts.append({"name": f"pull-{i}", "mountPath": f"/pull/{i}", "readOnly": True})
    spec: dict[str, Any] = {
        "nodeName": node,
        "restartPolicy": "Never",
        "priorityClassName": "system-node-critical",
        "tolerations": tolerations(cr),
        "automountServiceAccountToken": False,
        "containers": [
            {
                "name": "pulled",
                "image": settings.agent_image,
                "imagePullPolicy": "IfNotPresent",
                "command": [AGENT_BUSYBOX, "true"],
                "volumeMounts": mounts,
                "securityContext": unprivileged,
            }
        ],
        "volumes": volumes,
    }
    if init:
        spec["initContainers"] = init
    if settings.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": n} for n in settings.image_pull_secrets]
    return _pod(req, cr=cr, settings=settings, annotations=annotations, spec=spec)
