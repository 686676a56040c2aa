"""A record of NodeWright's pods as the API server saw them: every creation and phase change
in one namespace, in watch (resourceVersion) order, a stage pod as its stage and its check.
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
        """A stage pod is two entries (``shared.pods.parts``): its stage, created with the
        pod, and its check, created when it starts (the stage exited 0)."""
        if new is None:
            return
        meta = new["metadata"]
        labels = meta.get("labels") or {}
        container = (new.get("spec") or {}).get("containers", [{}])[0]
        before = {p.role: p.phase for p in pods.parts(old)} if old is not None else {}
        for part in pods.parts(new):
            if part.role == "check" and part.phase == "Pending":
                continue  # not started: the stage before it runs
            was = before.get(part.role)
            if was == part.phase:
                continue  # only creations and phase changes matter here
            started = was is None or (part.role == "check" and was == "Pending")
            self.events.append(
                Seen(
                    name=meta["name"],
                    node=str(new["spec"].get("nodeName", "")),
                    role=part.role,
                    package=labels.get(pods.LABEL_PACKAGE, ""),
                    stage=labels.get(pods.LABEL_STAGE, ""),
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
