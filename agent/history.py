"""Per-package version history on the host: what is installed now, and what happened before.

The file ``<state>/<cr>/history/<pkg>.json`` is rewritten atomically after a stage's check
succeeds -- a check, not the stage itself, is what proves the host is in the new state::

    {"schema": "nodewright.history/v1", "package": "sysctl-tuning",
     "current_version": "1.1.0",            # null once uninstalled or before any install
     "history": [{"version": "1.0.0", "action": "install", "time": "...", ...}, ...]}

The upgrade mode reads ``current_version`` when the executor does not pass a from-version.
A corrupt file is moved aside (``<pkg>.json.corrupt-<time>``) and reported, never silently
overwritten, because it is the only record of what ran on this node.

Not this module's job: idempotence flags (``agent.steps``), deciding when to record.
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent.events import utc_now
from agent.files import write_json_atomic

SCHEMA: Final = "nodewright.history/v1"
MAX_ENTRIES: Final = 100
"""Oldest entries are dropped beyond this; a node's history stays a small file forever."""


class Action(enum.StrEnum):
    INSTALL = "install"
    UPGRADE = "upgrade"
    CONFIG = "config"
    UNINSTALL = "uninstall"


@dataclass(frozen=True, slots=True)
class Entry:
    version: str
    action: Action
    time: str
    from_version: str | None = None
    run_id: str | None = None

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {
            "version": self.version,
            "action": self.action.value,
            "time": self.time,
        }
        if self.from_version is not None:
            doc["from_version"] = self.from_version
        if self.run_id is not None:
            doc["run_id"] = self.run_id
        return doc


@dataclass(frozen=True, slots=True)
class History:
    package: str
    current_version: str | None
    entries: tuple[Entry, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "schema": SCHEMA,
            "package": self.package,
            "current_version": self.current_version,
            "history": [e.to_json() for e in self.entries],
        }


class HistoryCorrupt(ValueError):
    """The history file exists but is not a history document."""


def _opt_str(doc: dict[str, object], key: str) -> str | None:
    value = doc.get(key)
    if value is not None and not isinstance(value, str):
        raise HistoryCorrupt(f"{key!r} must be a string or null")
    return value


def parse_history(document: object, package: str) -> History:
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise HistoryCorrupt(f"not a {SCHEMA} document")
    if document.get("package") != package:
        raise HistoryCorrupt(f"belongs to package {document.get('package')!r}, not {package!r}")
    current = _opt_str(document, "current_version")
    raw_entries = document.get("history")
    if not isinstance(raw_entries, list):
        raise HistoryCorrupt("'history' must be an array")
    entries: list[Entry] = []
    for raw in raw_entries:
        if not isinstance(raw, dict):
            raise HistoryCorrupt("history entries must be objects")
        version, time_ = raw.get("version"), raw.get("time")
        if not isinstance(version, str) or not isinstance(time_, str):
            raise HistoryCorrupt("history entries need string 'version' and 'time'")
        try:
            action = Action(str(raw.get("action")))
        except ValueError:
            raise HistoryCorrupt(f"unknown action {raw.get('action')!r}") from None
        entries.append(
            Entry(
                version=version,
                action=action,
                time=time_,
                from_version=_opt_str(raw, "from_version"),
                run_id=_opt_str(raw, "run_id"),
            )
        )
    return History(package=package, current_version=current, entries=tuple(entries))


def read_history(path: Path, package: str) -> History:
    """The package's history; empty if there is none. Raises :class:`HistoryCorrupt`."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return History(package=package, current_version=None)
    try:
        document = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HistoryCorrupt(f"not valid JSON: {exc}") from None
    return parse_history(document, package)


def set_aside(path: Path) -> Path:
    """Move a corrupt history file out of the way, keeping it for a human to inspect."""
    aside = path.with_name(f"{path.name}.corrupt-{utc_now().replace(':', '')}")
    os.replace(path, aside)
    return aside


def with_entry(history: History, entry: Entry) -> History:
    """``history`` plus ``entry``, with the current version updated and old entries trimmed."""
    current = None if entry.action is Action.UNINSTALL else entry.version
    entries = (*history.entries, entry)[-MAX_ENTRIES:]
    return History(package=history.package, current_version=current, entries=entries)


def write_history(path: Path, history: History) -> None:
    write_json_atomic(path, history.to_json())
