"""The status service's read-only web page: every NodeWright, its compartments and batches,
its nodes by state with their reasons, and a live feed of the event stream.

Served on the service's health port (``shared.health.Pages``), under ``/ui/``:

- ``/ui/`` the page (static HTML, script and style from ``services/status/ui``: no front-end
  build step), or a login form;
- ``/ui/api/overview`` the document the page draws (``services.status.overview``), as JSON;
- ``/ui/api/stream`` server-sent events: ``overview`` (that document, whenever it changes)
  and ``event`` (each stream event as it is published, as one sentence and its kind).

Who may look is Kubernetes' decision, as with kubectl: a request carries a bearer token (an
``Authorization`` header, the ``token`` query parameter once, or the cookie the page then
sets), which must pass a TokenReview, and its user a SubjectAccessReview for ``list`` on
``nodewrights.nodewright.nvidia.com``. A user who may ``kubectl get nodewrights`` may look;
nobody else sees anything but the login form. The cookie holds the token itself (HttpOnly,
SameSite=Strict, Secure over https), so any replica behind the Service can check it; answers
are cached for :data:`AUTH_CACHE_S`. The page sends nothing that changes anything.

Computing the overview is :mod:`services.status.overview`'s job; the caches are the shell's.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any, Final

import msgspec
from aiohttp import web
from nats.aio.msg import Msg

from services.status import kube_events, overview
from shared import api, events, subjects
from shared.bus import Bus
from shared.health import Pages
from shared.kube import ApiError, Kube

_log = logging.getLogger("nodewright.status.webpage")

COOKIE: Final = "nodewright_ui_token"
AUTH_CACHE_S: Final = 30.0
"""How long a token's TokenReview and SubjectAccessReview answers are reused."""
FEED_KEPT: Final = 200
"""Events kept for a page opened later (the feed shows the newest first)."""
FEED_HISTORY: Final = timedelta(minutes=10)
"""How far back the feed starts when the first page opens."""
OVERVIEW_EVERY_S: Final = 1.0
HEARTBEAT_S: Final = 15.0
"""A comment line this often keeps proxies from closing a quiet stream."""
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # The token may be in the first URL: never send it on.
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_STATIC: Final = {"/ui/app.js": "application/javascript", "/ui/style.css": "text/css"}


def _static(name: str) -> str:
    return resources.files("services.status").joinpath("ui", name).read_text()


@dataclass
class Access:
    """Whether a token may look, asked of the API server and remembered for a while."""

    kube: Kube
    _cache: dict[str, tuple[float, str | None]] = field(default_factory=dict)

    async def user(self, token: str) -> str | None:
        """The user of ``token`` if it may list NodeWrights, else None."""
        key = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached is not None and now - cached[0] < AUTH_CACHE_S:
            return cached[1]
        user = await self._ask(token)
        if len(self._cache) > 1024:  # bounded: drop the oldest answers
            for old in sorted(self._cache, key=lambda k: self._cache[k][0])[:512]:
                del self._cache[old]
        self._cache[key] = (now, user)
        return user

    async def _ask(self, token: str) -> str | None:
        review = await self.kube.create(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
        )
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return None
        who = status.get("user") or {}
        name = str(who.get("username") or "")
        sar = await self.kube.create(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": name,
                    "uid": who.get("uid") or "",
                    "groups": who.get("groups") or [],
                    "extra": who.get("extra") or {},
                    "resourceAttributes": {
                        "group": api.GROUP,
                        "resource": api.NODEWRIGHT_PLURAL,
                        "verb": "list",
                    },
                },
            },
        )
        allowed = bool((sar.get("status") or {}).get("allowed"))
        _log.info("Checked web page access", extra={"user": name, "allowed": allowed})
        return name if allowed else None


def line_of(msg: Msg) -> dict[str, Any] | None:
    """A stream message as a line of the feed; None when it does not decode."""
    try:
        event = events.decode(msg.data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return {
        "time": event.at.astimezone(UTC).isoformat(timespec="seconds"),
        "kind": event.kind,
        "nodewright": event.cr,
        "node": event.node or "",
        "type": kube_events.type_of(event.kind),
        "text": kube_events.describe(event),
    }


@dataclass
class Feed:
    """One ordered consumer of the event stream, started when the first page opens, whose
    lines go to every open page (a slow page loses lines, never slows the others)."""

    bus: Bus
    kept: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=FEED_KEPT))
    pages: set[asyncio.Queue[dict[str, Any]]] = field(default_factory=set)
    _sub: Any = None
    _starting: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def _on(self, msg: Msg) -> None:
        line = line_of(msg)
        if line is None:
            return
        self.kept.append(line)
        for queue in self.pages:
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(line)

    async def start(self) -> None:
        from nats.js.api import DeliverPolicy

        async with self._starting:
            if self._sub is not None:
                return
            since = datetime.now(UTC) - FEED_HISTORY
            self._sub = await self.bus.js.subscribe(
                f"{subjects.EVENTS}.>",
                stream=self.bus.settings.stream,
                cb=self._on,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.BY_START_TIME,
                config=_start_time(since),
            )

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None


def _start_time(since: datetime) -> Any:
    from nats.js.api import ConsumerConfig

    return ConsumerConfig(opt_start_time=since)


@dataclass
class WebPage:
    """The page's handlers over the status service's caches."""

    access: Access
    feed: Feed
    crs: Callable[[], Iterable[Mapping[str, Any]]]
    nodes: Callable[[], Iterable[Mapping[str, Any]]]
    stopping: asyncio.Event
    _doc: tuple[float, dict[str, Any]] | None = None

    def register(self, pages: Pages) -> None:
        pages.add("GET", "/ui", self.redirect)
        pages.add("GET", "/ui/", self.index)
        pages.add("POST", "/ui/login", self.login)
        pages.add("POST", "/ui/logout", self.logout)
        pages.add("GET", "/ui/api/overview", self.api_overview)
        pages.add("GET", "/ui/api/stream", self.stream)
        for path in _STATIC:
            pages.add("GET", path, self.static)

    def overview(self) -> dict[str, Any]:
        """The document, computed at most once per :data:`OVERVIEW_EVERY_S` for all pages."""
        now = time.monotonic()
        if self._doc is None or now - self._doc[0] >= OVERVIEW_EVERY_S:
            self._doc = (now, overview.document(list(self.crs()), list(self.nodes())))
        return self._doc[1]

    # ---- who is asking ----------------------------------------------------------------

    @staticmethod
    def _token(request: web.Request) -> str:
        header = request.headers.get("Authorization", "")
        if header.lower().startswith("bearer "):
            return header[7:].strip()
        return request.query.get("token") or request.cookies.get(COOKIE) or ""

    async def _user(self, token: str) -> str | None:
        if not token:
            return None
        try:
            return await self.access.user(token)
        except ApiError as exc:
            _log.warning(
                "Failed to check web page access",
                extra={"status": exc.status, "error": exc.message},
            )
            raise web.HTTPServiceUnavailable(
                text="NodeWright cannot ask the API server who you are right now; try again.\n"
            ) from None

    @staticmethod
    def _remember(request: web.Request, response: web.StreamResponse, token: str) -> None:
        response.set_cookie(
            COOKIE,
            token,
            path="/ui",
            httponly=True,
            samesite="Strict",
            secure=request.secure or request.headers.get("X-Forwarded-Proto") == "https",
            max_age=8 * 3600,
        )

    # ---- handlers ---------------------------------------------------------------------

    async def redirect(self, request: web.Request) -> web.StreamResponse:
        where = "/ui/" + (f"?{request.query_string}" if request.query_string else "")
        return web.Response(status=302, headers={"Location": where})

    async def index(self, request: web.Request) -> web.StreamResponse:
        token = self._token(request)
        user = await self._user(token)
        if user is None:
            return self._login_page(wrong=bool(token), status=401 if token else 200)
        if "token" in request.query:
            # Keep the token out of the address bar and history: the cookie has it now.
            return self._see("/ui/", request, token)
        page = _static("index.html").replace("{{user}}", _escape(user))
        return web.Response(text=page, content_type="text/html", headers=SECURITY_HEADERS)

    async def login(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        token = str(form.get("token") or "").strip()
        if await self._user(token) is None:
            return self._login_page(wrong=True, status=401)
        return self._see("/ui/", request, token)

    async def logout(self, request: web.Request) -> web.StreamResponse:
        response = self._see("/ui/", request, "")
        response.del_cookie(COOKIE, path="/ui")
        return response

    def _see(self, where: str, request: web.Request, token: str) -> web.Response:
        """303 to ``where``, remembering ``token`` (if any) in the cookie."""
        response = web.Response(status=303, headers={**SECURITY_HEADERS, "Location": where})
        if token:
            self._remember(request, response, token)
        return response

    def _login_page(self, *, wrong: bool, status: int) -> web.Response:
        page = _static("login.html").replace(
            "{{error}}",
            '<p class="error" id="login-error">That token was refused: it is unknown, '
            "expired, or its user may not list NodeWrights.</p>"
            if wrong
            else "",
        )
        return web.Response(
            text=page, content_type="text/html", status=status, headers=SECURITY_HEADERS
        )

    async def static(self, request: web.Request) -> web.StreamResponse:
        name = request.path.rsplit("/", 1)[1]
        return web.Response(
            text=_static(name), content_type=_STATIC[request.path], headers=SECURITY_HEADERS
        )

    async def _require(self, request: web.Request) -> str:
        user = await self._user(self._token(request))
        if user is None:
            raise web.HTTPUnauthorized(
                text=json.dumps(
                    {"error": "a bearer token whose user may list NodeWrights is needed"}
                ),
                content_type="application/json",
                headers={"WWW-Authenticate": 'Bearer realm="nodewright"'},
            )
        return user

    async def api_overview(self, request: web.Request) -> web.StreamResponse:
        await self._require(request)
        return web.json_response(self.overview(), headers=SECURITY_HEADERS)

    async def stream(self, request: web.Request) -> web.StreamResponse:
        token = self._token(request)
        await self._require(request)
        response = web.StreamResponse(
            headers={
                **SECURITY_HEADERS,
                "Content-Type": "text/event-stream",
                "X-Accel-Buffering": "no",  # nginx: do not buffer the stream
            }
        )
        await response.prepare(request)
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=FEED_KEPT)
        self.feed.pages.add(queue)
        try:
            try:
                await self.feed.start()
            except Exception as exc:  # the stream may not exist yet: the overview still works
                _log.warning("Failed to follow the event stream", extra={"error": repr(exc)})
            for line in list(self.feed.kept):
                await _send(response, "event", line)
            last = ""
            beat = checked = time.monotonic()
            while not self.stopping.is_set():
                doc = json.dumps(self.overview(), separators=(",", ":"))
                if doc != last:
                    await response.write(f"event: overview\ndata: {doc}\n\n".encode())
                    last = doc
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(OVERVIEW_EVERY_S):
                        line = await queue.get()
                        await _send(response, "event", line)
                        while not queue.empty():
                            await _send(response, "event", queue.get_nowait())
                now = time.monotonic()
                if now - beat >= HEARTBEAT_S:
                    await response.write(b": still here\n\n")
                    beat = now
                if now - checked >= AUTH_CACHE_S:
                    # A token revoked or expired meanwhile ends the stream.
                    if await self._user(token) is None:
                        await response.write(b"event: unauthorized\ndata: {}\n\n")
                        break
                    checked = now
        except ConnectionResetError:
            pass  # the page went away
        finally:
            self.feed.pages.discard(queue)
        return response


async def _send(response: web.StreamResponse, name: str, data: Any) -> None:
    await response.write(
        f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
    )


def _escape(text: str) -> str:
    return (
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    )
