"""The API client's request accounting: the resource a path names, and the counter every
service exposes on /metrics (checked against the real API server)."""

from __future__ import annotations

import asyncio
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
