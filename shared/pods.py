"""NodeWright's own pods (stage, check and interrupt pods): names, labels, and a parsed view.

Pod names are deterministic, so a second replica or a retried reconcile asking for the same
pod gets AlreadyExists instead of a duplicate. This module is pure: building manifests is the
owning service's job; this one only names pods and reads them.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

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
"""The cycle a stage or check pod belongs to (``PackageRecord.cycle_started``), or the
interrupt's start: part of the pod's name, so a later cycle never reuses one."""

Role = Literal["stage", "check", "interrupt"]

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


def _ts(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


def view(pod: Mapping[str, Any]) -> PodView:
    meta = pod.get("metadata") or {}
    lab = meta.get("labels") or {}
    ann = meta.get("annotations") or {}
    status = pod.get("status") or {}
    waiting_reason = waiting_message = message = image = ""
    exit_code: int | None = None
    for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
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
    image_volume = any("image" in (v or {}) for v in spec.get("volumes") or [])
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
        cycle=str(ann.get(ANN_CYCLE) or ""),
    )


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
