"""``progress.finished_cycles``: a stage still recorded as running whose check has a verdict
for that run reads as succeeded, and a package whose cycle's last stage passed its check
reads as installed, for every service, without a write of the executor for either (issue 15)
— and only then."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from shared import nodestate, progress
from shared.records.executor import ExecutorRecord, PackageRecord
from shared.records.validator import CheckRecord, ValidatorRecord
from tests.helpers.facts import T0, node

CR = "gpu-node-tuning"
LATER = T0 + timedelta(seconds=7)


def _record(stage: str = "config", **kw: Any) -> PackageRecord:
    fields: dict[str, Any] = {
        "version": "2.0.0",
        "stage": stage,
        "state": "succeeded",
        "installed": "1.0.0",
        "previous": "1.0.0",
        "cycle": "upgrade",
        "config": "old-config",
        "config_keys": {"a.conf": "old"},
        "cycle_config": "new-config",
        "cycle_keys": {"a.conf": "new"},
        "reason": None,
        "attempt": 2,
        "updated": T0,
        **kw,
    }
    return PackageRecord(**fields)


def _read(
    rec: PackageRecord, verdict: str = "passed", attempt: int = 2, cycle: str = ""
) -> PackageRecord:
    checks = {
        nodestate.check_key("k", rec.version, rec.stage): CheckRecord(
            verdict=verdict,  # type: ignore[arg-type]
            at=LATER,
            attempt=attempt,
            cycle=cycle,
        )
    }
    records = {
        nodestate.EXECUTOR: ExecutorRecord(packages={"k": rec}),
        nodestate.VALIDATOR: ValidatorRecord(checks=checks),
    }
    return progress.facts(node("n1", records=records), CR).executor.packages["k"]


def test_the_last_stage_passing_its_check_ends_the_cycle() -> None:
    read = _read(_record())
    assert (read.installed, read.previous) == ("2.0.0", "")
    assert (read.config, read.config_keys) == ("new-config", {"a.conf": "new"})
    assert (read.cycle_config, read.cycle_keys) == ("", {})
    assert (read.stage, read.state, read.attempt, read.updated) == ("config", "succeeded", 2, LATER)


def test_post_interrupt_is_the_last_stage_of_a_cycle_with_an_interrupt() -> None:
    assert _read(_record("post-interrupt", interrupt="reboot")).installed == "2.0.0"
    assert _read(_record("config", interrupt="reboot")).installed == "1.0.0", "interrupt next"


@pytest.mark.parametrize(
    ("rec", "verdict", "attempt"),
    [
        pytest.param(_record("apply"), "passed", 2, id="a-stage-follows"),
        pytest.param(_record(state="running"), "passed", 2, id="the-stage-runs-again"),
        pytest.param(_record(), "running", 2, id="the-check-runs"),
        pytest.param(_record(), "failed", 2, id="the-check-failed"),
        pytest.param(_record(), "passed", 1, id="a-verdict-about-an-earlier-attempt"),
        pytest.param(_record(cycle_config=""), "passed", 2, id="a-record-from-before-cycle-config"),
        pytest.param(
            _record("uninstall", cycle="uninstall"), "passed", 2, id="uninstall-ends-by-removal"
        ),
    ],
)
def test_nothing_else_ends_a_cycle(rec: PackageRecord, verdict: str, attempt: int) -> None:
    assert _read(rec, verdict, attempt) == rec


def test_the_facts_of_a_node_without_verdicts_are_the_record_itself() -> None:
    rec = ExecutorRecord(packages={"k": _record()})
    facts = progress.facts(node("n1", records={nodestate.EXECUTOR: rec}), CR)
    assert facts.executor == rec


RUN = T0.isoformat()
"""The cycle of :func:`_running`'s run, as its stage pod and the check's verdict name it."""


def _running(stage: str = "config", **kw: Any) -> PackageRecord:
    return _record(stage, state="running", cycle_started=T0, **kw)


def test_a_verdict_on_a_running_stage_says_the_stage_succeeded() -> None:
    """The check runs in the stage's pod once the stage exited 0: its verdict records the
    stage's end, which the executor no longer writes."""
    mid = _read(_running("apply"), "passed", cycle=RUN)
    assert (mid.stage, mid.state, mid.updated) == ("apply", "succeeded", LATER)
    assert (mid.installed, mid.previous) == ("1.0.0", "1.0.0"), "config follows"
    failed = _read(_running(), "failed", cycle=RUN)
    assert (failed.state, failed.installed) == ("succeeded", "1.0.0"), "succeeded, not checked"
    last = _read(_running(), "passed", cycle=RUN)
    assert (last.state, last.installed, last.previous) == ("succeeded", "2.0.0", "")


@pytest.mark.parametrize(
    ("rec", "verdict", "attempt", "cycle"),
    [
        pytest.param(_running(), "passed", 2, "2025-12-31T00:00:00+00:00", id="another-cycle"),
        pytest.param(_running(), "passed", 2, "", id="a-verdict-naming-no-cycle"),
        pytest.param(_running(), "passed", 1, RUN, id="an-earlier-attempt"),
        pytest.param(_running(), "running", 2, RUN, id="an-earlier-versions-check-start"),
        pytest.param(_running("interrupt"), "passed", 2, RUN, id="a-stage-without-a-check"),
    ],
)
def test_only_a_verdict_on_this_run_ends_a_running_stage(
    rec: PackageRecord, verdict: str, attempt: int, cycle: str
) -> None:
    """A package changed back to a version whose stage and attempt were checked in another
    cycle (the verdict not yet dropped) runs that stage again: the old verdict is not its."""
    assert _read(rec, verdict, attempt, cycle) == rec
