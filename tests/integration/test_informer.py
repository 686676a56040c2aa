"""The informer's cache against a real API server: a write-through never brings back what the
watch saw deleted."""

from __future__ import annotations

from shared.informer import Informer, running
from shared.kube import JSON, Kube, path_of
from tests.helpers.waiting import eventually

FINALIZER = "test.nodewright.nvidia.com/hold"


async def test_a_write_that_removed_the_last_finalizer_does_not_come_back_after_the_delete(
    kapi: Kube, namespace: str
) -> None:
    """CI: the scheduler removed its finalizer from a deleted NodeWright and wrote the PATCH's
    response through to its cache after the watch had delivered the deletion; the NodeWright
    stayed in the cache for good, so the scheduler never tidied what it had left on nodes."""
    collection = path_of(plural="configmaps", namespace=namespace)
    path = path_of(plural="configmaps", namespace=namespace, name="held")
    changes: list[tuple[JSON | None, JSON | None]] = []
    informer = Informer(
        kube=kapi, path=collection, on_change=lambda old, new: changes.append((old, new))
    )
    body = {"metadata": {"name": "held", "finalizers": [FINALIZER]}, "data": {"a": "1"}}
    await kapi.create(collection, body)
    async with running(informer):
        key = f"{namespace}/held"
        await kapi.delete(path)
        written = await kapi.patch(path, {"metadata": {"finalizers": None}})
        assert written["metadata"].get("deletionTimestamp"), "the PATCH answered the last state"

        async def gone() -> bool:
            return informer.get(key) is None

        await eventually(gone, what="the watch to deliver the deletion")
        informer.observe(written)  # the response, processed after the watch event
        assert informer.get(key) is None, "the deleted object came back into the cache"
        assert changes[-1][1] is None, "its last change was the deletion"
        # A new object of that name is cached as usual.
        await kapi.create(collection, {"metadata": {"name": "held"}, "data": {"a": "2"}})
        again = await kapi.patch(path, {"data": {"a": "3"}})
        informer.observe(again)
        cached = informer.get(key)
        assert cached is not None
        assert cached["data"] == {"a": "3"}
