"""The validating admission webhook for NodeWright and DeploymentPolicy: TLS, certificates, wiring.

:func:`serve_webhook` serves AdmissionReview v1 over HTTPS with aiohttp and keeps itself
reachable: it owns a self-signed CA and serving certificate (made by ``pki`` in a child
process, ``certs.issue``; kept in a Secret with what they say, ``certs.CertFacts``, so every
replica serves the same chain, the caBundle survives restarts and no replica parses X.509
to know when to renew), writes the caBundle and rules into the
ValidatingWebhookConfiguration it owns (failurePolicy Fail, a short timeout), renews the
serving certificate before it expires and re-asserts the configuration periodically, so a
chart upgrade that blanks the caBundle heals itself.

The decisions are not made here: ``admission`` judges, this module decodes requests, fetches
the lookups it needs (a DeploymentPolicy, the NodeWrights referencing one) and encodes answers.
A lookup that fails denies the request: the same fail-closed stance as failurePolicy Fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import tempfile
from base64 import b64decode, b64encode
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Final, Protocol, TypeVar
from urllib.parse import urlsplit

import aiohttp
import msgspec
from aiohttp import web

from services.validator import admission, certs
from services.validator.certs import CertBundle, CertFacts, digest
from shared import api
from shared.kube import ApiError, Kube, path_of

_log = logging.getLogger("nodewright.validator.webhook")

NODEWRIGHTS_PATH: Final = "/validate/nodewrights"
DEPLOYMENT_POLICIES_PATH: Final = "/validate/deploymentpolicies"
_VWC_PATH: Final = path_of(
    group="admissionregistration.k8s.io", plural="validatingwebhookconfigurations"
)
_CA_KEY: Final = "ca.key"
_FACTS: Final = "nodewright.nvidia.com/certificate"
"""Annotation of the certificate Secret: its :class:`CertFacts` (expiry, hosts, digest)."""
_STARTUP_BACKOFF_MAX_S: Final = 5.0
_T = TypeVar("_T")


class WebhookSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """How the webhook is served and registered (a settings group of the validator)."""

    host: str = "0.0.0.0"
    """Bind address; all interfaces so the API server reaches the pod."""
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 9443
    """HTTPS port; 0 picks a free one (tests)."""
    configuration_name: str = "nodewright-validator"
    """The ValidatingWebhookConfiguration this webhook owns and keeps up to date."""
    service_name: str = "nodewright-validator"
    """Service in front of the validator pods; the API server calls it."""
    namespace: str = "nodewright-system"
    """Namespace of that Service and of the certificate Secret."""
    service_port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 443
    """Port of the Service."""
    url: str = ""
    """When set, the API server calls this URL instead of the Service (out-of-cluster runs and
    tests); ``{port}`` is replaced by the bound port. Its host is added to the certificate."""
    cert_secret: str = "nodewright-validator-tls"
    """Secret holding the CA and serving certificate, shared by replicas; empty keeps them in
    memory only (one replica, a new CA on every start)."""
    cert_owner: str = ""
    """Deployment (in ``namespace``) that owns the certificate Secret, so the garbage
    collector deletes the Secret with it (``helm uninstall``); empty: no owner, the Secret
    stays until deleted by hand."""
    timeout_seconds: Annotated[int, msgspec.Meta(ge=1, le=30)] = 5
    """How long the API server waits for an answer. Short: with failurePolicy Fail a hung
    webhook blocks every write of the two kinds."""
    lookup_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 3.0
    """Budget for the API lookups of one review; below timeout_seconds so we answer in time."""
    cert_validity_days: Annotated[int, msgspec.Meta(ge=2)] = 365
    """Lifetime of a serving certificate."""
    renew_before_days: Annotated[int, msgspec.Meta(ge=1)] = 30
    """Renew the serving certificate (and the CA) this long before it expires."""
    resync_interval_s: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    """How often to re-read the Secret and re-assert the webhook configuration."""


# ---- certificates -------------------------------------------------------------------------


def hosts_for(settings: WebhookSettings) -> tuple[str, ...]:
    """The names the serving certificate must carry: the Service's DNS names and the URL host."""
    svc, ns = settings.service_name, settings.namespace
    hosts = [f"{svc}.{ns}.svc", svc, f"{svc}.{ns}", f"{svc}.{ns}.svc.cluster.local"]
    if settings.url:
        host = urlsplit(settings.url.replace("{port}", "1")).hostname
        if host:
            hosts.insert(0, host)
    return tuple(dict.fromkeys(hosts))


def _needs_new(bundle: CertBundle | None, settings: WebhookSettings, now: datetime) -> bool:
    if bundle is None:
        return True
    due = bundle.expires() - timedelta(days=settings.renew_before_days)
    return now >= due or not bundle.covers(hosts_for(settings))


async def _renewed(
    bundle: CertBundle | None, settings: WebhookSettings, now: datetime
) -> CertBundle:
    ca = bundle
    if ca is not None:
        ca_expires = ca.described().ca_expires
        if now >= ca_expires - timedelta(days=settings.renew_before_days):
            # A new CA changes the caBundle; rare (the CA lives 10 years), and self-healing.
            ca = None
    return await certs.issue(
        hosts_for(settings),
        now=now,
        validity=timedelta(days=settings.cert_validity_days),
        ca=ca,
    )


class _SecretStore:
    """The certificate bundle in a Secret; optimistic concurrency keeps replicas agreeing."""

    def __init__(self, kube: Kube, settings: WebhookSettings) -> None:
        self._kube = kube
        self._path = path_of(plural="secrets", namespace=settings.namespace)
        self._name = settings.cert_secret
        self._owner = settings.cert_owner
        self._owner_path = path_of(
            group="apps", plural="deployments", namespace=settings.namespace, name=self._owner
        )
        self._version = ""
        self._refs: list[dict[str, Any]] = []
        """The stored Secret's owner references (kept when the owner cannot be read)."""

    async def _owner_references(self) -> list[dict[str, Any]] | None:
        """The Secret's owner reference to :attr:`WebhookSettings.cert_owner`; None when no
        owner is configured or it cannot be read (the certificate matters more than its
        clean-up: admission keeps working, the Secret is then left behind on uninstall)."""
        if not self._owner:
            return None
        try:
            owner = await self._kube.get(self._owner_path)
        except ApiError as exc:
            _log.warning(
                "Failed to read the webhook certificate owner",
                extra={"deployment": self._owner, "error": str(exc)},
            )
            return None
        return [
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": self._owner,
                "uid": owner["metadata"]["uid"],
            }
        ]

    async def _refs_to_write(self) -> list[dict[str, Any]]:
        return await self._owner_references() or self._refs

    async def _adopt(self, secret: Mapping[str, Any]) -> None:
        """Give a Secret written without an owner (an older validator, a lost lookup) its
        owner reference, so it is garbage-collected with the Deployment."""
        refs = secret["metadata"].get("ownerReferences") or []
        if not self._owner or any(
            r.get("kind") == "Deployment" and r.get("name") == self._owner for r in refs
        ):
            return
        wanted = await self._owner_references()
        if wanted is None:
            return
        body = {
            "metadata": {
                "resourceVersion": self._version,
                "ownerReferences": [*refs, *wanted],
            }
        }
        try:
            patched = await self._kube.patch(f"{self._path}/{self._name}", body)
        except ApiError as exc:
            if not exc.conflict:
                raise
            return  # another replica changed it; the next pass looks again
        self._version = str(patched["metadata"]["resourceVersion"])
        self._refs = list(patched["metadata"].get("ownerReferences") or [])

    async def load(self) -> CertBundle | None:
        try:
            secret = await self._kube.get(f"{self._path}/{self._name}")
        except ApiError as exc:
            if exc.not_found:
                self._version = ""
                return None
            raise
        self._version = str(secret["metadata"]["resourceVersion"])
        self._refs = list(secret["metadata"].get("ownerReferences") or [])
        await self._adopt(secret)
        data: Mapping[str, str] = secret.get("data") or {}
        said = (secret["metadata"].get("annotations") or {}).get(_FACTS)
        facts = None
        if said:
            # Wrong or stale facts cost nothing but a parse: their digest must match.
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                facts = msgspec.json.decode(said, type=CertFacts)
        try:
            return CertBundle(
                ca_cert=b64decode(data["ca.crt"]),
                ca_key=b64decode(data[_CA_KEY]),
                cert=b64decode(data["tls.crt"]),
                key=b64decode(data["tls.key"]),
                facts=facts,
            )
        except (KeyError, ValueError):
            _log.warning(
                "Ignored malformed webhook certificate Secret", extra={"secret": self._name}
            )
            return None

    async def save(self, bundle: CertBundle) -> CertBundle:
        """Store ``bundle``; if another replica stored one first, return that one instead."""
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {
                "name": self._name,
                "labels": {"app.kubernetes.io/managed-by": "nodewright-validator"},
                "annotations": {_FACTS: msgspec.json.encode(bundle.described()).decode()},
                **({"ownerReferences": refs} if (refs := await self._refs_to_write()) else {}),
            },
            "data": {
                "ca.crt": b64encode(bundle.ca_cert).decode(),
                _CA_KEY: b64encode(bundle.ca_key).decode(),
                "tls.crt": b64encode(bundle.cert).decode(),
                "tls.key": b64encode(bundle.key).decode(),
            },
        }
        try:
            if self._version:
                body["metadata"]["resourceVersion"] = self._version
                saved = await self._kube.replace(f"{self._path}/{self._name}", body)
            else:
                saved = await self._kube.create(self._path, body)
        except ApiError as exc:
            if not exc.conflict:
                raise
            _log.info("Adopted webhook certificate of another replica")
            theirs = await self.load()
            if theirs is None:
                raise
            return theirs
        self._version = str(saved["metadata"]["resourceVersion"])
        return bundle


# ---- webhook configuration ----------------------------------------------------------------


def configuration(settings: WebhookSettings, *, ca_bundle: bytes, port: int) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration this webhook owns (also deploy/webhook/*.yaml)."""

    def client_config(path: str) -> dict[str, Any]:
        cfg: dict[str, Any]
        if settings.url:
            cfg = {"url": settings.url.replace("{port}", str(port)).rstrip("/") + path}
        else:
            cfg = {
                "service": {
                    "name": settings.service_name,
                    "namespace": settings.namespace,
                    "port": settings.service_port,
                    "path": path,
                }
            }
        if ca_bundle:
            cfg["caBundle"] = b64encode(ca_bundle).decode()
        return cfg

    def hook(plural: str, path: str, operations: list[str]) -> dict[str, Any]:
        return {
            "name": f"{plural}.{api.GROUP}",
            "admissionReviewVersions": ["v1"],
            "clientConfig": client_config(path),
            "rules": [
                {
                    "apiGroups": [api.GROUP],
                    "apiVersions": [api.VERSION],
                    "operations": operations,
                    "resources": [plural],
                    "scope": "Cluster",
                }
            ],
            "failurePolicy": "Fail",
            "matchPolicy": "Equivalent",
            "sideEffects": "None",
            "timeoutSeconds": settings.timeout_seconds,
        }

    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {
            "name": settings.configuration_name,
            "labels": {
                "app.kubernetes.io/name": "nodewright",
                "app.kubernetes.io/component": "validator",
            },
        },
        "webhooks": [
            hook(api.NODEWRIGHT_PLURAL, NODEWRIGHTS_PATH, ["CREATE", "UPDATE"]),
            hook(
                api.DEPLOYMENT_POLICY_PLURAL,
                DEPLOYMENT_POLICIES_PATH,
                ["CREATE", "UPDATE", "DELETE"],
            ),
        ],
    }


def _contains(actual: Any, wanted: Any) -> bool:
    """``wanted`` is a sub-document of ``actual`` (the API server adds defaulted fields)."""
    if isinstance(wanted, dict):
        return isinstance(actual, dict) and all(
            _contains(actual.get(k), v) for k, v in wanted.items()
        )
    if isinstance(wanted, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(wanted)
            and all(_contains(a, w) for a, w in zip(actual, wanted, strict=True))
        )
    return bool(actual == wanted)


async def ensure_configuration(kube: Kube, desired: dict[str, Any]) -> bool:
    """Create or patch the ValidatingWebhookConfiguration; True when something was written."""
    name = desired["metadata"]["name"]
    try:
        current = await kube.get(f"{_VWC_PATH}/{name}")
    except ApiError as exc:
        if not exc.not_found:
            raise
        try:
            await kube.create(_VWC_PATH, desired)
            return True
        except ApiError as create_exc:
            if not create_exc.conflict:
                raise
            current = await kube.get(f"{_VWC_PATH}/{name}")
    if _contains(current.get("webhooks"), desired["webhooks"]) and _contains(
        current.get("metadata"), {"labels": desired["metadata"]["labels"]}
    ):
        return False
    # A merge patch replaces the webhooks list wholesale: exactly our two entries remain.
    patch = {"metadata": {"labels": desired["metadata"]["labels"]}, "webhooks": desired["webhooks"]}
    await kube.patch(f"{_VWC_PATH}/{name}", patch, kind="merge")
    return True


# ---- request handling ---------------------------------------------------------------------


class Lookups(Protocol):
    """What a review needs to know about other objects."""

    async def policy_exists(self, name: str) -> bool: ...

    async def nodewrights_using(self, policy: str) -> list[str]: ...


@dataclass(frozen=True)
class KubeLookups:
    """:class:`Lookups` answered by the API server."""

    kube: Kube

    async def policy_exists(self, name: str) -> bool:
        try:
            await self.kube.get(
                path_of(
                    group=api.GROUP,
                    version=api.VERSION,
                    plural=api.DEPLOYMENT_POLICY_PLURAL,
                    name=name,
                )
            )
        except ApiError as exc:
            if exc.not_found:
                return False
            raise
        return True

    async def nodewrights_using(self, policy: str) -> list[str]:
        # Tens of NodeWrights per cluster at most: a full list is cheap and never stale.
        found = await self.kube.get(
            path_of(group=api.GROUP, version=api.VERSION, plural=api.NODEWRIGHT_PLURAL)
        )
        return sorted(
            str(item["metadata"]["name"])
            for item in found.get("items") or ()
            if (item.get("spec") or {}).get("deploymentPolicy") == policy
        )


_LOOKUP_ERRORS: Final = (ApiError, TimeoutError, aiohttp.ClientError)


async def _review_nodewright(
    request: admission.AdmissionRequest, lookups: Lookups
) -> admission.Verdict:
    new = admission.decode_object(request.object, api.NodeWright)
    old = admission.decode_object(request.old_object, api.NodeWright)
    policies: frozenset[str] = frozenset()
    wanted = new.spec.deployment_policy if new is not None else None
    if wanted is not None and await lookups.policy_exists(wanted):
        policies = frozenset({wanted})
    return admission.review_nodewright(
        operation=request.operation,
        old=old,
        new=new,
        existing_policies=policies,
        inventory=admission.inventory_from_status(old.status) if old is not None else {},
    )


async def _review_policy(
    request: admission.AdmissionRequest, lookups: Lookups
) -> admission.Verdict:
    new = admission.decode_object(request.object, api.DeploymentPolicy)
    old = admission.decode_object(request.old_object, api.DeploymentPolicy)
    users: list[str] = []
    if request.operation == "DELETE":
        users = await lookups.nodewrights_using(request.name)
    return admission.review_deployment_policy(
        operation=request.operation, old=old, new=new, referenced_by=users
    )


async def review(
    request: admission.AdmissionRequest, *, plural: str, lookups: Lookups, timeout_s: float
) -> admission.AdmissionReviewResponse:
    """Answer one AdmissionRequest for ``plural`` (nodewrights or deploymentpolicies)."""
    uid = request.uid
    judge = _review_nodewright if plural == api.NODEWRIGHT_PLURAL else _review_policy
    try:
        async with asyncio.timeout(timeout_s):
            verdict = await judge(request, lookups)
    except msgspec.ValidationError as exc:
        return admission.denial(uid, "object", f"does not match the {plural} schema: {exc}")
    except _LOOKUP_ERRORS as exc:
        _log.warning(
            "Failed to look up objects for an admission review",
            extra={"plural": plural, "object_name": request.name, "error": str(exc)},
        )
        return admission.denial(
            uid, "metadata.name", f"the validator could not check references ({exc}); retry"
        )
    _log.info(
        "Admitted request" if verdict.allowed else "Denied request",
        extra={
            "plural": plural,
            "object_name": request.name,
            "operation": request.operation,
            "uid": uid,
            "dry_run": request.dry_run,
            "violations": [v.field for v in verdict.violations],
        },
    )
    return admission.respond(uid, verdict)


def make_app(*, lookups: Lookups, timeout_s: float) -> web.Application:
    """The aiohttp application answering AdmissionReviews on the two validate paths."""

    def handler(plural: str) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.Response:
            try:
                body = msgspec.json.decode(
                    await request.read(), type=admission.AdmissionReviewRequest
                )
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                return web.Response(status=400, text=f"not an AdmissionReview v1: {exc}\n")
            if body.request is None:
                return web.Response(status=400, text="AdmissionReview without request\n")
            answer = await review(body.request, plural=plural, lookups=lookups, timeout_s=timeout_s)
            return web.Response(body=msgspec.json.encode(answer), content_type="application/json")

        return handle

    app = web.Application()
    app.router.add_post(NODEWRIGHTS_PATH, handler(api.NODEWRIGHT_PLURAL))
    app.router.add_post(DEPLOYMENT_POLICIES_PATH, handler(api.DEPLOYMENT_POLICY_PLURAL))
    return app


# ---- serving ------------------------------------------------------------------------------


@dataclass
class Webhook:
    """A running webhook: where it listens, what it serves, whether it is registered."""

    port: int
    bundle: CertBundle
    registered: bool = False
    files: Path = field(default=Path(), repr=False)
    """Private directory the TLS key and chain are written to (ssl loads only from files)."""
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False)
    """Serves the current bundle; reloaded in place on renewal."""

    async def ready(self) -> bool:
        """Readiness probe: serving, and the configuration carries our caBundle."""
        return self.registered

    def load(self, bundle: CertBundle) -> None:
        """Serve ``bundle`` from now on (new TLS handshakes pick it up)."""
        cert, key = self.files / "tls.crt", self.files / "tls.key"
        # Private files: the key must never be readable by other users of the host.
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(bundle.key)
        cert.write_bytes(bundle.cert + bundle.ca_cert)
        if self.ssl_context is None:
            self.ssl_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.ssl_context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.ssl_context.load_cert_chain(cert, key)
        self.bundle = bundle


async def _current_bundle(
    store: _SecretStore | None, held: CertBundle | None, settings: WebhookSettings, now: datetime
) -> CertBundle:
    bundle = await _described(await store.load() if store is not None else held, held)
    if _needs_new(bundle, settings, now):
        fresh = await _renewed(bundle, settings, now)
        # Another replica's chain when it stored one first.
        bundle = await _described(await store.save(fresh) if store is not None else fresh, held)
        assert bundle is not None
        _log.info("Issued webhook serving certificate", extra={"expires": str(bundle.expires())})
    assert bundle is not None
    return bundle


async def _described(bundle: CertBundle | None, held: CertBundle | None) -> CertBundle | None:
    """``bundle`` with its facts: a chain an older validator or a hand edit stored without
    them is read in a child process, once per chain (the one served keeps them)."""
    if bundle is None or bundle.is_described():
        return bundle
    if held is not None and held.is_described() and digest(held) == digest(bundle):
        return msgspec.structs.replace(bundle, facts=held.facts)
    return await certs.describe(bundle)


async def _answered(call: Callable[[], Awaitable[_T]]) -> _T:
    """``call()``, again after a short backoff while the API server does not answer (a
    replica started during an outage waits for it, unready, instead of exiting with a
    traceback; shared.kube.Outage logs the outage once). Other errors are raised."""
    delay = 0.5
    while True:
        try:
            return await call()
        except ApiError as exc:
            if not exc.transient:
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, _STARTUP_BACKOFF_MAX_S)


async def _maintain(
    hook: Webhook,
    *,
    kube: Kube,
    store: _SecretStore | None,
    settings: WebhookSettings,
    clock: Callable[[], datetime],
) -> None:
    while True:
        await asyncio.sleep(settings.resync_interval_s)
        try:
            bundle = await _current_bundle(store, hook.bundle, settings, clock())
            if bundle != hook.bundle:
                hook.load(bundle)
                _log.info("Reloaded webhook serving certificate")
            desired = configuration(settings, ca_bundle=bundle.ca_cert, port=hook.port)
            if await ensure_configuration(kube, desired):
                _log.info(
                    "Updated ValidatingWebhookConfiguration",
                    extra={"configuration": settings.configuration_name},
                )
            hook.registered = True
        except Exception as exc:
            # Keep serving the chain we have and retry next pass: a maintenance hiccup (API
            # down, a hand-edited Secret) must not take admission down with it.
            _log.warning("Failed to maintain the webhook", extra={"error": str(exc)}, exc_info=exc)


def _utcnow() -> datetime:
    return datetime.now(UTC)


_CLOSE_TIMEOUT_S: Final = 5.0
"""How long a stopping webhook waits for its TLS connections to finish closing. The peer
answers close_notify at once; the bound only matters if it never does."""


async def _connections_closed(server: asyncio.AbstractServer) -> None:
    """Wait until every connection ``server`` accepted has closed its socket.

    aiohttp's cleanup starts the TLS shutdown of each connection (close_notify) and returns
    before the socket closes; on Python 3.11 ``Server.wait_closed`` returns at once once the
    listener is closed, without waiting for them (3.12 waits). A socket still open when the
    event loop ends is never closed: it leaks until the garbage collector finds it.
    """

    # The count of attached transports is the only view 3.11 gives of accepted connections.
    def still_open() -> int:
        count: int = getattr(server, "_active_count", 0)
        return count

    step_s = 0.01
    for _ in range(int(_CLOSE_TIMEOUT_S / step_s)):
        if not still_open():
            return
        await asyncio.sleep(step_s)
    _log.warning(
        "Webhook connections still open after stopping",
        extra={"connections": still_open(), "waited_s": _CLOSE_TIMEOUT_S},
    )


@contextlib.asynccontextmanager
async def serve_webhook(
    kube: Kube, settings: WebhookSettings, *, clock: Callable[[], datetime] = _utcnow
) -> AsyncIterator[Webhook]:
    """Serve the webhook until the context exits; yield the running :class:`Webhook`.

    On entry: load or issue the certificate, start HTTPS, register the configuration. While
    open: renew and re-register every ``resync_interval_s``. The configuration is left in place
    on exit (other replicas keep serving; a Helm uninstall removes it).
    """
    store = _SecretStore(kube, settings) if settings.cert_secret else None
    bundle = await _answered(lambda: _current_bundle(store, None, settings, clock()))
    app = make_app(lookups=KubeLookups(kube), timeout_s=settings.lookup_timeout_s)
    runner = web.AppRunner(app, access_log=None)
    with tempfile.TemporaryDirectory(prefix="nodewright-webhook-") as files:
        hook = Webhook(port=settings.port, bundle=bundle, files=Path(files))
        hook.load(bundle)
        await runner.setup()
        maintainer: asyncio.Task[None] | None = None
        server: asyncio.AbstractServer | None = None
        try:
            # reuse_port: replicas sharing a host (the rig, hostNetwork pods) bind one port and
            # the kernel spreads connections over them, so every replica registers the same
            # endpoint and none rewrites the configuration to point at itself. Only sockets of
            # the same user can share it.
            site = web.TCPSite(
                runner,
                settings.host,
                settings.port,
                ssl_context=hook.ssl_context,
                reuse_port=True,
            )
            await site.start()
            server = site._server
            sockets = getattr(server, "sockets", None) or []
            if sockets:
                hook.port = int(sockets[0].getsockname()[1])
            desired = configuration(settings, ca_bundle=bundle.ca_cert, port=hook.port)
            await _answered(lambda: ensure_configuration(kube, desired))
            hook.registered = True
            _log.info(
                "Serving admission webhook",
                extra={"port": hook.port, "configuration": settings.configuration_name},
            )
            maintainer = asyncio.create_task(
                _maintain(hook, kube=kube, store=store, settings=settings, clock=clock),
                name="webhook-maintainer",
            )
            yield hook
        finally:
            if maintainer is not None:
                maintainer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await maintainer
            await runner.cleanup()
            if server is not None:
                await _connections_closed(server)
