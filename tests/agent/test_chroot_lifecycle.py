"""The agent in a real chroot across a package's life: history, upgrade, uninstall, logs, and
the example package."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.logs import LOG_NAME_RE
from tests.agent.harness import REPO, Node, sh, write_package

pytestmark = pytest.mark.timeout(120, func_only=True)


def versioned(node: Node, directory: Path, version: str, *, upgrade: bool) -> Path:
    scratch = node.scratch()
    stages: dict[str, Any] = {
        "apply": {
            "steps": [{"name": "install", "path": "record.sh", "args": ["apply"]}],
            "check": [{"name": "check", "path": "true.sh"}],
        },
        "uninstall": {
            "steps": [{"name": "remove", "path": "record.sh", "args": ["uninstall"]}],
            "check": [{"name": "check", "path": "true.sh"}],
        },
    }
    if upgrade:
        stages["upgrade"] = {
            "steps": [{"name": "migrate", "path": "record.sh", "args": ["upgrade"]}],
            "check": [{"name": "check", "path": "true.sh"}],
        }
    record = sh(
        f'echo "$1 $NODEWRIGHT_PACKAGE_VERSION from=${{NODEWRIGHT_FROM_VERSION:-}} '
        f'to=${{NODEWRIGHT_TO_VERSION:-}}" >> {scratch}/record\n'
        'mkdir -p "$NODEWRIGHT_DATA_DIR" && echo kept > "$NODEWRIGHT_DATA_DIR/data"'
    )
    return write_package(
        directory,
        name="tool",
        version=version,
        stages=stages,
        scripts={"record.sh": record, "true.sh": sh("true")},
    )


def records(node: Node) -> list[str]:
    return node.host(f"/var/tmp/{node.cr}/record").read_text().splitlines()


def actions(node: Node) -> list[tuple[str, str, str | None]]:
    return [
        (h["action"], h["version"], h.get("from_version")) for h in node.history("tool")["history"]
    ]


def test_history_records_install_upgrade_and_uninstall(node: Node, tmp_path: Path) -> None:
    v1 = versioned(node, tmp_path / "v1", "1.0.0", upgrade=True)
    v2 = versioned(node, tmp_path / "v2", "1.1.0", upgrade=True)

    assert node.run("apply", v1, "--run-id", "run-1").returncode == 0
    assert not (node.state / "history" / "tool.json").exists()  # only a passing check records
    assert node.run("apply-check", v1, "--run-id", "run-1").returncode == 0
    assert node.history("tool")["current_version"] == "1.0.0"

    # The from-version comes from the host's history when the executor does not pass one.
    up = node.run("upgrade", v2)
    assert up.returncode == 0, up.result
    assert up.ran() == ["migrate"]
    assert up.result is not None
    assert up.result["from_version"] == "1.0.0"
    assert node.run("upgrade-check", v2).returncode == 0
    assert node.history("tool")["current_version"] == "1.1.0"
    # Upgrading dropped the old version's staged copy and flags.
    assert [p.name for p in (node.state / "packages" / "tool").iterdir()] == ["1.1.0"]
    assert not (node.state / "flags" / "tool" / "1.0.0").exists()

    assert node.run("uninstall", v2).returncode == 0
    assert node.history("tool")["current_version"] == "1.1.0"
    assert node.run("uninstall-check", v2).returncode == 0

    history = node.history("tool")
    assert history["current_version"] is None
    assert actions(node) == [
        ("install", "1.0.0", None),
        ("upgrade", "1.1.0", "1.0.0"),
        ("uninstall", "1.1.0", None),
    ]
    assert history["history"][0]["run_id"] == "run-1"
    assert records(node) == [
        "apply 1.0.0 from= to=",
        "upgrade 1.1.0 from=1.0.0 to=1.1.0",
        "uninstall 1.1.0 from= to=",
    ]
    # An uninstalled package leaves no flags, staged copy or data behind.
    for leftover in ("flags", "packages", "data"):
        assert not (node.state / leftover / "tool").exists(), leftover


def test_a_package_without_an_upgrade_stage_is_upgraded_by_its_apply_stage(
    node: Node, tmp_path: Path
) -> None:
    v1 = versioned(node, tmp_path / "v1", "1.0.0", upgrade=False)
    v2 = versioned(node, tmp_path / "v2", "2.0.0", upgrade=False)
    node.run("apply", v1)
    node.run("apply-check", v1)

    up = node.run("upgrade", v2, "--from-version", "1.0.0")

    assert up.returncode == 0
    assert up.ran() == ["install"]
    assert up.of("stage.fallback")
    assert records(node)[-1] == "apply 2.0.0 from=1.0.0 to=2.0.0"


@pytest.mark.parametrize(
    ("history_first", "from_flag", "fragment"),
    [
        pytest.param(False, None, "NODEWRIGHT_FROM_VERSION", id="no-history-no-flag"),
        pytest.param(True, "1.1.0", "not an upgrade", id="same-version"),
        pytest.param(True, "2.0.0", "not an upgrade", id="downgrade"),
    ],
)
def test_an_upgrade_without_a_lower_from_version_is_refused(
    node: Node, tmp_path: Path, history_first: bool, from_flag: str | None, fragment: str
) -> None:
    v1 = versioned(node, tmp_path / "v1", "1.0.0", upgrade=True)
    v2 = versioned(node, tmp_path / "v2", "1.1.0", upgrade=True)
    if history_first:
        node.run("apply", v1)
        node.run("apply-check", v1)
    args = ["--from-version", from_flag] if from_flag else []

    result = node.run("upgrade", v2, *args)

    assert result.returncode == 2
    assert result.result is not None
    assert fragment in result.result["error"]
    assert result.ran() == []


def test_a_retried_upgrade_check_after_history_was_recorded_still_works(
    node: Node, tmp_path: Path
) -> None:
    v1 = versioned(node, tmp_path / "v1", "1.0.0", upgrade=True)
    v2 = versioned(node, tmp_path / "v2", "1.1.0", upgrade=True)
    for mode, pkg in (("apply", v1), ("apply-check", v1), ("upgrade", v2), ("upgrade-check", v2)):
        assert node.run(mode, pkg).returncode == 0

    retry = node.run("upgrade-check", v2)

    assert retry.returncode == 0, retry.result
    assert retry.result is not None
    assert retry.result["from_version"] == "1.0.0"


def test_the_expected_version_guards_against_running_the_wrong_image(
    node: Node, tmp_path: Path
) -> None:
    v1 = versioned(node, tmp_path / "v1", "1.0.0", upgrade=False)

    wrong = node.run("apply", v1, "--to-version", "v1.1")
    right = node.run("apply", v1, "--to-version", "v1.0")

    assert wrong.returncode == 3
    assert wrong.result is not None
    assert "version 1.0.0, but NODEWRIGHT_TO_VERSION says 1.1.0" in wrong.result["error"]
    assert wrong.ran() == []
    assert right.returncode == 0


def test_uninstall_of_a_package_without_an_uninstall_stage_fails(
    node: Node, tmp_path: Path
) -> None:
    pkg = write_package(
        tmp_path / "pkg",
        stages={
            "apply": {
                "steps": [{"name": "s", "path": "t.sh"}],
                "check": [{"name": "c", "path": "t.sh"}],
            }
        },
        scripts={"t.sh": sh("true")},
    )

    result = node.run("uninstall", pkg)

    assert result.returncode == 3
    assert result.result is not None
    assert "no uninstall stage" in result.result["error"]


def test_a_corrupt_history_file_is_set_aside_not_lost(node: Node, tmp_path: Path) -> None:
    v1 = versioned(node, tmp_path / "v1", "1.0.0", upgrade=False)
    history = node.state / "history" / "tool.json"
    history.parent.mkdir(parents=True)
    history.write_text("{not json")

    result = node.run("apply-check", v1)

    assert result.returncode == 0
    assert result.of("history.corrupt")
    assert node.history("tool")["current_version"] == "1.0.0"
    aside = [p for p in history.parent.iterdir() if ".corrupt-" in p.name]
    assert [p.read_text() for p in aside] == ["{not json"]


def test_log_rotation_keeps_the_newest_n_files_per_step(node: Node, tmp_path: Path) -> None:
    pkg = write_package(
        tmp_path / "pkg",
        stages={
            "apply": {
                "steps": [{"name": "talk", "path": "talk.sh", "run": "always"}],
                "check": [{"name": "c", "path": "talk.sh"}],
            }
        },
        scripts={"talk.sh": sh('echo "run number $RUN"\necho "to stderr" >&2')},
    )

    for run in range(1, 8):
        assert node.run("apply", pkg, "--log-keep", "3", env={"RUN": str(run)}).returncode == 0

    log_dir = node.logs / "demo" / "1.0.0" / "apply" / "talk"
    files = sorted(log_dir.iterdir())
    assert len(files) == 3
    assert all(LOG_NAME_RE.fullmatch(f.name) for f in files)
    contents = [f.read_text() for f in files]
    assert ["run number 5" in contents[0], "run number 6" in contents[1]] == [True, True]
    newest = contents[2]
    assert " stdout run number 7\n" in newest
    assert " stderr to stderr\n" in newest
    assert "exit 0" in newest
    # The check mode's logs are rotated separately.
    assert not (node.logs / "demo" / "1.0.0" / "apply-check").exists()


# --- the example package ----------------------------------------------------------------

EXAMPLE = REPO / "examples" / "packages" / "sysctl-tuning"
SYSCTLS = {
    "vm/swappiness": "60",
    "net/core/somaxconn": "128",
    "net/ipv4/ip_local_port_range": "32768\t60999",
}


@pytest.fixture
def fake_proc_sys(node: Node) -> Iterator[None]:
    """The test chroot has no /proc mounted: plain files stand in for the kernel's sysctls, so
    the example package runs unmodified without touching this machine's kernel."""
    assert not os.path.ismount(node.host("/proc"))
    for key, value in SYSCTLS.items():
        path = node.host(f"/proc/sys/{key}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")
    yield
    shutil.rmtree(node.host("/proc/sys"))


def live(node: Node, key: str) -> str:
    return node.host(f"/proc/sys/{key}").read_text().strip()


@pytest.mark.usefixtures("fake_proc_sys")
def test_the_example_sysctl_package_installs_checks_reconfigures_and_uninstalls(
    node: Node, tmp_path: Path
) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "sysctl.conf").write_text("# tuned\nvm.swappiness = 10\nnet.core.somaxconn=4096\n")
    conf = node.host("/etc/sysctl.d/90-nodewright-sysctl-tuning.conf")

    for mode in ("apply", "apply-check"):
        result = node.run(mode, EXAMPLE, config_dir=config)
        assert result.returncode == 0, (mode, result.result)
    assert live(node, "vm/swappiness") == "10"
    assert live(node, "net/core/somaxconn") == "4096"
    assert conf.read_text().splitlines()[1:] == ["vm.swappiness = 10", "net.core.somaxconn = 4096"]

    # Drift on the node: the check notices and says which value is wrong.
    node.host("/proc/sys/vm/swappiness").write_text("30\n")
    drift = node.run("apply-check", EXAMPLE, config_dir=config)
    assert drift.returncode == 1
    assert drift.result is not None
    assert "stdout: FAIL: vm.swappiness is '30', want '10'" in drift.result["tail"]

    # A configMap change: somaxconn is no longer managed and goes back to its original value.
    (config / "sysctl.conf").write_text(
        "vm.swappiness = 5\nnet.ipv4.ip_local_port_range = 1024 65000\n"
    )
    for mode in ("config", "config-check"):
        result = node.run(mode, EXAMPLE, config_dir=config)
        assert result.returncode == 0, (mode, result.result)
    assert live(node, "vm/swappiness") == "5"
    assert live(node, "net/core/somaxconn") == "128"
    assert live(node, "net/ipv4/ip_local_port_range") == "1024 65000"

    for mode in ("uninstall", "uninstall-check"):
        result = node.run(mode, EXAMPLE, config_dir=config)
        assert result.returncode == 0, (mode, result.result)
    assert not conf.exists()
    assert live(node, "vm/swappiness") == "60"
    assert live(node, "net/ipv4/ip_local_port_range") == "32768 60999"
    history = node.history("sysctl-tuning")
    assert [h["action"] for h in history["history"]] == ["install", "config", "uninstall"]
    assert history["current_version"] is None


@pytest.mark.usefixtures("fake_proc_sys")
def test_the_example_package_rejects_an_unknown_sysctl(node: Node, tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "sysctl.conf").write_text("vm.no_such_knob = 1\n")

    result = node.run("apply", EXAMPLE, config_dir=config)

    assert result.returncode == 1
    assert result.result is not None
    assert any("unknown sysctl vm.no_such_knob" in line for line in result.result["tail"])
    assert not node.host("/etc/sysctl.d/90-nodewright-sysctl-tuning.conf").exists()
