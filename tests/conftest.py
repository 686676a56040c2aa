"""Test-run wide fixtures: one real control plane and nats-server per run (the rig),
API clients bound to it, and a namespace per test.

Tests that use the ``rig`` fixture (directly or through ``kube``/``namespace``) are marked
``rig`` automatically. Nothing here mocks Kubernetes or NATS.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from hypothesis import HealthCheck, settings
from kubernetes_asyncio import client, config

from nodewright.rig import Rig
from shared.config import KubeSettings
from shared.kube import ApiError, Kube, connect, path_of

# Property tests judge the code, not the machine: on 2 cores shared with a rig, a Go build or
# a running rollout, example generation and single examples can be slow for reasons that have
# nothing to do with the property, so neither the generation-speed health check nor the
# per-example deadline may fail a test. Failures are still found and shrunk as usual.
settings.register_profile("nodewright", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("nodewright")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "rig" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.rig)


@pytest.fixture(scope="session")
def rig() -> Iterator[Rig]:
    """The control plane and NATS, started once for the whole test run."""
    # NW_TEST_KEEP_RIG=1 keeps the rig's directory (service logs, etcd) to debug a
    # failed run; its path is printed.
    keep = os.environ.get("NW_TEST_KEEP_RIG") == "1"
    the_rig = Rig(keep_work_dir=keep)
    the_rig.start()
    try:
        yield the_rig
    finally:
        the_rig.stop()
        if keep:
            print(f"rig directory kept: {the_rig.dir}")


async def api_client(rig: Rig) -> client.ApiClient:
    cfg = client.Configuration()
    await config.load_kube_config(
        config_file=str(rig.endpoints.kubeconfig), client_configuration=cfg
    )
    return client.ApiClient(configuration=cfg)


@pytest.fixture
async def kube(rig: Rig) -> AsyncIterator[client.ApiClient]:
    """An API client with cluster-admin rights on the rig."""
    api = await api_client(rig)
    async with api:
        yield api


@pytest.fixture
async def kapi(rig: Rig) -> AsyncIterator[Kube]:
    """The JSON client the services use (the same transport, shared.kubeaccess), with
    cluster-admin rights on the rig."""
    async with connect(KubeSettings(kubeconfig=str(rig.endpoints.kubeconfig))) as kube:
        yield kube


@pytest.fixture
async def namespace(kapi: Kube) -> AsyncIterator[str]:
    """A fresh namespace for one test, deleted afterwards (without waiting for it to go)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    await kapi.create(path_of(plural="namespaces"), {"metadata": {"name": name}})
    try:
        yield name
    finally:
        try:
            await kapi.delete(path_of(plural="namespaces", name=name))
        except ApiError as exc:
            if not exc.not_found:
                raise


@pytest.fixture(autouse=True)
async def _no_leaked_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves asyncio tasks running behind it."""
    before = asyncio.all_tasks()
    yield
    leaked = [
        t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()
    ]
    if leaked:
        for task in leaked:
            task.cancel()
        await asyncio.gather(*leaked, return_exceptions=True)
        names = ", ".join(sorted(t.get_name() for t in leaked))
        pytest.fail(f"test leaked asyncio tasks: {names}")
