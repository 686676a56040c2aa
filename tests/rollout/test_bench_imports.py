"""``bench.imports`` says what each import adds to a fresh process (its figures are not
judged: only that it reads the kernel's counts and charges each module once)."""

from __future__ import annotations

import re
import subprocess
import sys

_ADDED = r"\+(-?\d+\.\d)"
_LINE = re.compile(
    rf"^(\S+)\s+(\d+\.\d) MiB  \(VmRSS {_ADDED}  RssAnon {_ADDED}  RssFile {_ADDED}\)$"
)


def _run(*modules: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.imports", *modules],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_each_module_is_charged_what_it_added_and_only_once() -> None:
    done = _run("asyncio", "asyncio.events")
    assert done.returncode == 0, done.stderr
    first, *rows = done.stdout.splitlines()
    assert first.startswith("(interpreter)")
    parsed = {m.group(1): m for m in map(_LINE.match, rows) if m}
    assert set(parsed) == {"asyncio", "asyncio.events"}, done.stdout
    # asyncio (with ssl, socket, selectors) costs a fresh interpreter megabytes; its
    # submodule, already loaded with it, costs nothing more.
    assert float(parsed["asyncio"].group(3)) > 1.0
    assert abs(float(parsed["asyncio.events"].group(3))) < 0.5


def test_a_module_that_does_not_import_is_one_line_and_a_failure() -> None:
    done = _run("no_such_module_here")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "bench.imports: cannot import no_such_module_here: No module named 'no_such_module_here'"
    ]
    assert "Traceback" not in done.stderr
