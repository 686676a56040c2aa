"""The executor service's async shell: wires its resources and root tasks to the supervisor.

Runs package stages on nodes as pods and reports their outcome. Decisions are made by the
pure core; this module only performs I/O.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from services.executor.config import Settings
from shared import runtime

NAME = "executor"


async def build(ctx: runtime.ServiceContext) -> None:
    """Register the service's root tasks with the supervisor."""


def main(environ: Mapping[str, str] | None = None) -> int:
    return runtime.main(
        name=NAME,
        settings_type=Settings,
        build=build,
        environ=os.environ if environ is None else environ,
    )
