"""How the command line prints what it found: tables, and documents as JSON or YAML.

Every command whose output is a listing takes ``-o table|wide|json|yaml`` (kubectl's
``-o``): ``table`` and ``wide`` are drawn with rich (wide adds columns), ``json`` and
``yaml`` print the command's document for tools. Tables look like kubectl's: a header row,
columns padded to their widest cell and three spaces apart, nothing wrapped or cut whatever
the terminal's width, no trailing blanks. rich is imported only when a table is drawn, so
commands that print none do not pay for it.

What goes into a table or a document is each command's business, not this module's.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Sequence
from typing import Any, Final, Literal

Format = Literal["table", "wide", "json", "yaml"]
FORMATS: Final[tuple[Format, ...]] = ("table", "wide", "json", "yaml")
DOCUMENT_FORMATS: Final[tuple[Format, ...]] = ("table", "json", "yaml")
"""For commands whose table has no wide form."""

_GAP: Final = 3
"""Spaces between two columns, as kubectl prints them."""


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A table as text: one line per row under the header, every column but the last padded
    to its widest cell and :data:`_GAP` spaces apart. Cells are printed with ``str``."""
    from rich.console import Console
    from rich.table import Table

    grid = Table(
        box=None,
        pad_edge=False,
        show_edge=False,
        padding=(0, _GAP, 0, 0),
        header_style=None,
        highlight=False,
    )
    for header in headers:
        grid.add_column(header, no_wrap=True, overflow="ignore")
    for row in rows:
        grid.add_row(*(str(cell) for cell in row))
    widest = sum(
        max((len(str(r[i])) for r in (headers, *rows)), default=0) + _GAP
        for i in range(len(headers))
    )
    buffer = io.StringIO()
    # Wide enough for every cell: a table is never wrapped to the terminal, like kubectl's.
    console = Console(
        file=buffer, width=max(widest + 1, 20), color_system=None, highlight=False, emoji=False
    )
    console.print(grid, markup=False)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())


def document(doc: Any, fmt: Literal["json", "yaml"]) -> str:
    """``doc`` (JSON-ready: dicts, lists, strings, numbers, booleans, None) as text."""
    if fmt == "json":
        return json.dumps(doc, indent=2)
    import yaml

    text: str = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    return text.rstrip("\n")


def say(text: str = "", *, err: bool = False) -> None:
    """Print one line (or several) and flush, so a pipe sees it at once."""
    stream = sys.stderr if err else sys.stdout
    print(text, file=stream, flush=True)
