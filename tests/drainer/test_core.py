"""The drainer core cordons with ownership, waits for protected pods, drains like kubectl
drain, names whatever blocks it, times out, and releases only its own cordon."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import msgspec
import pytest

from services.drainer import core, filters
from services.drainer.filters import EvictionResult, PdbInfo, PodInfo
from shared import api, events, nodeshell, nodestate, outbox, progress
from shared.decisions import Keep, Remove
from shared.events import ObjectRef, Reason
from shared.records.drainer import DrainPhase, DrainRecord
from shared.records.executor import ExecutorRecord, PackageRecord
from shared.records.scheduler import Selection
from shared.records.validator import ValidatorRecord
from tests.helpers.facts import T0, node, nodewright, written

CR = "gpu-node-tuning"
NOW = T0 + timedelta(minutes=5)


def _cr(**spec: Any) -> api.NodeWright:
    return nodewright(CR, **spec)


def _selection(cr: api.NodeWright, *, disruptive: bool = True) -> Selection:
    return Selection(
        generation=1,
        compartment="default",
        batch=1,
        selected_at=T0,
        disruptive=disruptive,
        target=progress.target_digest(cr),
    )


def _record(phase: DrainPhase = "cordoned", **kw: Any) -> DrainRecord:
    return DrainRecord(
        **{"phase": phase, "cordoned": True, "started": T0, "since": T0, **kw},
    )


def _done_records(cr: api.NodeWright) -> dict[str, msgspec.Struct]:
    d = progress.desired(cr)["nvidia-tuned"]
    return {
        nodestate.EXECUTOR: ExecutorRecord(
            packages={
                "nvidia-tuned": PackageRecord(
                    version=d.version,
                    stage="config",
                    state="succeeded",
                    installed=d.version,
                    config=d.config_digest,
                    updated=T0,
                )
            }
        ),
        nodestate.VALIDATOR: ValidatorRecord(validated=progress.target_digest(cr)),
    }


def _node(
    cr: api.NodeWright,
    *,
    drain: DrainRecord | None = None,
    selected: bool = True,
    disruptive: bool = True,
    others: dict[str, str] | None = None,
    extra: dict[str, msgspec.Struct] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    """A node dict for CR gpu-node-tuning; ``others`` adds raw drainer annotations of other CRs."""
    records: dict[str, msgspec.Struct] = dict(extra or {})
    if selected:
        records[nodestate.SCHEDULER] = _selection(cr, disruptive=disruptive)
    if drain is not None:
        records[nodestate.DRAINER] = drain
    obj = node("n1", records=records, **kw)
    for other, value in (others or {}).items():
        obj["metadata"]["annotations"][nodestate.key(nodestate.DRAINER, other)] = value
    return obj


def _other(rec: DrainRecord) -> str:
    return msgspec.json.encode(rec).decode()


def _pod(name: str, *, ns: str = "apps", **kw: Any) -> PodInfo:
    fields: dict[str, Any] = {
        "namespace": ns,
        "name": name,
        "uid": f"uid-{name}",
        "phase": "Running",
        "labels": {"app": name},
        "controller_kind": "ReplicaSet",
        **kw,
    }
    return PodInfo(**fields)


def _decide(
    cr: api.NodeWright,
    obj: dict[str, Any],
    pods: list[PodInfo] | None = None,
    *,
    now: Any = NOW,
    cr_present: bool = True,
) -> core.Decision:
    return core.decide(
        cr_name=CR,
        cr=cr if cr_present else None,
        node=progress.facts(obj, CR),
        others=core.drain_records(obj, besides=CR),
        pods=pods or [],
        now=now,
        eviction_retry_s=5.0,
        deletion_poll_s=2.0,
    )


def _written(d: core.Decision) -> DrainRecord:
    assert d.write is not None
    assert written(d.write.record, DrainRecord) is not None
    return written(d.write.record, DrainRecord)


def _kinds(d: core.Decision) -> list[str]:
    return [e.kind for e in d.publish]


# ---- classification -------------------------------------------------------------------------

OWN = {"app.kubernetes.io/managed-by": "nodewright"}


@pytest.mark.parametrize(
    ("pod", "options", "expected"),
    [
        pytest.param({}, {}, ("evict", "Managed"), id="managed-running-evicted"),
        pytest.param({"phase": "Pending"}, {}, ("evict", "Managed"), id="managed-pending-evicted"),
        pytest.param(
            {"labels": OWN, "controller_kind": ""},
            {"unmanagedPods": "Block"},
            ("skip", "NodeWrightPod"),
            id="own-pod-never-touched",
        ),
        pytest.param({"mirror": True}, {}, ("skip", "MirrorPod"), id="mirror-pod-skipped"),
        pytest.param(
            {"mirror": True, "controller_kind": ""},
            {},
            ("skip", "MirrorPod"),
            id="mirror-unmanaged",
        ),
        pytest.param({"phase": "Succeeded"}, {}, ("skip", "Completed"), id="succeeded-skipped"),
        pytest.param(
            {"phase": "Failed", "controller_kind": ""}, {}, ("skip", "Completed"), id="failed-bare"
        ),
        pytest.param(
            {},
            {"podSelector": {"matchLabels": {"tier": "batch"}}},
            ("skip", "NotSelected"),
            id="pod-selector-excludes",
        ),
        pytest.param(
            {"labels": {"tier": "batch"}},
            {"podSelector": {"matchLabels": {"tier": "batch"}}},
            ("evict", "Managed"),
            id="pod-selector-includes",
        ),
        pytest.param(
            {"controller_kind": "DaemonSet"}, {}, ("skip", "DaemonSetPod"), id="daemonset-ignored"
        ),
        pytest.param(
            {"controller_kind": "DaemonSet"},
            {"ignoreDaemonSets": False},
            ("block", "DaemonSetPod"),
            id="daemonset-blocks-when-not-ignored",
        ),
        pytest.param(
            {"controller_kind": "DaemonSet", "terminating": True},
            {"ignoreDaemonSets": False},
            ("await", "Terminating"),
            id="terminating-daemonset-awaited",
        ),
        pytest.param({"terminating": True}, {}, ("await", "Terminating"), id="terminating-awaited"),
        pytest.param(
            {"terminating": True, "controller_kind": ""},
            {"unmanagedPods": "Block"},
            ("await", "Terminating"),
            id="terminating-bare-awaited-not-blocking",
        ),
        pytest.param({"empty_dir": True}, {}, ("block", "EmptyDirData"), id="emptydir-blocks"),
        pytest.param(
            {"empty_dir": True},
            {"deleteEmptyDirData": True},
            ("evict", "Managed"),
            id="emptydir-evicted-when-allowed",
        ),
        pytest.param(
            {"controller_kind": ""}, {}, ("block", "UnmanagedPod"), id="unmanaged-blocks-default"
        ),
        pytest.param(
            {"controller_kind": ""},
            {"unmanagedPods": "Evict"},
            ("evict", "UnmanagedPod"),
            id="unmanaged-evicted",
        ),
        pytest.param(
            {"controller_kind": ""},
            {"unmanagedPods": "Delete"},
            ("delete", "UnmanagedPod"),
            id="unmanaged-deleted",
        ),
        pytest.param(
            {"controller_kind": "", "empty_dir": True},
            {"unmanagedPods": "Delete"},
            ("block", "EmptyDirData"),
            id="emptydir-checked-before-unmanaged",
        ),
    ],
)
def test_classify_follows_kubectl_drain_filters(
    pod: dict[str, Any], options: dict[str, Any], expected: tuple[str, str]
) -> None:
    verdict = filters.classify(_pod("p", **pod), api.from_dict(options, api.DrainOptions))
    assert (verdict.action, verdict.code) == expected


PROTECT = api.LabelSelector(match_labels={"workload": "training"})
TRAINING = {"workload": "training"}


@pytest.mark.parametrize(
    ("pod", "selector", "protected"),
    [
        pytest.param({"labels": TRAINING}, PROTECT, True, id="running-match"),
        pytest.param({"labels": TRAINING, "phase": "Pending"}, PROTECT, True, id="pending-match"),
        pytest.param(
            {"labels": TRAINING, "phase": "Succeeded"}, PROTECT, False, id="finished-not-protected"
        ),
        pytest.param(
            {"labels": TRAINING, "terminating": True}, PROTECT, False, id="terminating-not-waited"
        ),
        pytest.param({"labels": {**TRAINING, **OWN}}, PROTECT, False, id="own-pod-never-waited"),
        pytest.param({"labels": {"workload": "web"}}, PROTECT, False, id="no-match"),
        pytest.param({"labels": TRAINING}, None, False, id="unset-protects-nothing"),
        pytest.param({"labels": TRAINING}, api.LabelSelector(), False, id="empty-protects-nothing"),
        pytest.param(
            {"labels": TRAINING},
            api.LabelSelector(
                match_expressions=[
                    api.LabelSelectorRequirement(
                        key="workload", operator="In", values=["training", "inference"]
                    )
                ]
            ),
            True,
            id="expression-match",
        ),
    ],
)
def test_protected_pods(
    pod: dict[str, Any], selector: api.LabelSelector | None, protected: bool
) -> None:
    assert bool(filters.protected_pods([_pod("p", **pod)], selector)) is protected


def test_slim_pod_keeps_exactly_what_the_decisions_read() -> None:
    full = {
        "metadata": {
            "name": "web-1",
            "namespace": "apps",
            "uid": "u1",
            "resourceVersion": "7",
            "labels": {"app": "web"},
            "annotations": {
                filters.MIRROR_ANNOTATION: "abc",
                "kubectl.kubernetes.io/last-applied-configuration": "x" * 5000,
            },
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "controller": True},
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "other"},
            ],
            "deletionTimestamp": "2026-01-01T00:00:00Z",
            "managedFields": [{"manager": "x"}],
        },
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c", "image": "i"}],
            "volumes": [
                {"name": "scratch", "emptyDir": {}},
                {"name": "cfg", "configMap": {"name": "c"}},
            ],
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready"}]},
    }
    slim = filters.slim_pod(full)
    assert filters.pod_info(slim) == filters.pod_info(full)
    assert filters.pod_info(full) == PodInfo(
        namespace="apps",
        name="web-1",
        uid="u1",
        phase="Running",
        labels={"app": "web"},
        terminating=True,
        mirror=True,
        controller_kind="ReplicaSet",
        empty_dir=True,
    )
    assert slim["metadata"]["resourceVersion"] == "7", "the informer compares versions"
    assert "managedFields" not in slim["metadata"]
    assert list(slim["metadata"]["annotations"]) == [filters.MIRROR_ANNOTATION]
    assert "containers" not in slim["spec"]
    assert slim["spec"]["volumes"] == [{"name": "scratch", "emptyDir": {}}]


def test_an_unowned_pod_without_volumes_reads_as_unmanaged() -> None:
    info = filters.pod_info(filters.slim_pod({"metadata": {"name": "bare", "namespace": "a"}}))
    assert (info.controller_kind, info.empty_dir, info.mirror, info.phase) == (
        "",
        False,
        False,
        "Pending",
    )


@pytest.mark.parametrize(
    ("selector", "pod_ns", "matches"),
    [
        pytest.param({"matchLabels": {"app": "p"}}, "apps", True, id="label-match"),
        pytest.param({"matchLabels": {"app": "other"}}, "apps", False, id="label-mismatch"),
        pytest.param({}, "apps", True, id="empty-selector-matches-namespace"),
        pytest.param(None, "apps", False, id="no-selector-matches-nothing"),
        pytest.param({"matchLabels": {"app": "p"}}, "other", False, id="other-namespace"),
    ],
)
def test_pdb_matching(selector: dict[str, Any] | None, pod_ns: str, matches: bool) -> None:
    spec = {} if selector is None else {"selector": selector}
    pdb = filters.pdb_info(
        {
            "metadata": {"name": "guard", "namespace": "apps"},
            "spec": spec,
            "status": {"disruptionsAllowed": 0, "currentHealthy": 2, "desiredHealthy": 2},
        }
    )
    assert pdb.matches(_pod("p", ns=pod_ns)) is matches
    assert (pdb.current_healthy, pdb.desired_healthy) == (2, 2)


# ---- cordon -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("unschedulable", "others", "preexisting"),
    [
        pytest.param(False, {}, False, id="fresh-node"),
        pytest.param(True, {}, True, id="cordoned-by-someone-else"),
        pytest.param(True, {"other": _other(_record())}, False, id="joins-another-crs-cordon"),
        pytest.param(
            True,
            {"other": _other(_record(preexisting=True))},
            True,
            id="inherits-a-preexisting-cordon",
        ),
        pytest.param(True, {"other": "{not json"}, True, id="unreadable-other-record-is-safe"),
        pytest.param(
            True, {"other": _other(_record(cordoned=False))}, True, id="other-holds-no-cordon"
        ),
    ],
)
def test_cordon_records_ownership_in_the_same_write(
    unschedulable: bool, others: dict[str, str], preexisting: bool
) -> None:
    cr = _cr()
    d = _decide(cr, _node(cr, unschedulable=unschedulable, others=others))
    assert d.write is not None
    assert d.write.unschedulable is True
    rec = _written(d)
    assert (rec.phase, rec.cordoned, rec.preexisting) == ("cordoned", True, preexisting)
    assert (rec.started, rec.since) == (NOW, NOW)
    (event,) = d.publish
    assert isinstance(event, events.NodeCordoned)
    assert event.preexisting is preexisting
    assert d.evict == ()
    body = nodeshell.node_patch(core.node_decision(CR, "gpu-1", d), "42")
    assert body["spec"] == {"unschedulable": True}
    assert body["metadata"]["resourceVersion"] == "42"
    assert (
        msgspec.json.decode(
            body["metadata"]["annotations"][nodestate.key(nodestate.DRAINER, CR)], type=DrainRecord
        )
        == rec
    )


@pytest.mark.parametrize(
    ("node_kwargs", "spec", "annotations"),
    [
        pytest.param({"selected": False}, {}, {}, id="not-admitted"),
        pytest.param({"disruptive": False}, {}, {}, id="non-disruptive-admission"),
        pytest.param({"drain": _record("drained")}, {}, {}, id="already-drained"),
        pytest.param({"drain": _record("failed")}, {}, {}, id="failed-stays-as-is"),
        pytest.param({}, {}, {api.PAUSE_ANNOTATION: "true"}, id="paused"),
        pytest.param({}, {}, {api.DISABLE_ANNOTATION: "true"}, id="disabled"),
    ],
)
def test_nothing_happens_when_it_is_not_the_drainers_move(
    node_kwargs: dict[str, Any], spec: dict[str, Any], annotations: dict[str, str]
) -> None:
    cr = nodewright(CR, annotations=annotations, **spec)
    pods = [_pod("web")]
    d = _decide(cr, _node(cr, **node_kwargs), pods)
    assert d == core.Decision()


def test_an_undecodable_own_record_is_reported_and_never_overwritten() -> None:
    cr = _cr()
    obj = _node(cr)
    obj["metadata"]["annotations"][nodestate.key(nodestate.DRAINER, CR)] = "{garbage"
    d = _decide(cr, obj, [_pod("web")])
    assert d.write is None
    assert "does not decode" in d.problem


def test_a_node_uncordoned_behind_our_back_mid_drain_is_cordoned_again() -> None:
    cr = _cr()
    rec = _record("draining")
    d = _decide(cr, _node(cr, drain=rec, unschedulable=False), [_pod("web")])
    assert d.write == core.NodeWrite(record=Keep(), unschedulable=True)
    assert d.evict == ()


# ---- protected pods -----------------------------------------------------------------------------


def test_protected_pods_hold_the_node_and_nothing_is_evicted() -> None:
    cr = _cr(podNonInterruptLabels={"matchLabels": TRAINING})
    pods = [_pod("train", ns="ml", labels=TRAINING), _pod("web")]
    obj = _node(cr, drain=_record(), unschedulable=True)
    d = _decide(cr, obj, pods)
    rec = _written(d)
    assert rec.phase == "waiting"
    assert rec.reason is not None
    assert rec.reason.code == "ProtectedPodRunning"
    assert rec.reason.objects == (ObjectRef(kind="Pod", namespace="ml", name="train"),)
    assert "ml/train" in rec.reason.message
    assert d.evict == ()
    assert d.delete == ()
    assert _kinds(d) == ["node.waiting"]
    assert d.requeue_after is None, "an indefinite wait: pod changes re-queue the node"

    # Unchanged on the next pass: no write, no new event.
    again = _decide(
        cr, _node(cr, drain=rec, unschedulable=True), pods, now=NOW + timedelta(hours=9)
    )
    assert again == core.Decision()


def test_the_waiting_reason_lists_ten_pods_and_counts_the_rest() -> None:
    cr = _cr(podNonInterruptLabels={"matchLabels": TRAINING})
    pods = [_pod(f"train-{i:02d}", labels=TRAINING) for i in range(15)]
    rec = _written(_decide(cr, _node(cr, drain=_record(), unschedulable=True), pods))
    assert rec.reason is not None
    assert len(rec.reason.objects) == core.MAX_LISTED
    assert rec.reason.details["pods"] == "15"
    assert rec.reason.message.endswith("and 5 more")


def test_a_new_protected_pod_changes_the_reason_and_publishes_again() -> None:
    cr = _cr(podNonInterruptLabels={"matchLabels": TRAINING})
    first = _written(
        _decide(
            cr,
            _node(cr, drain=_record(), unschedulable=True),
            [_pod("a", labels=TRAINING)],
        )
    )
    d = _decide(cr, _node(cr, drain=first, unschedulable=True), [_pod("b", labels=TRAINING)])
    assert _kinds(d) == ["node.waiting"]
    assert _written(d).since == first.since, "still the same phase"


def test_the_protected_wait_does_not_count_toward_the_drain_timeout() -> None:
    cr = _cr(drain={"timeoutSeconds": 60})
    waited = _record("waiting", reason=Reason(code="ProtectedPodRunning", message="m"))
    later = T0 + timedelta(hours=3)
    d = _decide(cr, _node(cr, drain=waited, unschedulable=True), [_pod("web")], now=later)
    assert d.evict == (_pod("web"),)
    assert d.pending is not None
    assert d.pending.started == later, "draining starts now, after the wait"
    settled = core.settle(
        d.pending, [EvictionResult(pod=_pod("web"), outcome="evicted")], pdbs=[], now=later
    )
    rec = _written(settled)
    assert (rec.phase, rec.started) == ("draining", later)


# ---- draining ---------------------------------------------------------------------------------


def test_a_drain_evicts_waits_until_pods_are_gone_then_reports_drained() -> None:
    cr = _cr()
    pods = [_pod("web-1"), _pod("web-2")]
    d1 = _decide(cr, _node(cr, drain=_record(), unschedulable=True), pods)
    assert d1.write is None, "the write waits for the eviction results"
    assert [p.name for p in d1.evict] == ["web-1", "web-2"]
    assert d1.pending is not None
    d2 = core.settle(
        d1.pending,
        [EvictionResult(pod=p, outcome="evicted") for p in pods],
        pdbs=[],
        now=NOW,
    )
    rec = _written(d2)
    assert (rec.phase, rec.started, rec.cordoned) == ("draining", NOW, True)
    assert rec.reason is not None
    assert rec.reason.code == "Draining"
    assert rec.reason.details == {"pods": "2", "evicted": "2"}
    assert d2.requeue_after == 2.0
    assert d2.publish == ()

    # Evicted pods still terminating: not drained, nothing evicted again.
    terminating = [_pod("web-1", terminating=True), _pod("web-2", terminating=True)]
    d3 = _decide(cr, _node(cr, drain=rec, unschedulable=True), terminating)
    assert d3.evict == ()
    assert d3.write is None, "nothing changed"
    assert d3.requeue_after == 2.0

    # One is gone: still waiting for the other.
    d4 = _decide(cr, _node(cr, drain=rec, unschedulable=True), terminating[1:])
    rec4 = _written(d4)
    assert rec4.phase == "draining"
    assert rec4.reason is not None
    assert rec4.reason.objects == (ObjectRef(kind="Pod", namespace="apps", name="web-2"),)

    # All gone (or replaced by pods that are not ours to evict): drained.
    d5 = _decide(cr, _node(cr, drain=rec4, unschedulable=True), [])
    done = _written(d5)
    assert (done.phase, done.reason, done.cordoned, done.started) == ("drained", None, True, NOW)
    (event,) = d5.publish
    assert isinstance(event, events.NodeDrained)
    assert event.evicted == 2
    assert d5.write is not None
    assert d5.write.unschedulable is None


def test_only_the_decision_that_records_drained_says_it_declares_the_node_drained() -> None:
    """The shell reads the node's pods from the API server before carrying out this one
    decision when its cache is behind the node (a pod bound just before the cordon)."""
    cr = _cr()
    pods = [_pod("web-1")]
    cordon = _decide(cr, _node(cr))
    assert _written(cordon).phase == "cordoned"
    evict = _decide(cr, _node(cr, drain=_record(), unschedulable=True), pods)
    terminating = [_pod("web-1", terminating=True)]
    draining = _decide(cr, _node(cr, drain=_record(), unschedulable=True), terminating)
    assert _written(draining).phase == "draining"
    drained = _decide(cr, _node(cr, drain=_record(), unschedulable=True), [])
    assert _written(drained).phase == "drained"
    assert [d.declares_drained for d in (cordon, evict, draining, drained)] == [
        False,
        False,
        False,
        True,
    ]


def test_an_empty_node_is_drained_at_once() -> None:
    cr = _cr()
    skipped = [
        _pod("ds", controller_kind="DaemonSet"),
        _pod("static", mirror=True),
        _pod("ours", labels=OWN),
        _pod("done", phase="Succeeded"),
    ]
    d = _decide(cr, _node(cr, drain=_record(), unschedulable=True), skipped)
    assert _written(d).phase == "drained"
    assert _kinds(d) == ["node.drained"]


def test_unmanaged_pods_are_deleted_and_others_evicted_with_the_grace_period() -> None:
    cr = _cr(drain={"unmanagedPods": "Delete", "gracePeriodSeconds": 7})
    bare, web = _pod("bare", controller_kind=""), _pod("web")
    d = _decide(cr, _node(cr, drain=_record(), unschedulable=True), [bare, web])
    assert (d.evict, d.delete, d.grace_period_s) == ((web,), (bare,), 7)


@pytest.mark.parametrize(
    ("pods", "options", "code", "named"),
    [
        pytest.param([_pod("bare", controller_kind="")], {}, "UnmanagedPod", ["bare"], id="bare"),
        pytest.param([_pod("cache", empty_dir=True)], {}, "EmptyDirData", ["cache"], id="emptydir"),
        pytest.param(
            [_pod("ds", controller_kind="DaemonSet")],
            {"ignoreDaemonSets": False},
            "DaemonSetPod",
            ["ds"],
            id="daemonset",
        ),
        pytest.param(
            [
                _pod("ds", controller_kind="DaemonSet"),
                _pod("cache", empty_dir=True),
                _pod("bare", controller_kind=""),
            ],
            {"ignoreDaemonSets": False},
            "UnmanagedPod",
            ["bare", "cache", "ds"],
            id="several-kinds-all-named",
        ),
    ],
)
def test_blocking_pods_stop_the_drain_before_anything_is_evicted(
    pods: list[PodInfo], options: dict[str, Any], code: str, named: list[str]
) -> None:
    cr = _cr(drain={"timeoutSeconds": 600, **options})
    d = _decide(cr, _node(cr, drain=_record(), unschedulable=True), [*pods, _pod("web")])
    assert d.evict == ()
    assert d.delete == ()
    rec = _written(d)
    assert rec.phase == "blocked"
    assert rec.reason is not None
    assert rec.reason.code == code
    assert [o.name for o in rec.reason.objects] == named
    assert _kinds(d) == ["node.drain-blocked"]
    assert d.requeue_after == 600, "only the timeout needs a timer; pod changes re-queue"

    # The same blockers on the next pass: no write, no event.
    again = _decide(cr, _node(cr, drain=rec, unschedulable=True), [*pods, _pod("web")])
    assert (again.write, again.publish) == (None, ())


GUARD = PdbInfo(
    namespace="apps",
    name="guard",
    selector=api.LabelSelector(match_labels={"app": "web"}),
    disruptions_allowed=0,
    current_healthy=2,
    desired_healthy=2,
    expected_pods=2,
)


def _draining_step(cr: api.NodeWright, pods: list[PodInfo]) -> core.Pending:
    d = _decide(cr, _node(cr, drain=_record(), unschedulable=True), pods)
    assert d.pending is not None
    return d.pending


def test_a_pdb_refusal_blocks_with_a_reason_naming_the_pdb() -> None:
    cr = _cr()
    web = _pod("web", labels={"app": "web"})
    pending = _draining_step(cr, [web])
    d = core.settle(
        pending,
        [EvictionResult(pod=web, outcome="refused", message="Cannot evict pod")],
        pdbs=[GUARD],
        now=NOW,
    )
    rec = _written(d)
    assert rec.phase == "blocked"
    assert rec.reason is not None
    assert rec.reason.code == "PodDisruptionBudgetBlocking"
    assert rec.reason.objects[0] == ObjectRef(
        kind="PodDisruptionBudget", namespace="apps", name="guard"
    )
    assert ObjectRef(kind="Pod", namespace="apps", name="web") in rec.reason.objects
    assert rec.reason.details["allowedDisruptions"] == "0"
    assert rec.reason.details["podDisruptionBudget"] == "apps/guard"
    assert "apps/guard (0 disruptions allowed)" in rec.reason.message
    (event,) = d.publish
    assert isinstance(event, events.DrainBlocked)
    assert event.reason == rec.reason
    assert d.requeue_after == 5.0, "retried like kubectl drain"

    # Retried and refused again: nothing new to write or say.
    pending2 = _decide(cr, _node(cr, drain=rec, unschedulable=True), [web]).pending
    assert pending2 is not None
    again = core.settle(
        pending2,
        [EvictionResult(pod=web, outcome="refused", message="Cannot evict pod")],
        pdbs=[GUARD],
        now=NOW + timedelta(seconds=5),
    )
    assert (again.write, again.publish, again.requeue_after) == (None, (), 5.0)

    # The PDB relaxed: the eviction goes through and the node is draining again.
    pending3 = _decide(cr, _node(cr, drain=rec, unschedulable=True), [web]).pending
    assert pending3 is not None
    through = core.settle(
        pending3, [EvictionResult(pod=web, outcome="evicted")], pdbs=[GUARD], now=NOW
    )
    assert _written(through).phase == "draining"


@pytest.mark.parametrize(
    ("result", "pdbs", "code", "first_object"),
    [
        pytest.param(
            EvictionResult(pod=_pod("web"), outcome="refused", message="m", budget="guard"),
            [],
            "PodDisruptionBudgetBlocking",
            ObjectRef(kind="PodDisruptionBudget", namespace="apps", name="guard"),
            id="pdb-named-by-the-api-not-cached-yet",
        ),
        pytest.param(
            EvictionResult(
                pod=_pod("web", labels={"app": "web"}),
                outcome="multiple-pdbs",
                message="This pod has more than one PodDisruptionBudget",
            ),
            [GUARD, dataclasses.replace(GUARD, name="guard-2")],
            "MultiplePodDisruptionBudgets",
            ObjectRef(kind="PodDisruptionBudget", namespace="apps", name="guard"),
            id="several-pdbs",
        ),
        pytest.param(
            EvictionResult(pod=_pod("web"), outcome="retry", message="403: namespace terminating"),
            [],
            "EvictionRefused",
            ObjectRef(kind="Pod", namespace="apps", name="web"),
            id="temporary-refusal",
        ),
    ],
)
def test_other_refusals_block_with_their_own_reason(
    result: EvictionResult, pdbs: list[PdbInfo], code: str, first_object: ObjectRef
) -> None:
    cr = _cr()
    d = core.settle(_draining_step(cr, [result.pod]), [result], pdbs=pdbs, now=NOW)
    rec = _written(d)
    assert rec.phase == "blocked"
    assert rec.reason is not None
    assert rec.reason.code == code
    assert rec.reason.objects[0] == first_object
    assert _kinds(d) == ["node.drain-blocked"]


def test_mixed_results_block_and_count_what_was_evicted() -> None:
    cr = _cr()
    web, api_pod = _pod("web", labels={"app": "web"}), _pod("api")
    d = core.settle(
        _draining_step(cr, [web, api_pod]),
        [
            EvictionResult(pod=web, outcome="refused", message="m"),
            EvictionResult(pod=api_pod, outcome="evicted"),
        ],
        pdbs=[GUARD],
        now=NOW,
    )
    rec = _written(d)
    assert rec.phase == "blocked"
    assert rec.reason is not None
    assert rec.reason.details["evicted"] == "1"
    assert rec.reason.details["pods"] == "1"


def test_gone_pods_count_as_done() -> None:
    cr = _cr()
    web = _pod("web")
    d = core.settle(
        _draining_step(cr, [web]), [EvictionResult(pod=web, outcome="gone")], pdbs=[], now=NOW
    )
    rec = _written(d)
    assert rec.phase == "draining"
    assert rec.reason is not None
    assert rec.reason.details == {"pods": "0", "evicted": "0"}


def test_retries_never_outlast_the_drain_timeout() -> None:
    cr = _cr(drain={"timeoutSeconds": 60})
    rec = _record("blocked", reason=Reason(code="PodDisruptionBudgetBlocking", message="m"))
    web = _pod("web", labels={"app": "web"})
    d = _decide(cr, _node(cr, drain=rec, unschedulable=True), [web], now=T0 + timedelta(seconds=58))
    assert d.pending is not None
    settled = core.settle(
        d.pending, [EvictionResult(pod=web, outcome="refused", message="m")], pdbs=[GUARD], now=NOW
    )
    assert settled.requeue_after == pytest.approx(2.0)


# ---- timeout ----------------------------------------------------------------------------------


def test_the_drain_timeout_fails_the_node_naming_what_still_blocks() -> None:
    cr = _cr(drain={"timeoutSeconds": 60})
    blocked = _record(
        "blocked",
        reason=Reason(
            code="PodDisruptionBudgetBlocking",
            message="eviction refused for 1 pod(s): apps/web by PodDisruptionBudget apps/guard",
            objects=(
                ObjectRef(kind="PodDisruptionBudget", namespace="apps", name="guard"),
                ObjectRef(kind="Pod", namespace="apps", name="web"),
            ),
        ),
    )
    web = _pod("web", labels={"app": "web"})
    d = _decide(
        cr, _node(cr, drain=blocked, unschedulable=True), [web], now=T0 + timedelta(seconds=61)
    )
    assert d.evict == ()
    assert d.write is not None
    assert d.write.unschedulable is None, "a failed node stays cordoned"
    rec = _written(d)
    assert (rec.phase, rec.cordoned) == ("failed", True)
    assert rec.reason is not None
    assert rec.reason.code == "DrainTimeout"
    assert rec.reason.objects[:2] == (
        ObjectRef(kind="PodDisruptionBudget", namespace="apps", name="guard"),
        ObjectRef(kind="Pod", namespace="apps", name="web"),
    )
    assert rec.reason.details["lastReason"] == "PodDisruptionBudgetBlocking"
    assert rec.reason.details["timeoutSeconds"] == "60"
    assert "apps/guard" in rec.reason.message
    (event,) = d.publish
    assert isinstance(event, events.DrainFailed)
    assert event.reason == rec.reason
    failed_facts = progress.facts(_node(cr, drain=rec, unschedulable=True), CR)
    assert progress.turn(cr, failed_facts) == "failed"


def test_a_zero_timeout_waits_forever() -> None:
    cr = _cr(drain={"timeoutSeconds": 0})
    rec = _record("blocked", reason=Reason(code="UnmanagedPod", message="m"))
    bare = _pod("bare", controller_kind="")
    d = _decide(cr, _node(cr, drain=rec, unschedulable=True), [bare], now=T0 + timedelta(days=30))
    assert _written(d).phase == "blocked"
    assert d.requeue_after is None


def test_a_drain_finished_past_the_timeout_is_drained_not_failed() -> None:
    cr = _cr(drain={"timeoutSeconds": 60})
    rec = _record("draining", reason=Reason(code="Draining", message="m"))
    d = _decide(cr, _node(cr, drain=rec, unschedulable=True), [], now=T0 + timedelta(hours=1))
    assert _written(d).phase == "drained"


# ---- release ----------------------------------------------------------------------------------


def _release_case(cr: api.NodeWright, **kw: Any) -> core.Decision:
    return _decide(cr, _node(cr, unschedulable=True, **kw), [_pod("web")])


@pytest.mark.parametrize(
    ("case", "uncordon"),
    [
        pytest.param({"extra": "done"}, True, id="node-done"),
        pytest.param({"selected": False}, True, id="admission-released"),
        pytest.param({"cr_present": False}, True, id="cr-deleted"),
        pytest.param({"labels": {"nodepool": "cpu"}}, True, id="no-longer-a-target"),
        pytest.param({"deleting": True}, True, id="cr-being-deleted"),
        pytest.param({"drain": _record("drained", preexisting=True)}, False, id="preexisting"),
        pytest.param({"others": {"b": _other(_record())}}, False, id="another-cr-holds-it"),
        pytest.param({"others": {"b": "{bad"}}, False, id="unreadable-other-holds-it"),
        pytest.param(
            {"others": {"b": _other(_record(cordoned=False))}}, True, id="other-without-cordon"
        ),
        pytest.param({"drain": _record("failed"), "selected": False}, True, id="failed-then-reset"),
    ],
)
def test_release_removes_the_record_and_uncordons_only_its_own_cordon(
    case: dict[str, Any], uncordon: bool
) -> None:
    cr = _cr()
    if case.pop("deleting", False):
        cr = msgspec.structs.replace(
            cr, metadata=msgspec.structs.replace(cr.metadata, deletion_timestamp=NOW)
        )
    cr_present = case.pop("cr_present", True)
    triggers = ("selected", "labels", "extra")
    if (
        cr_present
        and cr.metadata.deletion_timestamp is None
        and not any(t in case for t in triggers)
    ):
        case["extra"] = "done"  # the ordinary release: the node is done
    if case.get("extra") == "done":
        case["extra"] = _done_records(cr)
    case.setdefault("drain", _record("drained"))
    obj = _node(cr, unschedulable=True, **case)
    d = _decide(cr, obj, [_pod("web")], cr_present=cr_present)
    assert d.write == core.NodeWrite(record=Remove(), unschedulable=False if uncordon else None)
    assert d.evict == ()
    (event,) = d.publish
    assert isinstance(event, events.NodeUncordoned)
    holders = tuple(sorted(case.get("others", {}))) if not uncordon else ()
    assert event.still_cordoned_by == holders
    body = nodeshell.node_patch(core.node_decision(CR, "gpu-1", d), "9")
    assert body["metadata"]["annotations"] == {
        nodestate.key(nodestate.DRAINER, CR): None,
        outbox.key(nodestate.DRAINER, CR): outbox.value([event]),
    }, "the record goes, the event goes into the outbox in the same write"
    assert ("spec" in body) is uncordon


def test_release_leaves_an_already_uncordoned_node_alone() -> None:
    cr = _cr()
    d = _decide(cr, _node(cr, selected=False, drain=_record("drained"), unschedulable=False))
    assert d.write == core.NodeWrite(record=Remove(), unschedulable=None)


def test_a_failed_node_keeps_its_cordon_while_still_admitted() -> None:
    cr = _cr()
    d = _release_case(cr, drain=_record("failed"))
    assert d == core.Decision()


def test_two_crs_sharing_a_node_release_it_only_when_both_are_done() -> None:
    a, b = _cr(), nodewright("other-cr")

    # A cordons a fresh node; B joins the cordon (not preexisting).
    obj = _node(a, unschedulable=False)
    rec_a = _written(_decide(a, obj))
    assert not rec_a.preexisting
    obj = _node(a, drain=rec_a, unschedulable=True)
    obj["metadata"]["annotations"][nodestate.key(nodestate.SCHEDULER, "other-cr")] = (
        msgspec.json.encode(_selection(b)).decode()
    )
    d_b = core.decide(
        cr_name="other-cr",
        cr=b,
        node=progress.facts(obj, "other-cr"),
        others=core.drain_records(obj, besides="other-cr"),
        pods=[],
        now=NOW,
    )
    rec_b = _written(d_b)
    assert (rec_b.cordoned, rec_b.preexisting) == (True, False)

    # A is done first: its record goes, the node stays cordoned for B.
    both = _node(a, drain=rec_a, unschedulable=True, extra=_done_records(a))
    both["metadata"]["annotations"][nodestate.key(nodestate.DRAINER, "other-cr")] = _other(rec_b)
    d_a = _decide(a, both)
    assert d_a.write == core.NodeWrite(record=Remove(), unschedulable=None)
    (event,) = d_a.publish
    assert isinstance(event, events.NodeUncordoned)
    assert event.still_cordoned_by == ("other-cr",)

    # Then B is released: nobody holds a cordon any more, the node is uncordoned.
    only_b = _node(b, selected=False, unschedulable=True)
    only_b["metadata"]["annotations"][nodestate.key(nodestate.DRAINER, "other-cr")] = _other(rec_b)
    d_last = core.decide(
        cr_name="other-cr",
        cr=b,
        node=progress.facts(only_b, "other-cr"),
        others=core.drain_records(only_b, besides="other-cr"),
        pods=[],
        now=NOW,
    )
    assert d_last.write == core.NodeWrite(record=Remove(), unschedulable=False)


def test_a_cordon_found_before_nodewright_survives_two_crs() -> None:
    a = _cr()
    rec_a = _written(_decide(a, _node(a, unschedulable=True)))
    assert rec_a.preexisting
    # B arrives while A holds the (preexisting) cordon: B inherits preexisting.
    obj = node("n1", unschedulable=True, records={nodestate.DRAINER: rec_a})
    b = nodewright("other-cr")
    obj["metadata"]["annotations"][nodestate.key(nodestate.SCHEDULER, "other-cr")] = (
        msgspec.json.encode(_selection(b)).decode()
    )
    rec_b = _written(
        core.decide(
            cr_name="other-cr",
            cr=b,
            node=progress.facts(obj, "other-cr"),
            others=core.drain_records(obj, besides="other-cr"),
            pods=[],
            now=NOW,
        )
    )
    assert rec_b.preexisting
    # A goes first, then B: neither uncordons.
    only_b = _node(b, selected=False, unschedulable=True)
    only_b["metadata"]["annotations"][nodestate.key(nodestate.DRAINER, "other-cr")] = _other(rec_b)
    d = core.decide(
        cr_name="other-cr",
        cr=None,
        node=progress.facts(only_b, "other-cr"),
        others={},
        pods=[],
        now=NOW,
    )
    assert d.write == core.NodeWrite(record=Remove(), unschedulable=None)


def test_event_ids_are_deterministic_for_the_same_fact() -> None:
    cr = _cr(podNonInterruptLabels={"matchLabels": TRAINING})
    obj = _node(cr, drain=_record(), unschedulable=True)
    pods = [_pod("train", labels=TRAINING)]
    first = _decide(cr, obj, pods)
    second = _decide(cr, obj, pods, now=NOW + timedelta(seconds=1))
    assert [e.id for e in first.publish] == [e.id for e in second.publish]


# ---- reading the API server's answers (bodies as the rig's API server sends them) ------------

_PDB_429 = {
    "kind": "Status",
    "status": "Failure",
    "message": "Cannot evict pod as it would violate the pod's disruption budget.",
    "reason": "TooManyRequests",
    "details": {
        "causes": [
            {
                "reason": "DisruptionBudget",
                "message": "The disruption budget guard needs 2 healthy pods and has 2 currently",
            }
        ]
    },
    "code": 429,
}
_UID_409 = (
    'Operation cannot be fulfilled on Pod "p": the UID in the precondition (a) does not match '
    "the UID in record (b). The object might have been deleted and then recreated"
)
_MULTI_500 = (
    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not "
    "support."
)


@pytest.mark.parametrize(
    ("status", "message", "body", "outcome", "budget"),
    [
        pytest.param(429, _PDB_429["message"], _PDB_429, "refused", "guard", id="pdb-429"),
        pytest.param(429, "Too many requests", {}, "refused", "", id="throttled-429"),
        pytest.param(404, "not found", {}, "gone", "", id="gone-404"),
        pytest.param(409, _UID_409, {}, "gone", "", id="replaced-by-new-uid-409"),
        pytest.param(409, "the object has been modified", {}, "retry", "", id="conflict-409"),
        pytest.param(500, _MULTI_500, {}, "multiple-pdbs", "", id="several-pdbs-500"),
        pytest.param(403, "namespace is being terminated", {}, "retry", "", id="forbidden-403"),
    ],
)
def test_refusals_are_read_from_the_api_answer(
    status: int, message: str, body: dict[str, Any], outcome: str, budget: str
) -> None:
    result = filters.refusal(_pod("p"), status=status, message=message, body=body)
    assert (result.outcome, result.budget) == (outcome, budget)
    if outcome == "retry":
        assert result.message.startswith(f"{status}: ")
