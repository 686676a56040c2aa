"""The one per-node shell (``shared.nodeshell.apply``) against in-memory fakes of its ports:
what it writes, in which order, and what it does when the node changed under it."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from services.drainer import core as drainer_core
from shared import events, nodepins, nodeshell, nodestate, outbox
from shared.decisions import Keep, NodeDecision, PodRef, Remove, Write
from shared.records.drainer import DrainRecord
from shared.records.executor import ExecutorRecord
from shared.records.validator import ValidatorRecord
from shared.streaming import TooLate
from tests.fakes import FakeBus, FakeNodes, FakeObjects
from tests.helpers.facts import T0, node

CR = "gpu-node-tuning"


def _pod(name: str) -> dict[str, object]:
    return {"kind": "Pod", "metadata": {"name": name, "labels": {}}}


def _event(n: int) -> events.Event:
    return events.NodeValidated(id=f"e{n}", at=T0, cr=CR, generation=1, node="n1")


async def _apply(
    decision: NodeDecision, nodes: FakeNodes
) -> tuple[float | None, FakeObjects, FakeBus]:
    objects, bus = FakeObjects(), FakeBus()
    got = await nodeshell.apply(decision, nodes=nodes, objects=objects, bus=bus)
    return got, objects, bus


def _nodes() -> FakeNodes:
    fake = FakeNodes()
    fake.add(node("n1"))
    return fake


def _cordon(**more: Any) -> tuple[DrainRecord, NodeDecision]:
    """The drainer's cordon of n1: its record and the decision writing it."""
    rec = DrainRecord(phase="cordoned", cordoned=True, started=T0, since=T0)
    decision = NodeDecision(
        owner=nodestate.DRAINER,
        cr=CR,
        node="n1",
        record=Write(rec),
        spec={"unschedulable": True},
        **more,
    )
    return rec, decision


async def test_the_record_and_spec_go_in_one_patch_on_the_version_decided_on() -> None:
    nodes = _nodes()
    version = nodes.nodes["n1"]["metadata"]["resourceVersion"]
    rec, decision = _cordon(events=(_event(1),), requeue_after=3.0)
    got, _, bus = await _apply(decision, nodes)
    assert got == 3.0
    ((name, body),) = nodes.patches
    assert name == "n1"
    assert body["metadata"]["resourceVersion"] == version
    assert body["spec"] == {"unschedulable": True}
    stored = nodestate.read(nodes.nodes["n1"], nodestate.DRAINER, CR, DrainRecord)
    assert stored == rec
    assert [e.id for e in bus.published] == ["e1"]
    # The event went into the outbox with the record, and was published; no write clears it.
    assert [e.id for e in outbox.pending(node_with(body), nodestate.DRAINER, CR)] == ["e1"]


async def test_the_next_write_drops_the_events_on_the_stream_from_the_outbox() -> None:
    """One write per transition: the outbox of the last one, published, goes with the
    next write of the owner, which carries only its own events; a write with no events
    removes it."""
    nodes = _nodes()
    bus = FakeBus()
    rec = DrainRecord(phase="cordoned", cordoned=True, started=T0, since=T0)

    async def write(record: DrainRecord | None, *ids: int) -> None:
        decision = NodeDecision(
            owner=nodestate.DRAINER,
            cr=CR,
            node="n1",
            record=Write(record) if record is not None else Remove(),
            events=tuple(_event(i) for i in ids),
        )
        await nodeshell.apply(decision, nodes=nodes, objects=FakeObjects(), bus=bus)

    await write(rec, 1)
    await write(DrainRecord(phase="drained", cordoned=True, started=T0, since=T0), 2)
    assert len(nodes.patches) == 2
    assert [e.id for e in outbox.pending(nodes.nodes["n1"], nodestate.DRAINER, CR)] == ["e2"]
    await write(None)
    assert len(nodes.patches) == 3
    key = outbox.key(nodestate.DRAINER, CR)
    assert key not in nodestate.annotations_of(nodes.nodes["n1"])
    assert nodes.patches[-1][1]["metadata"]["annotations"][key] is None
    assert [e.id for e in bus.published] == ["e1", "e2"]


def node_with(patch: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"annotations": patch["metadata"]["annotations"]}}


class Down(FakeBus):
    """NATS away: nothing is taken."""

    async def publish(self, event: events.Event) -> bool:
        raise nodeshell.Unpublished("no responders")


async def test_events_of_a_writer_that_died_before_publishing_are_published_by_the_next() -> None:
    """The lost events of the killed runs (node.completed for 196 of 200 nodes): the
    transition and its events are one write; whoever looks at the key next publishes what
    the outbox holds, exactly once, and clears it."""
    nodes = _nodes()
    rec = DrainRecord(phase="cordoned", cordoned=True, started=T0, since=T0)
    decision = NodeDecision(
        owner=nodestate.DRAINER,
        cr=CR,
        node="n1",
        record=Write(rec),
        events=(_event(1), _event(2)),
    )
    # NATS is away when the writer publishes (or it dies right after its write).
    got = await nodeshell.apply(decision, nodes=nodes, objects=FakeObjects(), bus=Down())
    assert got == nodeshell.UNPUBLISHED_RETRY_S
    assert nodestate.read(nodes.nodes["n1"], nodestate.DRAINER, CR, DrainRecord) == rec
    assert [e.id for e in outbox.pending(nodes.nodes["n1"], nodestate.DRAINER, CR)] == [
        "e1",
        "e2",
    ]
    # Another pass (any replica) with more to say: the old events stay first, once each.
    more = NodeDecision(owner=nodestate.DRAINER, cr=CR, node="n1", events=(_event(2), _event(3)))
    bus = FakeBus()
    await nodeshell.apply(more, nodes=nodes, objects=FakeObjects(), bus=bus)
    assert [e.id for e in bus.published] == ["e1", "e2", "e3"]
    writes = len(nodes.patches)
    # A later flush has nothing to do, and writes nothing.
    flushed = await nodeshell.flush(owner=nodestate.DRAINER, cr=CR, node="n1", nodes=nodes, bus=bus)
    assert flushed is None
    assert [e.id for e in bus.published] == ["e1", "e2", "e3"]
    assert len(nodes.patches) == writes


async def test_a_write_keeps_the_events_it_does_not_know_to_be_on_the_stream() -> None:
    """Another replica's outbox, not published yet (it died, or NATS is away for this one
    too): a write of this replica keeps those events, before its own."""
    nodes = _nodes()
    first = NodeDecision(owner=nodestate.VALIDATOR, cr=CR, node="n1", events=(_event(1),))
    await nodeshell.apply(first, nodes=nodes, objects=FakeObjects(), bus=Down())
    second = NodeDecision(
        owner=nodestate.VALIDATOR,
        cr=CR,
        node="n1",
        record=Write(ValidatorRecord()),
        events=(_event(2),),
    )
    got = await nodeshell.apply(second, nodes=nodes, objects=FakeObjects(), bus=Down())
    assert got == nodeshell.UNPUBLISHED_RETRY_S
    assert [e.id for e in outbox.pending(nodes.nodes["n1"], nodestate.VALIDATOR, CR)] == [
        "e1",
        "e2",
    ]
    bus = FakeBus()
    await nodeshell.flush(owner=nodestate.VALIDATOR, cr=CR, node="n1", nodes=nodes, bus=bus)
    assert [e.id for e in bus.published] == ["e1", "e2"]


async def test_a_node_that_changed_meanwhile_gets_nothing_created_or_published() -> None:
    nodes = _nodes()
    decision = NodeDecision(
        owner=nodestate.VALIDATOR,
        cr=CR,
        node="n1",
        record=Write(ValidatorRecord(validated="t")),
        fence=True,
        create=(_pod("check"),),
        events=(_event(1),),
    )

    class Stale(FakeNodes):
        def get(self, name: str) -> dict[str, object] | None:
            seen = super().get(name)
            self.touch(name)  # someone else writes between the read and the patch
            return seen

    stale = Stale(nodes=nodes.nodes, revision=nodes.revision)
    got, objects, bus = await _apply(decision, stale)
    assert got == nodeshell.STALE_RETRY_S
    assert stale.patches == []
    assert len(stale.refused) == 1
    assert (objects.created, bus.published) == ([], [])


def _unpinnable(nodes: FakeNodes) -> dict[str, Any]:
    """n1 as ``nodes`` hold it now, as a cache that trimmed its annotations holds it: only
    its resourceVersion can be the precondition (``shared.nodepins``)."""
    node = nodes.get("n1")
    assert node is not None
    node[nodepins.TRIMMED] = True
    return node


async def test_a_decision_on_a_node_that_changed_since_writes_and_creates_nothing() -> None:
    """Two executor replicas each started the same stage under a name of its own: one
    decided on the node without the other's record, and by the time its shell wrote, its
    cache held the other's write, whose version its patch carried. The precondition is the
    version decided on."""
    nodes = _nodes()
    decision = NodeDecision(
        owner=nodestate.EXECUTOR,
        cr=CR,
        node="n1",
        record=Write(ExecutorRecord(boot_id="b1")),
        fence=True,
        create=(_pod("apply"),),
        events=(_event(1),),
        observed=_unpinnable(nodes),
    )

    nodes.touch("n1")  # the other replica's write, in the cache after the decision
    got, objects, bus = await _apply(decision, nodes)
    assert got == nodeshell.STALE_RETRY_S
    assert nodes.patches == [], "no write carrying the newer version"
    assert (objects.created, bus.published) == ([], [])
    # On the node as it is now, the same decision goes through.
    got, objects, _ = await _apply(replace(decision, observed=_unpinnable(nodes)), nodes)
    assert objects.created == ["Pod/apply"]


async def test_pods_are_created_only_on_a_node_read_unchanged_when_nothing_is_written() -> None:
    """Issue 15: the fence of a decision that writes nothing is a read of the node's
    resourceVersion, not a precondition-only PATCH every node watcher is sent."""
    nodes = _nodes()
    decision = replace(_pod_start(nodes)[0], observed=_unpinnable(nodes))
    nodes.touch("n1")  # another replica recorded something after this decision was taken
    got, objects, _ = await _apply(decision, nodes)
    assert got == nodeshell.STALE_RETRY_S
    assert objects.created == [], "a stale decision creates nothing"
    assert nodes.confirms == [("n1", False)]
    _, objects, _ = await _apply(replace(decision, observed=_unpinnable(nodes)), nodes)
    assert nodes.patches == [], "no write at all"
    assert nodes.confirms[1:] == [("n1", True)]
    assert objects.created == ["Pod/apply"]


async def test_a_status_write_since_the_decision_does_not_refuse_its_write() -> None:
    """Issue 15: the status service's condition (and the kubelet's heartbeat) moved the
    node's resourceVersion between the admission, the cordon, the drain's end and the pod's
    start, and each owner's write after it was answered 409 and made again. With the node
    decided on, the precondition is what the decision read of it."""
    nodes = _nodes()
    decided_on = nodes.get("n1")
    assert decided_on is not None
    rec, decision = _cordon(observed=decided_on, reads_status=False)
    status = dict(decided_on["status"])
    status["conditions"] = [{"type": "Ready", "status": "False"}]  # the drainer reads no status
    nodes.set_status("n1", status)
    got, _, _ = await _apply(decision, nodes)
    assert got is None
    assert len(nodes.patches) == 1
    assert nodes.refused == []
    assert nodestate.read(nodes.nodes["n1"], nodestate.DRAINER, CR, DrainRecord) == rec


def _pod_start(nodes: FakeNodes, **more: Any) -> tuple[NodeDecision, dict[str, Any]]:
    """An executor decision to start a pod, taken on the node as ``nodes`` hold it now."""
    decided_on = nodes.get("n1")
    assert decided_on is not None
    decision = NodeDecision(
        owner=nodestate.EXECUTOR,
        cr=CR,
        node="n1",
        fence=True,
        create=(_pod("apply"),),
        observed=decided_on,
        **more,
    )
    return decision, decided_on


async def test_a_decision_that_reads_the_status_is_refused_when_it_changed() -> None:
    nodes = _nodes()
    decision, decided_on = _pod_start(nodes, record=Write(ExecutorRecord(boot_id="boot-1")))
    heartbeat = dict(decided_on["status"])
    heartbeat["conditions"] = [{"type": "Ready", "status": "True", "lastHeartbeatTime": "x"}]
    nodes.set_status("n1", heartbeat)
    got, objects, _ = await _apply(decision, nodes)
    assert got is None
    assert objects.created == ["Pod/apply"], "a heartbeat changes nothing read"
    later, _ = _pod_start(nodes, record=Write(ExecutorRecord(boot_id="boot-1")))
    assert later.observed is not None
    rebooted = dict(later.observed["status"])
    rebooted["nodeInfo"] = {"bootID": "boot-2"}
    nodes.set_status("n1", rebooted)
    got, objects, _ = await _apply(later, nodes)
    assert got == nodeshell.STALE_RETRY_S
    assert objects.created == []
    assert len(nodes.patches) == 1


async def test_an_annotation_written_since_the_decision_refuses_its_write() -> None:
    nodes = _nodes()
    decision, _ = _pod_start(nodes)
    # Another replica recorded the stage's result: the read fence sees it.
    nodes.nodes["n1"]["metadata"]["annotations"]["nodewright.nvidia.com/executor"] = "{}"
    nodes.touch("n1")
    got, objects, _ = await _apply(decision, nodes)
    assert got == nodeshell.STALE_RETRY_S
    assert objects.created == []
    assert nodes.confirms == [("n1", False)]
    status = nodes.get("n1")
    assert status is not None
    nodes.set_status("n1", {**status["status"], "conditions": [*status["status"]["conditions"]]})
    got, objects, _ = await _apply(replace(decision, observed=nodes.get("n1")), nodes)
    assert objects.created == ["Pod/apply"]
    assert nodes.confirms[1:] == [("n1", True)]


async def test_nothing_to_change_writes_nothing() -> None:
    nodes = _nodes()
    decision = NodeDecision(owner=nodestate.EXECUTOR, cr=CR, node="n1", requeue_after=4.0)
    got, objects, bus = await _apply(decision, nodes)
    assert got == 4.0
    assert nodes.patches == []
    assert (objects.created, objects.deleted, bus.published) == ([], [], [])


def _old_pod(name: str, uid: str = "u1", rv: str = "7") -> tuple[dict[str, Any], PodRef]:
    body = {"kind": "Pod", "metadata": {"name": name, "uid": uid, "resourceVersion": rv}}
    return body, PodRef(name=name, uid=uid, resource_version=rv, created=T0)


async def test_a_delete_is_fenced_like_a_create_so_a_stale_record_deletes_nothing() -> None:
    """The duplicate stage pod of the Helm upgrade: a fresh replica whose node cache was
    behind its pod cache deleted a running stage pod (its stale record did not keep it),
    and the up-to-date replica created it a second time. A delete now follows a write
    preconditioned on the node version the decision read."""
    nodes = _nodes()
    body, ref = _old_pod("config")
    decision = NodeDecision(owner=nodestate.EXECUTOR, cr=CR, node="n1", fence=True, delete=(ref,))

    class Stale(FakeNodes):
        def get(self, name: str) -> dict[str, object] | None:
            seen = super().get(name)
            self.touch(name)  # the record moved on after this replica's cache
            return seen

    stale = Stale(nodes=nodes.nodes, revision=nodes.revision)
    objects = FakeObjects(objects={("Pod", "config"): body})
    got = await nodeshell.apply(
        decision, nodes=stale, objects=objects, bus=FakeBus(), now=lambda: T0 + timedelta(hours=1)
    )
    assert got == nodeshell.STALE_RETRY_S
    assert objects.deleted == []
    assert ("Pod", "config") in objects.objects
    # On a current node the same decision deletes it, after the precondition write.
    current = nodes.nodes["n1"]["metadata"]["resourceVersion"]
    got = await nodeshell.apply(
        decision, nodes=nodes, objects=objects, bus=FakeBus(), now=lambda: T0 + timedelta(hours=1)
    )
    assert got is None
    assert nodes.patches == []
    assert nodes.confirms == [("n1", True)], f"read at {current} and found unchanged"
    assert objects.deleted == ["config"]


async def test_a_settled_pod_is_deleted_without_a_fence_write() -> None:
    """Issue 15: a finished pod the record has moved past (the core says which) costs a
    DELETE and no precondition-only Node PATCH; the others in the same decision still do."""
    nodes = _nodes()
    body, ref = _old_pod("apply")
    objects = FakeObjects(objects={("Pod", "apply"): body})
    settled = NodeDecision(
        owner=nodestate.EXECUTOR,
        cr=CR,
        node="n1",
        fence=True,
        delete=(ref,),
        settled=frozenset({"apply"}),
    )
    later = T0 + timedelta(hours=1)
    assert (
        await nodeshell.apply(
            settled, nodes=nodes, objects=objects, bus=FakeBus(), now=lambda: later
        )
        is None
    )
    assert (nodes.patches, nodes.confirms, objects.deleted) == ([], [], ["apply"])
    body2, ref2 = _old_pod("config", uid="u2")
    objects.objects[("Pod", "config")] = body2
    objects.objects[("Pod", "apply")] = body
    both = replace(settled, delete=(ref, ref2))
    await nodeshell.apply(both, nodes=nodes, objects=objects, bus=FakeBus(), now=lambda: later)
    assert len(nodes.confirms) == 1, "one pod not settled: the decision is fenced"


async def test_a_stop_keeps_the_pod_asks_for_no_fence_and_names_the_pod_decided_on() -> None:
    """A stage that timed out or was aborted: its pod is stopped (the kubelet ends it once
    its activeDeadlineSeconds is past) and kept for its logs; the record that says so is
    already written, so no fence; a namesake (another UID) is left alone, decided again."""
    nodes = _nodes()
    body, ref = _old_pod("apply")
    objects = FakeObjects(objects={("Pod", "apply"): body})
    stop = NodeDecision(owner=nodestate.EXECUTOR, cr=CR, node="n1", fence=True, stop=(ref,))
    assert await nodeshell.apply(stop, nodes=nodes, objects=objects, bus=FakeBus()) is None
    assert (nodes.patches, nodes.confirms, objects.deleted) == ([], [], [])
    assert objects.stopped == ["apply"]
    kept = objects.objects[("Pod", "apply")]
    assert kept["spec"]["activeDeadlineSeconds"] == nodeshell.STOP_DEADLINE_S
    namesake, _ = _old_pod("apply", uid="u9")
    objects.objects[("Pod", "apply")] = namesake
    got = await nodeshell.apply(stop, nodes=nodes, objects=objects, bus=FakeBus())
    assert got == nodeshell.STALE_RETRY_S
    assert objects.conflicts == ["apply"]


class _DownBus(FakeBus):
    """NATS away: nothing is taken."""

    async def settle(self, todo: Any) -> None:
        raise nodeshell.Unpublished("nats: connection closed")


async def test_what_a_pod_says_goes_out_before_the_write_and_its_pod_stays_until_it_did() -> None:
    """Issue 15: the executor writes no stage's end; ``stage.succeeded`` is said from the pod
    (the check's verdict records it). It goes before the pass's write (its events follow
    it on the stream), is not sent again once known, and no pod is deleted while the
    stream has not taken it: the pod is what says it."""
    nodes = _nodes()
    body, ref = _old_pod("apply")
    objects = FakeObjects(objects={("Pod", "apply"): body})
    said, started = _event(1), _event(2)
    decision = NodeDecision(
        owner=nodestate.EXECUTOR,
        cr=CR,
        node="n1",
        record=Write(ExecutorRecord(honoured=1)),
        fence=True,
        delete=(ref,),
        settled=frozenset({"apply"}),
        events=(started,),
        announce={"apply": (said,)},
    )
    later = T0 + timedelta(hours=1)
    again = await nodeshell.apply(
        decision, nodes=nodes, objects=objects, bus=_DownBus(), now=lambda: later
    )
    assert again == nodeshell.UNPUBLISHED_RETRY_S
    assert len(nodes.patches) == 1, "the rollout goes on without NATS: the write landed"
    assert objects.deleted == []
    up, announced = FakeBus(), list[events.Event]()
    pending = replace(decision, record=Keep(), events=())
    # The second pass finds it known to be on the stream: not sent nor announced again.
    for _ in range(2):
        await nodeshell.apply(
            pending,
            nodes=nodes,
            objects=objects,
            bus=up,
            announced=announced.extend,
            now=lambda: later,
        )
        # Said first, then what the write made while NATS was away left in the outbox.
        assert [e.id for e in up.published] == ["e1", "e2"]
        assert announced == [said]
        assert objects.deleted == ["apply"]
    # With a write: said first, then the write's own events.
    fresh, bus = _nodes(), FakeBus()
    await nodeshell.apply(decision, nodes=fresh, objects=FakeObjects(), bus=bus, now=lambda: later)
    assert [e.id for e in bus.published] == ["e1", "e2"]


async def test_a_delete_names_the_object_decided_on_not_its_namesake() -> None:
    nodes = _nodes()
    body, _ = _old_pod("check", uid="u2")
    _, seen = _old_pod("check", uid="u1")
    objects = FakeObjects(objects={("Pod", "check"): body})
    decision = NodeDecision(owner=nodestate.VALIDATOR, cr=CR, node="n1", fence=True, delete=(seen,))
    got = await nodeshell.apply(
        decision, nodes=nodes, objects=objects, bus=FakeBus(), now=lambda: T0 + timedelta(hours=1)
    )
    assert got == nodeshell.STALE_RETRY_S, "decided again on what is there now"
    assert (objects.deleted, objects.conflicts) == ([], ["check"])
    changed = {"kind": "Pod", "metadata": {"name": "check", "uid": "u1", "resourceVersion": "8"}}
    objects.objects[("Pod", "check")] = changed
    await nodeshell.apply(
        decision, nodes=nodes, objects=objects, bus=FakeBus(), now=lambda: T0 + timedelta(hours=1)
    )
    assert objects.deleted == [], "a pod that changed since the decision stays"


async def test_a_young_pod_is_not_deleted_until_no_replica_can_be_about_to_create_it() -> None:
    nodes = _nodes()
    body, ref = _old_pod("apply")
    objects = FakeObjects(objects={("Pod", "apply"): body})
    decision = NodeDecision(owner=nodestate.EXECUTOR, cr=CR, node="n1", fence=True, delete=(ref,))
    young = T0 + timedelta(seconds=nodeshell.MIN_POD_AGE_S - 5)
    got = await nodeshell.apply(
        decision, nodes=nodes, objects=objects, bus=FakeBus(), now=lambda: young
    )
    assert got == pytest.approx(5.0), "looked at again once it is old enough"
    assert objects.deleted == []
    # Issue 15: while only young pods wait, no fence write either (each pass made a
    # precondition-only PATCH: ~60 per node and service in a small rollout).
    assert (nodes.patches, nodes.confirms) == ([], []), "nothing to delete yet: nothing to fence"
    old = T0 + timedelta(seconds=nodeshell.MIN_POD_AGE_S)
    await nodeshell.apply(decision, nodes=nodes, objects=objects, bus=FakeBus(), now=lambda: old)
    assert objects.deleted == ["apply"]
    assert len(nodes.confirms) == 1, "the delete itself is fenced"


async def test_a_create_too_long_after_its_write_is_decided_again() -> None:
    """A slow API server between the precondition write and the create: past
    CREATE_WITHIN_S the write no longer proves the decision current."""
    nodes = _nodes()
    ticks = iter([0.0, 1.0, 1.0 + nodeshell.CREATE_WITHIN_S + 0.1])
    decision = NodeDecision(
        owner=nodestate.EXECUTOR,
        cr=CR,
        node="n1",
        fence=True,
        config_maps=({"kind": "ConfigMap", "metadata": {"name": "cm"}},),
        create=(_pod("apply"),),
        events=(_event(1),),
    )
    objects, bus = FakeObjects(), FakeBus()
    got = await nodeshell.apply(
        decision, nodes=nodes, objects=objects, bus=bus, clock=lambda: next(ticks)
    )
    assert got == nodeshell.STALE_RETRY_S
    assert objects.created == []


async def test_removing_a_record_deletes_its_annotation_and_only_it() -> None:
    nodes = FakeNodes()
    nodes.add(
        node(
            "n1",
            records={
                nodestate.VALIDATOR: ValidatorRecord(validated="t"),
                nodestate.EXECUTOR: ExecutorRecord(honoured=1),
            },
        )
    )
    decision = NodeDecision(owner=nodestate.VALIDATOR, cr=CR, node="n1", record=Remove())
    await _apply(decision, nodes)
    annotations = nodes.nodes["n1"]["metadata"]["annotations"]
    assert nodestate.key(nodestate.VALIDATOR, CR) not in annotations
    assert nodestate.key(nodestate.EXECUTOR, CR) in annotations


async def test_an_existing_pod_is_success_and_config_maps_come_first() -> None:
    nodes = _nodes()
    decision = NodeDecision(
        owner=nodestate.EXECUTOR,
        cr=CR,
        node="n1",
        fence=True,
        config_maps=({"kind": "ConfigMap", "metadata": {"name": "cm"}},),
        create=(_pod("apply"),),
        events=(_event(1),),
    )
    objects = FakeObjects(objects={("Pod", "apply"): _pod("apply")})
    bus = FakeBus()
    await nodeshell.apply(decision, nodes=nodes, objects=objects, bus=bus)
    assert objects.created == ["ConfigMap/cm"]
    assert [e.id for e in bus.published] == ["e1"]


async def test_the_drainers_release_lifts_its_cordon_in_the_same_patch() -> None:
    nodes = FakeNodes()
    rec = DrainRecord(phase="drained", cordoned=True, started=T0, since=T0)
    nodes.add(node("n1", unschedulable=True, records={nodestate.DRAINER: rec}))
    decision = drainer_core.Decision(
        write=drainer_core.NodeWrite(record=Remove(), unschedulable=False)
    )
    await _apply(drainer_core.node_decision(CR, "n1", decision), nodes)
    ((_, body),) = nodes.patches
    assert body["spec"] == {"unschedulable": False}
    assert body["metadata"]["annotations"] == {nodestate.key(nodestate.DRAINER, CR): None}
    keep = drainer_core.node_decision(CR, "n1", drainer_core.Decision())
    assert isinstance(keep.record, Keep)
    assert not keep.patches_node


class _Stream:
    """A stream of one subject per event kind and node, deduplicating within its window."""

    duplicate_window_s = 120.0

    def __init__(self) -> None:
        self.stored: list[events.Event] = []
        self.lookups: list[str] = []
        self.scans: list[str] = []
        self.sends_by: list[datetime | None] = []
        self.down = False
        self.now = T0

    async def publish(self, event: events.Event, *, send_by: datetime | None = None) -> bool:
        self.sends_by.append(send_by)
        if self.down:
            raise TimeoutError("nats: timeout")
        if send_by is not None and self.now > send_by:
            raise TooLate(event.id)
        self.stored.append(event)
        return True

    async def last_id(self, subject: str) -> str | None:
        self.lookups.append(subject)
        on = [e for e in self.stored if e.subject == subject]
        return on[-1].id if on else None

    async def ids_on(self, subject: str) -> set[str]:
        self.scans.append(subject)
        return {e.id for e in self.stored if e.subject == subject}


def _validated(n: int, age_s: float) -> events.Event:
    return events.NodeValidated(
        id=f"v{n}", at=T0 - timedelta(seconds=age_s), cr=CR, generation=1, node="n1"
    )


async def test_the_bus_looks_up_old_events_it_does_not_know_and_remembers_what_it_put() -> None:
    stream = _Stream()
    port = nodeshell.BusEvents(stream, now=lambda: T0)
    old, young = _validated(1, 600), _validated(2, 5)
    # Another process published the old one long ago (beyond JetStream's dedupe window).
    stream.stored.append(old)
    await port.settle([old, young])
    assert [e.id for e in stream.stored] == ["v1", "v2"], "the old one is not stored twice"
    assert stream.lookups == [old.subject], "only the old one is looked up"
    assert port.delivered(old)
    assert port.delivered(young)
    # Known now: nothing is sent or looked up again.
    await port.settle([old, young])
    assert (len(stream.stored), len(stream.lookups)) == (2, 1)
    # An old event the stream does not hold is published; so is everything after the last
    # message on its subject.
    port2 = nodeshell.BusEvents(stream, now=lambda: T0)
    lost = _validated(3, 900)
    await port2.settle([lost])
    assert [e.id for e in stream.stored] == ["v1", "v2", "v3"]


async def test_an_old_event_followed_on_its_subject_by_a_later_one_is_not_stored_twice() -> None:
    """CI, 200 nodes under kills and a NATS partition: a replica's outbox still held an old
    stage.started after another replica, which did not know it published, carried it into
    its next write and published it and the next stage.started (same subject: kind and
    node). The last message on the subject was that later event, not the old one, and the
    old one was published again, out of JetStream's window: stored twice."""
    stream = _Stream()
    old, later = _validated(1, 600), _validated(2, 300)
    stream.stored += [old, later]
    port = nodeshell.BusEvents(stream, now=lambda: T0)
    await port.settle([old])
    assert [e.id for e in stream.stored] == ["v1", "v2"], "not stored twice"
    assert stream.scans == [old.subject], "the subject's messages are read when the last differs"
    assert port.delivered(old)
    # Only then: an old event that is last on its subject costs one look-up, no read.
    port = nodeshell.BusEvents(stream, now=lambda: T0)
    await port.settle([later])
    assert stream.scans == [old.subject]
    # And one the subject does not hold is published, after the messages that are there.
    lost = _validated(3, 900)
    await nodeshell.BusEvents(stream, now=lambda: T0).settle([lost])
    assert [e.id for e in stream.stored] == ["v1", "v2", "v3"]


async def test_old_announcements_stored_in_another_order_are_looked_up_one_by_one() -> None:
    """Two packages' stage pods on a node say their ``stage.succeeded`` (one subject); the
    stream holds them in the order the executor first saw the stages end, which need not be
    the order of their ends. A replica that does not know them (restarted) must find both
    there, not take the events before the last one stored for the stored ones."""
    stream = _Stream()
    first_end, second_end = _validated(1, 600), _validated(2, 300)
    stream.stored += [second_end, first_end]  # seen in this order
    decision = NodeDecision(
        owner=nodestate.EXECUTOR,
        cr=CR,
        node="n1",
        announce={"a": (first_end,), "b": (second_end,)},
    )
    port = nodeshell.BusEvents(stream, now=lambda: T0)
    await nodeshell.apply(decision, nodes=_nodes(), objects=FakeObjects(), bus=port)
    assert [e.id for e in stream.stored] == ["v2", "v1"], "neither stored twice"
    assert port.delivered(first_end)
    assert port.delivered(second_end)


async def test_a_pod_with_nothing_to_say_is_deleted_while_another_ones_event_waits() -> None:
    """NATS away: only the pod whose event the stream lacks stays (a timed-out stage's pod
    must still be stopped)."""
    nodes = _nodes()
    (said_body, said_ref), (hung_body, hung_ref) = _old_pod("apply"), _old_pod("hung", uid="u2")
    objects = FakeObjects(objects={("Pod", "apply"): said_body, ("Pod", "hung"): hung_body})
    decision = NodeDecision(
        owner=nodestate.EXECUTOR,
        cr=CR,
        node="n1",
        fence=True,
        delete=(said_ref, hung_ref),
        settled=frozenset({"apply", "hung"}),
        announce={"apply": (_event(1),)},
    )
    later = T0 + timedelta(hours=1)
    again = await nodeshell.apply(
        decision, nodes=nodes, objects=objects, bus=_DownBus(), now=lambda: later
    )
    assert objects.deleted == ["hung"]
    assert again == nodeshell.UNPUBLISHED_RETRY_S


async def test_a_blind_publish_held_past_the_window_is_given_up_and_the_next_pass_looks() -> None:
    """CI, 200 nodes under kills: a restarted scheduler re-published a node.completed 100 s
    old, blind; the NATS partition held its attempts until the first copy was out of
    JetStream's window, and the stream stored it twice."""
    stream = _Stream()
    first = _validated(1, 100)
    stream.stored.append(first)  # the replica that died had published it
    clock = T0
    port = nodeshell.BusEvents(stream, now=lambda: clock)
    stream.now = T0 + timedelta(seconds=30)  # NATS took 30 s to take the attempt
    with pytest.raises(nodeshell.Unpublished):
        await port.settle([first])
    cutoff = timedelta(seconds=stream.duplicate_window_s - nodeshell.DEDUPE_MARGIN_S)
    assert stream.sends_by == [first.at + cutoff], "a blind publish is bounded by the cutoff"
    assert not port.delivered(first)
    clock = T0 + timedelta(seconds=30)  # the next pass: old now, so looked up
    await port.settle([first])
    assert [e.id for e in stream.stored] == ["v1"], "stored once"
    assert stream.lookups == [first.subject]
    assert port.delivered(first)
    # Looked up and not there (lost), it is published with no deadline.
    lost = _validated(2, 400)
    await port.settle([lost])
    assert [e.id for e in stream.stored] == ["v1", "v2"]
    assert stream.sends_by[-1] is None


async def test_the_bus_down_keeps_events_unknown_and_raises_unpublished() -> None:
    stream = _Stream()
    stream.down = True
    port = nodeshell.BusEvents(stream, now=lambda: T0)
    with pytest.raises(nodeshell.Unpublished):
        await port.settle([_validated(1, 1)])
    assert not port.delivered(_validated(1, 1))


async def test_a_published_outbox_gives_no_work_and_goes_with_its_nodewright() -> None:
    """What a finished node keeps: its owner's last events, published. They start no pass
    while the NodeWright exists; once it is gone, one write removes them."""
    nodes = _nodes()
    bus = FakeBus()
    last = NodeDecision(owner=nodestate.DRAINER, cr=CR, node="n1", events=(_event(1),))
    await nodeshell.apply(last, nodes=nodes, objects=FakeObjects(), bus=bus)
    held = nodes.nodes["n1"]
    assert outbox.key(nodestate.DRAINER, CR) in nodestate.annotations_of(held)
    assert nodeshell.outboxes_to_look_at(held, nodestate.DRAINER, bus, lambda cr: False) == []
    assert nodeshell.outboxes_to_look_at(held, nodestate.DRAINER, FakeBus(), lambda cr: False) == [
        CR
    ], "another process does not know them published: it looks"
    assert nodeshell.outboxes_to_look_at(held, nodestate.DRAINER, bus, lambda cr: True) == [CR]
    writes = len(nodes.patches)

    async def nothing(key: tuple[str, str]) -> float | None:
        return None

    got = await nodeshell.flush_then(
        owner=nodestate.DRAINER,
        key=(CR, "n1"),
        nodes=nodes,
        bus=bus,
        work=nothing,
        gone=lambda cr: False,
    )
    assert (got, len(nodes.patches)) == (None, writes)
    got = await nodeshell.flush_then(
        owner=nodestate.DRAINER,
        key=(CR, "n1"),
        nodes=nodes,
        bus=bus,
        work=nothing,
        gone=lambda cr: True,
    )
    assert (got, len(nodes.patches)) == (None, writes + 1)
    assert outbox.key(nodestate.DRAINER, CR) not in nodestate.annotations_of(nodes.nodes["n1"])


async def test_an_outbox_of_a_gone_nodewright_stays_until_the_stream_holds_it() -> None:
    nodes = _nodes()
    last = NodeDecision(owner=nodestate.DRAINER, cr=CR, node="n1", events=(_event(1),))
    await nodeshell.apply(last, nodes=nodes, objects=FakeObjects(), bus=Down())
    got = await nodeshell.tidy(owner=nodestate.DRAINER, cr=CR, node="n1", nodes=nodes, bus=Down())
    assert got == nodeshell.UNPUBLISHED_RETRY_S
    assert [e.id for e in outbox.pending(nodes.nodes["n1"], nodestate.DRAINER, CR)] == ["e1"]


async def test_an_outbox_whose_flush_failed_is_flushed_again_until_the_stream_holds_it() -> None:
    """The scheduler's releases (passes per NodeWright, not per node): an outbox noted from
    the node watch stays noted through any number of failed flushes, so a node that never
    changes again still gets its ``node.completed`` out once NATS is back."""
    nodes = _nodes()
    last = NodeDecision(owner=nodestate.SCHEDULER, cr=CR, node="n1", events=(_event(1),))
    await nodeshell.apply(last, nodes=nodes, objects=FakeObjects(), bus=Down())
    down = nodeshell.Unflushed(nodestate.SCHEDULER, nodes, Down())
    down.note(nodes.nodes["n1"], lambda cr: False)
    for _ in range(3):
        assert await down.flush(CR) == nodeshell.UNPUBLISHED_RETRY_S
    assert await down.flush(CR, "n1") == nodeshell.UNPUBLISHED_RETRY_S
    assert down.keys == {(CR, "n1")}
    bus = FakeBus()
    up = nodeshell.Unflushed(nodestate.SCHEDULER, nodes, bus, keys=down.keys)
    assert await up.flush(CR) is None
    assert [e.id for e in bus.published] == ["e1"]
    assert up.keys == set()
    assert await up.flush(CR) is None
    assert len(bus.published) == 1


async def test_a_service_without_an_object_port_writes_and_publishes_but_makes_no_pods() -> None:
    """The validator creates and deletes nothing: its decisions go through without one."""
    nodes = _nodes()
    bus = FakeBus()
    rec = DrainRecord(phase="cordoned", cordoned=True, started=T0, since=T0)
    plain = NodeDecision(
        owner=nodestate.VALIDATOR, cr=CR, node="n1", record=Write(rec), events=(_event(1),)
    )
    assert await nodeshell.apply(plain, nodes=nodes, bus=bus) is None
    assert [e.id for e in bus.published] == ["e1"]
    with pytest.raises(ValueError, match="object port"):
        await nodeshell.apply(
            replace(plain, record=Keep(), create=(_pod("p"),)), nodes=nodes, bus=bus
        )
