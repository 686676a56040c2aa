"""The probe and metrics HTTP server every service runs: /healthz, /readyz, /metrics.

``/healthz`` answers while the event loop answers (liveness). ``/readyz`` runs the
registered readiness checks (NATS connected, API server reachable) with a short timeout
and names the failing ones. ``/metrics`` exposes the process's own Prometheus registry.
A service may serve more pages on the same server (:class:`Pages`: the status service's web
page): they are registered after the server started, by exact method and path, and anything
else is 404. What the checks test and what the pages show is decided by their owners, not
here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4 as _METRICS_TYPE

from shared.config import HealthSettings

Check = Callable[[], Awaitable[bool]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# A probe that takes longer than this counts as failed; kubelet's default timeout is 1 s.
_CHECK_TIMEOUT_S = 0.9


class Probes:
    """Named readiness checks."""

    def __init__(self) -> None:
        self._checks: dict[str, Check] = {}

    def add(self, name: str, check: Check) -> None:
        self._checks[name] = check

    async def failing(self) -> list[str]:
        """Names of the checks that fail or time out, sorted."""

        async def one(name: str, check: Check) -> str | None:
            try:
                async with asyncio.timeout(_CHECK_TIMEOUT_S):
                    return None if await check() else name
            except Exception:
                return name

        results = await asyncio.gather(*(one(n, c) for n, c in self._checks.items()))
        return sorted(r for r in results if r is not None)


class Pages:
    """Handlers of further pages, by method and exact path; added while the server runs (the
    server's own routes are fixed once it started)."""

    def __init__(self) -> None:
        self._handlers: dict[tuple[str, str], Handler] = {}

    def add(self, method: str, path: str, handler: Handler) -> None:
        if (method, path) in self._handlers:
            raise ValueError(f"page {method} {path} registered twice")
        self._handlers[(method, path)] = handler

    async def handle(self, request: web.Request) -> web.StreamResponse:
        handler = self._handlers.get((request.method, request.path))
        if handler is None:
            if any(path == request.path for _, path in self._handlers):
                raise web.HTTPMethodNotAllowed(
                    request.method, sorted(m for m, path in self._handlers if path == request.path)
                )
            raise web.HTTPNotFound()
        return await handler(request)


def make_app(
    *, probes: Probes, registry: CollectorRegistry, pages: Pages | None = None
) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        failing = await probes.failing()
        if failing:
            return web.Response(status=503, text="not ready: " + ", ".join(failing) + "\n")
        return web.Response(text="ok\n")

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": _METRICS_TYPE})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    if pages is not None:
        # Last: the fixed routes above win; everything else is a page or 404.
        app.router.add_route("*", "/{path:.*}", pages.handle)
    return app


@contextlib.asynccontextmanager
async def serve(
    settings: HealthSettings,
    *,
    probes: Probes,
    registry: CollectorRegistry,
    pages: Pages | None = None,
) -> AsyncIterator[int]:
    """Serve the probes (and ``pages``) until the context exits; yield the bound port."""
    runner = web.AppRunner(make_app(probes=probes, registry=registry, pages=pages), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.host, settings.port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        port = sockets[0].getsockname()[1] if sockets else settings.port
        yield int(port)
    finally:
        await runner.cleanup()
