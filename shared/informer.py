"""List+watch caches of Kubernetes objects, the way client-go's informers keep them.

An :class:`Informer` lists a collection in pages, then watches from the list's
resourceVersion, keeping an in-memory store and calling ``on_change(old, new)`` for every
add, update and delete (``old``/``new`` is None for add/delete). Faults, as client-go's
reflector handles them:

- a watch that ends (its server-side timeout) or breaks (a cut connection, a restarted or
  absent API server) is opened again *from the last resourceVersion seen* (an event or a
  bookmark): nothing is listed again, so a slow API server never stalls the cache behind a
  full LIST, and no change is lost (the API server replays what happened meanwhile);
- only 410 Gone (that resourceVersion was compacted away) lists again, diffing the new list
  against the store so no change is lost;
- retries back off exponentially with jitter, up to :data:`MAX_BACKOFF_S`, so work resumes
  within seconds once the API server is back, and replicas do not retry in lockstep;
- the periodic resync (``resync_s``, jittered) replays the *cache* to ``on_change`` so a
  missed decision is retried; it makes no API call.

:meth:`Informer.observe` writes an object this process just wrote through to the store,
unless the store holds a newer version or the watch saw it deleted since (a bounded set of
tombstones: a response that removed the last finalizer must not bring its object back).

An optional ``transform`` is applied to every object before it is cached (by the list, the
watch and :meth:`Informer.observe`), so a service keeps only the fields it reads; the default
drops managedFields. The outage itself is logged by ``shared.kube.Outage``, once.

Services that share a process (``python -m services``) share each list and watch through an
:class:`InformerHub`: the first informer of a collection (same path, selectors and transform)
lists and watches it and hands every list and event to the others, its *followers*, which
keep stores, write-throughs, tombstones and handlers of their own, so each service sees
exactly what it would see alone, while the process decodes and keeps each object once.

What to do about a change is the caller's business; ``on_change`` must not block.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from shared import nodepins
from shared.kube import JSON, ApiError, Kube

_log = logging.getLogger("nodewright.informer")

OnChange = Callable[[JSON | None, JSON | None], None]
Transform = Callable[[JSON], JSON]

MAX_BACKOFF_S: Final = 5.0

TOMBSTONES: Final = 1024
"""Deletions an informer remembers (key -> the resourceVersion that saw it gone), so that
:meth:`Informer.observe` of a write the watch already saw deleted does not bring it back. A
write's response races its watch events by one request's latency: the recent ones suffice."""
"""The longest wait between two attempts to list or watch: short, so work resumes within
seconds of the API server's return (the requests in between fail fast or time out)."""
PAGE_SIZE: Final = 500
"""Items per LIST page (client-go's reflector uses 500)."""
# Server-side watch duration; the stream is re-opened from the last resourceVersion after it.
_WATCH_TIMEOUT_S = 240


def key_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else str(meta["name"])


def strip_managed_fields(obj: JSON) -> JSON:
    """The default transform: managedFields are large and never read by NodeWright."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


LAST_APPLIED: Final = "kubectl.kubernetes.io/last-applied-configuration"


def slim_node(obj: JSON) -> JSON:
    """The transform of every service's node cache: the metadata (but managedFields and
    kubectl's last-applied copy of an older object) and the spec whole, and of the status
    only what NodeWright reads, its conditions and boot ID (``shared.progress``). A real
    node's status is mostly its image list and capacities, several times all the rest: at
    thousands of nodes in five processes they would dominate the services' memory (issue
    15)."""
    obj = strip_managed_fields(obj)
    annotations = (obj.get("metadata") or {}).get("annotations")
    if isinstance(annotations, dict) and annotations.pop(LAST_APPLIED, None) is not None:
        # The annotations are no longer what the API server has: no write may pin them.
        obj[nodepins.TRIMMED] = True
    status = obj.get("status")
    if isinstance(status, dict):
        boot_id = (status.get("nodeInfo") or {}).get("bootID") or ""
        obj["status"] = {
            "conditions": status.get("conditions") or [],
            "nodeInfo": {"bootID": boot_id},
        }
    return obj


@dataclass
class Informer:
    kube: Kube
    path: str
    """Collection path, e.g. ``/api/v1/nodes``."""
    on_change: OnChange
    label_selector: str = ""
    field_selector: str = ""
    resync_s: float = 300.0
    """Replay the cache to ``on_change`` about this often (jittered by up to +20 %)."""
    transform: Transform | None = strip_managed_fields
    """Applied to every object before it is cached (None: kept as the API server sent it)."""
    name: str = ""
    page_size: int = PAGE_SIZE
    store: dict[str, JSON] = field(default_factory=dict)
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    rng: random.Random = field(default_factory=random.Random)
    lists: int = 0
    """How many full LISTs this informer made (the first, and one per 410 Gone)."""
    _rv: str = ""
    _tombstones: OrderedDict[str, str] = field(default_factory=OrderedDict)
    _followers: list[Informer] = field(default_factory=list)
    _leader: Informer | None = None

    @property
    def shares(self) -> tuple[str, str, str, Transform | None]:
        """What makes two informers' caches the same: they may share one list and watch."""
        return (self.path, self.label_selector, self.field_selector, self.transform)

    def follow(self, leader: Informer) -> None:
        """Take every list and event from ``leader`` instead of listing and watching."""
        if leader.shares != self.shares or leader._leader is not None or leader is self:
            raise ValueError(f"informer {self.name or self.path} cannot follow {leader.name}")
        self._leader = leader
        leader._followers.append(self)

    @property
    def _members(self) -> list[Informer]:
        return [self, *self._followers]

    def get(self, key: str) -> JSON | None:
        return self.store.get(key)

    def _shape(self, obj: JSON) -> JSON:
        return self.transform(obj) if self.transform is not None else obj

    def observe(self, obj: JSON) -> None:
        """Write-through: store an object this process just wrote, unless the cache already
        holds a newer version. Without it, a decision right after a write would read the
        pre-write object until the watch catches up (e.g. count a budget slot as free)."""
        obj = self._shape(obj)
        key = key_of(obj)
        old = self.store.get(key)
        if old is not None and _newer_or_same(old, obj):
            return
        gone_at = self._tombstones.get(key)
        if old is None and gone_at is not None and _at_or_after(gone_at, _rv_of(obj)):
            # The watch saw it deleted after this write (e.g. the write removed the last
            # finalizer): stored, it would stay in the cache for good (CI: a NodeWright
            # the scheduler finalized was never seen gone, so its outboxes stayed).
            return
        self.store[key] = obj

    def values(self) -> list[JSON]:
        return list(self.store.values())

    def covers(self, resource_version: str) -> bool:
        """Whether the cache has every change up to ``resource_version`` (:attr:`progress` is
        at or after it), e.g. every pod bound before a write whose answer carried it. False
        when either is unknown or not an integer: then nobody can tell, and the caller reads
        the API server."""
        return bool(resource_version) and _at_or_after(self._rv, resource_version)

    @property
    def progress(self) -> str:
        """The resourceVersion up to which the cache has every change (the last list, watch
        event or bookmark); objects written through by :meth:`observe` may be newer."""
        return self._rv

    def _query(self) -> dict[str, str | int | bool]:
        q: dict[str, str | int | bool] = {}
        if self.label_selector:
            q["labelSelector"] = self.label_selector
        if self.field_selector:
            q["fieldSelector"] = self.field_selector
        return q

    def _next_resync(self) -> float:
        return time.monotonic() + self.resync_s * self.rng.uniform(1.0, 1.2)

    async def run(self) -> None:
        """List and watch until cancelled (a follower waits: its leader feeds it)."""
        if self._leader is not None:
            await asyncio.Event().wait()
        failures = 0
        resync_at = self._next_resync()
        while True:
            try:
                if not self._rv:
                    await self._list()
                    failures = 0
                left = resync_at - time.monotonic()
                if left <= 0:
                    for member in self._members:
                        member._replay()
                    resync_at = self._next_resync()
                    continue
                opened = time.monotonic()
                await self._watch(timeout_s=max(1, int(min(_WATCH_TIMEOUT_S, left))))
                if time.monotonic() - opened >= 1.0:
                    failures = 0
                else:
                    # Closed at once (an API server shutting down): do not spin on it.
                    failures += 1
                    await asyncio.sleep(self._backoff(failures))
            except asyncio.CancelledError:
                raise
            except ApiError as exc:
                if exc.gone:
                    self._rv = ""  # compacted away: only a new list can say what changed
                    continue
                failures += 1
                if not exc.transient:
                    _log.warning(
                        "Failed to list or watch",
                        extra={"informer": self.name or self.path, "error": str(exc)},
                    )
                await asyncio.sleep(self._backoff(failures))
            except Exception as exc:
                failures += 1
                _log.warning(
                    "Failed to list or watch",
                    extra={"informer": self.name or self.path, "error": repr(exc)},
                )
                await asyncio.sleep(self._backoff(failures))

    def _backoff(self, failures: int) -> float:
        ceiling = min(0.2 * 2.0 ** (failures - 1), MAX_BACKOFF_S)
        return ceiling * self.rng.uniform(0.5, 1.0)

    async def _list(self) -> None:
        fresh: dict[str, JSON] = {}
        rv = ""
        async for page in self.kube.list_pages(self.path, self._query(), limit=self.page_size):
            if not rv:
                rv = str((page.get("metadata") or {}).get("resourceVersion") or "")
            for item in page.get("items") or []:
                obj = self._shape(item)
                fresh[key_of(obj)] = obj
        for follower in self._followers:
            follower._take_list(dict(fresh), rv)
        self._take_list(fresh, rv)

    def _take_list(self, fresh: dict[str, JSON], rv: str) -> None:
        self.lists += 1
        old_store = self.store
        self.store = fresh
        self._rv = rv
        for key, obj in fresh.items():
            old = old_store.get(key)
            if old is None or _rv_of(old) != _rv_of(obj):
                self._emit(old, obj)
        for key, old in old_store.items():
            if key not in fresh:
                self._bury(key, rv)
                self._emit(old, None)
        self.synced.set()

    def _replay(self) -> None:
        """The periodic resync: every cached object to the handler again (no API call)."""
        for obj in list(self.store.values()):
            self._emit(obj, obj)

    async def _watch(self, *, timeout_s: int) -> None:
        async for event in self.kube.watch(
            self.path, resource_version=self._rv, timeout_s=timeout_s, **self._query()
        ):
            kind = event.get("type")
            raw = event.get("object") or {}
            if kind == "BOOKMARK":
                rv = _rv_of(raw)
                for member in self._members:
                    member._rv = rv or member._rv
                continue
            obj = self._shape(raw)
            for member in self._members:
                member._take_event(kind == "DELETED", key_of(obj), obj)

    def _take_event(self, deleted: bool, key: str, obj: JSON) -> None:
        self._rv = _rv_of(obj) or self._rv
        if deleted:
            old = self.store.pop(key, None)
            self._bury(key, self._rv)
            self._emit(old, None)
            return
        old = self.store.get(key)
        if old is not None and _rv_of(old) != _rv_of(obj) and _newer_or_same(old, obj):
            return  # a write-through already stored a newer version
        self.store[key] = obj
        self._emit(old, obj)

    def _bury(self, key: str, rv: str) -> None:
        self._tombstones[key] = rv
        self._tombstones.move_to_end(key)
        while len(self._tombstones) > TOMBSTONES:
            self._tombstones.popitem(last=False)

    def _emit(self, old: JSON | None, new: JSON | None) -> None:
        if old is None and new is None:
            return
        try:
            self.on_change(old, new)
        except Exception:
            _log.exception("Informer handler failed", extra={"informer": self.name or self.path})


def _newer_or_same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return _at_or_after(_rv_of(a), _rv_of(b))


def _at_or_after(a: str, b: str) -> bool:
    # resourceVersions are opaque, but every API server in practice uses etcd revisions
    # (integers); when they are not integers the write wins.
    try:
        return int(a) >= int(b)
    except ValueError:
        return False


def _rv_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


async def wait_synced(*informers: Informer, timeout_s: float = 60.0) -> None:
    async with asyncio.timeout(timeout_s):
        for informer in informers:
            await informer.synced.wait()


class InformerHub:
    """The informers of the services sharing a process, by what they cache: the first of a
    collection lists and watches it, later ones follow it (see the module's docstring)."""

    def __init__(self) -> None:
        self._leaders: dict[tuple[str, str, str, Transform | None], Informer] = {}

    def attach(self, informer: Informer) -> None:
        leader = self._leaders.setdefault(informer.shares, informer)
        if leader is not informer:
            informer.follow(leader)


@contextlib.asynccontextmanager
async def running(*informers: Informer) -> Any:
    """Run informers for the duration of the context (tests and tools)."""
    tasks = [asyncio.create_task(i.run(), name=f"informer-{i.name or i.path}") for i in informers]
    try:
        await wait_synced(*informers)
        yield informers
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
