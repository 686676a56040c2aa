"""How ``nodewright package logs`` shows the agent's log to a person.

The agent writes one JSON object per line, for machines as much as for people
(docs/packages.md, "Output: events and the result"). This module turns each of them into one
short line: the time (UTC), the step, and what happened; a step's output as the step printed
it. A line that is not one of the agent's events (a runtime's own message, a pod of another
program, a line cut short) is left as it is. Fetching logs is not this module's job, nor is
deciding whether to render them (``--raw`` prints them as written).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

_SAID_ELSEWHERE = frozenset(
    {"ts", "level", "msg", "event", "cr", "mode", "run_id", "package", "version", "step"}
)
"""Fields every event carries (the header above the log names the pod, package and stage)
or that the line shows in its own place."""
_FIELD_CHARS = 160
"""A longer field (the list of files laid, a result) is cut: the raw line has all of it."""


def render(text: str) -> str:
    """``text`` (one or more lines as the log holds them) with each agent event rendered."""
    return "".join(line(part) for part in text.splitlines(keepends=True))


def line(raw: str) -> str:
    """One line of the log: the agent's event as a person reads it, else ``raw`` unchanged
    (its line end kept either way)."""
    body = raw.rstrip("\r\n")
    end = raw[len(body) :]
    event = _event(body)
    if event is None:
        return raw
    step = event.get("step")
    where = f" [{step}]" if isinstance(step, str) and step else ""
    return f"{_clock(event['ts'])}{where} {_what(event)}{end}"


def _event(body: str) -> Mapping[str, Any] | None:
    if not body.startswith("{"):
        return None
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    if not isinstance(parsed.get("event"), str) or not isinstance(parsed.get("ts"), str):
        return None
    return parsed


def _clock(ts: str) -> str:
    """``2026-12-07T17:58:20.177570Z`` -> ``17:58:20Z`` (the agent writes UTC)."""
    _, sep, time = ts.partition("T")
    return f"{time[:8]}Z" if sep and len(time) >= 8 else ts


def _what(event: Mapping[str, Any]) -> str:
    kind = event["event"]
    if kind == "step.output":
        said = str(event.get("line", ""))
        return f"stderr: {said}" if event.get("stream") == "stderr" else said
    if kind == "step.finished":
        if event.get("ok"):
            return f"finished: exit {event.get('rc')} in {event.get('duration_s')}s"
        return f"FAILED: {event.get('error') or 'the step failed'}"
    if kind == "agent.finished":
        result = event.get("result")
        result = result if isinstance(result, Mapping) else {}
        mode = result.get("mode") or event.get("mode") or "the agent"
        if result.get("ok"):
            return f"{mode} succeeded"
        return f"{mode} FAILED: {result.get('error') or 'see the lines above'}"
    level = str(event.get("level", "info"))
    mark = "" if level in ("info", "debug") else f"{level.upper()}: "
    rest = " ".join(
        f"{key}={_short(value)}" for key, value in event.items() if key not in _SAID_ELSEWHERE
    )
    return f"{mark}{event.get('msg') or kind}" + (f" ({rest})" if rest else "")


def _short(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= _FIELD_CHARS else text[:_FIELD_CHARS] + "..."
