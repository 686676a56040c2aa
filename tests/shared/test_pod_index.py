"""``shared.controller.PodIndex``: the pods of a (cr, node) key, and what each runs
(``shared.pods.parts``) read once per version of the pod, never a stale version."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from shared import pods
from shared.controller import PodIndex
from shared.informer import key_of
from tests.helpers.facts import nodewright
from tests.helpers.segment import segment_pod

PKG = "nvidia-tuned"


def _pod(*codes: int, rv: str) -> dict[str, Any]:
    pod = segment_pod(nodewright(), PKG, *codes, node="n-1")
    pod["metadata"]["resourceVersion"] = rv
    return pod


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The resourceVersions ``pods.parts`` was called on."""
    seen: list[str] = []
    real = pods.parts

    def counting(pod: dict[str, Any]) -> tuple[pods.PodView, ...]:
        seen.append(pod["metadata"].get("resourceVersion", ""))
        return real(pod)

    monkeypatch.setattr(pods, "parts", counting)
    return seen


def test_a_pod_is_read_once_per_version_and_again_when_it_changes(reads: list[str]) -> None:
    index = PodIndex()
    store: dict[str, dict[str, Any]] = {}
    first = _pod(rv="10")
    store[key_of(first)] = first
    index.on_change(None, first)
    key = PodIndex.key_of_pod(first)
    assert key is not None

    got = index.parts(key, store.get)
    assert index.parts(key, store.get) == got
    assert reads == ["10"]
    assert [p.phase for p in got][:2] == ["Running", "Pending"]

    # The apply container exited 0: a new version, read afresh, never the cached one.
    second = _pod(0, rv="11")
    store[key_of(second)] = second
    index.on_change(first, second)
    again = index.parts(key, store.get)
    assert reads == ["10", "11"]
    assert again != got
    assert [p.phase for p in again][:2] == ["Succeeded", "Running"]


def test_a_pod_without_a_version_is_read_every_time(reads: list[str]) -> None:
    index = PodIndex()
    pod = _pod(rv="")
    index.on_change(None, pod)
    key = PodIndex.key_of_pod(pod)
    assert key is not None
    index.parts(key, {key_of(pod): pod}.get)
    index.parts(key, {key_of(pod): pod}.get)
    assert reads == ["", ""]


def test_a_deleted_pod_leaves_no_parts_and_no_reading_behind(reads: list[str]) -> None:
    index = PodIndex()
    pod = _pod(rv="10")
    store = {key_of(pod): pod}
    index.on_change(None, pod)
    key = PodIndex.key_of_pod(pod)
    assert key is not None
    assert index.parts(key, store.get)
    index.on_change(copy.deepcopy(pod), None)
    del store[key_of(pod)]
    assert index.parts(key, store.get) == []
    assert index.keys() == set()
    assert index._parts == {}  # no reading kept for a pod that is gone
