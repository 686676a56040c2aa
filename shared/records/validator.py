"""The validator's record on a node: check verdicts and the node's validation
(``validator.nodewright.nvidia.com/<cr>``).

Written only by the validator; every other service reads it through ``shared.progress.NodeFacts``.

Import-linter lets no other service import this module: one writer per record.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from shared.events import Reason
from shared.nodestate import Record

CheckVerdict = Literal["running", "passed", "failed"]


class CheckRecord(Record, frozen=True, kw_only=True, omit_defaults=True):
    verdict: CheckVerdict
    at: datetime
    reason: Reason | None = None
    attempt: int = 1
    """The executor's attempt of the stage this verdict is about: a verdict about an
    earlier attempt (before a retry or rerun) no longer counts."""
    cycle: str = ""
    """The cycle of the stage run this verdict is about (its start, as the stage pod
    carries it): a cycle that comes back to a stage and attempt another one checked (a
    package changed back to a version before the validator wrote again) is not taken for
    checked. Empty in verdicts written before it was recorded."""


class ValidatorRecord(Record, frozen=True, kw_only=True, omit_defaults=True):
    checks: dict[str, CheckRecord] = {}
    """Keyed by ``<package>/<version>/<stage>``."""
    validated: str = ""
    """The target digest for which the whole node was validated."""
    at: datetime | None = None
    reason: Reason | None = None
    honoured: int = 0
    """The newest recovery request (:attr:`Request.seq`) the validator has acted on."""
    reset_boot: str = ""
    """The executor's :attr:`ExecutorRecord.reset_boot` the validator acted on (it forgot
    the node's validation for that reboot)."""
