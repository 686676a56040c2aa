"""Polling with a deadline, failing with a message that says what was awaited."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import pytest

T = TypeVar("T")


@dataclass(frozen=True)
class Pending:
    """A falsy probe result that says what is still missing, so a timeout names it."""

    what: str

    def __bool__(self) -> bool:
        return False


async def eventually(
    probe: Callable[[], Awaitable[T | Pending]],
    *,
    timeout_s: float = 60.0,
    interval_s: float = 0.2,
    what: str,
) -> T:
    """Poll ``probe`` until it returns a truthy value and return it; fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    last: T | Pending | None = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            assert not isinstance(last, Pending)  # a Pending is always falsy
            return last
        await asyncio.sleep(interval_s)
    pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}; last value: {last!r}")
