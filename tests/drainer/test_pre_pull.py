"""``spec.drain.prePullImages``: the executor makes one pod per admitted node that pulls the
images of its packages with work left; the drainer evicts nothing until that pod has them,
fails the drain (nothing evicted) when one does not pull within the grace, and the pod goes
once the drain is over. The pod is read as the drainer's informer keeps it (its slim
transform) from the manifest the executor sends, with statuses as a kubelet writes them."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta
from typing import Any

import msgspec
import pytest
from msgspec.structs import replace

from services.drainer import core as drainer, filters
from services.drainer.filters import PodInfo
from services.executor import core as executor
from shared import api, config, nodestate, pods, podspec, progress
from shared.records.drainer import DrainPhase, DrainRecord
from shared.records.executor import ExecutorRecord, PackageRecord
from shared.records.scheduler import Selection
from tests.helpers.facts import T0, node, nodewright, written

CR = "gpu-node-tuning"
NOW = T0 + timedelta(minutes=5)
TUNED = "ghcr.io/nvidia/nodewright-packages/nvidia-tuned:0.9.0"
DRIVER = "nvcr.io/nvidia/driver-pkg:580.1"
PACKAGES = {
    "nvidia-tuned": {
        "version": "0.9.0",
        "image": "ghcr.io/nvidia/nodewright-packages/nvidia-tuned",
    },
    "driver": {"version": "580.1", "image": "nvcr.io/nvidia/driver-pkg"},
}
GRACE = 60.0


def _cr(pre_pull: bool = True, **spec: Any) -> Any:
    return nodewright(CR, packages=PACKAGES, drain={"prePullImages": pre_pull}, **spec)


def _node(
    cr: Any,
    drain: DrainRecord | None = None,
    executor_record: ExecutorRecord | None = None,
) -> dict[str, Any]:
    records: dict[str, msgspec.Struct] = {
        nodestate.SCHEDULER: Selection(
            generation=1,
            compartment="default",
            batch=1,
            selected_at=T0,
            disruptive=True,
            target=progress.target_digest(cr),
        )
    }
    if drain is not None:
        records[nodestate.DRAINER] = drain
    if executor_record is not None:
        records[nodestate.EXECUTOR] = executor_record
    return node("n1", records=records, unschedulable=drain is not None)


def _record(phase: DrainPhase = "cordoned", started: datetime = T0) -> DrainRecord:
    return DrainRecord(phase=phase, cordoned=True, started=started, since=started)


def _settings(staging: config.PackageStaging = "image-volume") -> podspec.PodSettings:
    return podspec.PodSettings.of(
        namespace="nodewright-system",
        config=config.PodSettings(package_staging=staging, image_pull_secrets="regcred"),
    )


def _pull_manifest(
    cr: Any, obj: dict[str, Any], staging: config.PackageStaging = "image-volume"
) -> dict[str, Any]:
    """The pull pod the executor asks for on the node, as it sends it."""
    d = executor.decide(cr=cr, node=progress.facts(obj, CR), node_pods=[], now=T0)
    (req,) = d.create
    return podspec.pull_pod(req, cr=cr, node="n1", node_annotations={}, settings=_settings(staging))


def _as_kubelet(
    manifest: dict[str, Any], phase: str, *, waiting: tuple[str, str] | None = None
) -> dict[str, Any]:
    """``manifest`` as the API server returns it once a kubelet reported on it."""
    pod = copy.deepcopy(manifest)
    pod["metadata"].update(
        uid="uid-pull", resourceVersion="9", creationTimestamp="2026-01-01T00:00:00Z"
    )
    pod["metadata"]["managedFields"] = [{"manager": "kubelet"}]
    (container,) = pod["spec"]["containers"]
    if waiting is not None:
        state: dict[str, Any] = {"waiting": {"reason": waiting[0], "message": waiting[1]}}
    elif phase == "Succeeded":
        state = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    else:
        state = {"waiting": {"reason": "ContainerCreating"}}
    pod["status"] = {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": [
            {"name": container["name"], "image": container["image"], "state": state}
        ],
    }
    return pod


def _as_drainer_reads(pod: dict[str, Any]) -> PodInfo:
    slim = filters.slim_pod(pod)
    info = filters.pod_info(slim)
    assert info == filters.pod_info(pod), "the informer's slim pod reads as the whole one"
    return info


def _decide(
    cr: Any, obj: dict[str, Any], pods_on_node: list[PodInfo], now: datetime = NOW
) -> drainer.Decision:
    return drainer.decide(
        cr_name=CR,
        cr=cr,
        node=progress.facts(obj, CR),
        others={},
        pods=pods_on_node,
        now=now,
        image_pull_grace_s=GRACE,
    )


def _written(d: drainer.Decision) -> DrainRecord:
    assert d.write is not None
    rec = written(d.write.record, DrainRecord)
    assert rec is not None
    return rec


WEB = PodInfo(
    namespace="apps",
    name="web",
    uid="u-web",
    phase="Running",
    labels={"app": "web"},
    controller_kind="ReplicaSet",
)


# ---- the executor's pod ---------------------------------------------------------------------


@pytest.mark.parametrize("staging", ["image-volume", "copy"])
def test_the_pull_pod_pulls_every_package_image_and_runs_nothing_else(
    staging: config.PackageStaging,
) -> None:
    cr = _cr()
    manifest = _pull_manifest(cr, _node(cr), staging)
    spec = manifest["spec"]
    assert manifest["metadata"]["name"] == pods.pull_pod_name(
        cr=CR, node="n1", images=[DRIVER, TUNED], attempt=1
    )
    assert manifest["metadata"]["labels"][pods.LABEL_ROLE] == "pull"
    assert spec["nodeName"] == "n1"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["automountServiceAccountToken"] is False
    assert "hostPID" not in spec
    assert "hostNetwork" not in spec
    assert not [v for v in spec["volumes"] if "hostPath" in v], "nothing of the host"
    everything = spec.get("initContainers", []) + spec["containers"]
    assert all(not c["securityContext"].get("privileged") for c in everything)
    assert spec["containers"][0]["command"] == [podspec.AGENT_BUSYBOX, "true"]
    if staging == "image-volume":
        assert [v["image"]["reference"] for v in spec["volumes"]] == [TUNED, DRIVER]
        assert len(spec["containers"][0]["volumeMounts"]) == 2, "mounted, so pulled"
    else:
        assert [c["image"] for c in spec["initContainers"]][1:] == [TUNED, DRIVER]
        assert all(
            c["command"] == ["/nodewright-tools/busybox", "true"]
            for c in spec["initContainers"][1:]
        ), "a package image needs no shell"


def test_only_packages_with_work_left_are_pulled_and_nothing_without_the_option() -> None:
    cr = _cr()
    d = progress.desired(cr)["nvidia-tuned"]
    done = ExecutorRecord(
        packages={
            "nvidia-tuned": PackageRecord(
                version="0.9.0",
                stage="config",
                state="succeeded",
                installed="0.9.0",
                config=d.config_digest,
                updated=T0,
            )
        }
    )
    manifest = _pull_manifest(cr, _node(cr, executor_record=done))
    assert [v["image"]["reference"] for v in manifest["spec"]["volumes"]] == [DRIVER]
    off = _cr(pre_pull=False)
    decided = executor.decide(cr=off, node=progress.facts(_node(off), CR), node_pods=[], now=T0)
    assert decided.create == ()


def test_the_executor_keeps_the_pod_while_the_drain_lasts_and_deletes_it_after() -> None:
    cr = _cr()
    obj = _node(cr, drain=_record("waiting"))
    manifest = _pull_manifest(cr, obj)
    view = pods.view(_as_kubelet(manifest, "Succeeded"))
    during = executor.decide(cr=cr, node=progress.facts(obj, CR), node_pods=[view], now=NOW)
    assert (during.create, during.delete) == ((), ()), "made once, kept"
    drained = _node(cr, drain=_record("drained"))
    after = executor.decide(cr=cr, node=progress.facts(drained, CR), node_pods=[view], now=NOW)
    assert after.delete == (manifest["metadata"]["name"],)
    assert [r.role for r in after.create] == ["stage", "stage"], "the packages' stages start"
    paused = nodewright(
        CR,
        packages=PACKAGES,
        drain={"prePullImages": True},
        annotations={api.PAUSE_ANNOTATION: "true"},
    )
    held = executor.decide(cr=paused, node=progress.facts(_node(paused), CR), node_pods=[], now=T0)
    assert held.create == (), "a paused NodeWright starts no pull"


def test_a_simulated_pull_fails_where_the_node_wishes_it() -> None:
    cr = _cr()
    d = executor.decide(cr=cr, node=progress.facts(_node(cr), CR), node_pods=[], now=T0)
    (req,) = d.create
    sim = podspec.PodSettings.of(
        namespace="nodewright-system", config=config.PodSettings(simulate=True)
    )
    wish = {podspec.SIM_IMAGE_PULL_ERROR: "driver/apply"}
    failing = podspec.pull_pod(req, cr=cr, node="n1", node_annotations=wish, settings=sim)
    ann = failing["metadata"]["annotations"]
    assert ann[podspec.SIM_IMAGE_PULL_ERROR] == "ImagePullBackOff"
    assert ann[f"{podspec.SIM}/image"] == DRIVER
    fine = podspec.pull_pod(req, cr=cr, node="n1", node_annotations={}, settings=sim)
    assert fine["metadata"]["annotations"][f"{podspec.SIM}/succeed-after"] == "1s"


# ---- the drainer's gate ---------------------------------------------------------------------


def test_nothing_is_evicted_until_the_images_are_on_the_node() -> None:
    cr = _cr()
    obj = _node(cr, drain=_record())
    waiting = _decide(cr, obj, [WEB])
    rec = _written(waiting)
    assert rec.phase == "waiting"
    assert rec.reason is not None
    assert rec.reason.code == "ImagesPulling"
    name = pods.pull_pod_name(cr=CR, node="n1", images=[DRIVER, TUNED], attempt=1)
    assert name in rec.reason.message
    assert DRIVER in rec.reason.message
    assert TUNED in rec.reason.message
    assert rec.reason.details == {"pod": name, "images": "2"}
    assert waiting.evict == ()
    assert [e.kind for e in waiting.publish] == ["node.waiting"]

    # The pod made and pulling: the same wait, no write, no event.
    manifest = _pull_manifest(cr, obj)
    pulling = _as_drainer_reads(_as_kubelet(manifest, "Pending"))
    waited = _decide(cr, _node(cr, drain=rec), [WEB, pulling])
    assert waited.write is None
    assert waited.publish == ()
    assert waited.evict == ()

    # Pulled: the drain starts.
    pulled = _as_drainer_reads(_as_kubelet(manifest, "Succeeded"))
    drains = _decide(cr, _node(cr, drain=rec), [WEB, pulled])
    assert [p.name for p in drains.evict] == ["web"]


def test_an_image_that_does_not_pull_fails_the_drain_before_anything_is_evicted() -> None:
    cr = _cr()
    obj = _node(cr, drain=_record())
    manifest = _pull_manifest(cr, obj)
    message = f'failed to pull and unpack image "{DRIVER}": not found'
    failing = _as_drainer_reads(
        _as_kubelet(manifest, "Pending", waiting=("ImagePullBackOff", message))
    )
    created = datetime(2026, 1, 1, tzinfo=T0.tzinfo)
    started = created + timedelta(seconds=10)
    early = _decide(cr, _node(cr, drain=_record(started=started)), [WEB, failing], now=started)
    assert _written(early).reason.code == "ImagesPulling"  # type: ignore[union-attr]
    assert early.requeue_after == pytest.approx(GRACE), "looked at again when the grace ends"
    assert early.evict == ()

    late = _decide(
        cr,
        _node(cr, drain=_record(started=started)),
        [WEB, failing],
        now=started + timedelta(seconds=GRACE),
    )
    rec = _written(late)
    assert rec.phase == "failed"
    assert rec.reason is not None
    assert rec.reason.code == "ImagePullFailed"
    assert rec.reason.details["image"] == DRIVER, "the image volume that failed, named"
    assert "nodewright node retry" in rec.reason.message
    assert late.evict == ()
    assert late.delete == ()
    assert [e.kind for e in late.publish] == ["node.drain-failed"]
    assert progress.turn(cr, progress.facts(_node(cr, drain=rec), CR)) == "failed"

    # A retry restarts the drain: the pull gets its whole grace again from there.
    retried = started + timedelta(hours=1)
    again = _decide(cr, _node(cr, drain=_record(started=retried)), [WEB, failing], now=retried)
    assert _written(again).phase == "waiting"


def test_protected_pods_are_waited_for_first_and_a_running_drain_is_not_held() -> None:
    training = {"workload": "training"}
    cr = _cr(podNonInterruptLabels={"matchLabels": training})
    train = PodInfo(
        namespace="ml", name="train", uid="u-t", phase="Running", labels=training,
        controller_kind="Job",
    )  # fmt: skip
    held = _decide(cr, _node(cr, drain=_record()), [WEB, train])
    assert _written(held).reason.code == "ProtectedPodRunning"  # type: ignore[union-attr]
    draining = _decide(_cr(), _node(_cr(), drain=_record("draining")), [WEB])
    assert [p.name for p in draining.evict] == ["web"], "a drain under way goes on"


def test_without_the_option_the_drain_does_not_wait_for_a_pull() -> None:
    cr = _cr(pre_pull=False)
    d = _decide(cr, _node(cr, drain=_record()), [WEB])
    assert [p.name for p in d.evict] == ["web"]


def test_a_retry_gets_a_new_pull_pod_that_both_services_name_alike() -> None:
    """A kubelet backing off a failed pull tries again only minutes later: a retry's pull is a
    new pod (the old one goes), and the drainer waits for that one."""
    cr = _cr()
    failed = _record("failed")
    obj = _node(cr, drain=failed)
    old = pods.view(_as_kubelet(_pull_manifest(cr, _node(cr)), "Pending"))
    retry = nodestate.add_request(
        None, nodestate.Request(seq=0, action="retry", package="", stage="", at=NOW)
    )
    d = executor.decide(
        cr=cr, node=progress.facts(obj, CR), node_pods=[old], now=NOW, requests=retry
    )
    assert d.delete == (old.name,), "the failed node's pull pod goes"
    assert d.create == ()
    honoured = _record(started=NOW)
    again = executor.decide(
        cr=cr,
        node=progress.facts(_node(cr, drain=honoured), CR),
        node_pods=[],
        now=NOW,
        requests=retry,
    )
    (req,) = again.create
    assert req.name != old.name
    assert req.name == pods.pull_pod_name(cr=CR, node="n1", images=[DRIVER, TUNED], attempt=2)
    waits = drainer.decide(
        cr_name=CR,
        cr=cr,
        node=progress.facts(_node(cr, drain=replace(honoured, honoured=1)), CR),
        others={},
        pods=[],
        now=NOW,
        requests=retry,
    )
    assert _written(waits).reason.details["pod"] == req.name  # type: ignore[union-attr]


def test_correcting_the_image_in_the_spec_starts_the_failed_drain_over() -> None:
    """As for a failed stage, fixing the spec is a fix: a drain that failed pulling an image
    the CR no longer has starts over by itself (the same images again need a retry)."""
    cr = _cr()
    obj = _node(cr, drain=_record())
    manifest = _pull_manifest(cr, obj)
    message = f'failed to pull and unpack image "{DRIVER}": not found'
    failing = _as_drainer_reads(
        _as_kubelet(manifest, "Pending", waiting=("ImagePullBackOff", message))
    )
    late = _decide(cr, obj, [WEB, failing], now=NOW + timedelta(days=1))
    failed = _written(late)
    assert failed.reason is not None
    assert failed.reason.details[progress.PULL_IMAGES_DETAIL] == pods.pull_version([DRIVER, TUNED])
    assert "the drain starts over by itself" in failed.reason.message
    same = _node(cr, drain=failed)
    assert progress.turn(cr, progress.facts(same, CR)) == "failed"
    assert _decide(cr, same, [WEB, failing]) == drainer.Decision()

    fixed = nodewright(
        CR,
        packages={**PACKAGES, "driver": {"version": "580.2", "image": "nvcr.io/nvidia/driver-pkg"}},
        drain={"prePullImages": True},
    )
    obj = _node(fixed, drain=failed)
    assert progress.turn(fixed, progress.facts(obj, CR)) == "drainer"
    restarted = _written(_decide(fixed, obj, [WEB, failing], now=NOW + timedelta(days=2)))
    assert (restarted.phase, restarted.reason) == ("cordoned", None)
    assert restarted.started == NOW + timedelta(days=2)
    waits = _written(
        _decide(fixed, _node(fixed, drain=restarted), [WEB, failing], now=restarted.started)
    )
    assert waits.reason is not None
    assert waits.reason.code == "ImagesPulling"
    assert "nvcr.io/nvidia/driver-pkg:580.2" in waits.reason.message
