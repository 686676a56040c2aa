"""What drain does with each pod, like ``kubectl drain``, and what the API server answered.

Small frozen views of the cluster objects drain decisions read (:class:`PodInfo`,
:class:`PdbInfo`, and :func:`slim_pod`, the informer transform that keeps only those
fields), the pod filters (:func:`classify`: evict, delete, skip, block or await, with a
CamelCase why; :func:`protected_pods`), and :func:`refusal`, which reads an eviction's
error answer. Pure and table-tested; deciding what a node does next is
``services.drainer.core``'s job, sending the requests the shell's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec

from shared import api, pods as own_pods, progress, reasons
from shared.events import ObjectRef

MIRROR_ANNOTATION: Final = "kubernetes.io/config.mirror"
"""Set by the kubelet on the API mirror of a static pod; deleting the mirror does nothing."""


# ---- views of the cluster -------------------------------------------------------------------


@dataclass(frozen=True)
class PodInfo:
    """The parts of any pod on the node that drain decisions need."""

    namespace: str
    name: str
    uid: str
    phase: str
    labels: Mapping[str, str]
    terminating: bool = False
    mirror: bool = False
    controller_kind: str = ""
    """Kind of the controlling owner (ReplicaSet, DaemonSet ...); "" for an unmanaged pod."""
    empty_dir: bool = False
    pull: own_pods.PodView | None = None
    """Of NodeWright's pod pulling package images before the drain (``spec.drain.prePullImages``):
    what it says of the pull; None for every other pod."""

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef(kind="Pod", namespace=self.namespace, name=self.name)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def nodewright(self) -> bool:
        """One of NodeWright's own pods: never evicted, never waited for."""
        return self.labels.get(own_pods.LABEL_MANAGED) == own_pods.MANAGED_BY


def _pulls(obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return (
        labels.get(own_pods.LABEL_MANAGED) == own_pods.MANAGED_BY
        and labels.get(own_pods.LABEL_ROLE) == "pull"
    )


def slim_pod(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A pod reduced to what :func:`pod_info` reads (the informer keeps only this in memory);
    a pull pod keeps what :func:`shared.pods.view` reads of its pull too."""
    meta = obj.get("metadata") or {}
    owners = [
        {"kind": o.get("kind", ""), "name": o.get("name", ""), "controller": True}
        for o in meta.get("ownerReferences") or ()
        if o.get("controller")
    ]
    if _pulls(obj):
        pull = own_pods.slim(obj)
        if owners:
            pull["metadata"]["ownerReferences"] = owners
        return pull
    spec = obj.get("spec") or {}
    keep = ("name", "namespace", "uid", "resourceVersion", "labels", "deletionTimestamp")
    slim_meta: dict[str, Any] = {k: meta[k] for k in keep if k in meta}
    annotations = meta.get("annotations") or {}
    if MIRROR_ANNOTATION in annotations:
        slim_meta["annotations"] = {MIRROR_ANNOTATION: annotations[MIRROR_ANNOTATION]}
    if owners:
        slim_meta["ownerReferences"] = owners
    volumes = [
        {"name": v.get("name", ""), "emptyDir": {}}
        for v in spec.get("volumes") or ()
        if v.get("emptyDir") is not None
    ]
    return {
        "metadata": slim_meta,
        "spec": {"nodeName": spec.get("nodeName") or "", "volumes": volumes},
        "status": {"phase": (obj.get("status") or {}).get("phase") or ""},
    }


def pod_info(obj: Mapping[str, Any]) -> PodInfo:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    controller = next((o for o in meta.get("ownerReferences") or () if o.get("controller")), None)
    return PodInfo(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        phase=str((obj.get("status") or {}).get("phase") or "Pending"),
        labels=dict(meta.get("labels") or {}),
        terminating=bool(meta.get("deletionTimestamp")),
        mirror=MIRROR_ANNOTATION in (meta.get("annotations") or {}),
        controller_kind=str(controller.get("kind") or "") if controller else "",
        empty_dir=any(v.get("emptyDir") is not None for v in spec.get("volumes") or ()),
        pull=own_pods.view(obj) if _pulls(obj) else None,
    )


@dataclass(frozen=True)
class PdbInfo:
    """A PodDisruptionBudget, for naming the one that refuses an eviction."""

    namespace: str
    name: str
    selector: api.LabelSelector | None
    """None (no selector, or one we cannot read) matches no pod."""
    disruptions_allowed: int = 0
    current_healthy: int = 0
    desired_healthy: int = 0
    expected_pods: int = 0

    def matches(self, pod: PodInfo) -> bool:
        return (
            self.namespace == pod.namespace
            and self.selector is not None
            and progress.selector_matches(self.selector, pod.labels)
        )

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef(kind="PodDisruptionBudget", namespace=self.namespace, name=self.name)


def pdb_info(obj: Mapping[str, Any]) -> PdbInfo:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    raw = (obj.get("spec") or {}).get("selector")
    selector: api.LabelSelector | None = None
    if raw is not None:
        try:
            selector = api.from_dict(raw, api.LabelSelector)
        except msgspec.ValidationError:
            selector = None
    return PdbInfo(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        selector=selector,
        disruptions_allowed=int(status.get("disruptionsAllowed") or 0),
        current_healthy=int(status.get("currentHealthy") or 0),
        desired_healthy=int(status.get("desiredHealthy") or 0),
        expected_pods=int(status.get("expectedPods") or 0),
    )


# ---- pod classification (kubectl drain's filters) ---------------------------------------------

Action = Literal["evict", "delete", "skip", "block", "await"]


@dataclass(frozen=True)
class Verdict:
    """What the drain does with one pod, and why (a CamelCase code)."""

    action: Action
    code: str


def classify(pod: PodInfo, options: api.DrainOptions) -> Verdict:
    """kubectl drain's filters, in its order, with NodeWright's own pods exempt."""
    if pod.nodewright:
        return Verdict("skip", "NodeWrightPod")
    if pod.mirror:
        return Verdict("skip", "MirrorPod")
    if pod.phase in ("Succeeded", "Failed"):
        return Verdict("skip", "Completed")
    if not progress.selector_matches(options.pod_selector, pod.labels):
        return Verdict("skip", "NotSelected")
    daemon = pod.controller_kind == "DaemonSet"
    if daemon and options.ignore_daemon_sets:
        return Verdict("skip", reasons.DAEMON_SET_POD)
    if pod.terminating:
        return Verdict("await", "Terminating")
    if daemon:
        return Verdict("block", reasons.DAEMON_SET_POD)
    if pod.empty_dir and not options.delete_empty_dir_data:
        return Verdict("block", reasons.EMPTY_DIR_DATA)
    if not pod.controller_kind:
        match options.unmanaged_pods:
            case "Block":
                return Verdict("block", reasons.UNMANAGED_POD)
            case "Evict":
                return Verdict("evict", reasons.UNMANAGED_POD)
            case "Delete":
                return Verdict("delete", reasons.UNMANAGED_POD)
    return Verdict("evict", "Managed")


def protected_pods(pods: Iterable[PodInfo], selector: api.LabelSelector | None) -> list[PodInfo]:
    """Pods matching podNonInterruptLabels that are running or about to (an empty selector
    protects nothing)."""
    if progress.selector_is_empty(selector):
        return []
    return sorted(
        (
            p
            for p in pods
            if not p.nodewright
            and not p.terminating
            and p.phase in ("Running", "Pending")
            and progress.selector_matches(selector, p.labels)
        ),
        key=lambda p: p.key,
    )


# ---- eviction answers -----------------------------------------------------------------------


Outcome = Literal["evicted", "deleted", "gone", "refused", "multiple-pdbs", "retry"]


@dataclass(frozen=True)
class EvictionResult:
    """What the API server answered to one eviction (or deletion)."""

    pod: PodInfo
    outcome: Outcome
    """evicted/deleted: accepted; gone: 404 or another UID; refused: 429; multiple-pdbs: 500;
    retry: a temporary refusal (namespace terminating, conflict)."""
    message: str = ""
    budget: str = ""
    """The PDB the API server named in a 429 (its DisruptionBudget cause), if any."""


# The API server names the PDB in a 429's DisruptionBudget cause.
_BUDGET_NAME: Final = re.compile(r"disruption budget (\S+)")


def refusal(pod: PodInfo, *, status: int, message: str, body: Mapping[str, Any]) -> EvictionResult:
    """Read the API server's refusal of one eviction (or deletion) of ``pod``."""
    if status == 404 or (status == 409 and "precondition" in message.lower()):
        return EvictionResult(pod=pod, outcome="gone")  # gone, or replaced by another UID
    if status == 429:
        budget = ""
        for cause in (body.get("details") or {}).get("causes") or ():
            found = _BUDGET_NAME.search(str(cause.get("message") or ""))
            if cause.get("reason") == "DisruptionBudget" and found:
                budget = found.group(1)
        return EvictionResult(pod=pod, outcome="refused", message=message, budget=budget)
    if status == 500 and "PodDisruptionBudget" in message:
        return EvictionResult(pod=pod, outcome="multiple-pdbs", message=message)
    # Anything else (a terminating namespace, an update conflict, missing RBAC ...) is
    # retried; the node's reason carries the message so it is never a silent wait.
    return EvictionResult(pod=pod, outcome="retry", message=f"{status}: {message}")
