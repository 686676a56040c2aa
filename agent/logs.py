"""Per-step log files on the host, with rotation.

Each run of a step writes one file, ``<dir>/<UTC time>.log``, holding the step's stdout and
stderr as they arrive, each line prefixed with its time and stream. After the file is
closed, the directory keeps only the ``keep`` newest files: names are UTC timestamps of
fixed width, so name order is time order and no clock reading of the files is needed.

Not this module's job: deciding the directory (``agent.layout``) or forwarding output to
stdout (``agent.steps``).
"""

from __future__ import annotations

import os
import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, TextIO

LOG_NAME_RE: Final = re.compile(r"[0-9]{8}T[0-9]{6}\.[0-9]{6}Z\.log")


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")


def log_files(directory: Path) -> list[Path]:
    """The rotated log files in ``directory``, oldest first."""
    try:
        names = [e.name for e in os.scandir(directory) if e.is_file(follow_symlinks=False)]
    except FileNotFoundError:
        return []
    return [directory / n for n in sorted(n for n in names if LOG_NAME_RE.fullmatch(n))]


def rotate(directory: Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest log files; return the deleted paths."""
    if keep < 1:
        raise ValueError("keep must be at least 1")
    files = log_files(directory)
    doomed = files[:-keep] if len(files) > keep else []
    for path in doomed:
        path.unlink(missing_ok=True)
    return doomed


class StepLogFile:
    """One run's log file; create with :meth:`open`, write lines, then :meth:`close`."""

    def __init__(self, path: Path, handle: TextIO, keep: int) -> None:
        self.path = path
        self._handle = handle
        self._keep = keep

    @classmethod
    def open(cls, directory: Path, keep: int) -> StepLogFile:
        directory.mkdir(parents=True, exist_ok=True)
        while True:
            path = directory / f"{_stamp()}.log"
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
            except FileExistsError:
                # Two runs within one microsecond: take the next timestamp.
                time.sleep(0.000_01)
                continue
            handle = os.fdopen(fd, "w", encoding="utf-8", errors="replace", buffering=1)
            return cls(path, handle, keep)

    def line(self, stream: str, text: str) -> None:
        self._handle.write(
            f"{datetime.now(UTC).isoformat(timespec='microseconds')} {stream} {text}\n"
        )

    def note(self, text: str) -> None:
        """An agent line (command, exit code) as opposed to the step's own output."""
        self.line("agent", text)

    def close(self) -> list[Path]:
        """Close the file and rotate its directory; return the files rotation removed."""
        self._handle.close()
        return rotate(self.path.parent, self._keep)
