"""A record of NodeWright's pods as the API server saw them: every creation and phase change
in one namespace, in watch (resourceVersion) order. For asserting which stages ran, in what
order, on which node."""

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
        if new is None:
            return
        meta = new["metadata"]
        labels = meta.get("labels") or {}
        container = (new.get("spec") or {}).get("containers", [{}])[0]
        phase = str((new.get("status") or {}).get("phase") or "")
        if old is not None and str((old.get("status") or {}).get("phase") or "") == phase:
            return  # only creations and phase changes matter here
        self.events.append(
            Seen(
                name=meta["name"],
                node=str(new["spec"].get("nodeName", "")),
                role=labels.get(pods.LABEL_ROLE, ""),
                package=labels.get(pods.LABEL_PACKAGE, ""),
                stage=labels.get(pods.LABEL_STAGE, ""),
                phase=phase,
                env={e["name"]: str(e.get("value", "")) for e in container.get("env") or []},
                added=old is None,
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
