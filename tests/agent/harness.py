"""Test harness for the agent: build packages on disk and run ``python -m agent`` for real.

The agent runs as a subprocess with a clean environment (only what a test passes, plus
PATH/PYTHONPATH), the host root pointing at the test root filesystem, and a termination-log
file in the test's temp dir; every stdout line must be JSON.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodewright.rig import hostroot

REPO = Path(__file__).resolve().parents[2]
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
CALLS_DIR = hostroot.CALLS_DIR
"""Host path where the reboot/systemctl stand-ins record calls, one file per interrupt ID."""


def write_package(
    directory: Path,
    *,
    name: str = "demo",
    version: str = "1.0.0",
    stages: Mapping[str, Any],
    scripts: Mapping[str, str] = {},
    root_files: Mapping[str, str] = {},
    expected_config_files: list[str] | None = None,
) -> Path:
    """A package directory: config.json, ``steps/<name>`` scripts (made executable) and root/."""
    directory.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "schema_version": "v1",
        "name": name,
        "version": version,
        "stages": stages,
    }
    if expected_config_files is not None:
        doc["expected_config_files"] = expected_config_files
    (directory / "config.json").write_text(json.dumps(doc, indent=2))
    for rel, text in scripts.items():
        path = directory / "steps" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
    for rel, text in root_files.items():
        path = directory / "root" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return directory


def sh(body: str) -> str:
    """A POSIX sh step script."""
    return "#!/bin/sh\nset -eu\n" + body.strip() + "\n"


@dataclass
class AgentRun:
    returncode: int
    events: list[dict[str, Any]]
    stderr: str
    result: dict[str, Any] | None
    """The termination message, parsed; None if the agent wrote none."""
    termination_bytes: int = 0
    duration_s: float = 0.0

    def of(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == event]

    def ran(self) -> list[str]:
        """Names of the steps that actually started, in order."""
        return [e["step"] for e in self.of("step.started")]

    def skipped(self) -> list[str]:
        return [e["step"] for e in self.of("step.skipped")]


@dataclass
class Node:
    """One test's view of the test root filesystem: its own CR, so its own state and logs."""

    rootfs: Path
    workdir: Path
    cr: str = field(default_factory=lambda: f"t-{uuid.uuid4().hex[:10]}")

    def host(self, host_path: str) -> Path:
        return self.rootfs / host_path.lstrip("/")

    @property
    def state(self) -> Path:
        return self.host(f"/var/lib/nodewright/{self.cr}")

    @property
    def logs(self) -> Path:
        return self.host(f"/var/log/nodewright/{self.cr}")

    def scratch(self) -> str:
        """A host directory for this test's steps to leave marks in (created)."""
        path = f"/var/tmp/{self.cr}"
        self.host(path).mkdir(parents=True, exist_ok=True)
        return path

    def history(self, package: str) -> dict[str, Any]:
        return dict(json.loads((self.state / "history" / f"{package}.json").read_text()))

    def env(
        self,
        package_dir: Path | None,
        config_dir: Path | None = None,
        extra: Mapping[str, str] = {},
    ) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": str(REPO),
            "NODEWRIGHT_CR": self.cr,
            "NODEWRIGHT_HOST_ROOT": str(self.rootfs),
            "NODEWRIGHT_TERMINATION_LOG": str(self.workdir / "termination-log"),
            "NODEWRIGHT_CONFIG_DIR": str(config_dir or self.workdir / "no-config"),
            # Never the test machine's own /nodewright-node-metadata; a test passes its own.
            "NODEWRIGHT_NODE_METADATA_DIR": str(self.workdir / "no-node-metadata"),
        }
        if package_dir is not None:
            env["NODEWRIGHT_PACKAGE_DIR"] = str(package_dir)
        env.update(extra)
        return env

    def start(
        self,
        mode: str,
        package_dir: Path | None,
        *args: str,
        config_dir: Path | None = None,
        env: Mapping[str, str] = {},
    ) -> subprocess.Popen[str]:
        term = self.workdir / "termination-log"
        term.unlink(missing_ok=True)
        return subprocess.Popen(
            [sys.executable, "-m", "agent", mode, *args],
            env=self.env(package_dir, config_dir, env),
            cwd=self.workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def finish(self, proc: subprocess.Popen[str], started: float, timeout: float = 90) -> AgentRun:
        out, err = proc.communicate(timeout=timeout)
        events = []
        for line in out.splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                raise AssertionError(f"agent stdout line is not JSON: {line!r}") from None
        term = self.workdir / "termination-log"
        raw = term.read_bytes() if term.exists() else b""
        return AgentRun(
            returncode=proc.returncode,
            events=events,
            stderr=err,
            result=json.loads(raw) if raw else None,
            termination_bytes=len(raw),
            duration_s=time.monotonic() - started,
        )

    def run(
        self,
        mode: str,
        package_dir: Path | None,
        *args: str,
        config_dir: Path | None = None,
        env: Mapping[str, str] = {},
        timeout: float = 90,
    ) -> AgentRun:
        started = time.monotonic()
        proc = self.start(mode, package_dir, *args, config_dir=config_dir, env=env)
        try:
            return self.finish(proc, started, timeout)
        except BaseException:
            proc.kill()
            proc.wait()
            raise

    def terminate_when(self, proc: subprocess.Popen[str], marker: Path, within: float = 30) -> None:
        """Send SIGTERM to the agent as soon as ``marker`` exists."""
        deadline = time.monotonic() + within
        while not marker.exists():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise AssertionError(f"{marker} did not appear")
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)


def calls(node: Node, interrupt_id: str) -> list[str]:
    """The stand-in calls recorded for one interrupt ID."""
    path = node.host(f"{CALLS_DIR}/{interrupt_id}.log")
    return path.read_text().splitlines() if path.exists() else []
