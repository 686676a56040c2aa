"""NodeWright's own pods (stage and interrupt pods): names, labels, and parsed views.

Pod names are deterministic, so a second replica or a retried reconcile asking for the same
pod gets AlreadyExists instead of a duplicate. This module is pure: building manifests is the
owning service's job; this one only names pods and reads them.

A stage pod runs a *segment* of its package's cycle: the stages that follow one another with
nothing but their checks in between (``apply`` then ``config``; ``config`` alone; an
interrupt ends a segment). Its annotation :data:`ANN_STAGES` names them in order; each stage
runs in the init container named after it and its check in the container ``<stage>-check``
(the last check is the main container), so the kubelet starts each one only once the one
before it exited 0 (``shared.podspec``). :func:`parts` reads such a pod as a stage view
(the executor's to judge) and a check view (the validator's) per stage. One pod per
segment instead of a pod per stage (and before that, a pod per check too) is what the
issue-15 budget of writes asked for: every pod is a create, a delete, a binding of status
writes and an Event on the API server. Pods made by earlier versions (a stage pod whose
init container ``agent`` runs the stage and whose container ``check`` its check; a stage
pod without a check; a check pod of its own) are read as they always were.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final, Literal

from shared import reasons
from shared.events import ObjectRef, Reason
from shared.nodestate import DOMAIN

LABEL_CR = f"{DOMAIN}/nodewright"
LABEL_PACKAGE = f"{DOMAIN}/package"
LABEL_STAGE = f"{DOMAIN}/stage"
LABEL_ROLE = f"{DOMAIN}/role"
LABEL_MANAGED = "app.kubernetes.io/managed-by"
MANAGED_BY = "nodewright"
ANN_NODE = f"{DOMAIN}/node"
ANN_VERSION = f"{DOMAIN}/version"
ANN_ATTEMPT = f"{DOMAIN}/attempt"
ANN_CYCLE = f"{DOMAIN}/cycle"
"""The cycle a stage pod belongs to (``PackageRecord.cycle_started``), or the
interrupt's start: part of the pod's name, so a later cycle never reuses one."""
ANN_SPEC = f"{DOMAIN}/package-spec"
"""What a stage pod runs of its package (``shared.progress.pod_digest``): a stage running
in a pod of another spec is stopped and starts over. Absent on pods of earlier versions."""
ANN_STAGES = f"{DOMAIN}/stages"
"""The stages a stage pod runs, in order, comma-separated (``apply,config``): one container
per stage and one per check (:func:`stage_container`, :func:`check_container`). Absent on
pods of earlier versions (one stage, the label's)."""

Role = Literal["stage", "check", "interrupt", "pull"]
PULL_STAGE: Final = "pull"
"""The stage label of a pod pulling package images before a drain (``spec.drain.prePullImages``)."""

STAGE_CONTAINER = "agent"
"""The container running the agent's stage mode in pods of earlier versions (the init
container of a stage pod with a check, the only container otherwise) and interrupt pods."""
CHECK_CONTAINER = "check"
"""The main container of an earlier version's stage pod: the ``<stage>-check`` mode."""


def stage_container(stage: str) -> str:
    """The container of a segment pod (:data:`ANN_STAGES`) that runs ``stage``."""
    return stage


def check_container(stage: str) -> str:
    """The container of a segment pod that runs ``stage``'s check (``<stage>-check``)."""
    return f"{stage}-check"


# Waiting reasons that mean the image will not arrive without a change to the spec.
IMAGE_PULL_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)
# Waiting reasons of a container the runtime could not create or start; kubelet retries
# them forever, so a pod in one for the grace period is failed instead of waited on.
CREATE_FAILURE_REASONS = frozenset(
    {"CreateContainerError", "CreateContainerConfigError", "RunContainerError"}
)
PACKAGE_STAGING_SETTING = "packageStaging: copy"
"""What to set (Helm value; NODEWRIGHT_PODS_PACKAGE_STAGING=copy for the executor and the
validator) when the node's runtime has no image volumes (docs/packages.md)."""
# How runtimes without image volumes fail a container that mounts one: containerd 1.6/1.7
# ("failed to generate container spec: failed to mkdir \"\"") and CRI-O before 1.31.
_NO_IMAGE_VOLUME = re.compile(r'mkdir ""|image volume|ImageVolume|image_volume', re.IGNORECASE)


def pod_name(
    *,
    cr: str,
    node: str,
    role: Role,
    package: str,
    stage: str,
    version: str,
    attempt: int,
    cycle: str = "",
) -> str:
    """``<cr>-<package>-<stage>-<hash>``, at most 63 characters, unique per attempt of a
    stage within a cycle (``cycle``: when the cycle started), so a reinstall after an
    uninstall gets new names. Without a cycle (records written before it was kept) the name
    is the one it always was."""
    parts = [cr, node, role, package, stage, version, str(attempt)]
    if cycle:
        parts.append(cycle)
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:10]
    readable = re.sub(r"[^a-z0-9-]", "-", f"{cr}-{package}-{stage}".lower())[: 63 - 11].strip("-")
    return f"{readable}-{digest}"


def pull_pod_name(*, cr: str, node: str, images: Sequence[str], attempt: int) -> str:
    """The pod pulling ``images`` onto ``node`` before its drain (``spec.drain.prePullImages``):
    one per set of images and ``attempt`` (1 + the node's latest recovery request), so a
    package image changed meanwhile, or a retry, gets a pod of its own that pulls afresh (a
    kubelet backing off a failed pull tries again only minutes later), and the executor
    (which makes it) and the drainer (which waits for it) name the same pod."""
    return pod_name(
        cr=cr,
        node=node,
        role="pull",
        package="",
        stage=PULL_STAGE,
        version=pull_version(images),
        attempt=attempt,
    )


def pull_version(images: Sequence[str]) -> str:
    """What a pull pod pulls, as its :data:`ANN_VERSION` and part of its name."""
    return hashlib.sha256("\0".join(sorted(set(images))).encode()).hexdigest()[:16]


def labels(*, cr: str, role: Role, package: str, stage: str) -> dict[str, str]:
    return {
        LABEL_MANAGED: MANAGED_BY,
        LABEL_CR: cr,
        LABEL_ROLE: role,
        LABEL_PACKAGE: package,  # "" for the interrupt pod ("-" is not a valid label value)
        LABEL_STAGE: stage,
    }


def selector(*roles: Role) -> str:
    """Label selector of NodeWright pods with the given roles."""
    return f"{LABEL_MANAGED}={MANAGED_BY},{LABEL_ROLE} in ({','.join(roles)})"


@dataclass(frozen=True)
class PodView:
    """The parts of a NodeWright pod the cores decide on."""

    name: str
    cr: str
    node: str
    role: str
    package: str
    stage: str
    version: str
    attempt: int
    phase: str
    deleting: bool
    created: datetime | None
    waiting_reason: str = ""
    waiting_message: str = ""
    exit_code: int | None = None
    message: str = ""
    image: str = ""
    image_volume: bool = False
    """The pod mounts its package image as an image volume (packageStaging: image-volume)."""
    cycle: str = ""
    checked: bool = False
    """The stage part of a pod that runs the stage's check after it (:func:`parts`): the
    check's verdict, not a write of the stage's end, is what records that it succeeded."""
    ended: datetime | None = None
    """When the part's container exited (a part of :func:`parts`), if it did."""
    container: str = ""
    """The container whose log is this part's (:func:`parts`); "" for a whole pod."""
    spec: str = ""
    """What the pod runs of its package (:data:`ANN_SPEC`); "" when it does not say."""
    then: str = ""
    """The stage the same pod runs after this part's stage and its check ("" when none):
    a check that passed with a stage after it in its pod is not written, the next stage
    starting is its record (:func:`parts`)."""
    stopping: bool = False
    """The pod has an ``activeDeadlineSeconds``: the executor stopped it (a stage that timed
    out or was aborted), and the kubelet ends it; it is kept for its logs."""
    over: bool = False
    """The whole pod ended (its phase is Succeeded or Failed), whatever this part's phase."""

    @property
    def image_pull_failed(self) -> bool:
        return self.waiting_reason in IMAGE_PULL_REASONS

    @property
    def key(self) -> PodKey:
        """What the pod runs: (package, stage, version, attempt, cycle)."""
        return (self.package, self.stage, self.version, self.attempt, self.cycle)


PodKey = tuple[str, str, str, int, str]
"""(package, stage, version, attempt, cycle) of a NodeWright pod: how a core finds the pod of
a record's current attempt (:attr:`PodView.key`)."""


_READ_ANNOTATIONS: Final = frozenset(
    {ANN_NODE, ANN_VERSION, ANN_ATTEMPT, ANN_CYCLE, ANN_SPEC, ANN_STAGES}
)
_READ_METADATA: Final = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "labels",
)


def slim(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The transform of the executor's and the validator's pod caches: a NodeWright pod
    reduced to what :func:`parts` and :func:`view` read, with what a delete's
    preconditions (``shared.decisions.PodRef``) and the executor's ConfigMap sweep read.

    Dropped: the containers' commands, environment, mounts and security context, every
    volume but the package's image and ConfigMap volumes, the node-metadata document
    (``shared.nodemetadata``) and the kubelet's status beyond the phase and each
    container's name, image and state. A stage pod as the API server sends it is about 33
    KB of Python objects, and each of the two caches (their selectors differ) held every
    pod in flight and every finished one until its delete: the largest growth of one
    process over a 100-node rollout, 1.3 MB by tracemalloc (issue 15). Slimmed, 9 KB.
    ``tests/shared/test_slim_pod.py`` checks that every reading of a slimmed pod is the
    whole pod's."""
    meta = obj.get("metadata") or {}
    kept_meta: dict[str, Any] = {k: meta[k] for k in _READ_METADATA if k in meta}
    annotations = meta.get("annotations") or {}
    ours = {k: v for k, v in annotations.items() if k in _READ_ANNOTATIONS}
    if ours:
        kept_meta["annotations"] = ours
    spec = obj.get("spec") or {}
    kept_spec: dict[str, Any] = {
        "containers": [
            {"name": c.get("name") or "", "image": c.get("image") or ""}
            for c in spec.get("containers") or ()
        ],
        "volumes": [_slim_volume(v) for v in spec.get("volumes") or () if _read_volume(v)],
    }
    for k in ("nodeName", "activeDeadlineSeconds"):
        if spec.get(k) is not None:
            kept_spec[k] = spec[k]
    status = obj.get("status") or {}
    kept_status: dict[str, Any] = {}
    if "phase" in status:
        kept_status["phase"] = status["phase"]
    for k in ("initContainerStatuses", "containerStatuses"):
        if k in status:
            kept_status[k] = [
                {
                    "name": cs.get("name") or "",
                    "image": cs.get("image") or "",
                    "state": _slim_state(cs.get("state") or {}),
                }
                for cs in status[k] or ()
            ]
    return {"metadata": kept_meta, "spec": kept_spec, "status": kept_status}


_READ_STATE: Final = {
    "waiting": ("reason", "message"),
    "running": (),
    "terminated": ("exitCode", "reason", "message", "finishedAt"),
}


def _slim_state(state: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: {f: v[f] for f in _READ_STATE[k] if f in v}
        for k, v in state.items()
        if k in _READ_STATE and isinstance(v, dict)
    }


def _read_volume(volume: Mapping[str, Any]) -> bool:
    return isinstance(volume.get("image"), dict) or isinstance(volume.get("configMap"), dict)


def _slim_volume(volume: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": volume.get("name") or ""}
    if isinstance(volume.get("image"), dict):
        out["image"] = {"reference": volume["image"].get("reference") or ""}
    if isinstance(volume.get("configMap"), dict):
        out["configMap"] = {"name": volume["configMap"].get("name") or ""}
    return out


def _ts(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


def view(pod: Mapping[str, Any]) -> PodView:
    """The whole pod as one view (an interrupt pod, or a pod of an earlier version)."""
    status = pod.get("status") or {}
    return _view(
        pod,
        (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []),
    )


def has_check(pod: Mapping[str, Any]) -> bool:
    """A stage pod that runs its stage's check in the same pod (a segment pod, or one of
    an earlier version with a :data:`CHECK_CONTAINER`)."""
    if stages_of(pod):
        return True
    containers = (pod.get("spec") or {}).get("containers") or []
    return any(c.get("name") == CHECK_CONTAINER for c in containers)


def stages_of(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The stages a segment pod runs, in order (:data:`ANN_STAGES`); () for other pods."""
    ann = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANN_STAGES) or ""
    return tuple(s for s in str(ann).split(",") if s)


def parts(pod: Mapping[str, Any]) -> tuple[PodView, ...]:
    """What ``pod`` runs, one view each: per stage of a segment pod (:data:`ANN_STAGES`),
    the stage and its check, in order; the stage and its check of an earlier version's
    stage pod with a check container; else the whole pod (:func:`view`).

    Each part's ``created`` is when it could start (the pod's creation for the first, the
    end of the container before it for the others: a stage's timeout and a check's clock
    count from there), its ``attempt`` the pod's. A part after one that did not exit 0 is
    ``Pending`` whatever the runtime says of its container: it never runs."""
    seq = stages_of(pod)
    if not seq:
        return _parts_of_earlier(pod) if has_check(pod) else (view(pod),)
    status = pod.get("status") or {}
    inits = list(status.get("initContainerStatuses") or [])
    statuses = inits + list(status.get("containerStatuses") or [])
    ours = {c for s in seq for c in (stage_container(s), check_container(s))}
    # Containers before the first stage (packageStaging: copy) are the first stage's: their
    # image pull or failure is its.
    staging = [cs for cs in inits if cs.get("name") not in ours]
    pod_failed = status.get("phase") == "Failed"
    out: list[PodView] = []
    ok = True  # every container before this one exited 0
    start = _ts((pod.get("metadata") or {}).get("creationTimestamp"))
    for i, stage in enumerate(seq):
        then = seq[i + 1] if i + 1 < len(seq) else ""
        for role, name in (("stage", stage_container(stage)), ("check", check_container(stage))):
            own = _named(statuses, name)
            if not ok:
                seen: list[Any] = []
            else:
                seen = [*(staging if not out else []), *([own] if own else [])]
            v = _view(pod, seen)
            code = _exit_of(statuses, name)
            ended = _finished_at(statuses, name)
            if not ok:
                phase = "Pending"
            elif code is not None:
                phase = "Succeeded" if code == 0 else "Failed"
            elif pod_failed:
                phase = "Failed"  # evicted, or a staging container failed, before it ended
            elif "running" in (own.get("state") or {}):
                phase = "Running"
            else:
                phase = "Pending"
            if ok and code == 0:
                v = replace(v, exit_code=0, message="")
            out.append(
                replace(
                    v,
                    role=role,
                    stage=stage,
                    phase=phase,
                    created=start,
                    ended=ended if ok else None,
                    checked=role == "stage",
                    container=name,
                    then=then,
                )
            )
            ok = ok and phase == "Succeeded"
            start = (ended or start) if ok else None
    return tuple(out)


def _parts_of_earlier(pod: Mapping[str, Any]) -> tuple[PodView, ...]:
    """An earlier version's stage pod with a check container: its stage and its check."""
    status = pod.get("status") or {}
    inits = list(status.get("initContainerStatuses") or [])
    mains = list(status.get("containerStatuses") or [])
    pod_phase = str(status.get("phase") or "Pending")
    stage_exit = _exit_of(inits, STAGE_CONTAINER)
    check_exit = _exit_of(mains, CHECK_CONTAINER)
    stage = _view(pod, inits)
    if stage_exit is not None:
        stage_phase = "Succeeded" if stage_exit == 0 else "Failed"
    else:
        # Still staging or running; a pod that failed before the stage ended (evicted, a
        # staging container that failed) failed the stage.
        stage_phase = "Failed" if pod_phase == "Failed" else pod_phase
    if stage_exit == 0:
        stage = replace(stage, exit_code=0, message="")
    check = _view(pod, mains if stage_exit == 0 else [])
    if check_exit is not None:
        check_phase = "Succeeded" if check_exit == 0 else "Failed"
    elif stage_exit == 0:
        check_phase = "Failed" if pod_phase == "Failed" else "Running"
    else:
        check_phase = "Pending"  # the check has not started: the stage has not succeeded
    started = _finished_at(inits, STAGE_CONTAINER)
    return (
        replace(
            stage,
            role="stage",
            phase=stage_phase,
            checked=True,
            ended=started,
            container=STAGE_CONTAINER,
        ),
        # The check's clock (its timeout, its image's grace) starts when the stage ended,
        # not when the pod was made.
        replace(
            check,
            role="check",
            phase=check_phase,
            created=started or check.created,
            ended=_finished_at(mains, CHECK_CONTAINER),
            container=CHECK_CONTAINER,
        ),
    )


def past_first(parts: Sequence[PodView], key: PodKey) -> PodView | None:
    """The part the pod whose first stage part is ``key`` has reached (the last one that
    could start), when that is past its first stage: a segment pod runs the stage's check
    and the stages after it, and their starts are not written. None when it runs its first
    stage or ``parts`` hold no such pod."""
    first = next((p for p in parts if p.role == "stage" and p.key == key), None)
    if first is None:
        return None
    reached = [p for p in parts if p.name == first.name and p.created is not None]
    last = reached[-1] if reached else first
    return None if last is first else last


def said(p: PodView) -> str:
    """A part as people read it: its stage, or ``<stage>-check`` (its container's name)."""
    return check_container(p.stage) if p.role == "check" else p.stage


def doing(p: PodView) -> str:
    """What a part does, as the CLI and the sandbox say it: ``config running``."""
    return f"{said(p)} {p.phase.lower()}"


def by_node(parts: Iterable[PodView], cr: str) -> dict[str, list[PodView]]:
    """The parts of NodeWright ``cr``'s pods, per node."""
    out: dict[str, list[PodView]] = {}
    for p in parts:
        if p.cr == cr:
            out.setdefault(p.node, []).append(p)
    return out


def part(pod: Mapping[str, Any], role: Role) -> PodView | None:
    """The view of ``pod`` with ``role`` (see :func:`parts`), if it has one."""
    return next((v for v in parts(pod) if v.role == role), None)


def _named(statuses: list[Any], name: str) -> Mapping[str, Any]:
    return next((cs for cs in statuses if cs.get("name") == name), {})


def _exit_of(statuses: list[Any], name: str) -> int | None:
    term = (_named(statuses, name).get("state") or {}).get("terminated")
    return int(term.get("exitCode") or 0) if term else None


def _finished_at(statuses: list[Any], name: str) -> datetime | None:
    term = (_named(statuses, name).get("state") or {}).get("terminated") or {}
    return _ts(term.get("finishedAt"))


def _view(pod: Mapping[str, Any], statuses: list[Any]) -> PodView:
    meta = pod.get("metadata") or {}
    lab = meta.get("labels") or {}
    ann = meta.get("annotations") or {}
    status = pod.get("status") or {}
    waiting_reason = waiting_message = message = image = ""
    exit_code: int | None = None
    for cs in statuses:
        state = cs.get("state") or {}
        if "waiting" in state and not waiting_reason:
            waiting_reason = str(state["waiting"].get("reason") or "")
            waiting_message = str(state["waiting"].get("message") or "")
            image = str(cs.get("image") or "")
        term = state.get("terminated")
        if term and (exit_code is None or term.get("exitCode")):
            exit_code = int(term.get("exitCode") or 0)
            message = str(term.get("message") or term.get("reason") or "")
    spec = pod.get("spec") or {}
    if not image:
        containers = spec.get("containers") or []
        image = str(containers[0].get("image") or "") if containers else ""
    volumes = [v for v in spec.get("volumes") or [] if "image" in (v or {})]
    image_volume = bool(volumes)
    if waiting_reason in IMAGE_PULL_REASONS:
        image = _failed_pull(image, volumes, waiting_message)
    try:
        attempt = int(ann.get(ANN_ATTEMPT) or 1)
    except ValueError:
        attempt = 1
    return PodView(
        name=str(meta.get("name", "")),
        cr=str(lab.get(LABEL_CR, "")),
        node=str(ann.get(ANN_NODE) or (pod.get("spec") or {}).get("nodeName") or ""),
        role=str(lab.get(LABEL_ROLE, "")),
        package="" if lab.get(LABEL_PACKAGE) == "-" else str(lab.get(LABEL_PACKAGE, "")),
        stage=str(lab.get(LABEL_STAGE, "")),
        version=str(ann.get(ANN_VERSION, "")),
        attempt=attempt,
        phase=str(status.get("phase") or "Pending"),
        deleting=bool(meta.get("deletionTimestamp")),
        created=_ts(meta.get("creationTimestamp")),
        waiting_reason=waiting_reason,
        waiting_message=waiting_message,
        exit_code=exit_code,
        message=message,
        image=image,
        image_volume=image_volume,
        spec=str(ann.get(ANN_SPEC) or ""),
        cycle=str(ann.get(ANN_CYCLE) or ""),
        stopping=spec.get("activeDeadlineSeconds") is not None,
        over=status.get("phase") in ("Succeeded", "Failed"),
    )


def _failed_pull(container_image: str, volumes: list[Any], message: str) -> str:
    """The image a failed pull is about. A real kubelet reports an image volume it cannot
    pull on the container that mounts it (the agent's), naming the volume's image in the
    runtime's message: containerd the reference, CRI-O its repository."""
    for v in volumes:
        ref = str((v.get("image") or {}).get("reference") or "")
        if ref and (ref in message or _repository(ref) in message):
            return ref
    return container_image


def _repository(ref: str) -> str:
    """``registry/path`` of an image reference, without its tag or digest."""
    name = ref.split("@", 1)[0]
    head, _, tail = name.rpartition(":")
    return head if head and "/" not in tail else name


AGENT_RESULT_SCHEMA = "nodewright.agent.result/v1"
"""The schema of the agent's result document, its termination message (agent/result.py)."""
_TAIL_LINES = 5


def agent_outcome(pod: PodView) -> tuple[str, dict[str, str]]:
    """What a finished agent pod says about its run, for a reason: its error (e.g. ``step
    'boom' (boom.sh) exited with code 7``) and its last output lines, read from the agent's
    result in the termination message; the raw message when it is no agent result."""
    try:
        doc = json.loads(pod.message)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("schema") != AGENT_RESULT_SCHEMA:
        return pod.message, {}
    text = str(doc.get("error") or f"the agent failed with exit code {doc.get('exit_code')}")
    tail = [str(line) for line in doc.get("tail") or []][-_TAIL_LINES:]
    if tail:
        text += "; last output: " + " | ".join(tail)
    details = {"failedStep": str(doc["failed_step"])} if doc.get("failed_step") else {}
    return text, details


def pods_kind_ref(pod: PodView) -> ObjectRef:
    """An event/reason reference to a NodeWright pod (namespace filled by the reader)."""
    return ObjectRef(kind="Pod", name=pod.name)


def start_failure(pod: PodView, *, now: datetime, grace_s: float) -> Reason | None:
    """A reason when ``pod`` cannot start: its image cannot be pulled, or the runtime cannot
    create its container (at once when the runtime lacks image volumes: no retry helps)."""
    return image_pull_failure(pod, now=now, grace_s=grace_s) or create_failure(
        pod, now=now, grace_s=grace_s
    )


def create_failure(pod: PodView, *, now: datetime, grace_s: float) -> Reason | None:
    """``ImageVolumeUnsupported`` (naming the setting that avoids image volumes) or, after
    ``grace_s``, ``ContainerCreateFailed`` for a container the runtime cannot create."""
    if pod.waiting_reason not in CREATE_FAILURE_REASONS:
        return None
    runtime_says = f"{pod.waiting_reason}: {pod.waiting_message}"
    if pod.image_volume and _NO_IMAGE_VOLUME.search(pod.waiting_message):
        text = (
            f"the container runtime on node {pod.node} cannot mount the package image as an "
            f"image volume (containerd >= 2.1 can); set {PACKAGE_STAGING_SETTING} to copy the "
            f"package's files into the pod instead, then retry the node ({runtime_says})"
        )
        return Reason(
            code=reasons.IMAGE_VOLUME_UNSUPPORTED,
            message=text[:512],
            objects=(pods_kind_ref(pod),),
            details={"setting": PACKAGE_STAGING_SETTING, "waitingReason": pod.waiting_reason},
        )
    age = (now - pod.created).total_seconds() if pod.created else 0.0
    if age < grace_s:
        return None
    return Reason(
        code=reasons.CONTAINER_CREATE_FAILED,
        message=f"the container runtime cannot start pod {pod.name}: {runtime_says}"[:512],
        objects=(pods_kind_ref(pod),),
        details={"waitingReason": pod.waiting_reason},
    )


def image_pull_failure(pod: PodView, *, now: datetime, grace_s: float) -> Reason | None:
    """A reason when ``pod`` has not been able to pull its image for ``grace_s`` seconds."""
    if not pod.image_pull_failed:
        return None
    age = (now - pod.created).total_seconds() if pod.created else 0.0
    if age < grace_s:
        return None
    text = f"cannot pull image {pod.image}: {pod.waiting_reason}: {pod.waiting_message}"[:400]
    hint = (
        "; correct the image in the package's spec (the stage starts over by itself) or run "
        "`nodewright node retry`"
    )
    return Reason(
        code=reasons.IMAGE_PULL_FAILED,
        message=text + hint,
        objects=(pods_kind_ref(pod),),
        details={"image": pod.image, "waitingReason": pod.waiting_reason},
    )
