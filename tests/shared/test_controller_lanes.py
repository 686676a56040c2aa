"""``shared.controller.Controller.watch``: which lane of the work queue an informer's change
puts its keys in. A change (add, update, delete) is fresh work; the informer's periodic
replay of its cache (old and new the same object) is a resync and waits behind it."""

from __future__ import annotations

from typing import Any, cast

from prometheus_client import CollectorRegistry

from shared import runtime
from shared.config import ServiceSettings
from shared.controller import Controller
from shared.informer import Informer


def _controller() -> Controller[str]:
    ctx = runtime.ServiceContext(
        name="svc",
        identity="svc-0",
        settings=ServiceSettings(),
        bus=cast(Any, None),  # neither is used: nothing here runs or calls out
        kube=cast(Any, None),
        registry=CollectorRegistry(),
        supervisor=runtime.Supervisor(name="svc", graceful_timeout_s=1.0),
        health_port=0,
    )

    async def reconcile(key: str) -> float | None:
        return None

    return Controller(ctx=ctx, name="svc", reconcile=reconcile, all_keys=lambda: ())


def _name(old: dict[str, Any] | None, new: dict[str, Any] | None) -> list[str]:
    obj = new or old
    return [obj["metadata"]["name"]] if obj else []


def _node(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}}


async def _order(controller: Controller[str]) -> list[str]:
    queue = controller.queue
    return [await queue._next() for _ in range(len(queue))]


async def test_a_replay_of_the_cache_waits_behind_every_change() -> None:
    c = _controller()
    informer: Informer = c.watch("/api/v1/nodes", to_keys=_name)
    old = _node("replayed", "1")
    informer.on_change(old, old)  # the periodic replay: the very object, twice
    informer.on_change(None, _node("added", "2"))
    informer.on_change(_node("updated", "3"), _node("updated", "4"))
    informer.on_change(_node("deleted", "5"), None)
    assert await _order(c) == ["added", "updated", "deleted", "replayed"]


async def test_a_change_after_a_replay_makes_the_key_fresh_work() -> None:
    c = _controller()
    informer: Informer = c.watch("/api/v1/nodes", to_keys=_name)
    a, b = _node("a", "1"), _node("b", "1")
    informer.on_change(a, a)
    informer.on_change(b, b)
    informer.on_change(b, _node("b", "2"))  # b changed after the replay queued it
    assert await _order(c) == ["b", "a"]
