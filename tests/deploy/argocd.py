"""Running the Argo CD health check (deploy/argocd/health-nodewright.lua) as Argo CD does: the
object as the global ``obj``, the chunk's returned ``hs`` read back, in a real Lua
interpreter (Debian's lua5.1 and lua5.4, scripts/install-host-deps.sh).

Argo CD runs health checks in gopher-lua, a Lua 5.1 with only some standard libraries open;
the harness gives the chunk an environment of just ``obj`` and the base, string, table and
math functions, so a check that reached for ``os``, ``io`` or ``require`` fails here too."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

HEALTH_LUA = Path(__file__).resolve().parents[2] / "deploy" / "argocd" / "health-nodewright.lua"
INTERPRETERS = ("lua5.1", "lua5.4")
STATUSES = ("Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown")

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_HARNESS = """
local path = arg[1]
local f = assert(io.open(path, "r"))
local src = f:read("*a")
f:close()
local env = {
  obj = OBJ,
  ipairs = ipairs, pairs = pairs, next = next, select = select, type = type,
  tostring = tostring, tonumber = tonumber, error = error, pcall = pcall, assert = assert,
  unpack = unpack or table.unpack, string = string, table = table, math = math,
}
local chunk
if setfenv then
  chunk = assert(loadstring(src, "=health.lua"))
  setfenv(chunk, env)
else
  chunk = assert(load(src, "=health.lua", "t", env))
end
local hs = chunk()
assert(type(hs) == "table", "the health check returned no table")
io.write(tostring(hs.status), "\\n", tostring(hs.message))
"""


def to_lua(value: Any) -> str:
    """``value`` (decoded JSON) as a Lua table constructor, as Argo CD converts objects:
    objects to tables with string keys, arrays to sequences, null left out."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        assert math.isfinite(value), value
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list):
        return "{" + ", ".join(to_lua(v) for v in value if v is not None) + "}"
    if isinstance(value, dict):
        fields = []
        for key, v in value.items():
            if v is None:
                continue
            assert isinstance(key, str), key
            name = key if _NAME.match(key) and key not in _KEYWORDS else f"[{_string(key)}]"
            fields.append(f"{name} = {to_lua(v)}")
        return "{" + ", ".join(fields) + "}"
    raise TypeError(f"not JSON: {value!r}")


_KEYWORDS = frozenset(
    [
        "and",
        "break",
        "do",
        "else",
        "elseif",
        "end",
        "false",
        "for",
        "function",
        "goto",
        "if",
        "in",
        "local",
        "nil",
        "not",
        "or",
        "repeat",
        "return",
        "then",
        "true",
        "until",
        "while",
    ]
)


def _string(text: str) -> str:
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif code < 32 or code == 127:
            out.append(f"\\{code:03d}")
        elif code < 128:
            out.append(ch)
        else:  # UTF-8 bytes as decimal escapes: the same in Lua 5.1 and 5.4
            out.extend(f"\\{b:03d}" for b in ch.encode())
    out.append('"')
    return "".join(out)


def interpreter(name: str) -> str:
    found = shutil.which(name)
    assert found, f"{name} is not installed: run scripts/install-host-deps.sh (make setup)"
    return found


def health(obj: dict[str, Any], lua: str = "lua5.1", script: Path = HEALTH_LUA) -> tuple[str, str]:
    """(hs.status, hs.message) of the health check ``script`` on ``obj`` in ``lua``."""
    # A round trip through JSON: exactly what Argo CD has, nothing Python-only.
    plain = json.loads(json.dumps(obj))
    program = f"OBJ = {to_lua(plain)}\n{_HARNESS}"
    ran = subprocess.run(
        [interpreter(lua), "-", str(script)],
        input=program,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert ran.returncode == 0, f"{lua} failed: {ran.stderr}"
    status, _, message = ran.stdout.partition("\n")
    assert status in STATUSES, f"not an Argo CD health status: {status!r}"
    return status, message


def health_everywhere(obj: dict[str, Any]) -> tuple[str, str]:
    """The health in every interpreter, which must agree."""
    results = {lua: health(obj, lua) for lua in INTERPRETERS}
    assert len(set(results.values())) == 1, results
    return results[INTERPRETERS[0]]
