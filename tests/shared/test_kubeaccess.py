"""Reaching the API server without the generated client: the kubeconfig's current context,
the pod's service account, and a session that verifies the server and sends the token
(against a loopback HTTPS server with a certificate of its own)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import ssl
import subprocess
import sys
import tracemalloc
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from aiohttp import web

from services.validator.certs import CertBundle
from services.validator.pki import issue
from shared import kubeaccess
from shared.config import KubeSettings
from shared.kube import ApiError, connect

NOW = datetime(2026, 12, 3, tzinfo=UTC)


def _bundle(*hosts: str) -> CertBundle:
    return issue(hosts, now=datetime.now(UTC), validity=timedelta(days=1))


def _kubeconfig(
    path: Path, cluster: dict[str, Any], user: dict[str, Any], *, current: str = "ctx"
) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": user}],
                "contexts": [
                    {"name": "other", "context": {"cluster": "nowhere", "user": "u"}},
                    {"name": "ctx", "context": {"cluster": "c", "user": "u"}},
                ],
                "current-context": current,
            }
        )
    )
    return path


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def _https(tmp_path: Path, bundle: CertBundle, answer: Handler) -> AsyncIterator[int]:
    """``answer`` to every GET over HTTPS on loopback with ``bundle``'s certificate; its port."""
    (tmp_path / "srv.crt").write_bytes(bundle.cert)
    (tmp_path / "srv.key").write_bytes(bundle.key)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(tmp_path / "srv.crt"), str(tmp_path / "srv.key"))
    app = web.Application()
    app.router.add_get("/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context).start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[int, CertBundle, list[str]]]:
    """An HTTPS server on loopback whose certificate names ``apiserver.test`` only; it
    answers every GET with a NodeList and records the Authorization header it got."""
    bundle = _bundle("apiserver.test")
    seen: list[str] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response({"kind": "NodeList", "items": [], "q": dict(request.query)})

    async with _https(tmp_path, bundle, answer) as port:
        yield port, bundle, seen


async def test_a_kubeconfig_with_a_ca_file_and_a_token_reaches_the_server(
    tmp_path: Path, server: tuple[int, CertBundle, list[str]]
) -> None:
    port, bundle, seen = server
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "ca.crt").write_bytes(bundle.ca_cert)
    path = _kubeconfig(
        tmp_path / "kubeconfig",
        # Relative to the kubeconfig's directory, as kubectl reads it.
        {
            "server": f"https://127.0.0.1:{port}",
            "certificate-authority": "certs/ca.crt",
            "tls-server-name": "apiserver.test",
        },
        {"token": "s3cret"},
    )
    async with connect(KubeSettings(kubeconfig=str(path))) as kube:
        got = await kube.get("/api/v1/nodes", limit=5, watch=False)
    assert got["kind"] == "NodeList"
    assert got["q"] == {"limit": "5", "watch": "false"}
    assert seen == ["Bearer s3cret"]


async def test_the_server_is_verified_against_the_kubeconfig_ca(
    tmp_path: Path, server: tuple[int, CertBundle, list[str]]
) -> None:
    port, _, seen = server
    other_ca = _bundle("elsewhere.test").ca_cert
    path = _kubeconfig(
        tmp_path / "kubeconfig",
        {
            "server": f"https://127.0.0.1:{port}",
            "certificate-authority-data": base64.b64encode(other_ca).decode(),
            "tls-server-name": "apiserver.test",
        },
        {"token": "s3cret"},
    )
    async with connect(KubeSettings(kubeconfig=str(path))) as kube:
        with pytest.raises(ApiError) as failed:
            await kube.get("/api/v1/nodes")
    assert failed.value.status == 0  # no answer: the handshake failed
    assert seen == []


async def test_without_the_server_name_the_certificate_does_not_match(
    tmp_path: Path, server: tuple[int, CertBundle, list[str]]
) -> None:
    port, bundle, seen = server
    path = _kubeconfig(
        tmp_path / "kubeconfig",
        {
            "server": f"https://127.0.0.1:{port}",
            "certificate-authority-data": base64.b64encode(bundle.ca_cert).decode(),
        },
        {},
    )
    async with connect(KubeSettings(kubeconfig=str(path))) as kube:
        with pytest.raises(ApiError):
            await kube.get("/api/v1/nodes")
    assert seen == []


async def test_insecure_skip_tls_verify_skips_the_check_and_no_user_sends_no_token(
    tmp_path: Path, server: tuple[int, CertBundle, list[str]]
) -> None:
    port, _, seen = server
    path = _kubeconfig(
        tmp_path / "kubeconfig",
        {"server": f"https://127.0.0.1:{port}", "insecure-skip-tls-verify": True},
        {},
    )
    async with connect(KubeSettings(kubeconfig=str(path))) as kube:
        await kube.get("/api/v1/nodes")
    assert seen == [""]


def test_a_token_file_is_read_again_once_it_may_have_rotated(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("one\n")
    path = _kubeconfig(
        tmp_path / "kubeconfig", {"server": "https://127.0.0.1:1"}, {"tokenFile": "token"}
    )
    token = kubeaccess.from_kubeconfig(path).token
    assert token is not None
    assert token.current(100.0) == "one"
    (tmp_path / "token").write_text("two\n")
    assert token.current(100.0 + kubeaccess.TOKEN_REREAD_S - 1) == "one"
    assert token.current(100.0 + kubeaccess.TOKEN_REREAD_S) == "two"


def test_a_client_certificate_is_loaded_and_half_a_pair_is_refused(tmp_path: Path) -> None:
    client = _bundle("nodewright-admin")
    pair = {
        "client-certificate-data": base64.b64encode(client.cert).decode(),
        "client-key-data": base64.b64encode(client.key).decode(),
    }
    path = _kubeconfig(tmp_path / "kubeconfig", {"server": "https://127.0.0.1:1"}, pair)
    assert kubeaccess.from_kubeconfig(path).token is None
    mismatched = {**pair, "client-key-data": base64.b64encode(_bundle("x").key).decode()}
    _kubeconfig(path, {"server": "https://127.0.0.1:1"}, mismatched)
    with pytest.raises(kubeaccess.ConfigError, match="client key does not match"):
        kubeaccess.from_kubeconfig(path)
    half = {"client-certificate-data": pair["client-certificate-data"]}
    _kubeconfig(path, {"server": "https://127.0.0.1:1"}, half)
    with pytest.raises(kubeaccess.ConfigError, match="not both"):
        kubeaccess.from_kubeconfig(path)


@pytest.mark.parametrize(
    ("cluster", "current", "message"),
    [
        ({"server": "https://127.0.0.1:1"}, "missing", "current-context 'missing'"),
        ({"server": "https://127.0.0.1:1"}, "other", "names cluster 'nowhere'"),
        ({}, "ctx", "has no server"),
        (
            {"server": "https://x", "certificate-authority": "absent.crt"},
            "ctx",
            "cannot read certificate-authority",
        ),
    ],
)
def test_a_kubeconfig_that_cannot_work_says_what_is_missing(
    tmp_path: Path, cluster: dict[str, Any], current: str, message: str
) -> None:
    path = _kubeconfig(tmp_path / "kubeconfig", cluster, {"token": "t"}, current=current)
    with pytest.raises(kubeaccess.ConfigError, match=message):
        kubeaccess.from_kubeconfig(path)


async def test_a_credential_plugin_goes_to_kubernetes_asyncio(tmp_path: Path) -> None:
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"token": "from-plugin"},
    }
    plugin = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": "sh",
            "args": ["-c", f"echo '{json.dumps(credential)}'"],
            "interactiveMode": "Never",
        }
    }
    path = _kubeconfig(tmp_path / "kubeconfig", {"server": "https://127.0.0.1:1"}, plugin)
    assert kubeaccess.needs_plugin(path)
    async with connect(KubeSettings(kubeconfig=str(path))) as kube:
        assert isinstance(kube.api, kubeaccess.ApiClientTransport)


def test_in_cluster_reads_the_service_account_and_the_environment(tmp_path: Path) -> None:
    with pytest.raises(kubeaccess.ConfigError, match="KUBERNETES_SERVICE_HOST"):
        kubeaccess.in_cluster(tmp_path, env={})
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(kubeaccess.ConfigError, match="token is missing"):
        kubeaccess.in_cluster(tmp_path, env=env)
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_bytes(_bundle("kubernetes.default").ca_cert)
    access = kubeaccess.in_cluster(tmp_path, env=env)
    assert access.server == "https://[fd00::1]:443"
    assert access.token is not None
    assert access.token.current(0.0) == "sa-token"


@pytest.mark.parametrize(
    "module",
    [
        "services.scheduler.service",
        "services.drainer.service",
        "services.executor.service",
        "services.validator.service",
        "services.status.service",
    ],
)
def test_a_service_does_not_load_the_generated_client_nor_yaml(module: str) -> None:
    """Issue 15: importing kubernetes_asyncio's client cost each service ~34 MB; YAML (about
    1 MB) is loaded only to read a kubeconfig file, never in a pod."""
    probe = (
        f"import sys, {module}; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'kubernetes_asyncio', 'yaml'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("module", ["services.__main__", "services.drainer.__main__"])
def test_a_service_process_does_not_load_libstdcxx(module: str) -> None:
    """Issue 15: frozenlist's C++ extension (aiohttp's signal lists) loaded libstdc++, 0.6 to
    1 MB of each process; the services package asks for its pure-Python lists."""
    env = {k: v for k, v in os.environ.items() if k != "FROZENLIST_NO_EXTENSIONS"}
    probe = (
        f"import importlib; importlib.import_module({module!r}.rsplit('.', 1)[0]); "
        "import aiohttp, frozenlist; "
        "print(frozenlist.NO_EXTENSIONS, 'stdc++' in open('/proc/self/maps').read())"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env
    ).stdout
    assert out.split() == ["True", "False"]


@pytest.mark.parametrize("module", ["services.__main__", "services.executor.__main__"])
def test_a_service_process_holds_no_system_ca_bundle_it_never_uses(
    module: str, tmp_path: Path
) -> None:
    """Issue 15: aiohttp's import-time default contexts loaded the system's CA bundle, 2 MiB
    of every process, for requests the services never make without a context of their own.
    The operator's settings still hold for every context built after the import."""
    bundle = tmp_path / "cas.pem"
    bundle.write_bytes(_bundle("127.0.0.1").ca_cert)
    env = {**os.environ, "SSL_CERT_FILE": str(bundle)}
    env.pop("SSL_CERT_DIR", None)
    probe = (
        f"import importlib; importlib.import_module({module!r}.rsplit('.', 1)[0]); "
        "import os, ssl, aiohttp.connector as c; "
        "print(c._SSL_CONTEXT_VERIFIED.cert_store_stats()['x509_ca'], "
        "c._SSL_CONTEXT_UNVERIFIED.cert_store_stats()['x509_ca'], "
        "ssl.create_default_context().cert_store_stats()['x509_ca'], "
        "os.environ['SSL_CERT_FILE'] == " + repr(str(bundle)) + ", 'SSL_CERT_DIR' in os.environ)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env
    ).stdout
    assert out.split() == ["0", "0", "1", "True", "False"]


async def test_a_watch_does_not_take_one_of_the_requests_slots(tmp_path: Path) -> None:
    """Issue 15: a watch holds its connection for minutes. In the requests' pool, a
    process's watches held that many of its slots for good; with one slot, a watch left
    none. Streams have connections of their own."""
    bundle = _bundle("127.0.0.1")
    (tmp_path / "ca.crt").write_bytes(bundle.ca_cert)
    stop = asyncio.Event()

    async def answer(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            return web.json_response({"kind": "NodeList", "items": []})
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b'{"type":"BOOKMARK","object":{}}\n')
        await stop.wait()  # the stream stays open, as a watch's does
        return response

    async with _https(tmp_path, bundle, answer) as port:
        path = _kubeconfig(
            tmp_path / "kubeconfig",
            {"server": f"https://127.0.0.1:{port}", "certificate-authority": "ca.crt"},
            {"token": "t"},
        )
        try:
            async with connect(KubeSettings(kubeconfig=str(path), qps_burst=1)) as kube:
                watching = cast(
                    AsyncGenerator[dict[str, Any], None],
                    kube.watch("/api/v1/nodes", resource_version="1"),
                )
                first = await anext(watching)
                assert first["type"] == "BOOKMARK", "the watch is open and holds its connection"
                # Before: the one slot was the watch's, and this waited until the watch ended.
                got = await asyncio.wait_for(kube.get("/api/v1/nodes"), timeout=10)
                assert got["kind"] == "NodeList"
                stop.set()
                await watching.aclose()
        finally:
            stop.set()


async def test_a_tls_connection_holds_a_small_read_buffer(tmp_path: Path) -> None:
    """Issue 15: asyncio gives every TLS connection a 256 KiB read buffer for its life, and
    one process keeps over a hundred connections to the API server in a large rollout.
    Measured on Python's own allocations while 20 requests are held open at once; both ends
    of each connection are in this process (the server's too, as both are asyncio's)."""
    bundle = _bundle("127.0.0.1")
    (tmp_path / "ca.crt").write_bytes(bundle.ca_cert)
    n = 20
    arrived = 0
    all_arrived, release = asyncio.Event(), asyncio.Event()

    async def answer(request: web.Request) -> web.StreamResponse:
        nonlocal arrived
        if request.query.get("hold") == "true":
            arrived += 1
            if arrived == n:
                all_arrived.set()
            await release.wait()
        return web.json_response({"kind": "NodeList", "items": []})

    async with _https(tmp_path, bundle, answer) as port:
        path = _kubeconfig(
            tmp_path / "kubeconfig",
            {"server": f"https://127.0.0.1:{port}", "certificate-authority": "ca.crt"},
            {"token": "t"},
        )
        async with connect(KubeSettings(kubeconfig=str(path), qps_burst=n)) as kube:
            await kube.get("/api/v1/nodes")  # the first connection, imports and caches
            tracemalloc.start()
            try:
                before = tracemalloc.get_traced_memory()[0]
                held = [
                    asyncio.create_task(kube.get("/api/v1/nodes", hold="true")) for _ in range(n)
                ]
                await asyncio.wait_for(all_arrived.wait(), 30)
                per_connection = (tracemalloc.get_traced_memory()[0] - before) / n
            finally:
                release.set()
                tracemalloc.stop()
            await asyncio.gather(*held)
    # Both ends at 16 KiB each and what aiohttp keeps per request: 62 KiB here; at 64 KiB
    # each it was 154 KiB, at asyncio's 256 KiB 518.
    assert per_connection < 100 * 1024, f"{per_connection / 1024:.0f} KiB per connection"
