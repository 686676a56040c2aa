"""Metrics that several services make in one registry, made once per registry.

Each service creates its publisher's and consumers' counters from its own registry; when
services share a process (``python -m services``) they share its registry, and a second
``Counter`` of the same name would be refused. :func:`once` hands out the first one instead,
so the services' series add up under one name, told apart by their labels (the consumer).
Which metrics exist and what they mean is their owners' business.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar
from weakref import WeakKeyDictionary

from prometheus_client import CollectorRegistry

C = TypeVar("C")

_made: WeakKeyDictionary[CollectorRegistry, dict[str, Any]] = WeakKeyDictionary()


def once(registry: CollectorRegistry | None, name: str, make: Callable[[], C]) -> C:
    """The collector ``name`` of ``registry``, made by ``make`` the first time."""
    if registry is None:
        return make()
    made = _made.setdefault(registry, {})
    if name not in made:
        made[name] = make()
    collector: C = made[name]
    return collector
