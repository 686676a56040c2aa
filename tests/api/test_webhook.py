"""The webhook's certificates, configuration and HTTP handling, without an API server.

The lookups port is faked here (it is ours); the rig suite runs the same server against the
real API server over TLS.
"""

from __future__ import annotations

import base64
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from services.validator import certs, pki, webhook
from shared import api
from shared.kube import ApiError
from tests.api.test_models import EXAMPLE

NOW = datetime(2030, 1, 1, tzinfo=UTC)
SETTINGS = webhook.WebhookSettings(url="https://127.0.0.1:{port}", cert_secret="")


def test_the_serving_certificate_is_signed_by_the_ca_and_names_the_hosts() -> None:
    bundle = pki.issue(("127.0.0.1", "svc.ns.svc"), now=NOW, validity=timedelta(days=30))
    ca = x509.load_pem_x509_certificate(bundle.ca_cert)
    cert = x509.load_pem_x509_certificate(bundle.cert)
    cert.verify_directly_issued_by(ca)
    assert bundle.covers(("127.0.0.1", "svc.ns.svc"))
    assert not bundle.covers(("other.ns.svc",))
    assert bundle.expires() == NOW + timedelta(days=30)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    key = ca.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey)


async def test_an_issued_bundle_is_described_and_facts_of_other_chains_are_not_believed() -> None:
    bundle = await certs.issue(("127.0.0.1", "svc.ns.svc"), now=NOW, validity=timedelta(days=30))
    assert bundle.is_described()
    assert bundle.facts == pki.facts_of(bundle)
    assert bundle.facts is not None
    assert bundle.facts.hosts == ("svc.ns.svc", "127.0.0.1")
    assert bundle.facts.ca_expires == NOW + timedelta(days=3650)
    # Facts written for another chain (a hand-edited Secret) are not believed: the bundle
    # must be described again, from its own certificates.
    other = pki.issue(("elsewhere",), now=NOW, validity=timedelta(days=1))
    lying = msgspec.structs.replace(bundle, facts=other.facts)
    assert not lying.is_described()
    with pytest.raises(ValueError, match="describe it first"):
        lying.covers(("svc.ns.svc",))
    told = await certs.describe(lying)
    assert told.described() == bundle.facts
    assert told.covers(("svc.ns.svc",))
    assert told.expires() == NOW + timedelta(days=30)
    assert await certs.describe(told) is told, "a described bundle needs no child process"


def test_the_validator_issues_and_judges_certificates_without_loading_cryptography(
    tmp_path: Path,
) -> None:
    """Issue 15: ``cryptography`` adds about 10 MB to a process for good. The validator makes
    its first chain, reads an undescribed one and judges a described one with it loaded
    only in a child process."""
    bundle = pki.issue(("svc.ns.svc",), now=NOW, validity=timedelta(days=30))
    saved = tmp_path / "bundle.json"
    saved.write_bytes(msgspec.json.encode(msgspec.structs.replace(bundle, facts=None)))
    script = f"""
import asyncio, sys, msgspec
from datetime import datetime, UTC
import services.validator.service
from services.validator import webhook
from services.validator.certs import CertBundle
settings = webhook.WebhookSettings(url="https://127.0.0.1:{{port}}", cert_secret="")
now = datetime(2030, 1, 1, tzinfo=UTC)
fresh = asyncio.run(webhook._current_bundle(None, None, settings, now))
assert fresh.covers(webhook.hosts_for(settings)), fresh.facts
kept = asyncio.run(webhook._current_bundle(None, fresh, settings, now))
assert kept is fresh, "a chain still good is kept"
bare = msgspec.json.decode(open({str(saved)!r}, "rb").read(), type=CertBundle)
read = asyncio.run(webhook._described(bare, None))
assert read.covers(("svc.ns.svc",)) and read.expires().year == 2030
loaded = sorted(m for m in sys.modules if m.split(".")[0] == "cryptography")
assert not loaded, loaded
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


async def test_a_served_chain_keeps_its_facts_for_the_same_chain_read_again() -> None:
    served = pki.issue(("svc.ns.svc",), now=NOW, validity=timedelta(days=30))
    reread = msgspec.structs.replace(served, facts=None)
    got = await webhook._described(reread, served)
    assert got is not None
    assert got.facts == served.facts


async def test_a_failing_certificate_child_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "executable", "/bin/false")
    failed = r"/bin/false -m services.validator.pki\) exited 1: no message"
    with pytest.raises(certs.CertificateError, match=failed):
        await certs.issue(("a",), now=NOW, validity=timedelta(days=1))


def test_the_certificate_child_refuses_a_bad_request_naming_it() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "services.validator.pki"],
        input=b'{"type": "issue", "hosts": 3}',
        capture_output=True,
    )
    assert done.returncode == 2
    assert b"bad certificate request on stdin" in done.stderr
    assert b"hosts" in done.stderr


def test_reissuing_with_a_ca_keeps_the_ca() -> None:
    first = pki.issue(("a",), now=NOW, validity=timedelta(days=30))
    second = pki.issue(("a",), now=NOW + timedelta(days=29), validity=timedelta(days=30), ca=first)
    assert second.ca_cert == first.ca_cert
    assert second.cert != first.cert


@pytest.mark.parametrize(
    ("age", "hosts_change", "renew"),
    [
        pytest.param(timedelta(days=1), False, False, id="fresh"),
        pytest.param(timedelta(days=340), False, True, id="inside-renewal-window"),
        pytest.param(timedelta(days=1), True, True, id="new-host"),
    ],
)
def test_renewal_is_due_near_expiry_or_for_new_hosts(
    age: timedelta, hosts_change: bool, renew: bool
) -> None:
    bundle = pki.issue(
        webhook.hosts_for(SETTINGS), now=NOW, validity=timedelta(days=SETTINGS.cert_validity_days)
    )
    settings = (
        msgspec.structs.replace(SETTINGS, service_name="renamed") if hosts_change else SETTINGS
    )
    assert webhook._needs_new(bundle, settings, NOW + age) is renew


def test_hosts_cover_the_service_names_and_the_url_host() -> None:
    assert webhook.hosts_for(SETTINGS) == (
        "127.0.0.1",
        "nodewright-validator.nodewright-system.svc",
        "nodewright-validator",
        "nodewright-validator.nodewright-system",
        "nodewright-validator.nodewright-system.svc.cluster.local",
    )


def test_configuration_calls_the_service_or_the_url() -> None:
    by_service = webhook.configuration(webhook.WebhookSettings(), ca_bundle=b"CA", port=9443)
    hook = by_service["webhooks"][0]
    assert hook["clientConfig"] == {
        "service": {
            "name": "nodewright-validator",
            "namespace": "nodewright-system",
            "port": 443,
            "path": webhook.NODEWRIGHTS_PATH,
        },
        "caBundle": base64.b64encode(b"CA").decode(),
    }
    assert hook["failurePolicy"] == "Fail"
    assert hook["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    by_url = webhook.configuration(SETTINGS, ca_bundle=b"", port=4443)
    policies = by_url["webhooks"][1]
    assert policies["clientConfig"] == {
        "url": f"https://127.0.0.1:4443{webhook.DEPLOYMENT_POLICIES_PATH}"
    }
    assert policies["rules"][0]["operations"] == ["CREATE", "UPDATE", "DELETE"]


def test_configuration_comparison_ignores_server_defaults() -> None:
    desired = webhook.configuration(SETTINGS, ca_bundle=b"CA", port=1)
    served = msgspec.json.decode(msgspec.json.encode(desired))
    for hook in served["webhooks"]:
        hook["namespaceSelector"] = {}
        hook["objectSelector"] = {}
    assert webhook._contains(served["webhooks"], desired["webhooks"])
    served["webhooks"][0]["clientConfig"]["caBundle"] = ""
    assert not webhook._contains(served["webhooks"], desired["webhooks"])


class FakeLookups:
    """The lookups port over fixed data; ``broken`` makes every lookup fail like the API."""

    def __init__(self, *, policies: set[str], users: dict[str, list[str]], broken: bool = False):
        self.policies = policies
        self.users = users
        self.broken = broken

    async def policy_exists(self, name: str) -> bool:
        self._maybe_fail()
        return name in self.policies

    async def nodewrights_using(self, policy: str) -> list[str]:
        self._maybe_fail()
        return self.users.get(policy, [])

    def _maybe_fail(self) -> None:
        if self.broken:
            raise ApiError(503, "ServiceUnavailable", "etcd is down")


@pytest.fixture
async def client() -> AsyncIterator[TestClient[web.Request, web.Application]]:
    lookups = FakeLookups(policies={"exists"}, users={"used": ["nw-1"]})
    async with TestClient(TestServer(webhook.make_app(lookups=lookups, timeout_s=2))) as c:
        yield c


def _review(
    operation: str, obj: dict[str, Any] | None, old: dict[str, Any] | None = None
) -> dict[str, Any]:
    kind = (obj or old or {}).get("kind", "")
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0b7c",
            "kind": {"group": api.GROUP, "version": api.VERSION, "kind": kind},
            "operation": operation,
            "name": ((obj or old or {}).get("metadata") or {}).get("name", ""),
            "object": obj,
            "oldObject": old,
        },
    }


def _with_policy(name: str) -> dict[str, Any]:
    doc = msgspec.json.decode(msgspec.json.encode(EXAMPLE))
    del doc["spec"]["interruptionBudget"]
    doc["spec"]["deploymentPolicy"] = name
    return dict(doc)


POLICY = {
    "apiVersion": api.API_VERSION,
    "kind": "DeploymentPolicy",
    "metadata": {"name": "used"},
    "spec": {"default": {"budget": {"count": 1}}},
}


@pytest.mark.parametrize(
    ("path", "review", "allowed", "says"),
    [
        pytest.param(webhook.NODEWRIGHTS_PATH, _review("CREATE", EXAMPLE), True, "", id="nw-ok"),
        pytest.param(
            webhook.NODEWRIGHTS_PATH,
            _review("CREATE", _with_policy("exists")),
            True,
            "",
            id="nw-existing-policy",
        ),
        pytest.param(
            webhook.NODEWRIGHTS_PATH,
            _review("CREATE", _with_policy("missing")),
            False,
            "spec.deploymentPolicy: DeploymentPolicy 'missing' does not exist",
            id="nw-missing-policy",
        ),
        pytest.param(
            webhook.DEPLOYMENT_POLICIES_PATH,
            _review("DELETE", None, POLICY),
            False,
            "referenced by spec.deploymentPolicy of NodeWright(s) nw-1",
            id="dp-delete-referenced",
        ),
        pytest.param(
            webhook.DEPLOYMENT_POLICIES_PATH,
            _review("CREATE", POLICY),
            True,
            "",
            id="dp-create",
        ),
        pytest.param(
            webhook.NODEWRIGHTS_PATH,
            _review("CREATE", {**EXAMPLE, "spec": {"packages": {}}}),
            False,
            "does not match the nodewrights schema",
            id="nw-undecodable",
        ),
    ],
)
async def test_reviews_over_http(
    client: TestClient[web.Request, web.Application],
    path: str,
    review: dict[str, Any],
    allowed: bool,
    says: str,
) -> None:
    resp = await client.post(path, json=review)
    assert resp.status == 200
    body = await resp.json()
    assert body["apiVersion"] == "admission.k8s.io/v1"
    assert body["kind"] == "AdmissionReview"
    assert body["response"]["uid"] == "0b7c"
    assert body["response"]["allowed"] is allowed
    if not allowed:
        assert says in body["response"]["status"]["message"]


async def test_a_failed_lookup_denies(caplog: pytest.LogCaptureFixture) -> None:
    lookups = FakeLookups(policies=set(), users={}, broken=True)
    async with TestClient(TestServer(webhook.make_app(lookups=lookups, timeout_s=2))) as c:
        resp = await c.post(webhook.NODEWRIGHTS_PATH, json=_review("CREATE", _with_policy("p")))
        body = await resp.json()
    assert body["response"]["allowed"] is False
    assert "could not check references" in body["response"]["status"]["message"]
    assert "Failed to look up objects for an admission review" in caplog.messages


@pytest.mark.parametrize("payload", [b"not json", b'{"kind": "AdmissionReview"}'])
async def test_garbage_is_a_bad_request(
    client: TestClient[web.Request, web.Application], payload: bytes
) -> None:
    resp = await client.post(webhook.NODEWRIGHTS_PATH, data=payload)
    assert resp.status == 400


async def test_the_tls_chain_verifies_for_the_url_host(tmp_path: Path) -> None:
    bundle = pki.issue(
        webhook.hosts_for(SETTINGS), now=datetime.now(UTC), validity=timedelta(days=2)
    )
    hook = webhook.Webhook(port=0, bundle=bundle, files=tmp_path)
    hook.load(bundle)
    assert (tmp_path / "tls.key").stat().st_mode & 0o077 == 0
    lookups = FakeLookups(policies=set(), users={})
    runner = web.AppRunner(webhook.make_app(lookups=lookups, timeout_s=2))
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=hook.ssl_context)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        trust = ssl.create_default_context(cadata=bundle.ca_cert.decode())
        async with aiohttp.ClientSession() as session:
            url = f"https://127.0.0.1:{port}{webhook.NODEWRIGHTS_PATH}"
            async with session.post(url, json=_review("CREATE", EXAMPLE), ssl=trust) as resp:
                assert (await resp.json())["response"]["allowed"] is True
            other = ssl.create_default_context(
                cadata=pki.issue(("x",), now=NOW, validity=timedelta(days=1)).ca_cert.decode()
            )
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await session.post(url, json={}, ssl=other)
    finally:
        await runner.cleanup()
