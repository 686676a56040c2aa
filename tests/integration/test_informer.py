"""The informer's cache against a real API server: a write-through never brings back what the
watch saw deleted; informers sharing one watch each see every change."""

from __future__ import annotations

import asyncio
import copy

import pytest

from shared.informer import Informer, InformerHub, OnChange, running, wait_synced
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


async def test_a_follower_sees_every_change_of_its_leader_s_one_watch_and_keeps_its_own_writes(
    kapi: Kube, namespace: str
) -> None:
    """Services sharing a process (python -m services) share one list and watch per
    collection: each still sees every change, and a write-through stays its own."""
    collection = path_of(plural="configmaps", namespace=namespace)
    await kapi.create(collection, {"metadata": {"name": "before"}, "data": {"a": "1"}})
    seen: dict[str, list[tuple[JSON | None, JSON | None]]] = {"leader": [], "follower": []}
    hub = InformerHub()

    def recorder(who: str) -> OnChange:
        return lambda old, new: seen[who].append((old, new))

    leader = Informer(kube=kapi, path=collection, on_change=recorder("leader"))
    follower = Informer(kube=kapi, path=collection, on_change=recorder("follower"))
    hub.attach(leader)
    hub.attach(follower)
    other = Informer(kube=kapi, path=collection, label_selector="x=y", on_change=print)
    hub.attach(other)
    with pytest.raises(ValueError, match="cannot follow"):
        other.follow(leader)  # another selector is another cache
    leader_run = asyncio.create_task(leader.run())
    follower_run = asyncio.create_task(follower.run())
    try:
        await wait_synced(leader, follower)
        key = f"{namespace}/before"
        assert follower.get(key) is leader.get(key), "one decoded object, two stores"
        assert leader.lists == follower.lists == 1
        # A write-through of the follower's: an object as a write of its returned it, under a
        # name the watch never brings (a real write's version can reach the leader's watch
        # while the write is still being answered), so what is asserted does not race it.
        written = copy.deepcopy(leader.get(key) or {})
        written["metadata"]["name"] = "written"
        follower.observe(written)
        assert follower.get(f"{namespace}/written") is not None
        assert leader.get(f"{namespace}/written") is None, "the follower's write-through"
        await kapi.create(collection, {"metadata": {"name": "after"}, "data": {"b": "1"}})
        await kapi.delete(path_of(plural="configmaps", namespace=namespace, name="before"))

        async def both_saw_it() -> bool:
            return all(
                informer.get(f"{namespace}/after") is not None and informer.get(key) is None
                for informer in (leader, follower)
            )

        await eventually(both_saw_it, what="both to see the create and the delete")
        assert [(o is None, n is None) for o, n in seen["follower"]] == [
            (o is None, n is None) for o, n in seen["leader"]
        ]
        assert not follower_run.done(), "a follower waits; it makes no request of its own"
    finally:
        for task in (leader_run, follower_run):
            task.cancel()
        await asyncio.gather(leader_run, follower_run, return_exceptions=True)


async def test_the_cache_covers_a_write_once_its_watch_delivered_it_and_never_before_a_list(
    kapi: Kube, namespace: str
) -> None:
    """``covers`` tells whether the cache has every change up to a resourceVersion: the
    drainer declares a node drained only on pods read after the cordon it wrote."""
    collection = path_of(plural="configmaps", namespace=namespace)
    informer = Informer(kube=kapi, path=collection, on_change=lambda old, new: None)
    assert not informer.covers("1"), "an informer that has not listed covers nothing"
    async with running(informer):
        written = await kapi.create(collection, {"metadata": {"name": "w"}, "data": {"a": "1"}})
        rv = str(written["metadata"]["resourceVersion"])

        async def delivered() -> bool:
            return informer.get(f"{namespace}/w") is not None

        await eventually(delivered, what="the watch to deliver the write")
        assert informer.covers(rv)
        assert informer.covers(str(int(rv) - 1))
        assert not informer.covers(str(int(rv) + 10**9)), "a change it cannot have seen yet"
        assert not informer.covers(""), "an unknown version"
        assert not informer.covers("not-a-number"), "a version nobody can compare"
