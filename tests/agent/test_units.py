"""Pure helpers of the agent: paths, results, logs, history, settings, flags, interrupts."""

from __future__ import annotations

import ast
import errno
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from agent import events
from agent.config import Stage, Step, parse_config
from agent.errors import UsageError
from agent.history import (
    MAX_ENTRIES,
    Action,
    Entry,
    History,
    HistoryCorrupt,
    parse_history,
    read_history,
    with_entry,
)
from agent.interrupts import Interrupt, InterruptType, parse_interrupt, plan
from agent.layout import HostLayout, resolve_in_root
from agent.logs import rotate
from agent.modes import resolve_from_version, stage_for, step_environment
from agent.result import TERMINATION_MESSAGE_LIMIT, Result, bounded
from agent.settings import AgentSettings, Mode, build_parser, load_settings
from agent.steps import flag_name, substitute_args
from tests.agent.harness import REPO

# --- resolve_in_root ------------------------------------------------------------------------


def test_absolute_symlinks_resolve_inside_the_root(tmp_path: Path) -> None:
    (tmp_path / "data/lib").mkdir(parents=True)
    (tmp_path / "var").mkdir()
    (tmp_path / "var/lib").symlink_to("/data/lib")

    assert resolve_in_root(tmp_path, "/var/lib/x/y") == tmp_path / "data/lib/x/y"


def test_relative_symlinks_and_dotdot_never_climb_above_the_root(tmp_path: Path) -> None:
    (tmp_path / "a/b").mkdir(parents=True)
    (tmp_path / "a/up").symlink_to("../../../../etc")

    assert resolve_in_root(tmp_path, "/a/up/passwd") == tmp_path / "etc/passwd"
    assert resolve_in_root(tmp_path, "/../../a/./b/../b") == tmp_path / "a/b"


def test_symlink_loops_fail_like_the_kernel(tmp_path: Path) -> None:
    (tmp_path / "loop").symlink_to("/loop")

    with pytest.raises(OSError, match="symbolic links") as exc:
        resolve_in_root(tmp_path, "/loop/x")

    assert exc.value.errno == errno.ELOOP


def test_relative_host_paths_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="absolute"):
        resolve_in_root(tmp_path, "var/lib")


# --- result ----------------------------------------------------------------------------------


def test_a_small_result_is_kept_whole() -> None:
    doc = Result(mode="apply", package="p", version="1.0.0", ok=True).to_json()

    assert json.loads(bounded(doc)) == doc


@given(
    tail=st.lists(st.text(min_size=0, max_size=400), max_size=40),
    steps=st.integers(min_value=0, max_value=200),
    error=st.text(max_size=6000),
)
def test_any_result_fits_the_termination_message_and_keeps_the_verdict(
    tail: list[str], steps: int, error: str
) -> None:
    result = Result(
        mode="apply-check",
        package="p",
        version="1.0.0",
        exit_code=1,
        error=error,
        failed_step="x" * 63,
        tail=tail,
        steps=[{"name": f"step-{i}", "ok": i != steps - 1, "rc": 1} for i in range(steps)],
    )

    text = bounded(result.to_json())
    doc = json.loads(text)

    assert len(text.encode()) <= TERMINATION_MESSAGE_LIMIT
    for key in ("ok", "exit_code", "mode", "package", "version", "failed_step"):
        assert doc[key] == result.to_json()[key]


def test_shrinking_drops_the_oldest_tail_lines_first() -> None:
    tail = [f"line {i} " + "x" * 200 for i in range(40)]
    doc = json.loads(bounded(Result(mode="apply", tail=tail).to_json()))

    assert doc["truncated"] is True
    assert doc["tail"][-1] == tail[-1]
    assert doc["tail"] == tail[-len(doc["tail"]) :]


# --- logs ------------------------------------------------------------------------------------


def test_rotation_keeps_the_newest_and_ignores_other_files(tmp_path: Path) -> None:
    names = [f"2026010{d}T000000.000000Z.log" for d in range(1, 8)]
    for name in [*names, "notes.txt"]:
        (tmp_path / name).write_text(name)

    removed = rotate(tmp_path, 3)

    assert sorted(p.name for p in removed) == names[:4]
    assert sorted(p.name for p in tmp_path.iterdir()) == [*names[4:], "notes.txt"]
    with pytest.raises(ValueError, match="at least 1"):
        rotate(tmp_path, 0)


# --- history ---------------------------------------------------------------------------------


def test_history_round_trips_and_tracks_the_current_version() -> None:
    h = History(package="p", current_version=None)
    h = with_entry(h, Entry(version="1.0.0", action=Action.INSTALL, time="t1", run_id="r"))
    h = with_entry(
        h, Entry(version="1.1.0", action=Action.UPGRADE, time="t2", from_version="1.0.0")
    )
    assert h.current_version == "1.1.0"
    h = with_entry(h, Entry(version="1.1.0", action=Action.UNINSTALL, time="t3"))

    assert h.current_version is None
    assert parse_history(json.loads(json.dumps(h.to_json())), "p") == h


def test_history_keeps_a_bounded_number_of_entries() -> None:
    h = History(package="p", current_version=None)
    for i in range(MAX_ENTRIES + 5):
        h = with_entry(h, Entry(version=f"1.0.{i}", action=Action.CONFIG, time=str(i)))

    assert len(h.entries) == MAX_ENTRIES
    assert h.entries[0].version == "1.0.5"


@pytest.mark.parametrize(
    "document",
    [
        pytest.param([], id="not-an-object"),
        pytest.param({"schema": "other", "package": "p", "history": []}, id="wrong-schema"),
        pytest.param(
            {"schema": "nodewright.history/v1", "package": "q", "history": []}, id="other-package"
        ),
        pytest.param(
            {"schema": "nodewright.history/v1", "package": "p", "history": [{"version": "1"}]},
            id="entry-without-time",
        ),
        pytest.param(
            {
                "schema": "nodewright.history/v1",
                "package": "p",
                "history": [{"version": "1", "time": "t", "action": "reinstall"}],
            },
            id="unknown-action",
        ),
    ],
)
def test_malformed_history_is_reported_as_corrupt(document: object) -> None:
    with pytest.raises(HistoryCorrupt):
        parse_history(document, "p")


def test_missing_history_is_empty(tmp_path: Path) -> None:
    assert read_history(tmp_path / "none.json", "p") == History(package="p", current_version=None)


# --- settings ----------------------------------------------------------------------------------


def settings_of(argv: list[str], env: dict[str, str]) -> AgentSettings:
    return load_settings(build_parser().parse_args(argv), env)


def test_flags_override_variables_which_override_defaults() -> None:
    s = load_settings(
        build_parser().parse_args(["apply", "--log-keep", "9"]),
        {"NODEWRIGHT_CR": "my-cr", "NODEWRIGHT_LOG_KEEP": "2", "NODEWRIGHT_HOST_ROOT": "/h"},
    )

    assert (s.cr, s.log_keep, str(s.host_root), s.state_dir) == (
        "my-cr",
        9,
        "/h",
        "/var/lib/nodewright",
    )
    assert s.mode is Mode.APPLY
    assert str(s.termination_log) == "/dev/termination-log"


def test_versions_from_the_executor_are_accepted_as_the_cr_spells_them() -> None:
    s = settings_of(
        ["upgrade", "--from-version", "v1", "--to-version", "1.2"], {"NODEWRIGHT_CR": "c"}
    )
    assert (s.from_version, s.to_version) == ("1.0.0", "1.2.0")


@pytest.mark.parametrize(
    ("argv", "env", "fragment"),
    [
        pytest.param(["apply"], {}, "NODEWRIGHT_CR", id="no-cr"),
        pytest.param(
            ["apply"], {"NODEWRIGHT_CR": "Bad_Name"}, "Kubernetes object name", id="bad-cr"
        ),
        pytest.param(
            ["apply"],
            {"NODEWRIGHT_CR": "c", "NODEWRIGHT_HOSTROOT": "/h"},
            "NODEWRIGHT_HOSTROOT",
            id="typo",
        ),
        pytest.param(
            ["apply", "--log-keep", "0"], {"NODEWRIGHT_CR": "c"}, "between 1", id="keep-0"
        ),
        pytest.param(
            ["apply", "--log-keep", "x"], {"NODEWRIGHT_CR": "c"}, "not an integer", id="keep-x"
        ),
        pytest.param(
            ["apply", "--state-dir", "rel"], {"NODEWRIGHT_CR": "c"}, "absolute", id="relative-state"
        ),
        pytest.param(
            ["upgrade", "--from-version", "1.0.0.0"],
            {"NODEWRIGHT_CR": "c"},
            "semantic",
            id="bad-from",
        ),
        pytest.param(
            ["apply", "--force-rerun", "maybe"], {"NODEWRIGHT_CR": "c"}, "boolean", id="bad-bool"
        ),
        pytest.param(
            ["apply"],
            {"NODEWRIGHT_CR": "c", "NODEWRIGHT_NODE_ORDER": "-1"},
            "NODEWRIGHT_NODE_ORDER='-1' is not a non-negative integer",
            id="negative-order",
        ),
        pytest.param(
            ["apply", "--node-order", "first"],
            {"NODEWRIGHT_CR": "c"},
            "NODEWRIGHT_NODE_ORDER='first' is not a non-negative integer",
            id="bad-order",
        ),
        pytest.param(
            ["apply", "--interrupt-id", "x"],
            {"NODEWRIGHT_CR": "c"},
            "only for the interrupt",
            id="id-in-apply",
        ),
        pytest.param(
            ["interrupt", "--interrupt-id", "x"],
            {"NODEWRIGHT_CR": "c"},
            "NODEWRIGHT_INTERRUPT",
            id="no-spec",
        ),
        pytest.param(
            ["interrupt", "--interrupt", '{"type": "noop"}'],
            {"NODEWRIGHT_CR": "c"},
            "INTERRUPT_ID",
            id="no-id",
        ),
        pytest.param(
            ["interrupt", "--interrupt", '{"type": "noop"}', "--interrupt-id", "../x"],
            {"NODEWRIGHT_CR": "c"},
            "must match",
            id="path-in-id",
        ),
    ],
)
def test_invalid_settings_are_usage_errors_naming_the_variable(
    argv: list[str], env: dict[str, str], fragment: str
) -> None:
    with pytest.raises(UsageError, match=fragment):
        settings_of(argv, env)


def test_an_empty_termination_log_disables_it() -> None:
    s = load_settings(
        build_parser().parse_args(["apply", "--termination-log", ""]), {"NODEWRIGHT_CR": "c"}
    )
    assert s.termination_log is None


def test_modes_map_to_stages() -> None:
    assert [
        (m.value, m.stage, m.is_check) for m in (Mode.POST_INTERRUPT_CHECK, Mode.INTERRUPT)
    ] == [
        ("post-interrupt-check", "post-interrupt", True),
        ("interrupt", None, False),
    ]


# --- steps -----------------------------------------------------------------------------------


def test_env_arguments_are_substituted_and_unset_ones_refused() -> None:
    step = Step(name="s", path="a.sh", args=("env:A", "lit", "envelope"))

    assert substitute_args(step, {"A": "value"}) == ["value", "lit", "envelope"]
    with pytest.raises(UsageError, match="variable A is not set"):
        substitute_args(step, {})


def test_the_flag_name_changes_with_what_the_step_does_and_only_with_that() -> None:
    base = Step(name="s", path="a.sh", args=("x",))
    same = Step(name="s", path="a.sh", args=("x",), timeout_s=5)
    variants = [
        Step(name="s", path="b.sh", args=("x",)),
        Step(name="s", path="a.sh", args=("y",)),
        Step(name="s", path="a.sh", args=("x",), env={"K": "v"}),
        Step(name="s", path="a.sh", args=("x",), success_codes=frozenset({0, 1})),
    ]

    assert flag_name(base) == flag_name(same)
    assert flag_name(base).startswith("s.")
    assert len({flag_name(v) for v in [base, *variants]}) == 5


# --- interrupts ------------------------------------------------------------------------------


def test_restart_all_services_skips_system_plumbing_and_bad_names() -> None:
    commands = plan(
        Interrupt(type=InterruptType.RESTART_ALL_SERVICES),
        lambda: [
            "kubelet.service",
            "dbus.service",
            "systemd-udevd.service",
            "-x",
            "user@0.service",
        ],
    )

    assert [c.argv for c in commands] == [
        ("systemctl", "daemon-reload"),
        ("systemctl", "restart", "kubelet.service"),
    ]


def test_service_lists_are_deduplicated_in_order() -> None:
    parsed = parse_interrupt('{"type": "service", "services": ["b", "a", "b"]}')
    assert parsed.services == ("b", "a")
    assert [c.slug for c in plan(parsed, list)] == ["daemon-reload", "restart-b", "restart-a"]


def test_a_reboot_is_a_single_flagged_command() -> None:
    (command,) = plan(parse_interrupt('{"type": "reboot"}'), list)
    assert (command.slug, command.argv, command.reboot) == ("reboot", ("reboot",), True)


# --- modes -----------------------------------------------------------------------------------

CONFIG = parse_config(
    {
        "schema_version": "v1",
        "name": "p",
        "version": "2.0.0",
        "stages": {
            "apply": {"steps": [{"name": "s", "path": "a"}], "check": [{"name": "c", "path": "c"}]}
        },
    }
)


def test_upgrade_falls_back_to_apply_and_other_missing_stages_are_empty() -> None:
    stage, spec = stage_for(Mode.UPGRADE_CHECK, CONFIG)
    assert (stage.value, [s.name for s in spec.check]) == ("apply", ["c"])
    assert stage_for(Mode.CONFIG, CONFIG)[1].steps == ()


def test_steps_get_the_host_copy_of_the_node_metadata_never_the_container_mount() -> None:
    default = settings_of(["apply"], {"NODEWRIGHT_CR": "c"})
    flagged = settings_of(
        ["apply", "--node-metadata-dir", "/flag"],
        {"NODEWRIGHT_CR": "c", "NODEWRIGHT_NODE_METADATA_DIR": "/var"},
    )
    env = step_environment(
        environ={"NODEWRIGHT_CR": "c", "NODEWRIGHT_NODE_METADATA_DIR": "/var", "X": "1"},
        settings=flagged,
        layout=HostLayout(
            host_root=Path("/host"), state_dir="/var/lib/nodewright", log_dir="/l", cr="c"
        ),
        config=CONFIG,
        stage=Stage.APPLY,
        from_version=None,
    )

    assert str(default.node_metadata_dir) == "/nodewright-node-metadata"
    assert str(flagged.node_metadata_dir) == "/flag"
    assert env["NODEWRIGHT_NODE_METADATA_DIR"] == (
        "/var/lib/nodewright/c/packages/p/2.0.0/node-metadata"
    )
    assert env["NODEWRIGHT_CONFIG_DIR"] == "/var/lib/nodewright/c/packages/p/2.0.0/config"
    assert env["X"] == "1"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({"NODEWRIGHT_NODE_ORDER": "0"}, "0", id="zero-is-passed"),
        pytest.param({"NODEWRIGHT_NODE_ORDER": "12"}, "12", id="twelve"),
        pytest.param({"NODEWRIGHT_NODE_ORDER": ""}, None, id="empty-is-unknown"),
        pytest.param({}, None, id="unset"),
    ],
)
def test_steps_get_the_node_order_only_when_the_executor_passed_one(
    env: dict[str, str], expected: str | None
) -> None:
    environ = {"NODEWRIGHT_CR": "c", **env}
    settings = settings_of(["apply"], environ)
    step_env = step_environment(
        environ=environ,
        settings=settings,
        layout=HostLayout(
            host_root=Path("/host"), state_dir="/var/lib/nodewright", log_dir="/l", cr="c"
        ),
        config=CONFIG,
        stage=Stage.APPLY,
        from_version=None,
    )
    assert settings.node_order == (None if expected is None else int(expected))
    assert step_env.get("NODEWRIGHT_NODE_ORDER") == expected


def _log() -> events.EventLog:
    return events.setup(io.StringIO())


def _settings(from_version: str | None) -> AgentSettings:
    argv = ["upgrade", *(["--from-version", from_version] if from_version else [])]
    return settings_of(argv, {"NODEWRIGHT_CR": "c"})


def test_the_from_version_comes_from_the_executor_or_else_the_history() -> None:
    installed = with_entry(
        History(package="p", current_version=None),
        Entry(version="1.0.0", action=Action.INSTALL, time="t"),
    )

    assert resolve_from_version(_settings("1.5.0"), installed, "2.0.0", _log()) == "1.5.0"
    assert resolve_from_version(_settings(None), installed, "2.0.0", _log()) == "1.0.0"
    with pytest.raises(UsageError, match="not an upgrade"):
        resolve_from_version(_settings("2.0.0"), installed, "2.0.0", _log())


# --- events ----------------------------------------------------------------------------------


def test_events_are_json_lines_with_bound_fields_and_bounded_values() -> None:
    out = io.StringIO()
    log = events.setup(out).bind(cr="c", package="p")

    log.info("Started step", extra={"event": "step.started", "step": "s", "line": "x" * 5000})

    (line,) = out.getvalue().splitlines()
    doc = json.loads(line)
    assert (doc["msg"], doc["event"], doc["cr"], doc["package"], doc["step"]) == (
        "Started step",
        "step.started",
        "c",
        "p",
        "s",
    )
    assert doc["level"] == "info"
    assert doc["ts"].endswith("Z")
    assert len(doc["line"]) < 2100


# --- the CLI without a chroot ------------------------------------------------------------------


def run_cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent", *argv],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_validate_command_accepts_the_example_and_rejects_a_broken_package(
    tmp_path: Path,
) -> None:
    ok = run_cli("validate", str(REPO / "examples/packages/sysctl-tuning"))
    (tmp_path / "config.json").write_text("{}")
    bad = run_cli("validate", str(tmp_path))

    assert ok.returncode == 0
    assert json.loads(ok.stdout)["problems"] == []
    assert bad.returncode == 3
    assert "missing required field 'name'" in json.loads(bad.stdout)["problems"][1]


def test_a_usage_error_still_writes_a_result(tmp_path: Path) -> None:
    term = tmp_path / "term"

    proc = run_cli("apply", env={"NODEWRIGHT_TERMINATION_LOG": str(term)})

    assert proc.returncode == 2
    result = json.loads(term.read_text())
    assert (result["ok"], result["exit_code"], result["mode"]) == (False, 2, "apply")
    assert "NODEWRIGHT_CR" in result["error"]
    last = json.loads(proc.stdout.splitlines()[-1])
    assert last["event"] == "agent.finished"
    assert last["result"] == result


def test_a_missing_host_root_is_a_host_error(tmp_path: Path) -> None:
    proc = run_cli(
        "apply",
        "--cr",
        "c",
        "--host-root",
        str(tmp_path / "absent"),
        "--package-dir",
        str(REPO / "examples/packages/sysctl-tuning"),
        "--termination-log",
        str(tmp_path / "term"),
    )

    assert proc.returncode == 4
    assert "is not a directory" in json.loads((tmp_path / "term").read_text())["error"]


def test_the_agent_imports_only_the_standard_library_and_itself() -> None:
    """It must run from a minimal Python image: no shared/, services/, nodewright or PyPI."""
    imported: set[str] = set()
    for path in (REPO / "agent").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])

    assert {"agent", "subprocess", "json"} <= imported
    assert imported - sys.stdlib_module_names - {"agent"} == set()
