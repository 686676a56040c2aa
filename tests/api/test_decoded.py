"""``shared.api.Decoded``: a cached object is decoded once per resourceVersion."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest

from shared import api


def _cr(version: str, budget: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "nodewright.nvidia.com/v1alpha1",
        "kind": "NodeWright",
        "metadata": {"name": "tuning", "resourceVersion": version},
        "spec": {
            "interruptionBudget": {"count": budget},
            "packages": {"p": {"version": "1.0.0", "image": "registry.example/p"}},
        },
    }


def test_an_object_is_decoded_once_per_resource_version() -> None:
    decode = api.Decoded(api.NodeWright)
    first = decode(_cr("1"))
    assert decode(copy.deepcopy(_cr("1"))) is first
    changed = decode(_cr("2", budget=3))
    assert changed is not first
    assert changed.spec.interruption_budget is not None
    assert changed.spec.interruption_budget.count == 3
    unversioned = _cr("")
    assert decode(unversioned) is not decode(unversioned), "nothing to key it by: decoded"


def test_an_object_that_does_not_decode_raises_on_every_call() -> None:
    decode = api.Decoded(api.NodeWright)
    bad = _cr("5")
    bad["spec"]["packages"] = "not a mapping"
    for _ in range(2):
        with pytest.raises(msgspec.ValidationError, match="packages"):
            decode(bad)
    assert decode(_cr("6")).metadata.name == "tuning", "a fixed object decodes again"
