"""The agent's final result: one JSON document, bounded to fit a termination message.

Kubernetes keeps at most 4096 bytes of a container's termination message, and the executor
reads the result from there (or from the last ``agent.finished`` line of the log). The
document is shrunk in a fixed order until it fits -- oldest output-tail lines first, then
the per-step list, then the error text -- so the fields that decide what happened (``ok``,
``exit_code``, ``mode``, ``package``, ``version``, ``failed_step``, ``interrupt.status``)
always survive.

Not this module's job: deciding the exit code (``agent.cli``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from agent import AGENT_VERSION

SCHEMA: Final = "nodewright.agent.result/v1"
TERMINATION_MESSAGE_LIMIT: Final = 4096


@dataclass(slots=True)
class Result:
    mode: str
    cr: str | None = None
    run_id: str | None = None
    package: str | None = None
    version: str | None = None
    from_version: str | None = None
    ok: bool = False
    exit_code: int = 0
    error: str | None = None
    failed_step: str | None = None
    tail: list[str] = field(default_factory=list)
    steps: list[dict[str, object]] = field(default_factory=list)
    interrupt: dict[str, object] | None = None
    history: dict[str, object] | None = None

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {
            "schema": SCHEMA,
            "agent_version": AGENT_VERSION,
            "mode": self.mode,
            "ok": self.ok,
            "exit_code": self.exit_code,
        }
        optional: dict[str, object | None] = {
            "cr": self.cr,
            "run_id": self.run_id,
            "package": self.package,
            "version": self.version,
            "from_version": self.from_version,
            "error": self.error,
            "failed_step": self.failed_step,
            "interrupt": self.interrupt,
            "history": self.history,
        }
        doc.update({k: v for k, v in optional.items() if v is not None})
        if self.tail:
            doc["tail"] = list(self.tail)
        if self.steps:
            doc["steps"] = list(self.steps)
        return doc


def _size(doc: dict[str, object]) -> int:
    return len(_dumps(doc).encode("utf-8"))


def _dumps(doc: dict[str, object]) -> str:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def bounded(doc: dict[str, object], limit: int = TERMINATION_MESSAGE_LIMIT) -> str:
    """``doc`` as compact JSON of at most ``limit`` UTF-8 bytes, shrunk as the module says."""
    doc = dict(doc)
    if _size(doc) <= limit:
        return _dumps(doc)
    doc["truncated"] = True
    tail = doc.get("tail")
    if isinstance(tail, list):
        tail = list(tail)
        while tail and _size(doc) > limit:
            tail.pop(0)
            doc["tail"] = tail
        if not tail:
            doc.pop("tail", None)
    steps = doc.get("steps")
    if isinstance(steps, list) and _size(doc) > limit:
        failed = [s for s in steps if isinstance(s, dict) and not s.get("ok", True)]
        doc["steps"] = failed[-1:]
        doc["steps_omitted"] = len(steps) - len(failed[-1:])
        if _size(doc) > limit:
            doc.pop("steps")
    interrupt = doc.get("interrupt")
    if isinstance(interrupt, dict) and _size(doc) > limit:
        commands = interrupt.get("commands")
        shrunk = {k: v for k, v in interrupt.items() if k != "commands"}
        if isinstance(commands, list):
            shrunk["commands_omitted"] = len(commands)
        doc["interrupt"] = shrunk
    error = doc.get("error")
    if isinstance(error, str) and _size(doc) > limit:
        doc["error"] = error[:300] + "..."
    if _size(doc) > limit:
        doc.pop("history", None)
    if _size(doc) > limit:
        keep = (
            "schema",
            "agent_version",
            "mode",
            "ok",
            "exit_code",
            "package",
            "version",
            "failed_step",
            "error",
        )
        doc = {k: doc[k] for k in keep if k in doc} | {"truncated": True}
    return _dumps(doc)


def write_termination_message(path: Path, text: str) -> None:
    """Write the (already bounded) result; raises OSError for the caller to report."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
