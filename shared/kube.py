"""The Kubernetes API client every service uses: JSON in, JSON out.

One transport per process (:mod:`shared.kubeaccess`: aiohttp sessions, one for requests and one
for streams, with the kubeconfig's or the service account's credentials; a session per API
object would leak connections); each service of a process takes its own share of the requests'
(:meth:`Kube.capped`). On top of it :class:`Kube` speaks plain JSON dictionaries to REST paths:
no model classes, so custom resources, patches of every content type and watches all look the
same, and nothing is deserialised twice. HTTP failures become :class:`ApiError` with the status
code; a request that got no answer (connection refused or reset, a timeout) becomes an
:class:`ApiError` with status 0, so callers handle one error type. :attr:`ApiError.transient`
tells an expected fault of a slow or absent API server (no answer, 429, 5xx) from a refusal: it
is retried, and logged without a traceback. :class:`Outage` logs one warning when the API
server stops answering and one when it answers again, with how long it was gone. List+watch
caching and higher-level operations live with their callers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.metadata
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import aiohttp
import msgspec
from prometheus_client import CollectorRegistry, Counter

from shared import kubeaccess
from shared.config import KubeSettings
from shared.outages import Outage

JSON = dict[str, Any]
PatchKind = Literal["merge", "json", "strategic", "apply"]

_PATCH_TYPES: dict[PatchKind, str] = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",
}

_TEXT = "text/plain, application/json"
"""What a plain-text GET accepts: an error comes as a JSON Status."""

# Error bodies can be large (a whole rejected object); logs and messages keep this much.
_MAX_ERROR_TEXT = 1024

_log = logging.getLogger("nodewright.kube")

# Statuses of an overloaded, restarting or unreachable API server: worth retrying as they are.
_TRANSIENT = frozenset({0, 429, 500, 502, 503, 504})


class ApiError(Exception):
    """The API server refused a request; ``status`` is the HTTP code (0: no response)."""

    def __init__(self, status: int, reason: str, message: str, body: JSON | None = None) -> None:
        self.status = status
        self.reason = reason
        self.message = message[:_MAX_ERROR_TEXT]
        self.body = body or {}
        super().__init__(f"{status} {reason}: {self.message}")

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def patch_not_applicable(self) -> bool:
        """A JSON Patch the API server could not apply to the object as it is (a ``test``
        operation failed, or a path is not there): 422 without the field causes that a
        validation failure of the patched object names (``shared.nodepins``)."""
        details = self.body.get("details") or {}
        return self.status == 422 and not details.get("causes") and not details.get("name")

    @property
    def gone(self) -> bool:
        return self.status == 410

    @property
    def transient(self) -> bool:
        """An expected fault of a slow or absent API server (no answer, 429, 5xx): the
        request may succeed as it is later; nothing about it needs a traceback."""
        return self.status in _TRANSIENT


def api_server_outage() -> Outage:
    """How this process logs the API server not answering (shared.outages)."""
    return Outage(
        lost="Lost the Kubernetes API server",
        back="Reached the Kubernetes API server again",
        log=_log,
    )


def path_of(
    *,
    group: str = "",
    version: str = "v1",
    plural: str,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    """The REST path of a collection or object (names are URL-quoted)."""
    base = f"/api/{version}" if not group else f"/apis/{group}/{version}"
    if namespace:
        base += f"/namespaces/{quote(namespace, safe='')}"
    base += f"/{plural}"
    if name:
        base += f"/{quote(name, safe='')}"
        if subresource:
            base += f"/{subresource}"
    return base


def _resource_parts(path: str) -> list[str] | None:
    """The parts of a REST path after its group and version, without a namespace (None: not
    a resource path)."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if parts[:1] == ["api"]:
        rest = parts[2:]
    elif parts[:1] == ["apis"]:
        rest = parts[3:]
    else:
        return None
    if len(rest) > 2 and rest[0] == "namespaces":
        rest = rest[2:]  # namespaced: the namespace is not the resource
    return rest


def resource_of(path: str) -> str:
    """The resource a REST path names, with its subresource: ``nodes``, ``nodes/status``,
    ``pods/eviction``, ``nodewrights``; a non-resource path as itself (``/readyz``)."""
    rest = _resource_parts(path)
    if rest is None:
        return "/" + "/".join(p for p in path.split("?", 1)[0].split("/") if p)
    if not rest:
        return ""
    return rest[0] if len(rest) < 3 else f"{rest[0]}/{rest[2]}"


def verb_of(method: str, path: str, *, watch: bool = False) -> str:
    """The API server's name for a request: ``WATCH``, ``LIST`` (a GET of a collection) or
    the HTTP method; a read of one node and a list of all of them are not the same cost."""
    if watch:
        return "WATCH"
    if method == "GET" and len(_resource_parts(path) or ()) == 1:
        return "LIST"
    return method


RequestObserver = Callable[[str, str, str], None]
"""Called once per API request with (verb, resource, code): what the process asks for."""


def request_counter(registry: CollectorRegistry) -> RequestObserver:
    """A :data:`RequestObserver` counting requests in ``registry`` (client-go's
    ``rest_client_requests_total``, by resource too), so an operator sees which service
    writes what and a benchmark can split the API load by service."""
    counter = Counter(
        "nodewright_kube_requests",
        "Kubernetes API requests made, by verb (LIST and WATCH as the API server names them), "
        "resource and HTTP code",
        ["verb", "resource", "code"],
        registry=registry,
    )

    def observe(verb: str, resource: str, code: str) -> None:
        counter.labels(verb, resource, code).inc()

    return observe


@dataclass(frozen=True)
class Kube:
    api: kubeaccess.Transport
    observe: RequestObserver | None = None
    outage: Outage = field(default_factory=api_server_outage, compare=False)
    gate: asyncio.Semaphore | None = field(default=None, compare=False)
    """This view's own cap on requests in flight (:meth:`capped`); None: the transport's."""

    def capped(self, in_flight: int) -> Kube:
        """A view of this client whose requests in flight are at most ``in_flight``, apart
        from any other view's: each service of one process gets its own, as it would in a
        process of its own. One pool for five services let the scheduler's 40 admissions
        in flight hold the drainer's cordons back (issue 15). Streams (watches, followed
        logs) are not counted: they have connections of their own (:mod:`shared.kubeaccess`)."""
        return dataclasses.replace(self, gate=asyncio.Semaphore(in_flight))

    agent: str = field(default="", compare=False)
    """The User-Agent of this view's requests (:meth:`named`); empty: aiohttp's."""

    def named(self, service: str) -> Kube:
        """A view of this client whose requests say they are ``service``'s: the API server
        names their field manager after it (``kubectl get node --show-managed-fields`` shows
        which service wrote which field, where it said "Python" for all five) and its audit
        log names it."""
        return dataclasses.replace(self, agent=user_agent(service))

    def _slot(self) -> contextlib.AbstractAsyncContextManager[Any]:
        return self.gate if self.gate is not None else contextlib.nullcontext()

    async def ready(self) -> bool:
        """True unless this process's requests find the API server absent (an outage under
        way, :class:`Outage`). No request of its own: the probe ran every few seconds in
        every pod (API load for nothing), and behind a slow API server (2 s per call, issue
        14) its GET outlasted the probe's timeout, so every replica was unready, and never
        ready after a restart, while its work went on."""
        return self.outage.since is None

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int | bool] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout_s: float | None = None,
        accept: str = "application/json",
        stream: bool = False,
    ) -> Any:
        params = [
            (k, str(v).lower() if isinstance(v, bool) else v) for k, v in (query or {}).items()
        ]
        headers = {"Accept": accept, "Content-Type": content_type}
        if self.agent:
            headers["User-Agent"] = self.agent
        code = "error"  # no answer: a timeout or a connection failure
        try:
            try:
                resp = await self.api.send(
                    method,
                    path,
                    params=params,
                    headers=headers,
                    body=body,
                    timeout_s=timeout_s,
                    stream=stream,
                )
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                self.outage.failed(repr(exc))
                raise ApiError(0, "NoAnswer", f"{method} {path}: {exc!r}") from exc
            code = str(resp.status)
            if resp.status in (502, 503, 504):
                self.outage.failed(f"HTTP {resp.status}")
            else:
                self.outage.answered()
            return resp
        finally:
            if self.observe is not None:
                verb = verb_of(method, path, watch=(query or {}).get("watch") is True)
                self.observe(verb, resource_of(path), code)

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int | bool] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout_s: float | None = 30.0,
        raw: bool = False,
    ) -> JSON:
        """Send one request; return the decoded JSON object ({} for raw/non-JSON answers)."""
        async with self._slot():
            resp = await self._send(
                method,
                path,
                query=query,
                body=body,
                content_type=content_type,
                timeout_s=timeout_s,
            )
            try:
                data = await resp.read()
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                self.outage.failed(repr(exc))
                raise ApiError(0, "NoAnswer", f"{method} {path}: {exc!r}") from exc
            finally:
                resp.release()
        if not 200 <= resp.status <= 299:
            raise _error(resp.status, resp.reason or "", data.decode("utf-8", "replace"))
        if raw or not data:
            return {}
        decoded: JSON = _decode(data)
        return decoded

    async def get(self, path: str, **query: str | int | bool) -> JSON:
        return await self.request("GET", path, query=query)

    async def list_pages(
        self,
        path: str,
        query: Mapping[str, str | int | bool] | None = None,
        *,
        limit: int = 500,
        timeout_s: float = 60.0,
    ) -> AsyncIterator[JSON]:
        """LIST ``path`` in pages of ``limit`` items (one consistent snapshot: the first
        page's resourceVersion is the list's). A continue token that expired meanwhile
        raises ApiError 410: start over."""
        token = ""
        while True:
            page_query: dict[str, str | int | bool] = {**(query or {}), "limit": limit}
            if token:
                page_query["continue"] = token
            page = await self.request("GET", path, query=page_query, timeout_s=timeout_s)
            yield page
            token = str((page.get("metadata") or {}).get("continue") or "")
            if not token:
                return

    async def get_text(
        self,
        path: str,
        query: Mapping[str, str | int | bool] | None = None,
        *,
        timeout_s: float | None = 30.0,
    ) -> str:
        """GET a plain-text answer (a pod's log); an error status raises :class:`ApiError`."""
        async with self._slot():
            resp = await self._send("GET", path, query=query, timeout_s=timeout_s, accept=_TEXT)
            try:
                text: str = await resp.text(errors="replace")
            finally:
                resp.release()
        if not 200 <= resp.status <= 299:
            raise _error(resp.status, resp.reason or "", text)
        return text

    async def stream_text(
        self,
        path: str,
        query: Mapping[str, str | int | bool] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> AsyncIterator[str]:
        """GET a plain-text answer that keeps coming (a followed pod log): yield it line by
        line as the server sends it, until it ends. An error status raises :class:`ApiError`."""
        resp = await self._send(
            "GET", path, query=query, timeout_s=timeout_s, accept=_TEXT, stream=True
        )
        try:
            if not 200 <= resp.status <= 299:
                raise _error(resp.status, resp.reason or "", await resp.text(errors="replace"))
            while True:
                line = await resp.content.readline()
                if not line:
                    return
                yield line.decode(errors="replace")
        finally:
            _let_go(resp)

    async def create(self, path: str, body: JSON, **query: str | int | bool) -> JSON:
        return await self.request("POST", path, body=body, query=query)

    async def replace(self, path: str, body: JSON) -> JSON:
        return await self.request("PUT", path, body=body)

    async def patch(
        self,
        path: str,
        body: Any,
        *,
        kind: PatchKind = "merge",
        field_manager: str | None = None,
        force: bool = False,
        dry_run: bool = False,
    ) -> JSON:
        """``dry_run``: the API server validates and admits the patch and stores nothing
        (``dryRun=All``); the answer is the object as it would be."""
        query: dict[str, str | int | bool] = {}
        if field_manager:
            query["fieldManager"] = field_manager
        if force:
            query["force"] = True
        if dry_run:
            query["dryRun"] = "All"
        return await self.request(
            "PATCH", path, body=body, content_type=_PATCH_TYPES[kind], query=query
        )

    async def delete(self, path: str, body: JSON | None = None, *, dry_run: bool = False) -> JSON:
        """``dry_run``: the API server checks the deletion and deletes nothing."""
        return await self.request(
            "DELETE", path, body=body, query={"dryRun": "All"} if dry_run else None
        )

    async def create_if_absent(self, path: str, body: JSON) -> JSON | None:
        """Create; None when an object of that name exists already (deterministic names)."""
        try:
            return await self.create(path, body)
        except ApiError as exc:
            if exc.conflict:
                return None
            raise

    async def delete_if_present(self, path: str, *, dry_run: bool = False) -> bool:
        """Delete; False when it was gone already."""
        try:
            await self.delete(path, dry_run=dry_run)
        except ApiError as exc:
            if exc.not_found:
                return False
            raise
        return True

    async def watch(
        self,
        path: str,
        *,
        resource_version: str,
        timeout_s: int = 300,
        **query: str | int | bool,
    ) -> AsyncIterator[JSON]:
        """Yield watch events ({"type", "object"}) from ``resource_version`` until the server
        closes the stream (after ``timeout_s``). ERROR events raise ApiError (410: re-list)."""
        params: dict[str, str | int | bool] = {
            **query,
            "watch": True,
            "resourceVersion": resource_version,
            "allowWatchBookmarks": True,
            "timeoutSeconds": timeout_s,
        }
        resp = await self._send("GET", path, query=params, timeout_s=timeout_s + 30, stream=True)
        try:
            if not 200 <= resp.status <= 299:
                raise _error(resp.status, resp.reason or "", await resp.text())
            while True:
                try:
                    line = await resp.content.readline()
                except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                    # The stream broke (a restarted API server, a cut connection): the
                    # caller resumes from the last resourceVersion it saw.
                    raise ApiError(0, "WatchBroken", f"watch {path}: {exc!r}") from exc
                if not line:
                    return
                if not line.strip():
                    continue
                event: JSON = _decode(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    raise ApiError(
                        int(status.get("code") or 0),
                        str(status.get("reason") or ""),
                        str(status.get("message") or ""),
                        status,
                    )
                yield event
        finally:
            _let_go(resp)


def _let_go(resp: aiohttp.ClientResponse) -> None:
    """Give back a streamed answer. One left before its end (^C on a followed log, a watch
    cancelled at a stop) has its connection dropped at once: a graceful TLS close waits for
    the server's close_notify, which a server still streaming may not send before asyncio's
    SSL shutdown timeout (30 s), and closing the client session waits for that close."""
    if not resp.content.at_eof():
        conn = resp.connection
        transport = conn.transport if conn is not None else None
        if transport is not None:
            transport.abort()
    resp.release()


def user_agent(service: str) -> str:
    """``nodewright-<service>/<version>``, as client-go names a binary: the API server takes
    the part before the slash as the field manager of the writes."""
    try:
        version = importlib.metadata.version("nodewright")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return f"nodewright-{service}/{version}"


# msgspec's decoder: a third of the json module's time on node objects and watch events,
# which every service decodes by the thousand (issue 15).
_decode = msgspec.json.Decoder().decode


def _error(status: int, reason: str, text: str) -> ApiError:
    try:
        body = _decode(text)
    except ValueError:
        return ApiError(status, reason, text)
    if not isinstance(body, dict):
        return ApiError(status, reason, text)
    return ApiError(
        status, str(body.get("reason") or reason), str(body.get("message") or text), body
    )


@contextlib.asynccontextmanager
async def connect(
    settings: KubeSettings, *, registry: CollectorRegistry | None = None, shares: int = 1
) -> AsyncIterator[Kube]:
    """One client for the process; with ``registry``, its requests are counted there. A
    ``ConfigError`` says what the kubeconfig or the service account lacks. ``shares``: the
    services that will each take a view capped at ``qps_burst`` (:meth:`Kube.capped`); the
    connection pool holds them all."""
    transport = await _transport(settings, settings.qps_burst * shares)
    try:
        yield Kube(transport, observe=request_counter(registry) if registry is not None else None)
    finally:
        await transport.close()


async def _transport(settings: KubeSettings, in_flight: int) -> kubeaccess.Transport:
    if not settings.kubeconfig:
        return kubeaccess.Session(kubeaccess.in_cluster(), max_in_flight=in_flight)
    path = Path(settings.kubeconfig)
    if not kubeaccess.needs_plugin(path):
        access = kubeaccess.from_kubeconfig(path)
        return kubeaccess.Session(access, max_in_flight=in_flight)
    # A credential plugin: kubernetes_asyncio runs it (and is imported only then).
    from kubernetes_asyncio import client, config

    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(path), client_configuration=cfg)
    cfg.connection_pool_maxsize = in_flight
    api = client.ApiClient(configuration=cfg)
    session = api.rest_client.pool_manager
    if isinstance(session, aiohttp.ClientSession):
        # As in kubeaccess.Session: no environment lookups per request (issue 15).
        session._trust_env = False  # aiohttp has no public setter; the attribute is in ATTRS
    return kubeaccess.ApiClientTransport(api)
