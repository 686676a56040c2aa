"""End-to-end fixtures: a clean cluster, the five services as real processes, samplers.

Every test here starts from a cluster with no NodeWright, no DeploymentPolicy, no node and
no event stream (whatever earlier tests left is removed), runs the services as processes
(``nodewright.rig.fleet``) in a namespace of its own, and tears all of it down afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import nats
import pytest

from nodewright import manifests
from nodewright.rig import Rig
from nodewright.rig.fleet import Fleet
from nodewright.rig.realnode import LABEL_REAL
from shared import api, pods
from shared.informer import Informer
from shared.kube import ApiError, Kube, path_of
from tests.helpers.waiting import Pending

NODES = path_of(plural="nodes")


async def delete_all(kapi: Kube) -> None:
    """Remove every NodeWright, DeploymentPolicy and simulated node."""
    for path in (manifests.NODEWRIGHTS, manifests.POLICIES):
        try:
            listed = await kapi.get(path)
        except ApiError as exc:
            if exc.not_found:
                continue
            raise
        for obj in listed["items"]:
            name = obj["metadata"]["name"]
            with contextlib.suppress(ApiError):
                await kapi.patch(f"{path}/{name}", {"metadata": {"finalizers": None}})
            await kapi.delete_if_present(f"{path}/{name}")
    # A webhook registered by an earlier fleet points at a replica that is gone now.
    await kapi.delete_if_present(
        path_of(
            group="admissionregistration.k8s.io",
            plural="validatingwebhookconfigurations",
            name="nodewright-validator",
        )
    )
    await _force_delete_bound_pods(kapi)
    # The rig's real nodes stay (their kubelets registered them once); kwok's go.
    listed = await kapi.get(NODES, labelSelector=f"!{LABEL_REAL}")
    await asyncio.gather(
        *(kapi.delete_if_present(f"{NODES}/{n['metadata']['name']}") for n in listed["items"])
    )


async def _force_delete_bound_pods(kapi: Kube, timeout_s: float = 30.0) -> None:
    """Remove every pod bound to a node, at once (grace period 0), and wait until they are gone.

    A pod of an earlier test (its namespace being deleted) that is bound to a node outlives the
    node until the pod garbage collector's quarantine ends: nothing confirms its termination
    once kwok no longer serves the node. A later test that creates a node of the same name
    sooner inherits it, and its drain rightly waits for the "evicted" pod to be gone, for
    ever: the chaos test in test_rollout.py was stuck on ``waiting for 1 evicted pod(s) to be
    gone: nw-.../workload``, the readiness test's pod pinned to ``gpu-10`` (CI, and a full run
    here with the rig kept).
    """
    all_pods = path_of(plural="pods")
    real = {
        n["metadata"]["name"] for n in (await kapi.get(NODES, labelSelector=LABEL_REAL))["items"]
    }
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        # Only pods on simulated nodes: a real node's kubelet confirms its pods' end itself,
        # and its cluster pods (DNS, a NATS cluster) are not a test's leftovers.
        bound = [
            p["metadata"]
            for p in (await kapi.get(all_pods))["items"]
            if (p.get("spec") or {}).get("nodeName") not in (None, "", *real)
        ]
        if not bound:
            return
        if asyncio.get_running_loop().time() > deadline:
            names = [f"{m['namespace']}/{m['name']}" for m in bound]
            raise AssertionError(f"pods still bound to nodes after {timeout_s:.0f}s: {names}")
        await asyncio.gather(*(_force_delete(kapi, m) for m in bound))
        await asyncio.sleep(0.2)


async def _force_delete(kapi: Kube, meta: dict[str, Any]) -> None:
    path = path_of(plural="pods", namespace=meta["namespace"], name=meta["name"])
    with contextlib.suppress(ApiError):  # gone meanwhile
        await kapi.delete(path, {"gracePeriodSeconds": 0})


async def delete_stream(rig: Rig) -> None:
    nc = await nats.connect(rig.endpoints.nats_url)
    try:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await nc.jetstream().delete_stream("NODEWRIGHT")
    finally:
        await nc.close()


@pytest.fixture
async def cluster(rig: Rig, kapi: Kube) -> AsyncIterator[Kube]:
    """A cluster with the CRDs installed and nothing else NodeWright cares about."""
    await manifests.install_crds(kapi)
    await delete_all(kapi)
    await delete_stream(rig)
    yield kapi
    await delete_all(kapi)
    await delete_stream(rig)


async def wait_for_default_service_account(kapi: Kube, namespace: str) -> None:
    """With real nodes the ServiceAccount admission plugin is on: a pod created before the
    serviceaccount controller made the namespace's ``default`` account is refused."""
    path = path_of(plural="serviceaccounts", namespace=namespace, name="default")
    for _ in range(300):
        try:
            await kapi.get(path)
            return
        except ApiError as exc:
            if not exc.not_found:
                raise
        await asyncio.sleep(0.1)
    raise AssertionError(f"no default ServiceAccount in {namespace} after 30s")


@dataclass
class Services:
    fleet: Fleet
    namespace: str


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the item, so fixtures can tell a failed test."""
    report = yield
    item.stash.setdefault(_REPORTS, {})[report.when] = report
    return report


_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.fixture
async def services(
    rig: Rig, cluster: Kube, request: pytest.FixtureRequest
) -> AsyncIterator[Services]:
    """The five services as processes in a fresh namespace; the test starts them. When the
    test failed, what the services logged above info level is printed with its report."""
    ns = f"nw-{uuid.uuid4().hex[:8]}"
    await manifests.ensure_namespace(cluster, ns)
    if rig.real is not None:
        await wait_for_default_service_account(cluster, ns)
    fleet = Fleet(
        rig,
        namespace=ns,
        extra_env={
            "NODEWRIGHT_PODS_SIM_STAGE_DURATION": "1s",
            "NODEWRIGHT_RESYNC_INTERVAL_S": "10",
        },
    )
    try:
        yield Services(fleet=fleet, namespace=ns)
    finally:
        call = request.node.stash.get(_REPORTS, {}).get("call")
        if call is not None and call.failed:
            print(f"services of the failed test:\n{fleet.digest()}")
        codes = await asyncio.to_thread(fleet.stop)
        await cluster.delete_if_present(path_of(plural="namespaces", name=ns))
        bad = {name: code for name, code in codes.items() if code not in (0, -9)}
        assert not bad, f"services exited uncleanly on SIGTERM: {bad}"


@dataclass
class Sampler:
    """Calls ``probe`` every ``interval_s`` in the background and keeps the results."""

    probe: Callable[[], Awaitable[Any]]
    interval_s: float = 0.2
    samples: list[Any] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            # A transient API error skips one sample; any other error ends the sampling and
            # is raised by stop(): a sampler that died quietly would leave a test judging a
            # truncated history.
            with contextlib.suppress(ApiError, OSError):
                self.samples.append(await self.probe())
            await asyncio.sleep(self.interval_s)

    async def __aenter__(self) -> Sampler:
        self._task = asyncio.create_task(self._run(), name="sampler")
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            (outcome,) = await asyncio.gather(task, return_exceptions=True)
            if isinstance(outcome, Exception):
                raise AssertionError(f"the sampler's probe failed: {outcome!r}") from outcome


@dataclass(frozen=True)
class LedgerPod:
    """What a NodeWright pod was for: its node, role, package, stage, attempt and cycle."""

    name: str
    node: str
    role: str
    package: str
    stage: str
    attempt: str
    cycle: str

    @classmethod
    def of(cls, pod: dict[str, Any]) -> LedgerPod:
        meta = pod["metadata"]
        labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
        return cls(
            name=meta["name"],
            node=notes.get(pods.ANN_NODE, ""),
            role=labels.get(pods.LABEL_ROLE, ""),
            package=labels.get(pods.LABEL_PACKAGE, ""),
            stage=labels.get(pods.LABEL_STAGE, ""),
            attempt=notes.get(pods.ANN_ATTEMPT, ""),
            cycle=notes.get(pods.ANN_CYCLE, ""),
        )


@dataclass
class PodLedger:
    """Every NodeWright pod ever created in a namespace: name -> set of UIDs, and what
    each name was for."""

    uids: dict[str, set[str]] = field(default_factory=dict)
    pods: dict[str, LedgerPod] = field(default_factory=dict)

    def on_change(self, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is not None:
            self.uids.setdefault(new["metadata"]["name"], set()).add(new["metadata"]["uid"])
            self.pods.setdefault(new["metadata"]["name"], LedgerPod.of(new))

    def duplicates(self) -> dict[str, set[str]]:
        return {name: uids for name, uids in self.uids.items() if len(uids) > 1}

    def of_role(self, role: str, stage: str = "") -> list[LedgerPod]:
        return [p for p in self.pods.values() if p.role == role and (not stage or p.stage == stage)]

    def repeated(self) -> dict[str, list[str]]:
        """ "node role package/stage" that got more than one pod name (a step run again: a
        new attempt or cycle) -> "attempt N, cycle C" of each, to say which in a failure."""
        groups: dict[str, list[str]] = {}
        for p in self.pods.values():
            groups.setdefault(f"{p.node} {p.role} {p.package}/{p.stage}", []).append(
                f"attempt {p.attempt}, cycle {p.cycle}"
            )
        return {k: sorted(v) for k, v in sorted(groups.items()) if len(v) > 1}


@contextlib.asynccontextmanager
async def pod_ledger(kapi: Kube, namespace: str) -> AsyncIterator[PodLedger]:
    ledger = PodLedger()
    informer = Informer(
        kube=kapi,
        path=path_of(plural="pods", namespace=namespace),
        on_change=ledger.on_change,
        label_selector="app.kubernetes.io/managed-by=nodewright",
        name="ledger",
    )
    task = asyncio.create_task(informer.run(), name="pod-ledger")
    try:
        await asyncio.wait_for(informer.synced.wait(), 30)
        yield ledger
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def read_cr(kapi: Kube, name: str) -> api.NodeWright:
    return api.from_dict(await kapi.get(f"{manifests.NODEWRIGHTS}/{name}"), api.NodeWright)


async def cr_ready(kapi: Kube, name: str) -> bool | Pending:
    """NodeWright ``name`` is Ready; else how many nodes are complete (for ``eventually``)."""
    obj = await read_cr(kapi, name)
    ready = any(c.type == "Ready" and c.status == "True" for c in obj.status.conditions)
    return ready or Pending(obj.status.complete_nodes)
