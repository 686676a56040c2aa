"""A package's segment pod (apply, its check, config, its check) as the API server returns it
after some of its containers exited, for tests of what readers make of it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

from shared import api, pods, podspec, progress
from shared.podspec import PodRequest

CYCLE: Final = datetime(2026, 1, 1, tzinfo=UTC)
"""The cycle the pod runs in: a package record with ``cycle_started=CYCLE`` is its."""


def segment_pod(
    cr: api.NodeWright, package: str, *codes: int, node: str = "n-1", name: str = "seg"
) -> dict[str, Any]:
    """``package``'s pod on ``node`` running apply then config, attempt 1, whose first
    ``codes`` containers exited with those codes; the next one runs."""
    d = progress.desired(cr)[package]
    req = PodRequest(
        role="stage",
        package=package,
        stage="apply",
        version=d.version,
        attempt=1,
        desired=d,
        name=name,
        cycle=CYCLE.isoformat(),
        stages=("apply", "config"),
    )
    pod = podspec.stage_pod(
        req,
        cr=cr,
        node=node,
        node_annotations={},
        settings=podspec.PodSettings(namespace="nw", agent_image="a:1"),
        node_metadata="{}",
    )
    pod["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    pod["metadata"]["labels"][pods.LABEL_CR] = cr.metadata.name
    names = ["apply", "apply-check", "config", "config-check"]
    states: list[dict[str, Any]] = [
        {"terminated": {"exitCode": c, "finishedAt": f"2026-01-01T00:00:0{i + 1}Z"}}
        for i, c in enumerate(codes)
    ]
    states += [{"running": {}}] + [{"waiting": {}}] * (3 - len(codes))
    named = [{"name": n, "state": st} for n, st in zip(names, states, strict=False)]
    pod["status"] = {
        "phase": "Pending",
        "initContainerStatuses": named[:3],
        "containerStatuses": named[3:],
    }
    return pod
