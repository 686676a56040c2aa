"""The agent running real scripts chrooted into a real root filesystem: steps and their rules."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.agent.harness import Node, sh, write_package

# Fixture time (a cold root filesystem build) is not a test's time; the bodies stay bounded.
pytestmark = pytest.mark.timeout(120, func_only=True)


def counting_package(node: Node, directory: Path, *, version: str = "1.0.0") -> Path:
    """apply: a run-once step and a run-always step, each appending to a counter on the host."""
    scratch = node.scratch()
    count = sh(f'echo "$NODEWRIGHT_STEP $NODEWRIGHT_PACKAGE_VERSION" >> {scratch}/runs\necho ran')
    return write_package(
        directory,
        version=version,
        stages={
            "apply": {
                "steps": [
                    {"name": "once", "path": "count.sh"},
                    {"name": "every-time", "path": "count.sh", "run": "always"},
                ],
                "check": [{"name": "ok", "path": "true.sh"}],
            }
        },
        scripts={"count.sh": count, "true.sh": sh("true")},
    )


def runs(node: Node) -> list[str]:
    return node.host(f"/var/tmp/{node.cr}/runs").read_text().splitlines()


def test_a_run_once_step_runs_once_and_an_always_step_every_time(
    node: Node, tmp_path: Path
) -> None:
    pkg = counting_package(node, tmp_path / "pkg")

    first = node.run("apply", pkg)
    second = node.run("apply", pkg)

    assert first.returncode == 0, first.events
    assert second.returncode == 0, second.events
    assert first.ran() == ["once", "every-time"]
    assert second.ran() == ["every-time"]
    assert second.skipped() == ["once"]
    assert runs(node) == ["once 1.0.0", "every-time 1.0.0", "every-time 1.0.0"]
    flags = list((node.state / "flags" / "demo" / "1.0.0" / "apply").iterdir())
    assert [f.name.split(".")[0] for f in flags] == ["once"]


def test_force_rerun_and_a_new_version_run_flagged_steps_again(node: Node, tmp_path: Path) -> None:
    pkg = counting_package(node, tmp_path / "pkg")
    assert node.run("apply", pkg).returncode == 0

    forced = node.run("apply", pkg, "--force-rerun", "true")
    upgraded = node.run("apply", counting_package(node, tmp_path / "pkg2", version="1.1.0"))

    assert forced.ran() == ["once", "every-time"]
    assert upgraded.ran() == ["once", "every-time"]


def test_changing_a_steps_arguments_runs_it_again(node: Node, tmp_path: Path) -> None:
    scratch = node.scratch()
    script = {"echo.sh": sh(f'echo "$1" >> {scratch}/args')}
    check = [{"name": "ok", "path": "echo.sh", "args": ["check"]}]
    first = write_package(
        tmp_path / "a",
        stages={
            "apply": {"steps": [{"name": "s", "path": "echo.sh", "args": ["x"]}], "check": check}
        },
        scripts=script,
    )
    second = write_package(
        tmp_path / "b",
        stages={
            "apply": {"steps": [{"name": "s", "path": "echo.sh", "args": ["y"]}], "check": check}
        },
        scripts=script,
    )

    node.run("apply", first)
    node.run("apply", first)
    node.run("apply", second)

    assert node.host(f"{scratch}/args").read_text().split() == ["x", "y"]


@pytest.mark.parametrize("mode", ["config", "apply-check"])
def test_modes_other_than_apply_run_every_step_every_time(
    node: Node, tmp_path: Path, mode: str
) -> None:
    scratch = node.scratch()
    pkg = write_package(
        tmp_path / "pkg",
        stages={
            "apply": {
                "steps": [{"name": "a", "path": "mark.sh"}],
                "check": [{"name": "c", "path": "mark.sh"}],
            },
            "config": {
                "steps": [{"name": "a", "path": "mark.sh"}],
                "check": [{"name": "c", "path": "mark.sh"}],
            },
        },
        scripts={"mark.sh": sh(f"echo x >> {scratch}/marks")},
    )

    results = [node.run(mode, pkg) for _ in range(3)]

    assert [r.returncode for r in results] == [0, 0, 0]
    assert len(node.host(f"{scratch}/marks").read_text().split()) == 3


def test_a_missing_step_file_fails_loudly_naming_it_before_anything_runs(
    node: Node, tmp_path: Path
) -> None:
    scratch = node.scratch()
    pkg = write_package(
        tmp_path / "pkg",
        stages={
            "apply": {
                "steps": [{"name": "good", "path": "good.sh"}],
                "check": [{"name": "ok", "path": "good.sh"}],
            },
            # A typo in a stage other than the one being run still fails the run.
            "config": {
                "steps": [{"name": "typo", "path": "confgi.sh"}],
                "check": [{"name": "ok", "path": "good.sh"}],
            },
        },
        scripts={"good.sh": sh(f"touch {scratch}/ran")},
    )

    result = node.run("apply", pkg)

    assert result.returncode == 3
    assert result.result is not None
    assert "confgi.sh" in result.result["error"]
    assert "file not found" in result.result["error"]
    assert result.result["ok"] is False
    assert result.ran() == []
    assert not node.host(f"{scratch}/ran").exists()
    assert not node.state.exists()


def test_a_step_file_deleted_after_staging_is_a_failure_not_a_success(
    node: Node, tmp_path: Path
) -> None:
    """The load-time check cannot see a file vanish later; execution must still fail loudly."""
    pkg = write_package(
        tmp_path / "pkg",
        stages={
            "apply": {
                "steps": [
                    {"name": "remove-next", "path": "rm.sh"},
                    {"name": "next", "path": "next.sh"},
                ],
                "check": [{"name": "ok", "path": "rm.sh"}],
            }
        },
        scripts={"rm.sh": sh('rm -f "$NODEWRIGHT_STEPS_DIR/next.sh"'), "next.sh": sh("true")},
    )

    result = node.run("apply", pkg)

    assert result.returncode == 1
    assert result.result is not None
    assert result.result["failed_step"] == "next"
    assert "next.sh" in result.result["error"]


def test_a_failing_check_exits_non_zero_with_the_tail_of_its_output(
    node: Node, tmp_path: Path
) -> None:
    noisy = "\n".join(f"echo 'line {i}'" for i in range(1, 41))
    pkg = write_package(
        tmp_path / "pkg",
        stages={
            "apply": {
                "steps": [{"name": "s", "path": "true.sh"}],
                "check": [
                    {"name": "passes", "path": "true.sh"},
                    {"name": "fails", "path": "fail.sh"},
                    {"name": "never", "path": "true.sh"},
                ],
            }
        },
        scripts={"true.sh": sh("true"), "fail.sh": sh(noisy + "\necho 'drift found' >&2\nexit 3")},
    )

    result = node.run("apply-check", pkg)

    assert result.returncode == 1
    assert result.result is not None
    assert result.result["failed_step"] == "fails"
    assert "exited with 3" in result.result["error"]
    assert result.result["tail"][-1] == "stderr: drift found"
    assert result.result["tail"][-2] == "stdout: line 40"
    assert "stdout: line 1" not in result.result["tail"]
    assert result.ran() == ["passes", "fails"]
    finished = {e["step"]: e for e in result.of("step.finished")}
    assert finished["fails"]["rc"] == 3
    assert finished["fails"]["tail"] == result.result["tail"]
    assert "duration_s" in finished["passes"]
    assert [s["name"] for s in result.result["steps"]] == ["passes", "fails"]


def test_a_chatty_failing_step_is_bounded_in_events_and_termination_message(
    node: Node, tmp_path: Path
) -> None:
    line = "x" * 200
    pkg = write_package(
        tmp_path / "pkg",
        stages={
            "apply": {
                "steps": [{"name": "chatty", "path": "chatty.sh"}],
                "check": [{"name": "c", "path": "chatty.sh"}],
            }
        },
        scripts={
            "chatty.sh": sh(f'seq 1 6000 | while read -r i; do echo "$i {line}"; done\nexit 1')
        },
    )

    result = node.run("apply", pkg)

    assert result.returncode == 1
    assert 0 < result.termination_bytes <= 4096
    assert result.result is not None
    assert result.result["failed_step"] == "chatty"
    assert result.result["tail"][-1] == f"stdout: 6000 {line}"
    assert len(result.of("step.output")) == 5000
    (truncated,) = result.of("step.output_truncated")
    log_lines = Path(node.rootfs, truncated["log_file"].lstrip("/")).read_text().splitlines()
    assert sum(" stdout " in x for x in log_lines) == 6000


def test_success_codes_decide_success(node: Node, tmp_path: Path) -> None:
    pkg = write_package(
        tmp_path / "pkg",
        stages={
            "apply": {
                "steps": [{"name": "two-is-fine", "path": "exit2.sh", "success_codes": [0, 2]}],
                "check": [{"name": "zero-only", "path": "exit2.sh"}],
            }
        },
        scripts={"exit2.sh": sh("exit 2")},
    )

    assert node.run("apply", pkg).returncode == 0
    assert node.run("apply-check", pkg).returncode == 1


def test_steps_run_chrooted_with_env_config_files_and_substituted_arguments(
    node: Node, tmp_path: Path
) -> None:
    scratch = node.scratch()
    config = tmp_path / "config"
    config.mkdir()
    (config / "settings.txt").write_text("from the configmap\n")
    # Kubernetes ConfigMap volumes keep bookkeeping entries that must not be staged.
    (config / "..data").mkdir()
    pkg = write_package(
        tmp_path / "pkg",
        expected_config_files=["settings.txt"],
        stages={
            "apply": {
                "steps": [
                    {
                        "name": "show",
                        "path": "show.sh",
                        "args": ["env:TOKEN", "literal"],
                        "env": {"STEP_ONLY": "yes"},
                    }
                ],
                "check": [{"name": "ok", "path": "show.sh", "args": ["a", "b"]}],
            }
        },
        scripts={
            "show.sh": sh(
                f"""
out={scratch}/seen
echo "args=$1,$2" > $out
echo "token=$TOKEN step_only=$STEP_ONLY" >> $out
echo "pwd=$(pwd)" >> $out
echo "config=$(cat "$NODEWRIGHT_CONFIG_DIR/settings.txt")" >> $out
ls -a "$NODEWRIGHT_CONFIG_DIR" | tr '\\n' ' ' >> $out; echo >> $out
echo "root_marker=$(cat /.nodewright-test-rootfs)" >> $out
echo "host_root_var=${{NODEWRIGHT_HOST_ROOT:-unset}}" >> $out
echo "package=$NODEWRIGHT_PACKAGE@$NODEWRIGHT_PACKAGE_VERSION mode=$NODEWRIGHT_MODE" >> $out
echo "node_order=${{NODEWRIGHT_NODE_ORDER:-unset}}" >> $out
"""
            )
        },
    )

    result = node.run(
        "apply", pkg, config_dir=config, env={"TOKEN": "s3cret", "NODEWRIGHT_NODE_ORDER": "3"}
    )

    assert result.returncode == 0, result.events
    seen = node.host(f"{scratch}/seen").read_text().splitlines()
    staged = f"/var/lib/nodewright/{node.cr}/packages/demo/1.0.0"
    assert seen[0] == "args=s3cret,literal"
    assert seen[1] == "token=s3cret step_only=yes"
    assert seen[2] == f"pwd={staged}"
    assert seen[3] == "config=from the configmap"
    assert seen[4].split() == [".", "..", "settings.txt"]
    # It really ran inside the test root filesystem.
    assert seen[5].startswith(("root_marker=debootstrap-", "root_marker=busybox-"))
    assert seen[6] == "host_root_var=unset"  # container-only inputs are not passed to steps
    assert seen[7] == "package=demo@1.0.0 mode=apply"
    assert seen[8] == "node_order=3"  # the executor's NODEWRIGHT_NODE_ORDER reaches the steps
    # Substituted values never reach the event stream: they may be secrets.
    assert "s3cret" not in json.dumps(result.events)


def test_an_unset_env_argument_fails_before_any_step_runs(node: Node, tmp_path: Path) -> None:
    scratch = node.scratch()
    pkg = write_package(
        tmp_path / "pkg",
        stages={
            "apply": {
                "steps": [
                    {"name": "first", "path": "mark.sh"},
                    {"name": "second", "path": "mark.sh", "args": ["env:NOT_SET"]},
                ],
                "check": [{"name": "ok", "path": "mark.sh"}],
            }
        },
        scripts={"mark.sh": sh(f"touch {scratch}/ran")},
    )

    result = node.run("apply", pkg)

    assert result.returncode == 2
    assert result.result is not None
    assert "NOT_SET" in result.result["error"]
    assert "second" in result.result["error"]
    assert not node.host(f"{scratch}/ran").exists()


def test_a_missing_expected_config_file_fails_naming_it(node: Node, tmp_path: Path) -> None:
    pkg = write_package(
        tmp_path / "pkg",
        expected_config_files=["needed.conf"],
        stages={
            "apply": {
                "steps": [{"name": "s", "path": "t.sh"}],
                "check": [{"name": "c", "path": "t.sh"}],
            }
        },
        scripts={"t.sh": sh("true")},
    )

    result = node.run("apply", pkg)

    assert result.returncode == 3
    assert result.result is not None
    assert "needed.conf" in result.result["error"]


def test_a_missing_interpreter_on_the_host_fails_the_step_with_a_clear_message(
    node: Node, tmp_path: Path
) -> None:
    pkg = write_package(
        tmp_path / "pkg",
        stages={
            "apply": {
                "steps": [{"name": "py", "path": "p.py"}],
                "check": [{"name": "c", "path": "p.py"}],
            }
        },
        scripts={"p.py": "#!/usr/bin/nonexistent-python3\nprint('hi')\n"},
    )

    result = node.run("apply", pkg)

    assert result.returncode == 1
    assert result.result is not None
    assert result.result["failed_step"] == "py"
    assert "cannot execute" in result.result["error"]
    assert "interpreter" in result.result["error"]


def test_a_step_past_its_timeout_is_killed_and_fails(node: Node, tmp_path: Path) -> None:
    pkg = write_package(
        tmp_path / "pkg",
        stages={
            "apply": {
                "steps": [{"name": "slow", "path": "slow.sh", "timeout_seconds": 1}],
                "check": [{"name": "c", "path": "slow.sh"}],
            }
        },
        scripts={"slow.sh": sh("echo started\nsleep 60")},
    )

    result = node.run("apply", pkg)

    assert result.returncode == 1
    assert result.duration_s < 30
    assert result.result is not None
    assert "timed out" in result.result["error"]
    assert result.result["steps"] == [
        {
            "name": "slow",
            "ok": False,
            "rc": None,
            "duration_s": pytest.approx(1, abs=5),
            "timed_out": True,
        }
    ]


def test_a_step_that_leaves_a_daemon_holding_its_output_does_not_hang_the_agent(
    node: Node, tmp_path: Path
) -> None:
    pkg = write_package(
        tmp_path / "pkg",
        stages={
            "apply": {
                "steps": [{"name": "daemon", "path": "d.sh"}],
                "check": [{"name": "c", "path": "d.sh"}],
            }
        },
        scripts={"d.sh": sh("sleep 30 &\necho started daemon")},
    )

    result = node.run("apply", pkg)

    assert result.returncode == 0
    assert result.duration_s < 20
    assert [e["line"] for e in result.of("step.output")] == ["started daemon"]


def test_sigterm_lets_the_running_step_finish_and_stops_before_the_next(
    node: Node, tmp_path: Path
) -> None:
    scratch = node.scratch()
    pkg = write_package(
        tmp_path / "pkg",
        stages={
            "apply": {
                "steps": [
                    {"name": "first", "path": "first.sh"},
                    {"name": "second", "path": "second.sh"},
                ],
                "check": [{"name": "c", "path": "second.sh"}],
            }
        },
        scripts={
            "first.sh": sh(f"touch {scratch}/first-started\nsleep 2\ntouch {scratch}/first-done"),
            "second.sh": sh(f"touch {scratch}/second"),
        },
    )
    started = time.monotonic()

    proc = node.start("apply", pkg)
    node.terminate_when(proc, node.host(f"{scratch}/first-started"))
    result = node.finish(proc, started)

    assert result.returncode == 143
    assert node.host(f"{scratch}/first-done").exists()
    assert not node.host(f"{scratch}/second").exists()
    assert result.result is not None
    assert "termination signal" in result.result["error"]
    # The interrupted run left no flag for the step that did not run, and one for the first.
    flags = [f.name.split(".")[0] for f in (node.state / "flags/demo/1.0.0/apply").iterdir()]
    assert flags == ["first"]


def test_static_files_are_laid_onto_the_host_in_apply_but_not_in_uninstall(
    node: Node, tmp_path: Path
) -> None:
    pkg = write_package(
        tmp_path / "pkg",
        name=f"files-{node.cr}",
        stages={
            "apply": {
                "steps": [{"name": "s", "path": "t.sh"}],
                "check": [{"name": "c", "path": "t.sh"}],
            },
            "uninstall": {
                "steps": [{"name": "rm", "path": "rm.sh"}],
                "check": [{"name": "c", "path": "t.sh"}],
            },
        },
        scripts={"t.sh": sh("true"), "rm.sh": sh(f"rm -f /etc/nodewright-test/{node.cr}.conf")},
        root_files={f"etc/nodewright-test/{node.cr}.conf": "setting=1\n"},
    )
    laid = node.host(f"/etc/nodewright-test/{node.cr}.conf")

    assert node.run("apply", pkg).returncode == 0
    assert laid.read_text() == "setting=1\n"
    assert node.run("uninstall", pkg).returncode == 0
    assert not laid.exists()


def test_static_files_follow_host_symlinks_inside_the_host_root(node: Node, tmp_path: Path) -> None:
    """An absolute symlink on the host must resolve against the host root, not the container."""
    link_name = f"nw-link-{node.cr}"
    target = f"/opt/nw-target-{node.cr}"
    node.host(target).mkdir(parents=True)
    node.host(f"/etc/{link_name}").symlink_to(target)
    pkg = write_package(
        tmp_path / "pkg",
        stages={
            "apply": {
                "steps": [{"name": "s", "path": "t.sh"}],
                "check": [{"name": "c", "path": "t.sh"}],
            }
        },
        scripts={"t.sh": sh("true")},
        root_files={f"etc/{link_name}/file.conf": "inside\n"},
    )

    result = node.run("apply", pkg)

    assert result.returncode == 0, result.result
    assert node.host(f"{target}/file.conf").read_text() == "inside\n"
    # Nothing was written through the path as the container (this test process) sees it.
    assert not Path(target).exists()
    assert not Path(f"/etc/{link_name}").exists()
