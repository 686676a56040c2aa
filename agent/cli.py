"""Command line entry: parse the invocation, run the mode, turn the outcome into an exit code.

This is the one place where failures become exit codes (``agent.errors.ExitCode``) and where
the result document is written -- to the termination-message file and as the last stdout
line (``agent.finished``) -- whatever happened, including a usage error or a bug.
SIGTERM and SIGINT only set a flag here; the running step finishes and the agent stops
before the next one (``agent.steps``), exiting 143.

Not this module's job: what a mode does (``agent.modes``, ``agent.interrupts``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import TextIO

from agent import AGENT_VERSION
from agent.errors import AgentError, ExitCode, HostError, StepFailed
from agent.events import EventLog, setup
from agent.files import host_lock
from agent.interrupts import InterruptRun, InterruptRunner
from agent.layout import HostLayout
from agent.modes import run_package_mode
from agent.result import Result, bounded, write_termination_message
from agent.settings import AgentSettings, Mode, build_parser, load_settings, termination_log_of
from agent.validate import validate_package_dir


class StopFlag:
    """Set by SIGTERM/SIGINT; polled between steps."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def __call__(self) -> bool:
        return self.signal is not None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        self.signal = signum


def _publish(result: Result, path: Path | None, log: EventLog, *, final: bool = True) -> None:
    """Write the result to the termination-message file and as an event.

    ``final=False`` is the provisional result written before a reboot is issued: the
    shutdown may kill the agent before it gets to write the final one.
    """
    text = bounded(result.to_json())
    if path is not None:
        try:
            write_termination_message(path, text)
        except OSError as exc:
            log.warning(
                "Failed to write termination message",
                extra={"event": "result.write_failed", "path": str(path), "error": str(exc)},
            )
    if final:
        log.log(
            logging.INFO if result.ok else logging.ERROR,
            "Finished agent",
            extra={"event": "agent.finished", "result": json.loads(text)},
        )
    else:
        log.info(
            "Wrote provisional result",
            extra={"event": "result.provisional", "result": json.loads(text)},
        )


def _run_interrupt(
    settings: AgentSettings, *, log: EventLog, stop: StopFlag, result: Result
) -> None:
    assert settings.interrupt is not None
    assert settings.interrupt_id is not None
    if not settings.host_root.is_dir():
        raise HostError(
            f"host root {settings.host_root} is not a directory (is the host's / mounted?)"
        )
    layout = HostLayout(
        host_root=settings.host_root,
        state_dir=settings.state_dir,
        log_dir=settings.log_dir,
        cr=settings.cr,
    )
    run = InterruptRun(type=settings.interrupt.type, interrupt_id=settings.interrupt_id)
    log = log.bind(interrupt=settings.interrupt.type.value, interrupt_id=settings.interrupt_id)

    def before_reboot(current: InterruptRun) -> None:
        result.ok, result.exit_code, result.interrupt = True, int(ExitCode.OK), current.to_json()
        _publish(result, settings.termination_log, log, final=False)

    runner = InterruptRunner(
        layout=layout,
        interrupt_id=settings.interrupt_id,
        log=log,
        log_keep=settings.log_keep,
        before_reboot=before_reboot,
    )
    try:
        lock = layout.local(layout.lock_file("interrupt"))
        with host_lock(
            lock,
            stop=stop,
            on_wait=lambda: log.info("Waiting for interrupt lock", extra={"event": "lock.waiting"}),
        ):
            runner.run(settings.interrupt, run, stop)
    except OSError as exc:
        raise HostError(f"host filesystem error: {exc}") from exc
    finally:
        result.interrupt = run.to_json()


def _validate(package_dir: str, stdout: TextIO) -> int:
    problems = validate_package_dir(package_dir)
    stdout.write(
        json.dumps({"package_dir": package_dir, "ok": not problems, "problems": problems}) + "\n"
    )
    return int(ExitCode.OK if not problems else ExitCode.INVALID_PACKAGE)


def main(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    stdout: TextIO | None = None,
) -> int:
    env = dict(os.environ) if environ is None else dict(environ)
    out = stdout or sys.stdout
    log = setup(out)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help or an argparse usage error (already printed)
        return exc.code if isinstance(exc.code, int) else int(ExitCode.USAGE)
    if args.mode == "validate":
        return _validate(args.package_dir, out)
    stop = StopFlag()
    signal.signal(signal.SIGTERM, stop.handle)
    signal.signal(signal.SIGINT, stop.handle)
    result = Result(mode=args.mode)
    termination_log = termination_log_of(args, env)
    code = ExitCode.INTERNAL
    try:
        settings = load_settings(args, env)
        termination_log = settings.termination_log
        result.cr, result.run_id = settings.cr, settings.run_id
        log = log.bind(cr=settings.cr, mode=settings.mode.value, run_id=settings.run_id)
        log.info(
            "Started agent",
            extra={
                "event": "agent.started",
                "agent_version": AGENT_VERSION,
                "host_root": str(settings.host_root),
                "package_dir": str(settings.package_dir),
                "pid": os.getpid(),
            },
        )
        if settings.mode is Mode.INTERRUPT:
            _run_interrupt(settings, log=log, stop=stop, result=result)
        else:
            run_package_mode(settings, environ=env, log=log, stop=stop, result=result)
        code = ExitCode.OK
    except AgentError as exc:
        code = exc.exit_code
        result.error = str(exc)
        if isinstance(exc, StepFailed):
            result.failed_step, result.tail = exc.step, exc.tail
    except Exception as exc:
        log.exception("Crashed agent", extra={"event": "agent.crashed"})
        result.error = f"agent bug: {type(exc).__name__}: {exc}"
    result.ok, result.exit_code = code is ExitCode.OK, int(code)
    _publish(result, termination_log, log)
    return int(code)
