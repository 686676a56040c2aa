"""The status service against the real rig: it runs in-process, reads kwok nodes whose
records the test writes by hand (as the other services would), and must fold them into the
NodeWright status, the node conditions and status records, and turn bus events and dead
letters into Kubernetes Events."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import nats
import nats.js.errors
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nodewright.rig import Rig
from nodewright.rig.nodes import create_nodes, wait_ready
from services.status import core, service
from services.status.config import Settings
from shared import api, config, events, nodestate, progress, runtime, streaming, subjects
from shared.bus import Bus
from shared.events import Reason
from shared.kube import JSON, ApiError, Kube, path_of
from shared.records.drainer import DrainRecord
from shared.records.executor import ExecutorRecord, PackageRecord
from shared.records.scheduler import Selection
from shared.records.validator import ValidatorRecord
from tests.api.crds import NODEWRIGHTS, POLICIES, install_crds
from tests.helpers.bus import caught_up
from tests.helpers.waiting import Pending, eventually

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PACKAGE = {"version": "0.9.0", "image": "ghcr.io/nvidia/nodewright-packages/nvidia-tuned"}
RUN_LABEL = "status-test.nodewright.nvidia.com/run"

Record = Selection | DrainRecord | ExecutorRecord | ValidatorRecord | None


@dataclass
class Harness:
    """One running status service, a NATS client on its stream, and names unique to a test."""

    kapi: Kube
    bus: Bus
    publisher: streaming.Publisher
    settings: Settings
    run: str
    kubeconfig: Path
    health_port: int = 0
    """Where the running service serves /healthz, /readyz and /metrics."""

    @property
    def cr(self) -> str:
        return f"st-{self.run}"

    def node(self, suffix: str) -> str:
        return f"st-{self.run}-{suffix}"


async def _consumers_exist(bus: Bus) -> bool:
    for durable in (service.NAME, service.DEAD_LETTER_CONSUMER):
        try:
            await bus.js.consumer_info(bus.settings.stream, durable)
        except nats.js.errors.NotFoundError:
            return False
    return True


@contextlib.asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[runtime.ServiceContext]:
    """The status service in-process, stopped (and checked for a clean exit) afterwards."""
    contexts: list[runtime.ServiceContext] = []

    async def build(ctx: runtime.ServiceContext) -> None:
        contexts.append(ctx)
        await service.build(ctx)

    task = asyncio.create_task(
        runtime.serve(name=service.NAME, settings=settings, build=build), name="status-service"
    )
    try:
        await eventually(
            lambda: _started(task, contexts), timeout_s=30, what="the status service to start"
        )
        yield contexts[0]
        # A root task that ends or fails stops the whole service: it must still run.
        assert not task.done(), "the status service stopped during the test"
    finally:
        if contexts:
            contexts[0].supervisor.request_stop("test finished")
        else:
            task.cancel()
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 60)


async def _started(task: asyncio.Task[int], contexts: list[runtime.ServiceContext]) -> bool:
    if task.done():
        task.result()  # surfaces a startup crash
        pytest.fail("the status service stopped during startup")
    return bool(contexts)


@pytest.fixture
async def harness(
    rig: Rig, kapi: Kube, namespace: str, request: pytest.FixtureRequest
) -> AsyncIterator[Harness]:
    """The status service on the rig; indirect parameters are more of its settings."""
    await install_crds(kapi)
    run = uuid.uuid4().hex[:8]
    extra: dict[str, str] = getattr(request, "param", {})
    settings = config.load(
        Settings,
        {
            **rig.env(),
            "NODEWRIGHT_NATS_STREAM": f"ST{run.upper()}",
            "NODEWRIGHT_NAMESPACE": namespace,
            "NODEWRIGHT_HEALTH_PORT": "0",
            "NODEWRIGHT_GRACEFUL_TIMEOUT_S": "2",
            "NODEWRIGHT_RESYNC_INTERVAL_S": "2",
            "NODEWRIGHT_IDENTITY": f"status-{run}",
            **extra,
        },
    )
    nc = await nats.connect(settings.nats.url)
    bus = Bus(nc=nc, js=nc.jetstream(), settings=settings.nats)
    await streaming.ensure_stream(bus.js, settings.nats)
    h = Harness(
        kapi=kapi,
        bus=bus,
        publisher=streaming.Publisher(bus, source="test"),
        settings=settings,
        run=run,
        kubeconfig=rig.endpoints.kubeconfig,
    )
    try:
        async with running(settings) as ctx:
            h.health_port = ctx.health_port
            # The consumers start at the stream's end: publish only once they exist.
            await eventually(lambda: _consumers_exist(bus), what="the status consumers")
            yield h
    finally:
        await _delete(kapi, f"{NODEWRIGHTS}/{h.cr}")
        nodes = await kapi.get(path_of(plural="nodes"), labelSelector=f"{RUN_LABEL}={run}")
        for n in nodes.get("items") or []:
            await _delete(kapi, path_of(plural="nodes", name=n["metadata"]["name"]))
        await bus.js.delete_stream(settings.nats.stream)
        await nc.close()


async def _delete(kapi: Kube, path: str) -> None:
    with contextlib.suppress(ApiError):
        await kapi.delete(path)


# ---- helpers ---------------------------------------------------------------------------------


async def _nodes(h: Harness, *suffixes: str, labels: Mapping[str, str] | None = None) -> None:
    names = [h.node(s) for s in suffixes]
    await create_nodes(h.kapi, names, labels={RUN_LABEL: h.run, **(labels or {})})
    await wait_ready(h.kapi, names)


async def _nodewright(h: Harness, **spec: Any) -> api.NodeWright:
    body = {
        "apiVersion": api.API_VERSION,
        "kind": "NodeWright",
        "metadata": {"name": h.cr},
        "spec": {
            "nodeSelectors": {"matchLabels": {RUN_LABEL: h.run, "pool": "gpu"}},
            "packages": {"nvidia-tuned": PACKAGE},
            **spec,
        },
    }
    return api.from_dict(await h.kapi.create(NODEWRIGHTS, body), api.NodeWright)


async def _records(h: Harness, suffix: str, records: Mapping[str, Record]) -> None:
    """Write (None: remove) other services' records on a node, as they would."""
    annotations: dict[str, str | None] = {}
    for owner, record in records.items():
        annotations.update(nodestate.patch(owner, h.cr, record)["metadata"]["annotations"])
    await h.kapi.patch(
        path_of(plural="nodes", name=h.node(suffix)), {"metadata": {"annotations": annotations}}
    )


async def _cr(h: Harness) -> JSON:
    return await h.kapi.get(f"{NODEWRIGHTS}/{h.cr}")


async def _status(h: Harness) -> api.NodeWrightStatus:
    return api.from_dict((await _cr(h)).get("status") or {}, api.NodeWrightStatus)


async def _status_when(
    h: Harness, holds: Callable[[api.NodeWrightStatus], bool], what: str
) -> api.NodeWrightStatus:
    async def probe() -> api.NodeWrightStatus | None:
        status = await _status(h)
        return status if holds(status) else None

    found = await eventually(probe, what=what)
    assert found is not None
    return found


def _ready(status: api.NodeWrightStatus) -> api.Condition | None:
    return next((c for c in status.conditions if c.type == "Ready"), None)


async def _node_status(h: Harness, suffix: str) -> tuple[Any, Mapping[str, Any] | None]:
    """(an earlier version's status record annotation, the node condition) of the CR on a
    node."""
    obj = await h.kapi.get(path_of(plural="nodes", name=h.node(suffix)))
    record = nodestate.annotations_of(obj).get(nodestate.key(nodestate.STATUS, h.cr))
    ctype = f"nodewright.nvidia.com/{h.cr}"
    cond = next((c for c in obj["status"].get("conditions") or [] if c["type"] == ctype), None)
    return record, cond


async def _kube_events(kapi: Kube, namespace: str, selector: str = "") -> list[JSON]:
    query = {"labelSelector": selector} if selector else {}
    listed = await kapi.get(path_of(plural="events", namespace=namespace), **query)
    return list(listed.get("items") or [])


async def _kubectl_wait_ready(h: Harness, limit: str, cache: Path) -> int:
    proc = await asyncio.create_subprocess_exec(
        "kubectl",
        f"--kubeconfig={h.kubeconfig}",
        f"--cache-dir={cache}",
        "wait",
        "--for=condition=Ready",
        f"nodewrights.nodewright.nvidia.com/{h.cr}",
        f"--timeout={limit}",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    return await proc.wait()


def _selection(target: str) -> Selection:
    return Selection(
        generation=1, compartment="default", batch=1, selected_at=T0, disruptive=True, target=target
    )


def _package(cr: api.NodeWright, state: str, **kw: Any) -> ExecutorRecord:
    digest = progress.desired(cr)["nvidia-tuned"].config_digest
    fields: dict[str, Any] = {"version": "0.9.0", "stage": "config", "state": state, "updated": T0}
    if state == "succeeded":
        fields.update(installed="0.9.0", config=digest)
    fields.update(kw)
    return ExecutorRecord(packages={"nvidia-tuned": msgspec.convert(fields, PackageRecord)})


DRAINED = DrainRecord(phase="drained", cordoned=True, started=T0, since=T0)
IMAGE_PULL = Reason(code="ImagePullFailed", message="cannot pull image ghcr.io/x:0.9.0")


def _complete(cr: api.NodeWright) -> dict[str, Record]:
    target = progress.target_digest(cr)
    return {
        nodestate.SCHEDULER: None,
        nodestate.DRAINER: None,
        nodestate.EXECUTOR: _package(cr, "succeeded"),
        nodestate.VALIDATOR: ValidatorRecord(validated=target, at=T0),
    }


# ---- tests -----------------------------------------------------------------------------------


async def test_status_counts_nodes_explains_them_and_is_ready_only_when_all_complete(
    harness: Harness, tmp_path: Path
) -> None:
    h = harness
    await _nodes(h, "a", "b", "c", "d", labels={"pool": "gpu"})
    await _nodes(h, "x", labels={"pool": "cpu"})
    cr = await _nodewright(h, interruptionBudget={"count": 1})
    target = progress.target_digest(cr)
    await _records(h, "a", _complete(cr))
    await _records(
        h,
        "b",
        {
            nodestate.SCHEDULER: _selection(target),
            nodestate.DRAINER: DRAINED,
            nodestate.EXECUTOR: _package(cr, "failed", stage="apply", reason=IMAGE_PULL),
        },
    )
    await _records(
        h,
        "c",
        {
            nodestate.SCHEDULER: _selection(target),
            nodestate.DRAINER: DRAINED,
            nodestate.EXECUTOR: _package(cr, "running", stage="apply"),
        },
    )
    expected = api.NodeCounts(target=4, complete=1, in_progress=1, failed=1, waiting=1)

    status = await _status_when(
        h, lambda s: s.node_counts == expected, "node counts 1 complete, 1 each other state"
    )
    assert (status.complete_nodes, status.state, status.observed_generation) == (
        "1/4",
        "InProgress",
        1,
    )
    assert status.package_list == "nvidia-tuned:0.9.0"
    ready = _ready(status)
    assert ready is not None
    assert (ready.status, ready.reason) == ("False", "InProgress")
    assert ready.message.startswith(
        f"1/4 nodes complete, 1 failed ({h.node('b')}: ImagePullFailed: cannot pull image"
    )
    assert [(d.node, d.state, d.reason, d.package) for d in status.node_details] == [
        (h.node("b"), "Failed", "ImagePullFailed", "nvidia-tuned"),
        (h.node("c"), "InProgress", "StageRunning", "nvidia-tuned"),
        (h.node("d"), "Waiting", "BudgetExhausted", ""),
    ]
    (compartment,) = status.compartments
    assert (compartment.matched_nodes, compartment.complete_nodes, compartment.budget_nodes) == (
        4,
        1,
        1,
    )
    (package,) = status.packages
    assert (package.present_nodes, package.complete_nodes, package.failed_nodes) == (3, 1, 1)

    # Every target node carries its summary; the other node does not.
    record, cond = await _node_status(h, "a")
    assert record is None, "no per-step record: the condition is the node's summary"
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("True", "Complete")
    record, cond = await _node_status(h, "b")
    assert record is None
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("False", "Failed")
    assert cond["message"].startswith("ImagePullFailed: cannot pull image")
    assert await _node_status(h, "x") == (None, None)
    assert await _kubectl_wait_ready(h, "1s", tmp_path) != 0, "not Ready while nodes are not"

    # Nothing changes: no status or node write in a pass. An event about the NodeWright is
    # acked only after a status pass that started after it finished: wait for that.
    before = (await _cr(h))["metadata"]["resourceVersion"]
    node_before = (await h.kapi.get(path_of(plural="nodes", name=h.node("b"))))["metadata"]
    nudge = events.NodeValidated(
        id=events.event_id(h.cr, h.node("b"), "nudge", before),
        at=datetime.now(UTC),
        cr=h.cr,
        generation=1,
        node=h.node("b"),
    )
    await h.publisher.publish(nudge)
    await eventually(
        lambda: caught_up(h.bus.js, h.bus.settings.stream, service.NAME),
        what="a status pass after the nudge",
    )
    assert (await _cr(h))["metadata"]["resourceVersion"] == before
    node_after = (await h.kapi.get(path_of(plural="nodes", name=h.node("b"))))["metadata"]
    assert node_after["resourceVersion"] == node_before["resourceVersion"]

    # Every node completes: Ready, and kubectl wait returns.
    for suffix in ("b", "c", "d"):
        await _records(h, suffix, _complete(cr))

    status = await _status_when(
        h,
        lambda s: getattr(_ready(s), "status", "") == "True",
        "Ready=True once every node is complete",
    )
    assert status.node_counts == api.NodeCounts(target=4, complete=4)
    assert (status.state, status.complete_nodes, status.node_details) == ("Complete", "4/4", [])
    done = _ready(status)
    assert done is not None
    assert done.last_transition_time > ready.last_transition_time
    assert await _kubectl_wait_ready(h, "30s", tmp_path) == 0
    _, cond = await _node_status(h, "b")
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("True", "Complete")


def _bus_events(h: Harness) -> tuple[events.StageFailed, events.NodeSelected]:
    failed = events.StageFailed(
        id=events.event_id(h.cr, h.node("n"), "nvidia-tuned", "0.9.0", "apply", 1, "failed"),
        at=datetime.now(UTC),
        cr=h.cr,
        generation=1,
        node=h.node("n"),
        package="nvidia-tuned",
        version="0.9.0",
        stage="apply",
        reason=IMAGE_PULL,
    )
    selected = events.NodeSelected(
        id=events.event_id(h.cr, h.node("n"), "selected"),
        at=datetime.now(UTC),
        cr=h.cr,
        generation=1,
        node=h.node("n"),
        compartment="default",
        batch=1,
        disruptive=True,
    )
    return failed, selected


async def _publish(h: Harness, failed: events.StageFailed, selected: events.NodeSelected) -> None:
    await h.publisher.publish(selected)
    # The same event stored twice (as after a re-publish past the dedupe window).
    for _ in range(2):
        await h.bus.js.publish(failed.subject, events.encode(failed), stream=h.bus.settings.stream)


@pytest.mark.parametrize("harness", [{"NODEWRIGHT_STATUS_VERBOSE_EVENTS": "true"}], indirect=True)
async def test_in_verbose_mode_bus_events_become_events_on_the_nodewright_naming_the_node(
    harness: Harness,
) -> None:
    h = harness
    await _nodes(h, "n", labels={"pool": "gpu"})
    cr = await _nodewright(h)
    failed, selected = _bus_events(h)
    await _publish(h, failed, selected)
    selector = f"nodewright.nvidia.com/nodewright={h.cr}"

    async def two_events() -> list[JSON]:
        found = await _kube_events(h.kapi, "default", selector)
        return found if len(found) >= 2 else []

    await eventually(two_events, what="2 Kubernetes Events")
    # Every stored message handled (both copies of the duplicate acked): nothing more comes.
    await eventually(
        lambda: caught_up(h.bus.js, h.bus.settings.stream, service.NAME),
        what="the status consumer to ack every message",
    )
    found = await _kube_events(h.kapi, "default", selector)
    summary = sorted(
        (e["involvedObject"]["kind"], e["reason"], e["type"], e.get("series")) for e in found
    )
    assert summary == [
        ("NodeWright", "NodeSelected", "Normal", None),
        ("NodeWright", "StageFailed", "Warning", None),
    ]
    on_cr = next(e for e in found if e["reason"] == "StageFailed")
    assert on_cr["involvedObject"]["uid"] == cr.metadata.uid
    assert on_cr["related"]["name"] == h.node("n")
    assert on_cr["reportingComponent"] == "nodewright.nvidia.com/status"
    for part in (h.node("n"), "nvidia-tuned", "apply", "ImagePullFailed: cannot pull image"):
        assert part in on_cr["message"]


async def test_by_default_only_what_a_person_acts_on_becomes_an_event(harness: Harness) -> None:
    h = harness
    await _nodes(h, "n", labels={"pool": "gpu"})
    cr = await _nodewright(h)
    await _publish(h, *_bus_events(h))
    # What the stream said happened on the node, as the executor records it: it failed.
    failed_apply = PackageRecord(
        version="0.9.0",
        stage="apply",
        state="failed",
        reason=IMAGE_PULL,
        updated=datetime.now(UTC),
    )
    await _records(
        h, "n", {nodestate.EXECUTOR: ExecutorRecord(packages={"nvidia-tuned": failed_apply})}
    )
    selector = f"nodewright.nvidia.com/nodewright={h.cr}"

    async def node_failed() -> list[JSON]:
        found = await _kube_events(h.kapi, "default", selector)
        return found if len([e for e in found if e["reason"] == "NodeFailed"]) >= 2 else []

    await eventually(node_failed, what="NodeFailed on the Node and on the NodeWright")
    await asyncio.sleep(2)
    found = await _kube_events(h.kapi, "default", selector)
    assert sorted((e["involvedObject"]["kind"], e["reason"], e["type"]) for e in found) == [
        ("Node", "NodeFailed", "Warning"),
        ("NodeWright", "NodeFailed", "Warning"),
    ], "the stream's NodeSelected and StageFailed are on the stream only"
    on_node = next(e for e in found if e["involvedObject"]["kind"] == "Node")
    assert on_node["involvedObject"]["name"] == h.node("n")
    assert on_node["related"]["uid"] == cr.metadata.uid
    assert "ImagePullFailed" in on_node["message"]


async def test_dead_letters_raise_warning_events_even_for_garbage(harness: Harness) -> None:
    h = harness
    await _nodewright(h)
    js, stream = h.bus.js, h.bus.settings.stream
    # Garbage on an event subject: the service's own consumer dead-letters it...
    subject = subjects.event(cr=h.cr, node=h.node("gone"), kind="stage.failed")
    await js.publish(subject, b"{not json", stream=stream)
    # ... and garbage straight on a dead-letter subject, naming nothing.
    await js.publish(subjects.dead_letter(f"other-{h.run}"), b"\x00\xff", stream=stream)

    async def on_nodewright() -> list[JSON]:
        found = await _kube_events(h.kapi, "default", f"nodewright.nvidia.com/nodewright={h.cr}")
        return [e for e in found if e["reason"] == "DeadLetteredEvent"]

    (event,) = await eventually(on_nodewright, what="a DeadLetteredEvent on the NodeWright")
    assert event["type"] == "Warning"
    assert event["involvedObject"]["kind"] == "NodeWright"
    for part in ("Service status", "stage.failed", h.node("gone"), "malformed event", "9 bytes"):
        assert part in event["message"]

    namespace = h.settings.namespace

    async def on_namespace() -> list[JSON]:
        found = await _kube_events(h.kapi, namespace)
        return [e for e in found if e["reason"] == "DeadLetteredEvent"]

    (event,) = await eventually(on_namespace, what="a DeadLetteredEvent in the namespace")
    assert event["type"] == "Warning"
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "name": namespace,
        "namespace": namespace,
    }
    assert f"other-{h.run}" in event["message"]


async def test_a_missing_policy_blocks_waiting_nodes_until_it_exists(harness: Harness) -> None:
    h = harness
    await _nodes(h, "p", "q", labels={"pool": "gpu"})
    policy = f"st-{h.run}"
    await _nodewright(h, deploymentPolicy=policy)

    status = await _status_when(
        h, lambda s: s.node_counts.blocked == 2, "both nodes Blocked by the missing policy"
    )
    types = {c.type: c for c in status.conditions}
    assert types["DeploymentPolicyNotFound"].status == "True"
    assert policy in types["DeploymentPolicyNotFound"].message
    assert status.state == "Blocked"
    assert {d.reason for d in status.node_details} == {"DeploymentPolicyNotFound"}

    await h.kapi.create(
        POLICIES,
        {
            "apiVersion": api.API_VERSION,
            "kind": "DeploymentPolicy",
            "metadata": {"name": policy},
            "spec": {"default": {"budget": {"count": 1}}},
        },
    )
    try:
        status = await _status_when(
            h, lambda s: s.node_counts.waiting == 2, "both nodes Waiting once the policy exists"
        )
        assert [c.type for c in status.conditions] == ["Ready"]
        # The kernel admits one now (the budget is 1; no scheduler runs here to write it),
        # the other waits for that batch.
        assert sorted(d.reason for d in status.node_details) == ["Admitting", "WaitingForBatch"]
    finally:
        await _delete(h.kapi, f"{POLICIES}/{policy}")


async def test_a_node_no_scheduler_admits_says_admitting_after_the_grace(
    harness: Harness,
) -> None:
    """No scheduler runs here: the node the kernel admits first gets no condition for
    core.ADMIT_GRACE_S (the scheduler's write would make InProgress its first one), then
    says Admitting, never stuck without a word."""
    h = harness
    await _nodes(h, "g", labels={"pool": "gpu"})
    await _nodewright(h)
    status = await _status_when(h, lambda s: len(s.node_details) == 1, "the node in the status")
    assert [d.reason for d in status.node_details] == ["Admitting"]
    seen_at = time.monotonic()
    _, cond = await _node_status(h, "g")
    assert cond is None, "no condition while the admission is due"

    async def reported() -> Mapping[str, Any] | Pending:
        _, cond = await _node_status(h, "g")
        return cond if cond is not None else Pending("no condition yet")

    cond = await eventually(reported, timeout_s=30, what="the Admitting condition")
    assert cond["message"].startswith("Admitting: ")
    assert time.monotonic() - seen_at > core.ADMIT_GRACE_S / 2


async def test_deleting_the_nodewright_removes_its_node_status(harness: Harness) -> None:
    h = harness
    await _nodes(h, "r", labels={"pool": "gpu"})
    await _nodewright(h)

    async def summarized() -> bool:
        _, cond = await _node_status(h, "r")
        return cond is not None

    await eventually(summarized, what="the node condition")
    await h.kapi.delete(f"{NODEWRIGHTS}/{h.cr}")

    async def cleaned() -> bool:
        return await _node_status(h, "r") == (None, None)

    await eventually(cleaned, what="the node condition to go")


async def test_an_earlier_versions_status_record_is_removed(harness: Harness) -> None:
    """The per-step record an earlier version wrote goes (compare-and-swap of that annotation
    alone), on a target node and on a node that is no target any more."""
    h = harness
    legacy = '{"phase":"Running","since":"2026-01-01T00:00:00Z"}'
    key = nodestate.key(nodestate.STATUS, h.cr)
    await _nodes(h, "t", labels={"pool": "gpu"})
    await _nodes(h, "o", labels={"pool": "cpu"})
    for suffix in ("t", "o"):
        await h.kapi.patch(
            path_of(plural="nodes", name=h.node(suffix)),
            {"metadata": {"annotations": {key: legacy}}},
        )
    await _nodewright(h)

    async def removed() -> bool:
        target, cond = await _node_status(h, "t")
        other = await _node_status(h, "o")
        return target is None and cond is not None and other == (None, None)

    await eventually(removed, what="both legacy records to go, the target's condition to come")


async def _scrape(h: Harness, cr: str) -> dict[str, float]:
    """The service's /metrics series of NodeWright ``cr``, as ``name{k=v,...}`` (labels
    sorted) -> value."""
    url = f"http://127.0.0.1:{h.health_port}/metrics"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        text = await response.text()
    return {
        _series(s.name, s.labels): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("nodewright") == cr
    }


def _series(name: str, labels: Mapping[str, str]) -> str:
    return name + "{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}"


async def test_metrics_show_each_nodewright_and_its_series_go_when_it_is_deleted(
    harness: Harness,
) -> None:
    h = harness
    await _nodes(h, "m1", "m2", labels={"pool": "gpu"})
    cr = await _nodewright(h, interruptionBudget={"count": 1})
    other = f"{h.cr}-other"
    await h.kapi.create(
        NODEWRIGHTS,
        {
            "apiVersion": api.API_VERSION,
            "kind": "NodeWright",
            "metadata": {"name": other},
            "spec": {
                "nodeSelectors": {"matchLabels": {RUN_LABEL: h.run, "pool": "cpu"}},
                "packages": {"nvidia-tuned": PACKAGE},
            },
        },
    )
    try:
        await _records(h, "m1", _complete(cr))
        nw = {"nodewright": h.cr}
        pkg = {**nw, "package": "nvidia-tuned", "version": "0.9.0"}
        rollout = {**nw, "policy": "none", "compartment": "__default__", "strategy": "none"}
        expected = {
            **{
                _series("nodewright_status", {**nw, "status": state}): float(state == "Waiting")
                for state in (
                    "Unknown",
                    "Waiting",
                    "InProgress",
                    "Complete",
                    "Failed",
                    "Blocked",
                    "Stopped",
                    "Paused",
                    "Disabled",
                )
            },
            **{
                _series("nodewright_nodes", {**nw, "status": state}): count
                for state, count in (
                    ("Waiting", 1.0),
                    ("InProgress", 0.0),
                    ("Complete", 1.0),
                    ("Failed", 0.0),
                    ("Blocked", 0.0),
                )
            },
            _series("nodewright_target_nodes", nw): 2.0,
            **{
                _series("nodewright_package_nodes", {**pkg, "state": state}): count
                for state, count in (
                    ("complete", 1.0),
                    ("in_progress", 0.0),
                    ("failed", 0.0),
                    ("uninstalling", 0.0),
                )
            },
            **{
                _series("nodewright_package_stage_nodes", {**pkg, "stage": stage}): float(
                    stage == "config"
                )
                for stage in (
                    "apply",
                    "upgrade",
                    "config",
                    "interrupt",
                    "post-interrupt",
                    "uninstall",
                )
            },
            _series("nodewright_package_restarts", pkg): 0.0,
            **{
                _series(f"nodewright_rollout_{name}", rollout): value
                for name, value in (
                    ("matched_nodes", 2.0),
                    ("budget_nodes", 1.0),
                    ("in_progress", 0.0),
                    ("completed", 1.0),
                    ("failed", 0.0),
                    ("progress_percent", 50.0),
                    ("current_batch", 1.0),
                    ("consecutive_failed_batches", 0.0),
                    ("stopped", 0.0),
                    ("awaiting_approval", 0.0),
                )
            },
        }
        complete = _series("nodewright_nodes", {**nw, "status": "Complete"})

        async def one_complete() -> dict[str, float] | None:
            scraped = await _scrape(h, h.cr)
            return scraped if scraped.get(complete) == 1.0 else None

        assert await eventually(one_complete, what="the metrics to count 1 complete node") == (
            expected
        )
        target = _series("nodewright_target_nodes", {"nodewright": other})
        assert (await _scrape(h, other))[target] == 0.0

        await h.kapi.delete(f"{NODEWRIGHTS}/{h.cr}")

        async def gone() -> bool:
            return await _scrape(h, h.cr) == {}

        await eventually(gone, what="the deleted NodeWright's series to go")
        # The other NodeWright's series stay.
        assert (await _scrape(h, other))[target] == 0.0
    finally:
        await _delete(h.kapi, f"{NODEWRIGHTS}/{other}")


async def _status_writes(h: Harness) -> float:
    url = f"http://127.0.0.1:{h.health_port}/metrics"
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        text = await resp.text()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "nodewright_status_writes_total"
        and sample.labels == {"object": "nodewright", "outcome": "written"}
    )


@pytest.mark.parametrize("harness", [{"NODEWRIGHT_STATUS_PASS_INTERVAL_S": "4"}], indirect=True)
async def test_changes_within_the_pass_interval_go_out_in_one_status_write(
    harness: Harness,
) -> None:
    h = harness
    suffixes = ("w1", "w2", "w3", "w4")
    await _nodes(h, *suffixes, labels={"pool": "gpu"})
    cr = await _nodewright(h, interruptionBudget={"count": 1})
    await _status_when(h, lambda s: s.complete_nodes == "0/4", "the first status")
    await asyncio.sleep(4)  # a quiet spell: the next change is written at once
    before = await _status_writes(h)
    for suffix in suffixes:
        await _records(h, suffix, _complete(cr))
        await asyncio.sleep(0.5)  # each change has a pass of its own: 4 writes without a limit
    status = await _status_when(
        h, lambda s: s.complete_nodes == "4/4", "the status to count every complete node"
    )
    ready = _ready(status)
    assert ready is not None
    assert ready.status == "True"
    await asyncio.sleep(5)  # a write still due would land within the interval
    # The first change at once, the rest together once the interval has passed.
    assert 1 <= await _status_writes(h) - before <= 2


@pytest.mark.parametrize(
    "harness",
    # A resync far away: only the pass that wrote its share can queue the rest.
    [{"NODEWRIGHT_STATUS_WAITING_WRITES_PER_PASS": "2", "NODEWRIGHT_RESYNC_INTERVAL_S": "600"}],
    indirect=True,
)
async def test_a_pass_writes_its_share_of_waiting_conditions_and_the_next_passes_the_rest(
    harness: Harness,
) -> None:
    h = harness
    suffixes = ("p1", "p2", "p3", "p4", "p5", "p6")
    await _nodes(h, *suffixes, labels={"pool": "gpu"})
    cr = await _nodewright(h, interruptionBudget={"count": 1})
    target = progress.target_digest(cr)
    # p1 failed and holds the budget's one slot: the others wait for it.
    await _records(
        h,
        "p1",
        {
            nodestate.SCHEDULER: _selection(target),
            nodestate.DRAINER: DRAINED,
            nodestate.EXECUTOR: _package(cr, "failed", stage="apply", reason=IMAGE_PULL),
        },
    )

    async def every_condition() -> dict[str, str] | Pending:
        reasons = {}
        for suffix in suffixes:
            _, cond = await _node_status(h, suffix)
            if cond is None:
                return Pending(f"{suffix} has no condition yet")
            reasons[suffix] = cond["reason"]
        return reasons

    # Three passes of two, a second apart (the pass interval).
    reasons = await eventually(every_condition, timeout_s=30, what="every node's condition")
    assert reasons == {"p1": "Failed", **{s: "Waiting" for s in suffixes[1:]}}
