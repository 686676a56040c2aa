"""``core.rest_after``: the pace of a NodeWright's passes (``decision_share``)."""

from __future__ import annotations

import pytest

from services.scheduler import core
from services.scheduler.config import SchedulerSettings, Settings
from shared import config


@pytest.mark.parametrize(
    ("decided_s", "share", "rest_s"),
    [
        (0.1, 0.25, 0.3),  # decisions take a quarter of the time at most
        (0.1, 0.5, 0.1),
        (0.1, 1.0, 0.0),  # a whole core: passes back to back, as before
        (0.0, 0.25, 0.0),  # nothing decided (a lost write's quick retry): no wait
    ],
)
def test_the_next_pass_waits_so_decisions_keep_to_their_share(
    decided_s: float, share: float, rest_s: float
) -> None:
    assert core.rest_after(decided_s, share) == pytest.approx(rest_s)
    decided_then_rested = decided_s + core.rest_after(decided_s, share)
    if decided_then_rested:
        assert decided_s / decided_then_rested == pytest.approx(share)


def test_the_share_is_a_setting_refused_outside_zero_to_one() -> None:
    env = {"NODEWRIGHT_SCHEDULER_DECISION_SHARE": "0.25"}
    assert config.load(Settings, env).scheduler.decision_share == 0.25
    assert SchedulerSettings().decision_share == 0.5
    for bad in ("0", "1.5", "-1"):
        with pytest.raises(config.ConfigError, match="NODEWRIGHT_SCHEDULER_DECISION_SHARE"):
            config.load(Settings, {"NODEWRIGHT_SCHEDULER_DECISION_SHARE": bad})
