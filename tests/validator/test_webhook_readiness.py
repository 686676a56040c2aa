"""The validator process is ready only while its admission webhook is served and registered:
a Service sends admission requests to ready pods, and with failurePolicy Fail a request sent
to a replica that does not serve yet refuses the change (the process had reported ready once
NATS and the API server answered, before its webhook configuration existed)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from services.validator import service
from services.validator.certs import CertBundle
from services.validator.webhook import Webhook
from shared import health


async def test_not_ready_until_the_webhook_is_registered_nor_after_it_stopped() -> None:
    probes = health.Probes()
    registering = asyncio.Event()
    # Not served here: readiness reads only whether the configuration was registered.
    unused = CertBundle(ca_cert=b"", ca_key=b"", cert=b"", key=b"")
    hook = Webhook(port=0, bundle=unused, files=Path())

    @contextlib.asynccontextmanager
    async def serve() -> AsyncIterator[Webhook]:
        await registering.wait()  # the certificate, the HTTPS server, the configuration
        hook.registered = True
        yield hook

    task = asyncio.create_task(service.admission(probes, serve)())
    await asyncio.sleep(0)
    assert await probes.failing() == ["webhook"], "ready before the webhook is served"
    registering.set()
    for _ in range(10):
        await asyncio.sleep(0)
    assert await probes.failing() == []
    hook.registered = False  # the configuration could not be asserted again
    assert await probes.failing() == ["webhook"]
    hook.registered = True
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert await probes.failing() == ["webhook"], "ready after the webhook stopped"
