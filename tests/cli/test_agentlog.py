"""``nodewright package logs`` renders the agent's JSON lines for a person (``nodewright.
agentlog``): pure, no I/O. The lines are the agent's own format (docs/packages.md "Output:
events and the result")."""

from __future__ import annotations

import json
from typing import Any

from nodewright import agentlog


def _event(event: str, **fields: Any) -> str:
    base = {
        "ts": "2026-05-01T12:00:03.000001Z",
        "level": "info",
        "msg": {"step.output": "Step output", "step.finished": "Finished step"}.get(event, "Msg"),
        "cr": "tuning",
        "mode": "apply-check",
        "run_id": "r-1",
        "package": "sysctl-tuning",
        "version": "1.0.0",
        "event": event,
    }
    return json.dumps({**base, **fields}, separators=(",", ":")) + "\n"


def test_a_steps_output_reads_as_it_printed_it_with_its_time_and_step() -> None:
    out = _event("step.output", step="verify", stream="stdout", line="ok: vm.swappiness = 10")
    err = _event("step.output", step="verify", stream="stderr", line="warning: slow disk")
    assert agentlog.line(out) == "12:00:03Z [verify] ok: vm.swappiness = 10\n"
    assert agentlog.line(err) == "12:00:03Z [verify] stderr: warning: slow disk\n"


def test_a_step_that_failed_says_why_and_one_that_passed_its_exit_code() -> None:
    failed = _event(
        "step.finished",
        step="verify-settings",
        ok=False,
        rc=1,
        duration_s=0.012,
        error="step 'verify-settings' (check.sh) exited with 1, expected one of [0]",
        tail=["stdout: FAIL: vm.swappiness is '30', want '10'"],
    )
    passed = _event("step.finished", step="write", ok=True, rc=0, duration_s=0.5)
    assert agentlog.line(failed) == (
        "12:00:03Z [verify-settings] FAILED: step 'verify-settings' (check.sh) exited with 1, "
        "expected one of [0]\n"
    )
    assert agentlog.line(passed) == "12:00:03Z [write] finished: exit 0 in 0.5s\n"


def test_the_agents_verdict_ends_the_log() -> None:
    ok = _event("agent.finished", result={"mode": "apply", "ok": True, "exit_code": 0})
    bad = _event("agent.finished", result={"mode": "apply-check", "ok": False, "error": "boom"})
    assert agentlog.line(ok) == "12:00:03Z apply succeeded\n"
    assert agentlog.line(bad) == "12:00:03Z apply-check FAILED: boom\n"


def test_other_events_say_their_message_and_their_own_fields_and_warnings_are_marked() -> None:
    waiting = _event("lock.waiting", msg="Waiting for package lock", lock="/var/lock/x")
    warned = _event("history.corrupt", level="warning", msg="Moved aside", error="bad json")
    laid = _event("files.laid", msg="Laid files", files=["/etc/x"] * 100, count=100)
    assert agentlog.line(waiting) == "12:00:03Z Waiting for package lock (lock=/var/lock/x)\n"
    assert agentlog.line(warned) == "12:00:03Z WARNING: Moved aside (error=bad json)\n"
    rendered = agentlog.line(laid)
    assert rendered.startswith('12:00:03Z Laid files (files=["/etc/x",')
    assert rendered.endswith("... count=100)\n"), "a long field is cut, the rest still said"


def test_what_is_not_an_agent_event_is_left_as_it_is() -> None:
    for raw in (
        "plain text from another program\n",
        '{"not": "an agent event"}\n',
        '{"event": "step.output", "line": "no time"}\n',
        '{"ts": "2026-05-01T12:00:03Z", "event": "step.output", "line": "cut sh\n',
        "[1, 2, 3]\n",
        "",
        "no line end",
    ):
        assert agentlog.line(raw) == raw


def test_a_whole_log_is_rendered_line_by_line_and_keeps_its_last_line_end_or_lack_of_it() -> None:
    text = _event("step.output", step="a", line="one") + "runtime says hi\n"
    text += _event("step.output", step="a", line="two").rstrip("\n")
    assert agentlog.render(text) == ("12:00:03Z [a] one\nruntime says hi\n12:00:03Z [a] two")
