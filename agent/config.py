"""The package's ``config.json``: parse, validate and expose it as immutable values.

This is the agent's stdlib twin of ``schemas/package-config.v1.json`` (JSON Schema 2020-12,
published for package authors and CI). Both must judge every document the same; the tests
hold a corpus of valid and invalid configs and run it through both. Two rules cannot be said
in JSON Schema and live only here: step names are unique within a stage, and at least one
stage has a step.

Parsing collects *every* problem with its JSON path (``$.stages.apply.steps[0].path``) so
``nodewright package validate`` can list them all at once. What this module does not do:
look at the filesystem (step files, config files) -- that is ``agent.validate`` and
``agent.modes``; run anything; know about the host.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

SCHEMA_VERSION: Final = "v1"
CONFIG_FILE: Final = "config.json"

# Patterns mirror the schema. fullmatch() is used on purpose: Python's "$" also matches
# before a trailing newline, which the schema's ECMA-262 "$" does not.
NAME_RE: Final = re.compile(r"[a-z]([-a-z0-9]{0,41}[a-z0-9])?")
"""The CR's package-name rule (shared.api.PACKAGE_NAME_RE); also a directory name on the host."""
STEP_NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
STEP_PATH_RE: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*(/[A-Za-z0-9_][A-Za-z0-9_.+-]*)*")
CONFIG_FILE_RE: Final = re.compile(r"[A-Za-z0-9_][-._A-Za-z0-9]*")
ENV_NAME_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENV_ARG_PREFIX: Final = "env:"
# semver.org's recommended pattern with [0-9] instead of \d (Python's \d also matches
# non-ASCII digits, ECMA-262's does not) and without +build metadata: the version is the
# image tag, and a tag cannot contain '+'.
SEMVER_RE: Final = re.compile(
    r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"(?:-((?:0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*)"
    r"(?:\.(?:0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
)
CR_VERSION_RE: Final = re.compile(
    r"v?((?:0|[1-9][0-9]*)(?:\.(?:0|[1-9][0-9]*)){0,2})(-[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?"
)
"""A version as the CR spells it (shared.api.VERSION_RE): optional 'v', 1-3 numeric parts."""
MAX_PATH_LEN: Final = 255
MAX_ARG_LEN: Final = 4096
MAX_ARGS: Final = 64
MAX_STEPS: Final = 64
MAX_TIMEOUT_S: Final = 86400
MAX_DESCRIPTION: Final = 1024


class Stage(enum.StrEnum):
    """A package stage; each has a mode of the same name and a ``<stage>-check`` mode."""

    APPLY = "apply"
    CONFIG = "config"
    UPGRADE = "upgrade"
    UNINSTALL = "uninstall"
    POST_INTERRUPT = "post-interrupt"


class Run(enum.StrEnum):
    """When an apply step runs again (other stages' steps always run; see agent.steps)."""

    ONCE = "once"
    """Skip the step when its idempotence flag exists (it already succeeded)."""
    ALWAYS = "always"
    """Run every time; the step is idempotent by itself."""


@dataclass(frozen=True, slots=True)
class Step:
    """One executable step: a file under the package's ``steps/`` run chrooted on the host."""

    name: str
    path: str
    """Relative to the package's ``steps/`` directory."""
    args: tuple[str, ...] = ()
    """Arguments; ``env:VAR`` is replaced by the value of VAR at run time (unset = error)."""
    env: Mapping[str, str] = field(default_factory=dict)
    success_codes: frozenset[int] = frozenset({0})
    run: Run = Run.ONCE
    timeout_s: float | None = None
    """Kill the step (its whole process group) after this long; None = no limit."""


@dataclass(frozen=True, slots=True)
class StageSpec:
    """A stage: the steps that change the host and the checks that verify them."""

    steps: tuple[Step, ...] = ()
    check: tuple[Step, ...] = ()


@dataclass(frozen=True, slots=True)
class PackageConfig:
    """A validated ``config.json``."""

    name: str
    version: str
    description: str
    expected_config_files: tuple[str, ...]
    stages: Mapping[Stage, StageSpec]

    def stage(self, stage: Stage) -> StageSpec | None:
        return self.stages.get(stage)

    def all_steps(self) -> Iterator[tuple[Stage, Step]]:
        """Every step and check of every stage, in file order."""
        for stage, spec in self.stages.items():
            for step in (*spec.steps, *spec.check):
                yield stage, step


class ConfigInvalid(ValueError):
    """config.json is not a valid package config; ``problems`` lists every issue found."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


# --- semver ---------------------------------------------------------------------------


def is_semver(text: str) -> bool:
    return SEMVER_RE.fullmatch(text) is not None


def normalize_version(text: str) -> str:
    """A version as the CR may spell it (``v1.2``, ``1.2``) as strict semver (``1.2.0``).

    Raises ValueError if it is not a version even then.
    """
    m = CR_VERSION_RE.fullmatch(text)
    if m is None:
        raise ValueError(f"not a semantic version: {text!r}")
    parts = m[1].split(".")
    normalized = ".".join([*parts, *["0"] * (3 - len(parts))]) + (m[2] or "")
    if not is_semver(normalized):
        raise ValueError(f"not a semantic version: {text!r}")
    return normalized


def semver_key(version: str) -> tuple[int, int, int, tuple[tuple[int, int, str], ...] | None]:
    """A sort key implementing semver 2.0 precedence.

    The last element is None for a release, which must sort *after* any pre-release of the
    same core version; callers use :func:`compare_semver`, which handles that.
    """
    m = SEMVER_RE.fullmatch(version)
    if m is None:
        raise ValueError(f"not a semantic version: {version!r}")
    major, minor, patch, pre = int(m[1]), int(m[2]), int(m[3]), m[4]
    if pre is None:
        return major, minor, patch, None
    # Numeric identifiers sort before alphanumeric ones, numerically among themselves.
    ids = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split("."))
    return major, minor, patch, ids


def compare_semver(a: str, b: str) -> int:
    """-1, 0 or 1 as ``a`` has lower, equal or higher precedence than ``b``."""
    ka, kb = semver_key(a), semver_key(b)
    if ka[:3] != kb[:3]:
        return -1 if ka[:3] < kb[:3] else 1
    pa, pb = ka[3], kb[3]
    if pa == pb:
        return 0
    if pa is None:
        return 1
    if pb is None:
        return -1
    return -1 if pa < pb else 1


# --- parsing ----------------------------------------------------------------------------


class _Problems:
    """Collects problems with their JSON paths instead of stopping at the first."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.items.append(f"{path}: {message}")


def _is_int(value: object) -> bool:
    # JSON Schema's "integer" accepts 1.0; bool is an int subclass in Python but not in JSON.
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _object(value: object, path: str, problems: _Problems) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        problems.add(path, "must be an object")
        return None
    return value


def _unknown_keys(obj: Mapping[str, Any], allowed: set[str], path: str, p: _Problems) -> None:
    for key in sorted(set(obj) - allowed):
        p.add(path, f"unknown field {key!r} (allowed: {', '.join(sorted(allowed))})")


def _string(
    value: object,
    path: str,
    p: _Problems,
    *,
    pattern: re.Pattern[str] | None = None,
    max_len: int | None = None,
    what: str = "",
) -> str | None:
    if not isinstance(value, str):
        p.add(path, "must be a string")
        return None
    if max_len is not None and len(value) > max_len:
        p.add(path, f"must be at most {max_len} characters")
        return None
    if pattern is not None and pattern.fullmatch(value) is None:
        p.add(path, f"{value!r} is not {what or 'valid'} (pattern {pattern.pattern})")
        return None
    return value


def _parse_arg(value: object, path: str, p: _Problems) -> str | None:
    arg = _string(value, path, p, max_len=MAX_ARG_LEN)
    if arg is None:
        return None
    if arg.startswith(ENV_ARG_PREFIX) and not ENV_NAME_RE.fullmatch(arg[len(ENV_ARG_PREFIX) :]):
        p.add(path, f"{arg!r} starts with 'env:' but is not followed by a variable name")
        return None
    return arg


def _parse_step(raw: object, path: str, p: _Problems, *, with_run: bool) -> Step | None:
    obj = _object(raw, path, p)
    if obj is None:
        return None
    allowed = {"name", "path", "args", "env", "success_codes", "timeout_seconds"}
    if with_run:
        allowed.add("run")
    _unknown_keys(obj, allowed, path, p)
    before = len(p.items)
    for key in ("name", "path"):
        if key not in obj:
            p.add(path, f"missing required field {key!r}")
    name = path_ = None
    if "name" in obj:
        name = _string(obj["name"], f"{path}.name", p, pattern=STEP_NAME_RE, what="a step name")
    if "path" in obj:
        path_ = _string(
            obj["path"],
            f"{path}.path",
            p,
            pattern=STEP_PATH_RE,
            max_len=MAX_PATH_LEN,
            what="a relative path inside steps/ without '.' or '..' components",
        )
    args: list[str] = []
    if "args" in obj:
        raw_args = obj["args"]
        if not isinstance(raw_args, list):
            p.add(f"{path}.args", "must be an array of strings")
        elif len(raw_args) > MAX_ARGS:
            p.add(f"{path}.args", f"must have at most {MAX_ARGS} items")
        else:
            for i, a in enumerate(raw_args):
                parsed = _parse_arg(a, f"{path}.args[{i}]", p)
                if parsed is not None:
                    args.append(parsed)
    env: dict[str, str] = {}
    if "env" in obj:
        raw_env = _object(obj["env"], f"{path}.env", p)
        for key, value in (raw_env or {}).items():
            if ENV_NAME_RE.fullmatch(key) is None:
                p.add(f"{path}.env", f"{key!r} is not a valid variable name")
            elif not isinstance(value, str):
                p.add(f"{path}.env.{key}", "must be a string")
            else:
                env[key] = value
    codes: frozenset[int] = frozenset({0})
    if "success_codes" in obj:
        raw_codes = obj["success_codes"]
        if not isinstance(raw_codes, list) or not raw_codes:
            p.add(f"{path}.success_codes", "must be a non-empty array of integers 0-255")
        elif not all(_is_int(c) and 0 <= c <= 255 for c in raw_codes):
            p.add(f"{path}.success_codes", "every item must be an integer 0-255")
        elif len({int(c) for c in raw_codes}) != len(raw_codes):
            p.add(f"{path}.success_codes", "items must be unique")
        else:
            codes = frozenset(int(c) for c in raw_codes)
    run = Run.ONCE
    if "run" in obj:
        raw_run = obj["run"]
        if not isinstance(raw_run, str) or raw_run not in {r.value for r in Run}:
            p.add(f"{path}.run", f"must be one of {', '.join(r.value for r in Run)}")
        else:
            run = Run(raw_run)
    timeout: float | None = None
    if "timeout_seconds" in obj:
        raw_t = obj["timeout_seconds"]
        if not _is_number(raw_t) or not 0 < raw_t <= MAX_TIMEOUT_S:
            p.add(f"{path}.timeout_seconds", f"must be a number > 0 and <= {MAX_TIMEOUT_S}")
        else:
            timeout = float(raw_t)
    if len(p.items) != before or name is None or path_ is None:
        return None
    return Step(
        name=name,
        path=path_,
        args=tuple(args),
        env=env,
        success_codes=codes,
        run=run,
        timeout_s=timeout,
    )


def _parse_steps(raw: object, path: str, p: _Problems, *, with_run: bool) -> list[Step]:
    if not isinstance(raw, list):
        p.add(path, "must be an array of steps")
        return []
    if len(raw) > MAX_STEPS:
        p.add(path, f"must have at most {MAX_STEPS} items")
        return []
    steps = [_parse_step(item, f"{path}[{i}]", p, with_run=with_run) for i, item in enumerate(raw)]
    return [s for s in steps if s is not None]


def _parse_stage(raw: object, stage: Stage, path: str, p: _Problems) -> StageSpec | None:
    obj = _object(raw, path, p)
    if obj is None:
        return None
    _unknown_keys(obj, {"steps", "check"}, path, p)
    if not obj:
        p.add(path, "must have 'steps' or 'check'")
        return None
    # Only apply steps are flag-guarded, so only they may say when to run (agent.steps).
    steps = _parse_steps(obj.get("steps", []), f"{path}.steps", p, with_run=stage is Stage.APPLY)
    check = _parse_steps(obj.get("check", []), f"{path}.check", p, with_run=False)
    raw_steps, raw_check = obj.get("steps", []), obj.get("check", [])
    if (
        isinstance(raw_steps, list)
        and raw_steps
        and not (isinstance(raw_check, list) and raw_check)
    ):
        p.add(path, "a stage with steps must have at least one check")
    # Beyond the schema: names key the flags and log directories of a stage.
    seen: set[str] = set()
    for step in (*steps, *check):
        if step.name in seen:
            p.add(path, f"step name {step.name!r} is used twice in this stage")
        seen.add(step.name)
    return StageSpec(steps=tuple(steps), check=tuple(check))


def parse_config(document: object) -> PackageConfig:
    """Validate a decoded config.json document.

    Raises :class:`ConfigInvalid` listing every problem found.
    """
    p = _Problems()
    obj = _object(document, "$", p)
    if obj is None:
        raise ConfigInvalid(p.items)
    allowed = {
        "schema_version",
        "name",
        "version",
        "description",
        "expected_config_files",
        "stages",
    }
    _unknown_keys(obj, allowed, "$", p)
    for key in ("schema_version", "name", "version", "stages"):
        if key not in obj:
            p.add("$", f"missing required field {key!r}")
    if "schema_version" in obj and obj["schema_version"] != SCHEMA_VERSION:
        p.add(
            "$.schema_version",
            f"{obj['schema_version']!r} is not supported (this agent reads {SCHEMA_VERSION!r})",
        )
    name = version = None
    if "name" in obj:
        name = _string(obj["name"], "$.name", p, pattern=NAME_RE, what="a package name")
    if "version" in obj:
        version = _string(
            obj["version"], "$.version", p, pattern=SEMVER_RE, what="a semantic version (x.y.z)"
        )
    description = ""
    if "description" in obj:
        description = _string(obj["description"], "$.description", p, max_len=MAX_DESCRIPTION) or ""
    files: list[str] = []
    if "expected_config_files" in obj:
        raw_files = obj["expected_config_files"]
        if not isinstance(raw_files, list):
            p.add("$.expected_config_files", "must be an array of file names")
        else:
            for i, f in enumerate(raw_files):
                parsed = _string(
                    f,
                    f"$.expected_config_files[{i}]",
                    p,
                    pattern=CONFIG_FILE_RE,
                    max_len=MAX_PATH_LEN,
                    what="a config file name (a ConfigMap key)",
                )
                if parsed is not None:
                    if parsed in files:
                        p.add("$.expected_config_files", f"{parsed!r} is listed twice")
                    files.append(parsed)
    stages: dict[Stage, StageSpec] = {}
    if "stages" in obj:
        raw_stages = _object(obj["stages"], "$.stages", p)
        if raw_stages is not None:
            _unknown_keys(raw_stages, {s.value for s in Stage}, "$.stages", p)
            if not raw_stages:
                p.add("$.stages", "must define at least one stage")
            for stage in Stage:
                if stage.value in raw_stages:
                    spec = _parse_stage(raw_stages[stage.value], stage, f"$.stages.{stage}", p)
                    if spec is not None:
                        stages[stage] = spec
            if raw_stages and not p.items and not any(s.steps for s in stages.values()):
                # Beyond the schema: a package whose every mode is a no-op is a mistake.
                p.add("$.stages", "at least one stage must have a step")
    if p.items or name is None or version is None:
        raise ConfigInvalid(p.items)
    return PackageConfig(
        name=name,
        version=version,
        description=description,
        expected_config_files=tuple(files),
        stages=stages,
    )


NESTED_LAYOUT_DIR = "nodewright-package"
"""Where packages built for NodeWright 0.1 put their files inside the image. An image volume
(or the copy init container) brings the image's *root* to the package directory, so those
files arrive one level too deep; the error says so instead of only "file not found"."""


def _layout_hint(package_dir: Path) -> str:
    if (package_dir / NESTED_LAYOUT_DIR / CONFIG_FILE).is_file():
        return (
            f" (the image has {CONFIG_FILE} under /{NESTED_LAYOUT_DIR}/: a package image keeps "
            f"its files at its root, e.g. COPY config.json /{CONFIG_FILE} and COPY steps/ /steps/;"
            " see docs/packages.md, Package image)"
        )
    return ""


def load_config(package_dir: Path) -> PackageConfig:
    """Read and validate ``<package_dir>/config.json``; problems name the file."""
    path = package_dir / CONFIG_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigInvalid([f"{path}: file not found{_layout_hint(package_dir)}"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigInvalid([f"{path}: cannot be read: {exc}"]) from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigInvalid([f"{path}: not valid JSON: {exc}"]) from None
    try:
        return parse_config(document)
    except ConfigInvalid as exc:
        raise ConfigInvalid([f"{path}: {problem}" for problem in exc.problems]) from None
