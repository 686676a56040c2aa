"""The API client's request accounting: the resource a path names, and the counter every
service exposes on /metrics (checked against the real API server)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from shared.config import KubeSettings
from shared.kube import (
    ApiError,
    Kube,
    connect,
    path_of,
    request_counter,
    resource_of,
    verb_of,
)


@pytest.mark.parametrize(
    ("path", "resource"),
    [
        ("/api/v1/nodes", "nodes"),
        ("/api/v1/nodes/gpu-node.001", "nodes"),
        ("/api/v1/nodes/gpu-node.001/status", "nodes/status"),
        ("/api/v1/namespaces", "namespaces"),
        ("/api/v1/namespaces/nodewright-system", "namespaces"),
        ("/api/v1/namespaces/nodewright-system/pods", "pods"),
        ("/api/v1/namespaces/ns/pods/p-1/eviction", "pods/eviction"),
        ("/apis/nodewright.nvidia.com/v1alpha1/nodewrights/a.b/status", "nodewrights/status"),
        ("/apis/coordination.k8s.io/v1/namespaces/ns/leases/nodewright-scheduler", "leases"),
        ("/apis/events.k8s.io/v1/namespaces/default/events?limit=5", "events"),
        ("/readyz", "/readyz"),
    ],
)
def test_the_resource_of_a_path(path: str, resource: str) -> None:
    assert resource_of(path) == resource


@pytest.mark.parametrize(
    ("method", "path", "verb"),
    [
        ("GET", "/api/v1/nodes", "LIST"),
        ("GET", "/api/v1/nodes?labelSelector=a%3Db", "LIST"),
        ("GET", "/api/v1/nodes/gpu-node.001", "GET"),
        ("GET", "/api/v1/namespaces/ns/pods", "LIST"),
        ("GET", "/api/v1/namespaces/ns/pods/p-1/log", "GET"),
        ("GET", "/api/v1/namespaces", "LIST"),
        ("GET", "/api/v1/namespaces/ns", "GET"),
        ("GET", "/apis/nodewright.nvidia.com/v1alpha1/nodewrights", "LIST"),
        ("PATCH", "/api/v1/nodes/gpu-node.001", "PATCH"),
        ("DELETE", "/api/v1/namespaces/ns/pods", "DELETE"),
        ("GET", "/readyz", "GET"),
    ],
)
def test_the_verb_of_a_request_is_the_api_servers(method: str, path: str, verb: str) -> None:
    assert verb_of(method, path) == verb
    assert verb_of(method, path, watch=True) == "WATCH"


def _counts(registry: CollectorRegistry) -> dict[tuple[str, str, str], float]:
    return {
        (s.labels["verb"], s.labels["resource"], s.labels["code"]): s.value
        for m in registry.collect()
        if m.name == "nodewright_kube_requests"
        for s in m.samples
        if s.name == "nodewright_kube_requests_total"
    }


@pytest.mark.rig
async def test_every_request_is_counted_by_verb_resource_and_code(kapi: Kube) -> None:
    registry = CollectorRegistry()
    kube = Kube(kapi.api, observe=request_counter(registry))
    await kube.get(path_of(plural="nodes"))
    with pytest.raises(ApiError):
        await kube.get(path_of(plural="nodes", name="no-such-node.example"))
    async for _ in kube.watch(path_of(plural="namespaces"), resource_version="0", timeout_s=1):
        pass
    assert _counts(registry) == {
        ("LIST", "nodes", "200"): 1.0,
        ("GET", "nodes", "404"): 1.0,
        ("WATCH", "namespaces", "200"): 1.0,
    }


async def test_the_client_reads_no_proxy_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 15: every request looked up netrc and proxy settings in a thread. The
    process's client must not: a proxy in the environment gets no connection (and the
    request fails as the unreachable server's, a NoAnswer)."""
    reached: list[bytes] = []

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        reached.append(await reader.readline())
        writer.close()

    server = await asyncio.start_server(proxy, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    for variable in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(variable, f"http://127.0.0.1:{port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    async with server, connect(KubeSettings(kubeconfig=str(kubeconfig))) as kube:
        with pytest.raises(ApiError) as failed:
            await kube.get(path_of(plural="nodes"))
    assert failed.value.status == 0
    assert reached == []


async def test_readiness_follows_the_outage_without_a_request_of_its_own() -> None:
    sent: list[str] = []

    class Recording(Kube):
        async def request(self, method: str, path: str, **_: object) -> dict[str, object]:
            sent.append(f"{method} {path}")
            return {}

    kube = Recording(api=None)  # type: ignore[arg-type]
    assert await kube.ready()
    kube.outage.failed("connection refused")
    assert not await kube.ready(), "an outage under way: not ready"
    kube.outage.answered()
    assert await kube.ready()
    assert sent == [], "the probe costs the API server nothing"


class _Held:
    """A response the fake transport hands out: reading it waits for the test's word, and
    releasing it gives its slot back (as releasing aiohttp's gives its connection back)."""

    status = 200
    reason = "OK"

    def __init__(self, answer: asyncio.Event, released: Callable[[], None]) -> None:
        self._answer = answer
        self.release = released

    async def read(self) -> bytes:
        await self._answer.wait()
        return b"{}"


class _Counting:
    """A :class:`shared.kubeaccess.Transport` that counts the requests it has in flight by
    path, holding every answer until ``answer`` is set."""

    def __init__(self) -> None:
        self.answer = asyncio.Event()
        self.in_flight: dict[str, int] = {}
        self.most: dict[str, int] = {}

    async def send(self, method: str, path: str, **_: object) -> _Held:
        self.in_flight[path] = self.in_flight.get(path, 0) + 1
        self.most[path] = max(self.most.get(path, 0), self.in_flight[path])

        def released() -> None:
            self.in_flight[path] -= 1

        return _Held(self.answer, released)

    async def close(self) -> None:
        pass


async def test_each_capped_view_has_its_own_requests_in_flight() -> None:
    """Issue 15: in one process the five services shared one pool, and the scheduler's
    admissions in flight held the drainer's cordons back. Each view has its own cap: one
    view at its cap does not hold another's request, and its own wait their turn."""
    transport = _Counting()
    base = Kube(transport)  # type: ignore[arg-type]
    scheduler, drainer = base.capped(2), base.capped(1)
    admissions = [asyncio.create_task(scheduler.get("/admit")) for _ in range(5)]
    cordons = [asyncio.create_task(drainer.get("/cordon")) for _ in range(3)]
    for _ in range(20):
        await asyncio.sleep(0)
    assert transport.in_flight == {"/admit": 2, "/cordon": 1}, "each at its own cap, at once"
    transport.answer.set()
    await asyncio.gather(*admissions, *cordons)
    assert transport.most == {"/admit": 2, "/cordon": 1}
    assert transport.in_flight == {"/admit": 0, "/cordon": 0}
    assert scheduler.outage is base.outage, "one API server: the views share its outage"


async def test_an_uncapped_client_sends_every_request_at_once() -> None:
    transport = _Counting()
    kube = Kube(transport)  # type: ignore[arg-type]
    sent = [asyncio.create_task(kube.get("/x")) for _ in range(4)]
    for _ in range(20):
        await asyncio.sleep(0)
    assert transport.in_flight == {"/x": 4}, "the transport's own pool is the only cap"
    transport.answer.set()
    await asyncio.gather(*sent)


async def test_a_named_view_says_whose_requests_they_are() -> None:
    """The API server names a write's field manager after the User-Agent: it said "Python"
    for all five services."""
    sent: list[dict[str, str]] = []

    class Recording(_Counting):
        async def send(self, method: str, path: str, **kwargs: object) -> _Held:
            sent.append(dict(kwargs["headers"]))  # type: ignore[call-overload]
            return await super().send(method, path)

    transport = Recording()
    transport.answer.set()
    base = Kube(transport)  # type: ignore[arg-type]
    await base.named("drainer").capped(3).get("/x")
    await base.get("/x")
    agent = sent[0]["User-Agent"]
    assert agent.startswith("nodewright-drainer/"), agent
    assert agent.split("/", 1)[1], "with the version"
    assert "User-Agent" not in sent[1], "the base client sends the transport's own"
