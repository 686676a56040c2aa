"""Pacing of the runs that read a whole fleet (``shared.workqueue.rest_after``): the
scheduler's ``decision_share`` and the status service's ``pass_share``."""

from __future__ import annotations

import pytest

from services.scheduler.config import SchedulerSettings, Settings as SchedulerServiceSettings
from services.status.config import Settings as StatusServiceSettings, StatusSettings
from shared import config, workqueue


@pytest.mark.parametrize(
    ("spent_s", "share", "rest_s"),
    [
        (0.1, 0.25, 0.3),  # computing takes a quarter of the time at most
        (0.1, 0.5, 0.1),
        (0.1, 1.0, 0.0),  # a whole core: runs back to back
        (0.0, 0.25, 0.0),  # nothing computed (a lost write's quick retry): no wait
    ],
)
def test_the_next_run_waits_so_computing_keeps_to_its_share(
    spent_s: float, share: float, rest_s: float
) -> None:
    assert workqueue.rest_after(spent_s, share) == pytest.approx(rest_s)
    spent_then_rested = spent_s + workqueue.rest_after(spent_s, share)
    if spent_then_rested:
        assert spent_s / spent_then_rested == pytest.approx(share)


@pytest.mark.parametrize(
    ("variable", "settings", "read", "default"),
    [
        (
            "NODEWRIGHT_SCHEDULER_DECISION_SHARE",
            SchedulerServiceSettings,
            lambda s: s.scheduler.decision_share,
            SchedulerSettings().decision_share,
        ),
        (
            "NODEWRIGHT_STATUS_PASS_SHARE",
            StatusServiceSettings,
            lambda s: s.status.pass_share,
            StatusSettings().pass_share,
        ),
    ],
)
def test_each_share_is_a_setting_refused_outside_zero_to_one(
    variable: str, settings: type[config.ServiceSettings], read: object, default: float
) -> None:
    assert callable(read)
    assert read(config.load(settings, {variable: "0.3"})) == 0.3
    assert read(config.load(settings, {})) == default
    assert 0 < default <= 1
    for bad in ("0", "1.5", "-1"):
        with pytest.raises(config.ConfigError, match=variable):
            config.load(settings, {variable: bad})
