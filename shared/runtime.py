"""One supervisor per process: root tasks, signals, graceful shutdown, crash-only exit.

A service builds its resources (NATS, API client, probe server) in one ``AsyncExitStack``
via :func:`serve`, registers its root tasks, and hands control to :class:`Supervisor`. The
supervisor runs until SIGTERM/SIGINT or until any root task ends: a root task that returns
or raises is a crash, so the process exits non-zero and Kubernetes restarts it. On stop, the
``stopping`` event is set first (consumers stop fetching), in-flight work gets
``graceful_timeout_s``, then the rest is cancelled. A last-resort timer hard-exits a process
whose loop is wedged. What each root task does is not this module's business.

Several services can share one process (:func:`main_many`, ``python -m services``): each is
built as it would be alone, from a context of its own (its settings, a supervisor scope that
prefixes its task names), over one API client, one NATS connection, one metrics registry, one
probe server and one :class:`~shared.informer.InformerHub`, so their common caches are listed,
watched and kept once. Any root task that ends stops them all, as in a process of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
)

from shared import bus, config, health, kube, kubeaccess, logging as logging_
from shared.config import ServiceSettings
from shared.informer import InformerHub

RootTask = Callable[[], Coroutine[Any, Any, None]]

_log = logging.getLogger("nodewright.runtime")

# Extra time after the graceful period before the hard exit; covers slow cleanup of clients.
_ULTIMATE_MARGIN_S = 10.0


def utcnow() -> datetime:
    """The clock passed into cores; tests pass their own."""
    return datetime.now(UTC)


class Supervisor:
    """Runs named root tasks until a stop is requested or one of them ends."""

    def __init__(self, *, name: str, graceful_timeout_s: float) -> None:
        self.name = name
        self.graceful_timeout_s = graceful_timeout_s
        self.stopping = asyncio.Event()
        self._tasks: dict[str, RootTask] = {}
        self._graceful: set[str] = set()
        self._reason = [""]
        self._prefix = ""

    def scoped(self, prefix: str) -> Supervisor:
        """The same supervisor for one of the services sharing the process: the tasks it adds
        are named ``prefix/name`` (two services may both have an ``informer:nodes``)."""
        scope = copy.copy(self)  # shares the tasks, the stop flag and the stop reason
        scope._prefix = f"{self._prefix}{prefix}/"
        return scope

    def add(self, name: str, task: RootTask, *, graceful: bool = False) -> None:
        """Register a root task that runs until cancelled.

        ``graceful`` tasks watch ``stopping`` and finish their in-flight work by themselves
        (consumers, work queues); they get ``graceful_timeout_s`` before being cancelled.
        Other tasks (caches, timers, elections) are cancelled as soon as the stop begins.
        """
        name = self._prefix + name
        if name in self._tasks:
            raise ValueError(f"root task {name!r} registered twice")
        self._tasks[name] = task
        if graceful:
            self._graceful.add(name)

    def request_stop(self, reason: str) -> None:
        if not self.stopping.is_set():
            self._reason[0] = reason
            _log.info("Stopping service", extra={"reason": reason})
            self.stopping.set()

    async def run(self) -> int:
        """Run until stopped; return the process exit code (0 after a clean stop)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop, sig.name)
        tasks = {asyncio.create_task(fn(), name=name): name for name, fn in self._tasks.items()}
        stop_wait: asyncio.Task[Any] = asyncio.create_task(self._wait_stop(), name="stop-flag")
        exit_code = 0
        try:
            done, _ = await asyncio.wait([*tasks, stop_wait], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task in tasks and not self._finished_for_stop(task):
                    exit_code = 1
                    self._report_crash(tasks[task], task)
            self.request_stop(self._reason[0] or "root task ended")
            timer = self._arm_ultimate_exit()
            try:
                for task, name in tasks.items():
                    if name not in self._graceful and not task.done():
                        task.cancel()
                pending = [t for t in tasks if not t.done()]
                if pending:
                    _, still = await asyncio.wait(pending, timeout=self.graceful_timeout_s)
                    for task in still:
                        _log.warning("Cancelled root task", extra={"task": tasks[task]})
                        task.cancel()
                    await asyncio.gather(*still, return_exceptions=True)
                for task, name in tasks.items():
                    if task not in done and not task.cancelled() and task.exception() is not None:
                        exit_code = 1
                        self._report_crash(name, task)
            finally:
                timer.cancel()
        finally:
            stop_wait.cancel()
            await asyncio.gather(stop_wait, return_exceptions=True)
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        _log.info("Stopped service", extra={"exit_code": exit_code})
        return exit_code

    def _finished_for_stop(self, task: asyncio.Task[None]) -> bool:
        """A graceful task that returned because the stop began is not a crash."""
        return self.stopping.is_set() and not task.cancelled() and task.exception() is None

    async def _wait_stop(self) -> None:
        await self.stopping.wait()

    @staticmethod
    def _report_crash(name: str, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            _log.error("Root task was cancelled unexpectedly", extra={"task": name})
            return
        exc = task.exception()
        if exc is None:
            _log.error("Root task finished unexpectedly", extra={"task": name})
        else:
            _log.error("Root task failed", extra={"task": name}, exc_info=exc)

    def _arm_ultimate_exit(self) -> threading.Timer:
        # A thread, not loop.call_later: the point is to fire when the loop itself is stuck.
        timer = threading.Timer(self.graceful_timeout_s + _ULTIMATE_MARGIN_S, os._exit, args=(2,))
        timer.daemon = True
        timer.start()
        return timer


@dataclass(frozen=True, kw_only=True)
class ServiceContext:
    """The immutable bag of dependencies a service's shell receives."""

    name: str
    identity: str
    settings: ServiceSettings
    bus: bus.Bus
    kube: kube.Kube
    registry: CollectorRegistry
    supervisor: Supervisor
    health_port: int
    pages: health.Pages = dataclasses.field(default_factory=health.Pages)
    """More pages of the health server (the status service's web page)."""
    probes: health.Probes = dataclasses.field(default_factory=health.Probes)
    """The process's readiness checks (``/readyz``): a service adds what must hold before it
    takes traffic, such as the validator's admission webhook being served and registered."""
    clock: Callable[[], datetime] = utcnow
    informers: InformerHub = dataclasses.field(default_factory=InformerHub)
    """Shared by the services of one process, so each collection is watched once."""


Builder = Callable[[ServiceContext], Awaitable[None]]


@dataclass(frozen=True, kw_only=True)
class Service:
    """What a service is to a process: its name, its settings' type and how it is built."""

    name: str
    settings_type: type[ServiceSettings]
    build: Builder


def process_registry() -> CollectorRegistry:
    """A service's own registry with the standard process metrics every Prometheus client
    exports (process_cpu_seconds_total, process_resident_memory_bytes, open fds ...,
    python_info, python_gc_*): the default registry has them, a fresh one does not."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


@contextlib.asynccontextmanager
async def _context(
    *, name: str, settings: ServiceSettings, shares: int = 1
) -> AsyncIterator[ServiceContext]:
    identity = settings.identity or f"{socket.gethostname()}-{os.getpid()}"
    registry = process_registry()
    supervisor = Supervisor(name=name, graceful_timeout_s=settings.graceful_timeout_s)
    probes = health.Probes()
    pages = health.Pages()
    async with contextlib.AsyncExitStack() as stack:
        # The Kubernetes client first: it reads local credentials only, so a kubeconfig or
        # service account that cannot work is reported at once, not after NATS answers.
        api = await stack.enter_async_context(
            kube.connect(settings.kube, registry=registry, shares=shares)
        )
        api = api.named(name)
        nats_bus = await stack.enter_async_context(
            bus.connect(settings.nats, name=f"{name}/{identity}", stopping=supervisor.stopping)
        )
        probes.add("nats", nats_bus.ready)
        probes.add("kube", api.ready)
        port = await stack.enter_async_context(
            health.serve(settings.health, probes=probes, registry=registry, pages=pages)
        )
        yield ServiceContext(
            name=name,
            identity=identity,
            settings=settings,
            bus=nats_bus,
            kube=api,
            registry=registry,
            supervisor=supervisor,
            health_port=port,
            pages=pages,
            probes=probes,
        )


async def serve(*, name: str, settings: ServiceSettings, build: Builder) -> int:
    """Open the service's resources, let ``build`` register root tasks, run to the end."""
    async with _context(name=name, settings=settings) as ctx:
        await build(ctx)
        _log.info(
            "Started service",
            extra={"identity": ctx.identity, "health_port": ctx.health_port},
        )
        return await ctx.supervisor.run()


async def serve_many(*, name: str, services: Sequence[tuple[Service, ServiceSettings]]) -> int:
    """Build several services over one process's resources (the first one's settings for
    NATS, the API server and the probes: they come from the same environment), run them
    until the stop or until any root task ends."""
    first = services[0][1]
    async with _context(name=name, settings=first, shares=len(services)) as shared:
        for service, settings in services:
            await service.build(
                dataclasses.replace(
                    shared,
                    name=service.name,
                    settings=settings,
                    supervisor=shared.supervisor.scoped(service.name),
                    # Its own NODEWRIGHT_KUBE_QPS_BURST requests in flight, as alone: one
                    # service's burst (the scheduler opening a batch) does not queue the
                    # others' writes behind it.
                    kube=shared.kube.capped(settings.kube.qps_burst).named(service.name),
                )
            )
        _log.info(
            "Started services",
            extra={
                "identity": shared.identity,
                "health_port": shared.health_port,
                "services": ",".join(s.name for s, _ in services),
            },
        )
        return await shared.supervisor.run()


def main(
    *,
    name: str,
    settings_type: type[ServiceSettings],
    build: Builder,
    environ: Mapping[str, str],
) -> int:
    """Process entry point shared by the services: decode config once, log, serve."""
    try:
        settings = config.load(settings_type, environ)
    except config.ConfigError as exc:
        # Logging is not configured yet (the level is part of the config): plain stderr.
        print(f"{name}: invalid configuration: {exc}", file=sys.stderr)
        return 2
    logging_.configure(service=name, level=settings.log_level)
    return _run(serve(name=name, settings=settings, build=build))


def main_many(*, name: str, services: Sequence[Service], environ: Mapping[str, str]) -> int:
    """Entry point of a process running ``services`` together (``python -m services``)."""
    try:
        loaded = config.load_many([s.settings_type for s in services], environ)
    except config.ConfigError as exc:
        print(f"{name}: invalid configuration: {exc}", file=sys.stderr)
        return 2
    logging_.configure(service=name, level=loaded[0].log_level)
    return _run(serve_many(name=name, services=list(zip(services, loaded, strict=True))))


def _run(serving: Coroutine[Any, Any, int]) -> int:
    try:
        return asyncio.run(serving)
    except kubeaccess.ConfigError as exc:
        # Permanent until the pod's spec or mounts change: exit, and say what is missing.
        _log.error("Cannot configure the Kubernetes client", extra={"error": str(exc)})
        return 2
