"""``validate_package_dir``: what ``nodewright package validate DIR`` reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agent.validate import validate_package_dir
from tests.agent.harness import REPO, sh, write_package

STAGES = {
    "apply": {
        "steps": [{"name": "s", "path": "apply.sh"}],
        "check": [{"name": "c", "path": "checks/check.sh"}],
    }
}


def test_the_example_package_is_valid() -> None:
    assert validate_package_dir(REPO / "examples" / "packages" / "sysctl-tuning") == []


def test_a_complete_package_is_valid(tmp_path: Path) -> None:
    pkg = write_package(
        tmp_path, stages=STAGES, scripts={"apply.sh": sh("true"), "checks/check.sh": sh("true")}
    )
    (pkg / "steps" / "apply.sh").chmod(0o644)  # the agent stages steps executable itself

    assert validate_package_dir(pkg) == []


def test_missing_step_files_are_each_named(tmp_path: Path) -> None:
    pkg = write_package(tmp_path, stages=STAGES)

    problems = validate_package_dir(pkg)

    assert len(problems) == 2
    assert problems[0].startswith(f"{pkg}/steps/apply.sh: file not found")
    assert "step 's' of stage 'apply'" in problems[0]
    assert problems[1].startswith(f"{pkg}/steps/checks/check.sh: file not found")


def test_a_step_file_without_an_interpreter_line_is_not_runnable(tmp_path: Path) -> None:
    pkg = write_package(
        tmp_path,
        stages=STAGES,
        scripts={"apply.sh": "echo no shebang\n", "checks/check.sh": sh("true")},
    )

    (problem,) = validate_package_dir(pkg)

    assert "apply.sh: not runnable" in problem


def test_a_step_symlink_leaving_the_package_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside.sh"
    outside.write_text(sh("true"))
    pkg = write_package(tmp_path / "pkg", stages=STAGES, scripts={"checks/check.sh": sh("true")})
    (pkg / "steps" / "apply.sh").symlink_to(outside)

    (problem,) = validate_package_dir(pkg)

    assert "points outside the package" in problem


def test_a_directory_where_a_step_file_should_be_is_refused(tmp_path: Path) -> None:
    pkg = write_package(tmp_path, stages=STAGES, scripts={"checks/check.sh": sh("true")})
    (pkg / "steps" / "apply.sh").mkdir()

    (problem,) = validate_package_dir(pkg)

    assert "not a regular file" in problem


def test_config_problems_are_reported_with_the_file_name(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"schema_version": "v1", "name": "x"')

    (problem,) = validate_package_dir(tmp_path)

    assert problem.startswith(f"{tmp_path}/config.json: not valid JSON")


def test_root_must_be_a_directory(tmp_path: Path) -> None:
    pkg = write_package(
        tmp_path, stages=STAGES, scripts={"apply.sh": sh("true"), "checks/check.sh": sh("true")}
    )
    (pkg / "root").write_text("oops")

    assert validate_package_dir(pkg) == [
        f"{pkg}/root: must be a directory of files to lay onto the host"
    ]


def test_a_missing_directory_is_reported(tmp_path: Path) -> None:
    assert validate_package_dir(tmp_path / "nope") == [f"{tmp_path / 'nope'}: not a directory"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``nodewright package validate`` as a user runs it: a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "nodewright.cli", "package", "validate", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )


def test_the_cli_says_the_example_package_is_valid() -> None:
    pkg = str(REPO / "examples" / "packages" / "sysctl-tuning")

    done = _cli(pkg)

    assert (done.returncode, done.stdout, done.stderr) == (0, f"{pkg}: valid\n", "")


def test_the_cli_lists_every_problem_and_exits_3(tmp_path: Path) -> None:
    pkg = write_package(tmp_path, stages=STAGES)

    done = _cli(str(pkg))

    assert done.returncode == 3
    lines = done.stderr.splitlines()
    assert lines[0] == f"{pkg}: 2 problems"
    assert lines[1].startswith(f"  {pkg}/steps/apply.sh: file not found")
    assert lines[2].startswith(f"  {pkg}/steps/checks/check.sh: file not found")
    assert done.stdout == ""


def test_the_cli_json_output_is_for_tools(tmp_path: Path) -> None:
    pkg = write_package(tmp_path, stages=STAGES, scripts={"checks/check.sh": sh("true")})

    done = _cli(str(pkg), "-o", "json")

    assert done.returncode == 3
    doc = json.loads(done.stdout)
    assert doc["package_dir"] == str(pkg)
    assert doc["ok"] is False
    assert doc["problems"] == validate_package_dir(pkg)
    assert len(doc["problems"]) == 1


def test_a_package_one_level_too_deep_is_named_as_the_01_layout(tmp_path: Path) -> None:
    """What the agent sees of an image built as 0.1 documented: the image's root mounted at
    the package directory, the files under nodewright-package/ in it."""
    write_package(
        tmp_path / "nodewright-package",
        stages=STAGES,
        scripts={"apply.sh": sh("true"), "checks/check.sh": sh("true")},
    )

    (problem,) = validate_package_dir(tmp_path)

    assert problem.startswith(f"{tmp_path}/config.json: file not found (the image has")
    assert "COPY config.json /config.json" in problem


def test_the_rig_host_root_uses_the_agents_path() -> None:
    from agent.steps import HOST_PATH
    from nodewright.rig import hostroot

    assert hostroot.HOST_PATH == HOST_PATH
