"""Validate a package directory before it is published, and before every run.

:func:`validate_package_dir` is the check behind ``nodewright package validate DIR`` (and
``python -m agent validate DIR``): config.json against the v1 rules, then every step file
the config names. The agent calls :func:`step_file_problems` itself before running any
mode, so a misspelt step path fails the run naming the file instead of looking like a
successful no-op (upstream #493/#605).

A step file is runnable when it starts with ``#!`` (the interpreter must exist on the
*host*; that can only be checked on the node) or is an ELF binary. Its executable bit does
not matter: the agent stages steps with mode 0755.

Not this module's job: parsing config.json (``agent.config``), config files from the CR
(checked at run time in ``agent.modes``, they are not part of the package).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from agent.config import ConfigInvalid, PackageConfig, load_config

STEPS_DIR: Final = "steps"
ROOT_DIR: Final = "root"
RUNNABLE_MAGIC: Final = (b"#!", b"\x7fELF")


def step_file_problems(package_dir: Path, config: PackageConfig) -> list[str]:
    """One message per step file that is missing, outside the package or not runnable."""
    problems: list[str] = []
    steps_dir = package_dir / STEPS_DIR
    seen: set[str] = set()
    for stage, step in config.all_steps():
        if step.path in seen:
            continue
        seen.add(step.path)
        path = steps_dir / step.path
        where = f"step {step.name!r} of stage {stage.value!r}"
        try:
            real = path.resolve(strict=True)
        except FileNotFoundError:
            problems.append(f"{path}: file not found ({where}; is the path misspelt?)")
            continue
        except OSError as exc:
            problems.append(f"{path}: cannot be resolved ({where}): {exc}")
            continue
        if not real.is_relative_to(package_dir.resolve()):
            problems.append(f"{path}: points outside the package to {real} ({where})")
            continue
        if not real.is_file():
            problems.append(f"{path}: not a regular file ({where})")
            continue
        try:
            with open(real, "rb") as handle:
                head = handle.read(4)
        except OSError as exc:
            problems.append(f"{path}: cannot be read ({where}): {exc}")
            continue
        if not head.startswith(RUNNABLE_MAGIC):
            problems.append(
                f"{path}: not runnable ({where}): it must start with '#!' naming an "
                "interpreter on the host (e.g. #!/bin/sh) or be an ELF binary"
            )
    return problems


def validate_package_dir(path: str | Path) -> list[str]:
    """Every problem with the package at ``path``; an empty list means it is valid."""
    package_dir = Path(path)
    if not package_dir.is_dir():
        return [f"{package_dir}: not a directory"]
    try:
        config = load_config(package_dir)
    except ConfigInvalid as exc:
        return list(exc.problems)
    problems = step_file_problems(package_dir, config)
    root = package_dir / ROOT_DIR
    if root.exists() and not root.is_dir():
        problems.append(f"{root}: must be a directory of files to lay onto the host")
    return problems
