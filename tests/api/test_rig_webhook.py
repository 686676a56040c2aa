"""The real aiohttp webhook, called by the rig's API server over loopback TLS.

Every case is something the CRD schema accepts but admission must refuse; the message must
come from the webhook ("denied the request") and name the field.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import os
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest
from cryptography import x509

from services.validator import webhook
from shared import api
from shared.kube import ApiError, Kube, path_of
from tests.api import crds
from tests.api.conftest import VWCS, Objects, unique, webhook_answers
from tests.api.test_rig_invalid import at, nodewright, policy
from tests.helpers.waiting import eventually

pytestmark = pytest.mark.rig

Doc = dict[str, Any]
Step = Callable[[Objects, dict[str, str]], Awaitable[None]]


def _nw(name: str, *mutations: Callable[[Doc], None]) -> Doc:
    doc = nodewright()
    doc["metadata"]["name"] = name
    for m in mutations:
        m(doc)
    return doc


def _dp(name: str, *mutations: Callable[[Doc], None]) -> Doc:
    doc = policy()
    doc["metadata"]["name"] = name
    for m in mutations:
        m(doc)
    return doc


def create_nw(*mutations: Callable[[Doc], None]) -> Step:
    async def step(objects: Objects, names: dict[str, str]) -> None:
        await objects.create(_nw(names["nw"], *mutations))

    return step


def create_dp(*mutations: Callable[[Doc], None]) -> Step:
    async def step(objects: Objects, names: dict[str, str]) -> None:
        await objects.create(_dp(names["dp"], *mutations))

    return step


def update(kind: str, *mutations: Callable[[Doc], None]) -> Step:
    async def step(objects: Objects, names: dict[str, str]) -> None:
        path = f"{crds.collection(kind)}/{names['nw' if kind == 'NodeWright' else 'dp']}"
        doc = await objects.kube.get(path)
        for m in mutations:
            m(doc)
        await objects.kube.replace(path, doc)

    return step


def set_status(**status: Any) -> Step:
    async def step(objects: Objects, names: dict[str, str]) -> None:
        path = f"{crds.NODEWRIGHTS}/{names['nw']}"
        doc = await objects.kube.get(path)
        await objects.kube.replace(f"{path}/status", {**doc, "status": status})

    return step


def delete_dp() -> Step:
    async def step(objects: Objects, names: dict[str, str]) -> None:
        await objects.kube.delete(f"{crds.POLICIES}/{names['dp']}")

    return step


def use_policy(doc: Doc) -> None:
    doc["spec"]["deploymentPolicy"] = doc["metadata"]["name"].replace("nw-", "dp-")


UNINSTALLABLE = at("spec.packages.a.uninstall", {"enabled": True})
PRESENT = {"packages": [{"name": "a", "version": "1.0.0", "presentNodes": 2}]}

CASES = [
    pytest.param(
        (),
        create_nw(use_policy),
        "spec.deploymentPolicy",
        "does not exist",
        id="nw-create-missing-policy",
    ),
    pytest.param(
        (),
        create_nw(
            at("spec.packages.a.dependsOn", {"b": "2.0.0"}),
            at("spec.packages.b.dependsOn", {"a": "1.0.0"}),
        ),
        "spec.packages[a].dependsOn",
        "a -> b -> a",
        id="nw-create-cycle",
    ),
    pytest.param(
        (),
        create_nw(at("spec.packages.Bad_Name", {"version": "1", "image": "r/x"})),
        "spec.packages[Bad_Name]",
        "package name",
        id="nw-create-package-name",
    ),
    pytest.param(
        (),
        create_nw(at("spec.packages.a.configMap", {"../etc": "x"})),
        "spec.packages[a].configMap[../etc]",
        "ConfigMap key",
        id="nw-create-config-key",
    ),
    pytest.param(
        (),
        create_nw(
            at("spec.packages.a.configMap", {"a.conf": "x"}),
            at("spec.packages.a.configInterrupts", {"*.yaml": {"type": "reboot"}}),
        ),
        "spec.packages[a].configInterrupts[*.yaml]",
        "matches no key",
        id="nw-create-config-interrupt-glob",
    ),
    pytest.param(
        (),
        create_nw(at("spec.nodeSelectors", {"matchLabels": {"bad key": "x"}})),
        "spec.nodeSelectors.matchLabels[bad key]",
        "label key",
        id="nw-create-label-key",
    ),
    pytest.param(
        (),
        create_nw(at("metadata.annotations", {api.PAUSE_ANNOTATION: "yes"})),
        f"metadata.annotations[{api.PAUSE_ANNOTATION}]",
        '"true" or "false"',
        id="nw-create-pause-value",
    ),
    pytest.param(
        (create_nw(),),
        update("NodeWright", use_policy),
        "spec.deploymentPolicy",
        "does not exist",
        id="nw-update-missing-policy",
    ),
    pytest.param(
        (create_nw(UNINSTALLABLE), set_status(**PRESENT)),
        update("NodeWright", at("spec.packages.a", ...)),
        "spec.packages[a]",
        "still present on 2 node(s)",
        id="nw-update-remove-before-uninstall",
    ),
    pytest.param(
        (create_nw(UNINSTALLABLE), set_status(**PRESENT)),
        update("NodeWright", at("spec.packages.a.version", "0.9.0")),
        "spec.packages[a].version",
        "cannot downgrade",
        id="nw-update-downgrade-before-uninstall",
    ),
    pytest.param(
        (),
        create_dp(
            at(
                "spec.maintenanceWindows",
                [{"start": "01:00", "end": "02:00", "timeZone": "Mars/Olympus_Mons"}],
            )
        ),
        "spec.maintenanceWindows[0].timeZone",
        "IANA time zone",
        id="dp-create-time-zone",
    ),
    pytest.param(
        (),
        create_dp(
            at(
                "spec.compartments",
                [{"name": "c", "selector": {"matchLabels": {"-x": "1"}}, "budget": {"count": 1}}],
            )
        ),
        "spec.compartments[0].selector.matchLabels[-x]",
        "label key",
        id="dp-create-label-key",
    ),
    pytest.param(
        (create_dp(),),
        update(
            "DeploymentPolicy",
            at(
                "spec.maintenanceWindows",
                [{"start": "01:00", "end": "02:00", "timeZone": "Europe/Atlantis"}],
            ),
        ),
        "spec.maintenanceWindows[0].timeZone",
        "IANA time zone",
        id="dp-update-time-zone",
    ),
    pytest.param(
        (create_dp(), create_nw(use_policy)),
        delete_dp(),
        "spec.deploymentPolicy",
        "still referenced",
        id="dp-delete-referenced",
    ),
]


@pytest.mark.parametrize(("setup", "action", "field", "says"), CASES)
async def test_the_webhook_refuses(
    objects: Objects,
    running_webhook: webhook.Webhook,
    setup: tuple[Step, ...],
    action: Step,
    field: str,
    says: str,
) -> None:
    suffix = unique("x")[2:]
    names = {"nw": f"nw-{suffix}", "dp": f"dp-{suffix}"}
    for step in setup:
        await step(objects, names)
    with pytest.raises(ApiError) as err:
        await action(objects, names)
    message = err.value.message
    assert "denied the request" in message, message
    assert field in message, message
    assert says in message, message


async def test_the_webhook_admits_what_it_should(
    objects: Objects, running_webhook: webhook.Webhook
) -> None:
    name = unique("ok")
    await objects.create(_dp(name))
    nw = _nw(name, at("spec.deploymentPolicy", name), UNINSTALLABLE)
    await objects.create(nw)
    path = f"{crds.NODEWRIGHTS}/{name}"
    # Removing an uninstall-enabled package is fine once status shows it on no node.
    await set_status(packages=[{"name": "a", "version": "1.0.0", "presentNodes": 0}])(
        objects, {"nw": name}
    )
    stored = await objects.kube.get(path)
    changed = copy.deepcopy(stored)
    del changed["spec"]["packages"]["a"]
    replaced = await objects.kube.replace(path, changed)
    assert "a" not in replaced["spec"]["packages"]
    assert "a" not in (await objects.kube.get(path))["spec"]["packages"], "admitted and stored"
    # Deleting the policy once nothing references it.
    await objects.kube.delete(path)
    await objects.kube.delete(f"{crds.POLICIES}/{name}")
    for gone in (path, f"{crds.POLICIES}/{name}"):
        with pytest.raises(ApiError) as err:
            await objects.kube.get(gone)
        assert err.value.not_found, gone


def _settings(namespace: str, **more: Any) -> webhook.WebhookSettings:
    return webhook.WebhookSettings(
        host="127.0.0.1",
        port=0,
        url="https://127.0.0.1:{port}",
        namespace=namespace,
        cert_secret="validator-tls",
        configuration_name=unique("nodewright-validator"),
        **more,
    )


async def _ca_bundle(kube: Kube, name: str) -> set[bytes]:
    vwc = await kube.get(f"{VWCS}/{name}")
    return {base64.b64decode(w["clientConfig"].get("caBundle", "")) for w in vwc["webhooks"]}


async def test_replicas_share_the_certificate_kept_in_a_secret(
    crd_kube: Kube, namespace: str
) -> None:
    settings = _settings(namespace)
    try:
        async with webhook.serve_webhook(crd_kube, settings) as first:
            assert await first.ready()
            assert await _ca_bundle(crd_kube, settings.configuration_name) == {first.bundle.ca_cert}
        async with webhook.serve_webhook(crd_kube, settings) as second:
            assert second.bundle == first.bundle
        secret = await crd_kube.get(
            path_of(plural="secrets", namespace=namespace, name=settings.cert_secret)
        )
        assert secret["type"] == "kubernetes.io/tls"
        cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert "127.0.0.1" in {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    finally:
        await crd_kube.delete(f"{VWCS}/{settings.configuration_name}")


async def test_the_certificate_secret_is_owned_by_the_validator_deployment(
    crd_kube: Kube, namespace: str
) -> None:
    """helm uninstall deletes the validator's Deployment; the garbage collector then deletes
    the Secret the validator wrote at run time. A Secret written without an owner (an older
    validator) is adopted the next time a validator reads it."""
    deployments = path_of(group="apps", plural="deployments", namespace=namespace)
    labels = {"app": "validator"}
    deployment = {
        "metadata": {"name": "nodewright-validator"},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "v", "image": "example.invalid/v:1"}]},
            },
        },
    }
    owner = await crd_kube.create(deployments, deployment)
    secret_path = path_of(plural="secrets", namespace=namespace, name="validator-tls")
    unowned = _settings(namespace)
    owned = msgspec.structs.replace(unowned, cert_owner="nodewright-validator")
    try:
        async with webhook.serve_webhook(crd_kube, unowned) as first:
            assert await first.ready()
        secret = await crd_kube.get(secret_path)
        assert not secret["metadata"].get("ownerReferences")
        async with webhook.serve_webhook(crd_kube, owned) as second:
            assert second.bundle == first.bundle  # adopted, not re-issued
        secret = await crd_kube.get(secret_path)
        assert [
            (r["kind"], r["name"], r["uid"]) for r in secret["metadata"]["ownerReferences"]
        ] == [("Deployment", "nodewright-validator", owner["metadata"]["uid"])]
        await crd_kube.delete(f"{deployments}/nodewright-validator")

        async def collected() -> bool:
            try:
                await crd_kube.get(secret_path)
            except ApiError as exc:
                return exc.not_found
            return False

        await eventually(collected, timeout_s=60, what="the garbage collector to delete the Secret")
        # An owner that cannot be read is logged and the Secret written without one
        # (admission matters more than clean-up); once it is back, the Secret is adopted.
        async with webhook.serve_webhook(crd_kube, owned) as third:
            assert await third.ready()
        assert not (await crd_kube.get(secret_path))["metadata"].get("ownerReferences")
        again = await crd_kube.create(deployments, deployment)
        async with webhook.serve_webhook(crd_kube, owned):
            pass
        refs = (await crd_kube.get(secret_path))["metadata"]["ownerReferences"]
        assert [r["uid"] for r in refs] == [again["metadata"]["uid"]]
    finally:
        await crd_kube.delete(f"{VWCS}/{unowned.configuration_name}")


async def test_a_blanked_ca_bundle_is_restored(crd_kube: Kube, namespace: str) -> None:
    settings = _settings(namespace, resync_interval_s=0.2)
    try:
        async with webhook.serve_webhook(crd_kube, settings) as hook:
            name = settings.configuration_name
            vwc = await crd_kube.get(f"{VWCS}/{name}")
            for w in vwc["webhooks"]:
                w["clientConfig"].pop("caBundle", None)
            await crd_kube.replace(f"{VWCS}/{name}", vwc)
            assert await _ca_bundle(crd_kube, name) == {b""}

            async def restored() -> bool:
                return await _ca_bundle(crd_kube, name) == {hook.bundle.ca_cert}

            await eventually(restored, timeout_s=20, what="the caBundle to be restored")
    finally:
        await crd_kube.delete(f"{VWCS}/{settings.configuration_name}")


def _open_sockets_on(port: int) -> int:
    """This process's TCP sockets whose local port is ``port`` (from /proc, not from asyncio:
    a socket asyncio lost track of is exactly what this must see)."""
    ours = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                ours.add(target[len("socket:[") : -1])
    count = 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table, encoding="ascii") as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                if local_port == port and fields[9] in ours:
                    count += 1
    return count


async def test_a_stopped_webhook_leaves_no_connection_open(crd_kube: Kube) -> None:
    """The API server keeps TLS connections to the webhook alive; stopping the webhook closes
    every one of them (close_notify included) before it returns, so nothing is left for the
    garbage collector when the event loop ends."""
    settings = _settings("default", resync_interval_s=3600)
    try:
        async with webhook.serve_webhook(crd_kube, settings) as hook:
            # Several reviews, so the API server holds connections to us when we stop.
            for _ in range(3):
                await eventually(lambda: webhook_answers(crd_kube), timeout_s=30, what="a review")
            assert _open_sockets_on(hook.port) >= 1, "the API server is connected"
        assert _open_sockets_on(hook.port) == 0
    finally:
        await crd_kube.delete(f"{VWCS}/{settings.configuration_name}")
