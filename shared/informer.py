"""List+watch caches of Kubernetes objects, the way client-go's informers keep them.

An :class:`Informer` lists a collection, then watches from the list's resourceVersion,
keeping an in-memory store and calling ``on_change(old, new)`` for every add, update and
delete (``old``/``new`` is None for add/delete). A 410 Gone or any watch failure re-lists
(with backoff), diffing the new list against the store so no change is lost; a periodic
full re-list (``resync_s``) also replays every object to ``on_change`` so a missed decision
is retried. A ``transform`` can strip fields before storing (managedFields, large status
parts) to keep memory flat at thousands of nodes. Bookmarks keep the resourceVersion fresh.

What to do about a change is the caller's business; ``on_change`` must not block.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.kube import JSON, ApiError, Kube

_log = logging.getLogger("nodewright.informer")

OnChange = Callable[[JSON | None, JSON | None], None]
Transform = Callable[[JSON], JSON]

_MAX_BACKOFF_S = 30.0
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


@dataclass
class Informer:
    kube: Kube
    path: str
    """Collection path, e.g. ``/api/v1/nodes``."""
    on_change: OnChange
    label_selector: str = ""
    field_selector: str = ""
    resync_s: float = 300.0
    transform: Transform = strip_managed_fields
    name: str = ""
    store: dict[str, JSON] = field(default_factory=dict)
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    _rv: str = ""

    def get(self, key: str) -> JSON | None:
        return self.store.get(key)

    def observe(self, obj: JSON) -> None:
        """Write-through: store an object this process just wrote, unless the cache already
        holds a newer version. Without it, a decision right after a write would read the
        pre-write object until the watch catches up (e.g. count a budget slot as free)."""
        obj = self.transform(obj)
        key = key_of(obj)
        old = self.store.get(key)
        if old is not None and _newer_or_same(old, obj):
            return
        self.store[key] = obj

    def values(self) -> list[JSON]:
        return list(self.store.values())

    def _query(self) -> dict[str, str | int | bool]:
        q: dict[str, str | int | bool] = {}
        if self.label_selector:
            q["labelSelector"] = self.label_selector
        if self.field_selector:
            q["fieldSelector"] = self.field_selector
        return q

    async def run(self) -> None:
        """List and watch until cancelled."""
        backoff = 0.5
        while True:
            try:
                await self._list(replay_all=False)
                backoff = 0.5
                deadline = time.monotonic() + self.resync_s
                while time.monotonic() < deadline:
                    await self._watch(timeout_s=int(min(_WATCH_TIMEOUT_S, self.resync_s)))
                # Periodic resync: re-list and hand every object to the handler again.
                await self._list(replay_all=True)
            except asyncio.CancelledError:
                raise
            except ApiError as exc:
                if not exc.gone:
                    _log.warning(
                        "Failed to list or watch",
                        extra={"informer": self.name or self.path, "error": str(exc)},
                    )
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, _MAX_BACKOFF_S)
            except Exception as exc:
                _log.warning(
                    "Failed to list or watch",
                    extra={"informer": self.name or self.path, "error": repr(exc)},
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)

    async def _list(self, *, replay_all: bool) -> None:
        listed = await self.kube.get(self.path, **self._query())
        fresh = {}
        for item in listed.get("items") or []:
            obj = self.transform(item)
            fresh[key_of(obj)] = obj
        old_store = self.store
        self.store = fresh
        self._rv = str((listed.get("metadata") or {}).get("resourceVersion") or "")
        for key, obj in fresh.items():
            old = old_store.get(key)
            if replay_all or old is None or _rv_of(old) != _rv_of(obj):
                self._emit(old, obj)
        for key, old in old_store.items():
            if key not in fresh:
                self._emit(old, None)
        self.synced.set()

    async def _watch(self, *, timeout_s: int) -> None:
        async for event in self.kube.watch(
            self.path, resource_version=self._rv, timeout_s=timeout_s, **self._query()
        ):
            kind = event.get("type")
            raw = event.get("object") or {}
            if kind == "BOOKMARK":
                self._rv = _rv_of(raw) or self._rv
                continue
            obj = self.transform(raw)
            key = key_of(obj)
            self._rv = _rv_of(obj) or self._rv
            if kind == "DELETED":
                old = self.store.pop(key, None)
                self._emit(old, None)
            else:
                old = self.store.get(key)
                if old is not None and _rv_of(old) != _rv_of(obj) and _newer_or_same(old, obj):
                    continue  # a write-through already stored a newer version
                self.store[key] = obj
                self._emit(old, obj)

    def _emit(self, old: JSON | None, new: JSON | None) -> None:
        if old is None and new is None:
            return
        try:
            self.on_change(old, new)
        except Exception:
            _log.exception("Informer handler failed", extra={"informer": self.name or self.path})


def _newer_or_same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    # resourceVersions are opaque, but every API server in practice uses etcd revisions
    # (integers); when they are not integers the write wins.
    try:
        return int(_rv_of(a)) >= int(_rv_of(b))
    except ValueError:
        return False


def _rv_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


async def wait_synced(*informers: Informer, timeout_s: float = 60.0) -> None:
    async with asyncio.timeout(timeout_s):
        for informer in informers:
            await informer.synced.wait()


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
