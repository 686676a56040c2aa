"""NodeWright's own pods (stage, check and interrupt pods): names, labels, and a parsed view.

Pod names are deterministic, so a second replica or a retried reconcile asking for the same
pod gets AlreadyExists instead of a duplicate. This module is pure: building manifests is the
owning service's job; this one only names pods and reads them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

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

Role = Literal["stage", "check", "interrupt"]

# Waiting reasons that mean the image will not arrive without a change to the spec.
IMAGE_PULL_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)


def pod_name(
    *, cr: str, node: str, role: Role, package: str, stage: str, version: str, attempt: int
) -> str:
    """``<cr>-<package>-<stage>-<hash>``, at most 63 characters, unique per attempt."""
    digest = hashlib.sha256(
        "\0".join([cr, node, role, package, stage, version, str(attempt)]).encode()
    ).hexdigest()[:10]
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

    @property
    def image_pull_failed(self) -> bool:
        return self.waiting_reason in IMAGE_PULL_REASONS


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
    if not image:
        containers = (pod.get("spec") or {}).get("containers") or []
        image = str(containers[0].get("image") or "") if containers else ""
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
    )


def pods_kind_ref(pod: PodView) -> ObjectRef:
    """An event/reason reference to a NodeWright pod (namespace filled by the reader)."""
    return ObjectRef(kind="Pod", name=pod.name)


def image_pull_failure(pod: PodView, *, now: datetime, grace_s: float) -> Reason | None:
    """A reason when ``pod`` has not been able to pull its image for ``grace_s`` seconds."""
    if not pod.image_pull_failed:
        return None
    age = (now - pod.created).total_seconds() if pod.created else 0.0
    if age < grace_s:
        return None
    text = f"cannot pull image {pod.image}: {pod.waiting_reason}: {pod.waiting_message}"
    return Reason(
        code="ImagePullFailed",
        message=text[:512],
        objects=(pods_kind_ref(pod),),
        details={"image": pod.image, "waitingReason": pod.waiting_reason},
    )
