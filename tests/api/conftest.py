"""Fixtures of the API suite on the rig: installed CRDs, cleanup of CRs, the running webhook."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.validator import webhook
from shared import api
from shared.kube import ApiError, Kube, path_of
from tests.api import crds
from tests.helpers.waiting import eventually

VWCS = path_of(group="admissionregistration.k8s.io", plural="validatingwebhookconfigurations")


def unique(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def crd_kube(kapi: Kube) -> Kube:
    """The rig's API with the NodeWright and DeploymentPolicy CRDs installed and served."""
    await crds.install_crds(kapi)
    return kapi


class Objects:
    """Creates CRs and deletes whatever it created when the test ends."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._made: list[tuple[str, str]] = []

    async def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        where = crds.collection(manifest["kind"])
        created = await self.kube.create(where, manifest)
        self._made.append((where, created["metadata"]["name"]))
        return created

    async def cleanup(self) -> None:
        # NodeWrights first: a policy cannot be deleted while one references it.
        for where, name in sorted(self._made, key=lambda m: m[0] != crds.NODEWRIGHTS):
            try:
                await self.kube.delete(f"{where}/{name}")
            except ApiError as exc:
                if not exc.not_found:
                    raise


@pytest.fixture
async def objects(crd_kube: Kube) -> AsyncIterator[Objects]:
    made = Objects(crd_kube)
    try:
        yield made
    finally:
        await made.cleanup()


async def webhook_answers(kube: Kube) -> bool:
    """A dry-run create only the webhook refuses (a package key CEL does not check)."""
    probe = {
        "apiVersion": api.API_VERSION,
        "kind": "NodeWright",
        "metadata": {"name": unique("probe")},
        "spec": {"packages": {"Not_A_Name": {"version": "1", "image": "r/x"}}},
    }
    try:
        await kube.create(crds.NODEWRIGHTS, probe, dryRun="All")
    except ApiError as exc:
        return "denied the request" in exc.message
    return False


@pytest.fixture
async def running_webhook(crd_kube: Kube) -> AsyncIterator[webhook.Webhook]:
    """The real aiohttp webhook on loopback TLS, registered with the rig's API server.

    Its configuration is deleted before the server stops, so later tests never meet a
    failurePolicy Fail webhook that nobody serves.
    """
    settings = webhook.WebhookSettings(
        host="127.0.0.1",
        port=0,
        url="https://127.0.0.1:{port}",
        cert_secret="",
        configuration_name=unique("nodewright-validator"),
        resync_interval_s=3600,
    )
    async with webhook.serve_webhook(crd_kube, settings) as hook:
        try:
            await eventually(
                lambda: webhook_answers(crd_kube), timeout_s=30, what="the webhook being called"
            )
            yield hook
        finally:
            await crd_kube.delete(f"{VWCS}/{settings.configuration_name}")

            # The API server drops the configuration from its cache shortly after; wait so
            # the next test does not race it.
            async def gone() -> bool:
                return not await webhook_answers(crd_kube)

            await eventually(gone, timeout_s=30, what="the webhook configuration to go")
