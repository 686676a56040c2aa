"""An outage is two warnings, whatever the number of failed attempts in between."""

from __future__ import annotations

import logging

import pytest

from shared.outages import Outage


def test_an_outage_is_one_warning_when_it_starts_and_one_with_its_duration_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    outage = Outage(
        lost="Lost it", back="Back again", log=logging.getLogger("t"), clock=lambda: now[0]
    )
    caplog.set_level(logging.DEBUG, logger="t")
    outage.answered()  # answering while nothing is lost says nothing
    for _ in range(50):
        outage.failed("connection refused")
        now[0] += 1
    outage.answered()
    outage.answered()
    warnings = [
        (r.getMessage(), r.__dict__) for r in caplog.records if r.levelno == logging.WARNING
    ]
    assert [m for m, _ in warnings] == ["Lost it", "Back again"]
    assert warnings[0][1]["error"] == "connection refused"
    assert warnings[1][1]["outage_s"] == 50.0
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 49
    outage.failed("again")
    assert outage.outages == 2
