"""The drainer service's async shell: wires its resources and root tasks to the supervisor.

Cordons, waits for protected pods, drains through the Eviction API, and uncordons. Decisions
are made by the pure core; this module only performs I/O.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from services.drainer.config import Settings
from shared import runtime

NAME = "drainer"


async def build(ctx: runtime.ServiceContext) -> None:
    """Register the service's root tasks with the supervisor."""


def main(environ: Mapping[str, str] | None = None) -> int:
    return runtime.main(
        name=NAME,
        settings_type=Settings,
        build=build,
        environ=os.environ if environ is None else environ,
    )
