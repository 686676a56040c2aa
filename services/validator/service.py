"""The validator service's async shell: wires its resources and root tasks to the supervisor.

Judges stage checks and node health, lifts readiness taints, serves admission. Decisions are
made by the pure core; this module only performs I/O.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from services.validator.config import Settings
from shared import runtime

NAME = "validator"


async def build(ctx: runtime.ServiceContext) -> None:
    """Register the service's root tasks with the supervisor."""


def main(environ: Mapping[str, str] | None = None) -> int:
    return runtime.main(
        name=NAME,
        settings_type=Settings,
        build=build,
        environ=os.environ if environ is None else environ,
    )
