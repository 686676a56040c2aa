"""Structured JSON logging for every process.

Messages are constant strings in Kubernetes style ("Cordoned Node"); variable data goes in
``extra=`` as snake_case keys. This module only formats and installs the handler; where to
log (once, at the ack decision) is the callers' business.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_RESERVED = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys() | {"message", "asctime", "taskName"}
)

# Values under these keys never reach a log line, whatever a caller passes.
_SECRET_KEYS = frozenset({"token", "password", "secret", "authorization", "bearer_token"})


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, msg, then the record's extras."""

    def __init__(self, *, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "service": self._service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key in _RESERVED or key.startswith("_"):
                continue
            out[key] = "<redacted>" if key.lower() in _SECRET_KEYS else value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


def configure(*, service: str, level: str = "INFO", stream: TextIO | None = None) -> None:
    """Install the JSON handler on the root logger, replacing any earlier one."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(service=service))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # The clients log every reconnect attempt at INFO; our own lines say what matters.
    logging.getLogger("nats").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def bind(logger: logging.Logger, **values: Any) -> logging.LoggerAdapter[logging.Logger]:
    """A logger that adds ``values`` to every record (e.g. node, package, attempt)."""
    return _Adapter(logger, values)


class _Adapter(logging.LoggerAdapter[logging.Logger]):
    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        extra: Mapping[str, Any] = self.extra or {}
        kwargs["extra"] = {**extra, **(kwargs.get("extra") or {})}
        return msg, kwargs
