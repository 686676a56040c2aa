"""One vocabulary of reasons: every code NodeWright writes comes from ``shared.reasons``, and
every code there is written somewhere."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from shared import reasons

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(
    p
    for d in ("services", "shared", "nodewright")
    for p in (ROOT / d).rglob("*.py")
    if p.name != "reasons.py"
)
CODES = {
    name: value
    for name, value in vars(reasons).items()
    if name.isupper() and isinstance(value, str) and not name.startswith("_")
}


def test_codes_are_distinct_camel_case_identifiers() -> None:
    assert len(set(CODES.values())) == len(CODES)
    for name, code in CODES.items():
        assert re.fullmatch(r"[A-Z][A-Za-z]+", code), (name, code)


def test_every_code_is_used_outside_the_vocabulary() -> None:
    text = "\n".join(p.read_text() for p in SOURCES)
    unused = sorted(n for n in CODES if f"reasons.{n}" not in text)
    assert unused == []


def test_no_reason_is_written_with_a_literal_code() -> None:
    """``Reason(code="...")`` anywhere but here would be a second vocabulary."""
    literal: list[str] = []
    for path in SOURCES:
        for call in ast.walk(ast.parse(path.read_text())):
            if not isinstance(call, ast.Call):
                continue
            name = call.func.id if isinstance(call.func, ast.Name) else ""
            if isinstance(call.func, ast.Attribute):
                name = call.func.attr
            if name != "Reason":
                continue
            for kw in call.keywords:
                if kw.arg == "code" and isinstance(kw.value, ast.Constant):
                    literal.append(f"{path.relative_to(ROOT)}:{call.lineno} {kw.value.value!r}")
    assert literal == []


def test_the_ignore_label_reason_is_node_ignored() -> None:
    # The CR models once declared "Ignored" while everything wrote "NodeIgnored".
    assert reasons.NODE_IGNORED == "NodeIgnored"
    text = "\n".join(p.read_text() for p in SOURCES)
    assert '"Ignored"' not in text
