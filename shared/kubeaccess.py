"""How a service reaches the Kubernetes API server: the server's address, the TLS trust, the
credentials, and one aiohttp session that sends requests with them.

Built from a kubeconfig file (its current context) or from the pod's service account. The
generated ``kubernetes_asyncio`` client would do it too, but importing it loads every model
and API class of Kubernetes, ~34 MB of each service's memory (issue 15), for what the
services never use: they speak JSON to REST paths (:mod:`shared.kube`). So this module reads
the kubeconfig fields of static credentials itself (a CA, a client certificate, a bearer
token or token file, ``insecure-skip-tls-verify``, ``tls-server-name``, ``proxy-url``), and
hands a kubeconfig whose user runs a credential plugin (``exec``, ``auth-provider``) or
uses a password to ``kubernetes_asyncio``, imported only then.

Not this module's job: what a request means or how its answer is decoded (:mod:`shared.kube`).
"""

from __future__ import annotations

import asyncio.sslproto
import base64
import os
import ssl
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlencode

import aiohttp
import msgspec

if TYPE_CHECKING:
    from kubernetes_asyncio import client

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_S = 60.0
"""How long a token read from a file is used before the file is read again: the kubelet
rotates a projected service-account token well before it expires (as client-go does)."""
READ_BUFFER = 2**21
"""A watch event can carry a large object (etcd takes requests up to 1.5 MiB)."""
TLS_READ_BUFFER = 16 * 1024
"""Bytes asyncio reads from a TLS connection at once: a buffer each connection holds for
its life (see :func:`lean_tls_reads`)."""


def lean_tls_reads() -> None:
    """Give every TLS connection of the process a read buffer of :data:`TLS_READ_BUFFER`
    instead of asyncio's 256 KiB (``asyncio.sslproto.SSLProtocol.max_size``, Python 3.11+).

    Each connection allocates and zero-fills that buffer when it opens. Measured here with
    aiohttp over TLS on loopback (both ends in one process): 518 KiB a connection at 256 KiB,
    154 at 64, 62 at 16. One process running the five services keeps 30 connections to the
    API server in a rollout of 100 nodes and 100 to 170 at 1,000 to 10,000 nodes: at 64 KiB
    the buffers alone were 2 to 11 MB of it (issue 15). 16 KiB is one TLS record's payload,
    the most OpenSSL hands over at once. The cost is more reads for large answers: a 28 MB
    answer (a LIST of 10,000 nodes) took 140 ms of CPU at 16 KiB against 116 at 64 (the
    services make a few such LISTs per start; watch events are a few KiB each).
    Process-wide and idempotent; a Python without the attribute is left as it is."""
    protocol = asyncio.sslproto.SSLProtocol
    if getattr(protocol, "max_size", 0) > TLS_READ_BUFFER:
        protocol.max_size = TLS_READ_BUFFER


class ConfigError(Exception):
    """The kubeconfig or the service account does not say how to reach the API server; the
    message says what is missing and where."""


class Transport(Protocol):
    """Sends one request to the API server; the caller reads and releases the answer."""

    async def send(
        self,
        method: str,
        path: str,
        *,
        params: Sequence[tuple[str, str | int]],
        headers: Mapping[str, str],
        body: Any,
        timeout_s: float | None,
        stream: bool = False,
    ) -> aiohttp.ClientResponse: ...

    async def close(self) -> None: ...


@dataclass
class Token:
    """A bearer token, given or read from a file (re-read every :data:`TOKEN_REREAD_S`)."""

    value: str = ""
    path: Path | None = None
    _read_at: float = field(default=float("-inf"), repr=False)

    def current(self, now: float) -> str:
        if self.path is not None and now - self._read_at >= TOKEN_REREAD_S:
            self.value = self.path.read_text().strip()
            self._read_at = now
        return self.value


@dataclass(frozen=True)
class Access:
    """Where the API server is and how to authenticate to it."""

    server: str
    ssl: ssl.SSLContext
    token: Token | None = None
    proxy: str | None = None
    server_hostname: str | None = None


class Session:
    """The process's connections to the API server (:class:`Transport`): a pool of at most
    ``max_in_flight`` for requests, and one apart for streams (watches, followed logs).

    A stream holds its connection for minutes. In the requests' pool, the process's eight
    watches held eight of its 50 slots for good, and one process running the five services
    was left two for everything but the scheduler's 40 admissions in flight (issue 15).
    How many streams a process opens is fixed by its code, so their pool has no limit."""

    def __init__(self, access: Access, *, max_in_flight: int) -> None:
        lean_tls_reads()
        self.access = access
        self._session = self._open(access, limit=max_in_flight)
        self._streams = self._open(access, limit=0)  # aiohttp: 0 is no limit

    @staticmethod
    def _open(access: Access, *, limit: int) -> aiohttp.ClientSession:
        # trust_env=False: no ~/.netrc or proxy variables read per request (5 to 25 % of a
        # service's CPU, issue 15); the kubeconfig's own proxy-url is passed per request.
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limit, ssl=access.ssl),
            trust_env=False,
            read_bufsize=READ_BUFFER,
        )

    async def send(
        self,
        method: str,
        path: str,
        *,
        params: Sequence[tuple[str, str | int]],
        headers: Mapping[str, str],
        body: Any,
        timeout_s: float | None,
        stream: bool = False,
    ) -> aiohttp.ClientResponse:
        url = self.access.server.rstrip("/") + path
        if params:
            url += "?" + urlencode(params)
        sent = dict(headers)
        if self.access.token is not None:
            sent["Authorization"] = f"Bearer {self.access.token.current(time.monotonic())}"
        data = body if body is None or isinstance(body, bytes) else msgspec.json.encode(body)
        session = self._streams if stream else self._session
        return await session.request(
            method,
            url,
            headers=sent,
            data=data,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            proxy=self.access.proxy,
            server_hostname=self.access.server_hostname,
        )

    async def close(self) -> None:
        try:
            await self._session.close()
        finally:
            await self._streams.close()


class ApiClientTransport:
    """A :class:`Transport` over a ``kubernetes_asyncio`` ``ApiClient``: for credential
    plugins, and for callers that hold such a client already (the CLI, tests)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    async def send(
        self,
        method: str,
        path: str,
        *,
        params: Sequence[tuple[str, str | int]],
        headers: Mapping[str, str],
        body: Any,
        timeout_s: float | None,
        stream: bool = False,
    ) -> aiohttp.ClientResponse:
        # kubernetes_asyncio has one pool: a stream takes one of its connections (raise
        # NODEWRIGHT_KUBE_QPS_BURST by the number of watches where that matters). Its
        # default headers override the request's: its User-Agent is sent, not the service's.
        del stream
        resp: aiohttp.ClientResponse = await self.api.call_api(
            path,
            method,
            query_params=list(params),
            header_params=dict(headers),
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=timeout_s,
        )
        return resp

    async def close(self) -> None:
        await self.api.close()


# ---- reading the configuration ----------------------------------------------------------


def in_cluster(root: Path = SERVICE_ACCOUNT, env: Mapping[str, str] = os.environ) -> Access:
    """The pod's service account: the API server's Service from the environment the kubelet
    sets, its CA and the (rotating) token from the mounted files."""
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ConfigError(
            "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set: not in a pod; "
            "set NODEWRIGHT_KUBE_KUBECONFIG to a kubeconfig file"
        )
    for name in ("token", "ca.crt"):
        if not (root / name).is_file():
            raise ConfigError(f"{root / name} is missing: mount the service account's token")
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    return Access(
        server=server,
        ssl=ssl.create_default_context(cafile=str(root / "ca.crt")),
        token=Token(path=root / "token"),
    )


def needs_plugin(path: Path) -> bool:
    """Whether the kubeconfig's current user authenticates in a way :func:`from_kubeconfig`
    leaves to ``kubernetes_asyncio`` (a credential plugin, a password)."""
    _, user = _current(path)
    return any(k in user for k in ("exec", "auth-provider", "username", "password"))


def from_kubeconfig(path: Path) -> Access:
    """The current context of the kubeconfig at ``path``, with static credentials."""
    cluster, user = _current(path)
    base = path.parent
    server = str(cluster.get("server") or "")
    if not server:
        raise ConfigError(f"{path}: the current context's cluster has no server")
    if cluster.get("insecure-skip-tls-verify"):
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        ca_data = _data(cluster, "certificate-authority", base)
        context = ssl.create_default_context(
            cadata=ca_data.decode() if ca_data is not None else None
        )
    cert, key = _data(user, "client-certificate", base), _data(user, "client-key", base)
    if (cert is None) != (key is None):
        raise ConfigError(f"{path}: the user has a client certificate or key, not both")
    if cert is not None and key is not None:
        try:
            _load_cert_chain(context, cert, key)
        except ssl.SSLError as exc:
            raise ConfigError(
                f"{path}: the client key does not match the certificate, or either is not "
                f"PEM: {exc}"
            ) from exc
    token: Token | None = None
    if user.get("token"):
        token = Token(value=str(user["token"]))
    elif user.get("tokenFile"):
        token = Token(path=_resolve(str(user["tokenFile"]), base))
    return Access(
        server=server,
        ssl=context,
        token=token,
        proxy=str(cluster["proxy-url"]) if cluster.get("proxy-url") else None,
        server_hostname=str(cluster["tls-server-name"]) if cluster.get("tls-server-name") else None,
    )


def _current(path: Path) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """The cluster and user entries of the kubeconfig's current context."""
    # Only a kubeconfig file needs YAML: in a pod (the service account) the service never
    # loads it, about 1 MB (issue 15).
    import yaml

    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read kubeconfig {path}: {exc}") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"{path} is not a kubeconfig")
    name = str(doc.get("current-context") or "")
    contexts = _named(doc, "contexts", "context")
    if name not in contexts:
        raise ConfigError(f"{path}: current-context {name!r} is not among its contexts")
    context = contexts[name]
    clusters, users = _named(doc, "clusters", "cluster"), _named(doc, "users", "user")
    cluster_name, user_name = str(context.get("cluster") or ""), str(context.get("user") or "")
    if cluster_name not in clusters:
        raise ConfigError(f"{path}: context {name!r} names cluster {cluster_name!r}, not in it")
    return clusters[cluster_name], users.get(user_name, {})


def _named(doc: Mapping[str, Any], section: str, item: str) -> dict[str, Mapping[str, Any]]:
    return {
        str(entry.get("name")): entry.get(item) or {}
        for entry in doc.get(section) or []
        if isinstance(entry, dict)
    }


def _resolve(name: str, base: Path) -> Path:
    """A file named in a kubeconfig: relative to the kubeconfig's directory, as kubectl reads it."""
    p = Path(name).expanduser()
    return p if p.is_absolute() else base / p


def _data(entry: Mapping[str, Any], name: str, base: Path) -> bytes | None:
    """PEM from ``<name>-data`` (base64) or from the file ``<name>``; None when neither is set."""
    if entry.get(f"{name}-data"):
        return base64.b64decode(str(entry[f"{name}-data"]))
    if entry.get(name):
        path = _resolve(str(entry[name]), base)
        try:
            return path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read {name} {path}: {exc}") from exc
    return None


def _load_cert_chain(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """The ssl module loads a certificate chain from files only: write them to a private
    temporary directory for the call, and remove them right after."""
    with tempfile.TemporaryDirectory(prefix="nodewright-tls-") as directory:
        cert_file, key_file = Path(directory, "tls.crt"), Path(directory, "tls.key")
        cert_file.write_bytes(cert)
        key_file.touch(mode=0o600)
        key_file.write_bytes(key)
        context.load_cert_chain(str(cert_file), str(key_file))
