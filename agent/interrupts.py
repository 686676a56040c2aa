"""Interrupts: reboot, restart of listed services, restart of all services, noop.

An interrupt is a list of commands run chrooted on the host, each guarded by a flag under
``<state>/<cr>/interrupts/<interrupt id>/<command>.json`` that is written *before* the
command runs. A command whose flag exists is never run again for that interrupt id, so a
retried pod (or one restarted by the reboot it caused) does not reboot the node twice. A
command that exits non-zero on its own removes its flag again (it did not take effect) and
fails the interrupt, so a retry can run it.

A reboot is not judged here. The agent records the node's boot ID in the flag and in the
termination message *before* issuing ``reboot`` and then exits; the shutdown may well kill
it first, which is expected and not an error. Whether the node actually rebooted is decided
by the validator service comparing the node's boot ID with the recorded one, never by this
process's exit code (upstream #633, #218).

Commands (the host's own tools, found on a fixed host PATH inside the chroot):

* ``reboot``: ``reboot``
* ``service``: ``systemctl daemon-reload``, then ``systemctl restart <unit>`` per service
* ``restartAllServices``: ``systemctl daemon-reload``, then ``systemctl restart <unit>`` for
  every running service except system plumbing (:data:`NEVER_RESTART`)
* ``noop``: nothing; only the flag

Not this module's job: merging interrupts across packages (the scheduler does), deciding when
an interrupt may start (drainer/executor), or judging the reboot (validator).
"""

from __future__ import annotations

import enum
import json
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent.errors import HostError, StepFailed, Terminated, UsageError
from agent.events import EventLog, utc_now
from agent.files import write_json_atomic
from agent.layout import HostLayout
from agent.logs import StepLogFile
from agent.steps import HOST_PATH, chroot_into, kill_group, pump_output

BOOT_ID_FILE: Final = Path("/proc/sys/kernel/random/boot_id")
"""The kernel's boot ID; the agent's container shares the host kernel, so its own /proc is
the node's answer (and works when the host's /proc is not visible under the host root)."""
UNIT_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9:_.@\\-]{0,255}")
"""A systemd unit name; the leading character rules out option injection (``--force``)."""
NEVER_RESTART: Final = ("dbus", "systemd-", "user@", "user-runtime-dir@", "getty@", "serial-getty@")
"""Unit prefixes ``restartAllServices`` leaves alone: restarting them under a live node
breaks logins and the service manager itself, not the workloads an interrupt is meant for."""
SIGNAL_EXITS: Final = frozenset({128 + 1, 128 + 2, 128 + 9, 128 + 15})
"""Shell-style exit codes of a process killed by HUP, INT, KILL or TERM."""
COMMAND_TIMEOUT_S: Final = 600.0


class InterruptType(enum.StrEnum):
    """Interrupt types, spelled as in the NodeWright CR."""

    REBOOT = "reboot"
    SERVICE = "service"
    RESTART_ALL_SERVICES = "restartAllServices"
    NOOP = "noop"


@dataclass(frozen=True, slots=True)
class Interrupt:
    type: InterruptType
    services: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Command:
    """One flagged unit of an interrupt."""

    slug: str
    """Names the flag and log directory; stable across retries of the same interrupt."""
    argv: tuple[str, ...]
    """Empty for noop."""
    reboot: bool = False


def parse_interrupt(text: str) -> Interrupt:
    """Parse the executor's JSON (``{"type": "service", "services": ["containerd"]}``)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"interrupt is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise UsageError("interrupt must be a JSON object with a 'type'")
    unknown = set(doc) - {"type", "services"}
    if unknown:
        raise UsageError(f"interrupt has unknown fields: {', '.join(sorted(unknown))}")
    try:
        kind = InterruptType(str(doc.get("type")))
    except ValueError:
        allowed = ", ".join(t.value for t in InterruptType)
        raise UsageError(f"interrupt type {doc.get('type')!r} is not one of {allowed}") from None
    raw = doc.get("services", [])
    if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
        raise UsageError("interrupt 'services' must be an array of unit names")
    bad = [s for s in raw if UNIT_RE.fullmatch(s) is None]
    if bad:
        raise UsageError(f"interrupt services are not valid unit names: {bad}")
    if kind is InterruptType.SERVICE and not raw:
        raise UsageError("a 'service' interrupt needs a non-empty 'services' list")
    if kind is not InterruptType.SERVICE and raw:
        raise UsageError(f"a {kind.value!r} interrupt takes no 'services'")
    return Interrupt(type=kind, services=tuple(dict.fromkeys(raw)))


def _restart(unit: str) -> Command:
    return Command(slug=f"restart-{unit}", argv=("systemctl", "restart", unit))


DAEMON_RELOAD: Final = Command(slug="daemon-reload", argv=("systemctl", "daemon-reload"))


def plan(interrupt: Interrupt, running_services: Callable[[], list[str]]) -> list[Command]:
    """The commands of an interrupt, in order. ``running_services`` is only asked for
    ``restartAllServices``."""
    match interrupt.type:
        case InterruptType.REBOOT:
            return [Command(slug="reboot", argv=("reboot",), reboot=True)]
        case InterruptType.NOOP:
            return [Command(slug="noop", argv=())]
        case InterruptType.SERVICE:
            return [DAEMON_RELOAD, *(_restart(s) for s in interrupt.services)]
        case InterruptType.RESTART_ALL_SERVICES:
            units = sorted(
                u
                for u in running_services()
                if UNIT_RE.fullmatch(u) and not u.startswith(NEVER_RESTART)
            )
            return [DAEMON_RELOAD, *(_restart(u) for u in units)]


def read_boot_id(path: Path = BOOT_ID_FILE) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip() or None
    except OSError:
        return None


@dataclass(slots=True)
class InterruptRun:
    """What happened; becomes the ``interrupt`` part of the result."""

    type: InterruptType
    interrupt_id: str
    status: str = "running"
    """done | reboot-issued | reboot-already-issued | failed"""
    boot_id_before: str | None = None
    boot_id_now: str | None = None
    commands: list[dict[str, object]] | None = None

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {
            "type": self.type.value,
            "id": self.interrupt_id,
            "status": self.status,
            "commands": self.commands or [],
        }
        if self.boot_id_before is not None:
            doc["boot_id_before"] = self.boot_id_before
        if self.boot_id_now is not None:
            doc["boot_id_now"] = self.boot_id_now
        return doc


class InterruptRunner:
    """Runs an interrupt's commands on the host with at-most-once flags."""

    def __init__(
        self,
        *,
        layout: HostLayout,
        interrupt_id: str,
        log: EventLog,
        log_keep: int,
        boot_id: Callable[[], str | None] = read_boot_id,
        before_reboot: Callable[[InterruptRun], None] = lambda run: None,
    ) -> None:
        self.layout = layout
        self.interrupt_id = interrupt_id
        self.log = log
        self.log_keep = log_keep
        self.boot_id = boot_id
        self.before_reboot = before_reboot
        self.flag_dir = layout.local(layout.interrupt_dir(interrupt_id))

    def _open_log(self, command: Command) -> StepLogFile:
        try:
            return StepLogFile.open(
                self.layout.local(self.layout.interrupt_log_dir(self.interrupt_id, command.slug)),
                self.log_keep,
            )
        except OSError as exc:
            raise HostError(f"cannot create the log file of {command.slug!r}: {exc}") from exc

    def _exec(self, command: Command, log_file: StepLogFile) -> tuple[int | None, list[str]]:
        """Run a command chrooted on the host; return (exit code or None on timeout, output)."""
        lines: list[str] = []

        def on_line(stream: str, text: str) -> None:
            log_file.line(stream, text)
            lines.append(text)
            self.log.info(
                "Command output",
                extra={
                    "event": "interrupt.output",
                    "command": command.slug,
                    "stream": stream,
                    "line": text,
                },
            )

        log_file.note(f"run {list(command.argv)}")
        try:
            proc = subprocess.Popen(
                list(command.argv),
                env={
                    "PATH": HOST_PATH,
                    "LANG": "C.UTF-8",
                    "NODEWRIGHT_INTERRUPT_ID": self.interrupt_id,
                },
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                preexec_fn=chroot_into(str(self.layout.host_root), "/"),
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            log_file.note(f"cannot execute: {exc}")
            log_file.close()
            raise StepFailed(
                f"interrupt command {' '.join(command.argv)!r} cannot be executed on the host: "
                f"{exc.strerror or exc}",
                step=command.slug,
            ) from exc
        try:
            timed_out = pump_output(proc, on_line, COMMAND_TIMEOUT_S)
            rc = proc.wait()
        except BaseException:
            kill_group(proc)
            raise
        finally:
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        log_file.note(f"exit {rc}" + (" (timed out)" if timed_out else ""))
        log_file.close()
        return (None if timed_out else rc), lines

    def running_services(self) -> list[str]:
        query = Command(
            slug="list-services",
            argv=(
                "systemctl",
                "list-units",
                "--type=service",
                "--state=running",
                "--plain",
                "--no-legend",
                "--no-pager",
            ),
        )
        rc, lines = self._exec(query, self._open_log(query))
        if rc != 0:
            raise StepFailed(
                f"listing running services failed with exit code {rc}", step="list-services"
            )
        return [line.split()[0] for line in lines if line.strip()]

    def run(
        self, interrupt: Interrupt, run: InterruptRun, stop: Callable[[], bool]
    ) -> InterruptRun:
        run.commands = []
        commands = plan(interrupt, self.running_services)
        for command in commands:
            if stop():
                raise Terminated(f"stopped by a termination signal before {command.slug!r}")
            flag = self.flag_dir / f"{command.slug}.json"
            if flag.exists():
                recorded = _read_flag(flag)
                self.log.info(
                    "Skipped interrupt command",
                    extra={
                        "event": "interrupt.command.skipped",
                        "command": command.slug,
                        "flag": str(flag),
                    },
                )
                run.commands.append({"command": command.slug, "skipped": True})
                if command.reboot:
                    before = recorded.get("boot_id")
                    run.boot_id_before = before if isinstance(before, str) else None
                    run.boot_id_now = self.boot_id()
                    run.status = "reboot-already-issued"
                    return run
                continue
            # Everything that can fail before the command runs happens before its flag is
            # written: a flag must never stand for a command that did not run.
            log_file = self._open_log(command) if command.argv else None
            boot_id = self.boot_id()
            record: dict[str, object] = {
                "interrupt_id": self.interrupt_id,
                "command": command.slug,
                "argv": list(command.argv),
                "state": "started",
                "started": utc_now(),
                "boot_id": boot_id,
            }
            try:
                write_json_atomic(flag, record)
            except OSError as exc:
                raise HostError(f"cannot write the interrupt flag {flag}: {exc}") from exc
            if command.reboot:
                run.boot_id_before = boot_id
                run.status = "reboot-issued"
                # The shutdown may kill us at any moment from here on: the result must
                # already say what was done.
                self.before_reboot(run)
            if log_file is None:
                rc: int | None = 0
                output: list[str] = []
            else:
                self.log.info(
                    "Started interrupt command",
                    extra={
                        "event": "interrupt.command.started",
                        "command": command.slug,
                        "argv": list(command.argv),
                    },
                )
                started = time.monotonic()
                try:
                    rc, output = self._exec(command, log_file)
                except StepFailed:
                    flag.unlink(missing_ok=True)
                    raise
                self.log.info(
                    "Finished interrupt command",
                    extra={
                        "event": "interrupt.command.finished",
                        "command": command.slug,
                        "rc": rc,
                        "duration_s": round(time.monotonic() - started, 3),
                    },
                )
            killed = rc is not None and (rc < 0 or rc in SIGNAL_EXITS)
            if command.reboot and (rc == 0 or killed):
                run.commands.append({"command": command.slug, "rc": rc})
                return run
            if rc != 0:
                # It did not take effect: let a retry run it again.
                flag.unlink(missing_ok=True)
                run.status = "failed"
                run.commands.append({"command": command.slug, "rc": rc})
                raise StepFailed(
                    f"interrupt command {' '.join(command.argv)!r} exited with {rc}",
                    step=command.slug,
                    tail=output[-20:],
                )
            write_json_atomic(flag, {**record, "state": "done", "finished": utc_now(), "rc": rc})
            run.commands.append({"command": command.slug, "rc": rc})
        run.status = "done"
        return run


def _read_flag(path: Path) -> dict[str, object]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}
