"""The agent's stdout: one JSON object per line, one line per event.

Events are stdlib log records with a constant message and an ``event`` key (``step.started``,
``step.finished``, ...) plus key/values; the formatter turns each into a JSON line with a UTC
timestamp. The executor can read the container's log as a machine-readable stream; people
read it through ``nodewright package logs``, which renders each event as a short line
(``nodewright.agentlog``; ``--raw`` and ``kubectl logs`` show the JSON). Step output is forwarded as
``step.output`` events and also written, unabridged, to the step's log file on the host
(``agent.logs``).

Not this module's job: the final result (``agent.result``), log files on the host.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import MutableMapping
from datetime import UTC, datetime
from typing import Any, Final, TextIO

LOGGER_NAME: Final = "nodewright.agent"
MAX_FIELD_CHARS: Final = 2000
"""Longer string fields (a runaway output line) are cut so one event stays one sane line."""

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_RECORD_ATTRS: Final = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys()
) | {"message", "asctime", "taskName"}


def utc_now() -> str:
    """RFC 3339 UTC timestamp with microseconds, the format of every time the agent writes."""
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _bounded(value: object) -> object:
    if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
        return value[:MAX_FIELD_CHARS] + f"...[{len(value) - MAX_FIELD_CHARS} more chars]"
    return value


class JsonLineFormatter(logging.Formatter):
    """Formats a record as one JSON object: ts, level, msg, then the record's extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="microseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRS and not key.startswith("_"):
                payload[key] = _bounded(value)
        if record.exc_info:
            payload["exception"] = _bounded(self.formatException(record.exc_info))
        return json.dumps(payload, ensure_ascii=False, default=str, separators=(",", ":"))


class EventLog(logging.LoggerAdapter[logging.Logger]):
    """A logger whose bound fields (cr, package, version, mode, run_id) go into every event."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        # LoggerAdapter's default replaces the call's extra with the bound one; merge instead.
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs

    def bind(self, **fields: object) -> EventLog:
        return EventLog(self.logger, {**(self.extra or {}), **fields})


def setup(stream: TextIO | None = None) -> EventLog:
    """Route the agent's logger to ``stream`` (stdout) as JSON lines; idempotent."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(JsonLineFormatter())
    logger.addHandler(handler)
    return EventLog(logger, {})
