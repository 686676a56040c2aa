"""Builders of NodeWright CRs and Node objects for pure-core tests (no I/O)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import msgspec

from shared import api, decisions, nodestate
from shared.events import Reason
from shared.records.scheduler import Selection
from shared.records.status import condition_type

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def nodewright(
    name: str = "gpu-node-tuning",
    *,
    packages: Mapping[str, Mapping[str, Any]] | None = None,
    generation: int = 1,
    annotations: Mapping[str, str] | None = None,
    **spec: Any,
) -> api.NodeWright:
    pkgs = packages or {
        "nvidia-tuned": {
            "version": "0.9.0",
            "image": "ghcr.io/nvidia/nodewright-packages/nvidia-tuned",
        }
    }
    body = {
        "apiVersion": "nodewright.nvidia.com/v1alpha1",
        "kind": "NodeWright",
        "metadata": {
            "name": name,
            "generation": generation,
            "uid": "uid-1",
            "annotations": dict(annotations or {}),
        },
        "spec": {"nodeSelectors": {"matchLabels": {"nodepool": "gpu"}}, "packages": pkgs, **spec},
    }
    return api.from_dict(body, api.NodeWright)


def selection(target: str = "t", **kw: Any) -> Selection:
    """An admission into batch 1 of the default compartment (``kw`` overrides)."""
    fields: dict[str, Any] = {
        "generation": 1,
        "compartment": "__default__",
        "batch": 1,
        "selected_at": T0,
        "disruptive": True,
        "target": target,
        **kw,
    }
    return Selection(**fields)


def node(
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    ready: bool = True,
    unschedulable: bool = False,
    boot_id: str = "boot-1",
    created: str = "2026-01-01T00:00:00Z",
    records: Mapping[str, msgspec.Struct] | None = None,
    taints: list[dict[str, str]] | None = None,
    conditions: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A Node dict; ``records`` maps an owner (nodestate.SCHEDULER ...) to its record for CR
    gpu-node-tuning; ``conditions`` are added after Ready (see :func:`reported`)."""
    annotations = {
        nodestate.key(owner, "gpu-node-tuning"): msgspec.json.encode(rec).decode()
        for owner, rec in (records or {}).items()
    }
    return {
        "metadata": {
            "name": name,
            "labels": {"nodepool": "gpu", **(labels or {})},
            "annotations": annotations,
            "creationTimestamp": created,
            "resourceVersion": "1",
        },
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True" if ready else "False"},
                *(dict(c) for c in conditions),
            ],
            "nodeInfo": {"bootID": boot_id},
        },
    }


R = TypeVar("R", bound=msgspec.Struct)


def written(change: decisions.RecordChange, kind: type[R]) -> R:
    """The record a decision writes; fails the test when the decision keeps or removes it."""
    assert isinstance(change, decisions.Write), f"expected a write, got {change!r}"
    assert isinstance(change.record, kind), change.record
    return change.record


def reported(
    state: str,
    reason: Reason | None = None,
    *,
    since: datetime = T0,
    cr: str = "gpu-node-tuning",
) -> dict[str, Any]:
    """The node condition the status service writes for ``cr``, in the form it writes it:
    reason the state, message ``code: message`` for a Waiting, Blocked or Failed node."""
    stamp = since.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "type": condition_type(cr),
        "status": "True" if state == "Complete" else "False",
        "reason": state,
        "message": f"{reason.code}: {reason.message}" if reason is not None else state,
        "lastTransitionTime": stamp,
        "lastHeartbeatTime": stamp,
    }
