"""A record of NodeWright's pods as the API server saw them: every creation and phase change
in one namespace, in watch (resourceVersion) order, a stage pod as each of its stages and
checks.
For asserting which stages and checks ran, in what order, on which node."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from shared import pods
from shared.informer import Informer
from shared.kube import Kube, path_of


@dataclass(frozen=True)
class Seen:
    """One watch event of a NodeWright pod, in the API server's order."""

    name: str
    node: str
    role: str
    package: str
    stage: str
    phase: str
    env: dict[str, str]
    added: bool


@dataclass
class PodLog:
    """Every NodeWright pod event in a namespace, in watch (= resourceVersion) order."""

    events: list[Seen] = field(default_factory=list)

    def on_change(self, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        """A stage pod is an entry per part (``shared.pods.parts``): its first stage,
        created with the pod, and each later stage and check, created when it starts."""
        if new is None:
            return
        meta = new["metadata"]
        labels = meta.get("labels") or {}
        spec = new.get("spec") or {}
        containers = {
            c["name"]: c for c in [*(spec.get("initContainers") or []), *spec["containers"]]
        }
        before = {(p.role, p.stage): p.phase for p in pods.parts(old)} if old is not None else {}
        for i, part in enumerate(pods.parts(new)):
            if i > 0 and part.phase == "Pending":
                continue  # not started: a part before it runs
            was = before.get((part.role, part.stage or labels.get(pods.LABEL_STAGE, "")))
            if was == part.phase:
                continue  # only creations and phase changes matter here
            started = was is None or (i > 0 and was == "Pending")
            container = containers.get(part.container) or spec["containers"][0]
            self.events.append(
                Seen(
                    name=meta["name"],
                    node=str(spec.get("nodeName", "")),
                    role=part.role,
                    package=labels.get(pods.LABEL_PACKAGE, ""),
                    stage=part.stage or labels.get(pods.LABEL_STAGE, ""),
                    phase=part.phase,
                    env={e["name"]: str(e.get("value", "")) for e in container.get("env") or []},
                    added=started,
                )
            )

    def created(self, since: int = 0, **match: str) -> list[Seen]:
        """Pods created after event ``since``, one entry per pod, matching ``match``."""
        return [
            e
            for e in self.events[since:]
            if e.added and all(getattr(e, k) == v for k, v in match.items())
        ]

    def index(self, pred: Any) -> int:
        return next(i for i, e in enumerate(self.events) if pred(e))


@contextlib.asynccontextmanager
async def pod_log(kapi: Kube, namespace: str) -> AsyncIterator[PodLog]:
    log = PodLog()
    informer = Informer(
        kube=kapi,
        path=path_of(plural="pods", namespace=namespace),
        on_change=log.on_change,
        label_selector=f"{pods.LABEL_MANAGED}={pods.MANAGED_BY}",
        name="pod-log",
    )
    task = asyncio.create_task(informer.run(), name="pod-log")
    try:
        await asyncio.wait_for(informer.synced.wait(), 30)
        yield log
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
