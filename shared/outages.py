"""Outages of a dependency (the API server, NATS) logged the way an operator reads them:
one warning when it stops answering (the first failure), one when it answers again (with
the outage's duration), nothing per failed attempt in between.

Not this module's job: retrying (each client backs off on its own) or deciding what a
failure means for the work (the services' shells).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Outage:
    lost: str
    """The constant message of the first warning, e.g. "Lost the Kubernetes API server"."""
    back: str
    """The constant message of the second, e.g. "Reached the Kubernetes API server again"."""
    log: logging.Logger
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    since: float | None = None
    """When the current outage started (None: the dependency answers)."""
    outages: int = 0

    def failed(self, error: str) -> None:
        if self.since is None:
            self.since = self.clock()
            self.outages += 1
            self.log.warning(self.lost, extra={"error": error})
        else:
            self.log.debug(self.lost, extra={"error": error})

    def answered(self) -> None:
        if self.since is not None:
            duration = self.clock() - self.since
            self.since = None
            self.log.warning(self.back, extra={"outage_s": round(duration, 1)})
