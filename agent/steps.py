"""Run a list of steps chrooted into the host: environment, arguments, flags, output, timeouts.

A step is a file in the staged package's ``steps/`` directory on the host, executed with
``chroot(host_root)`` and the staged package directory as working directory, so it sees
the host exactly as a root shell on the node would. Its stdout and stderr go, line by line,
to a rotated log file on the host and to ``step.output`` events; the last lines are kept for
the result when the step fails.

Idempotence: apply steps (``run: once``, the default) leave a flag after succeeding and
are skipped while it exists. The flag's name hashes what the step *is* -- path, argument
templates, success codes and env -- under ``flags/<pkg>/<version>/``, so a new version or
a changed step runs again. Every other mode always runs all its steps: config must pick up
changed config files, upgrade/uninstall are explicit requests, post-interrupt follows a
fresh interrupt, and checks must look at the host as it is now.

SIGTERM is honoured between steps (the running step is allowed to finish); the caller's
``stop`` callable reports it. Not this module's job: choosing the steps, staging files,
history (``agent.modes``).
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from agent.config import ENV_ARG_PREFIX, Run, Step
from agent.errors import HostError, StepFailed, Terminated, UsageError
from agent.events import EventLog, utc_now
from agent.files import write_json_atomic
from agent.layout import HostLayout
from agent.logs import StepLogFile

HOST_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""PATH inside the chroot: the host's tools, not the container image's."""
TAIL_LINES: Final = 20
TAIL_LINE_CHARS: Final = 300
KILL_GRACE_S: Final = 10.0
"""After a timeout, SIGTERM the step's process group, then SIGKILL it after this long."""
DRAIN_AFTER_EXIT_S: Final = 2.0
"""A step that backgrounds a daemon leaves our pipes open; stop reading this long after the
step itself exited instead of waiting for the daemon to close them."""
_READ_CHUNK: Final = 65536
MAX_OUTPUT_EVENTS: Final = 5000
"""Output lines of one step forwarded as events; the rest go only to the log file, so a
chatty step (a package manager's progress) cannot flood the pod's log."""


def substitute_args(step: Step, env: Mapping[str, str]) -> list[str]:
    """The step's arguments with every ``env:VAR`` replaced; an unset VAR is a usage error."""
    out: list[str] = []
    for arg in step.args:
        if arg.startswith(ENV_ARG_PREFIX):
            var = arg[len(ENV_ARG_PREFIX) :]
            if var not in env:
                raise UsageError(
                    f"step {step.name!r} argument {arg!r}: environment variable {var} is not set"
                )
            out.append(env[var])
        else:
            out.append(arg)
    return out


def flag_name(step: Step) -> str:
    """The idempotence flag's file name: the step name plus a hash of what the step does."""
    identity = {
        "path": step.path,
        "args": list(step.args),
        "success_codes": sorted(step.success_codes),
        "env": dict(sorted(step.env.items())),
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return f"{step.name}.{digest}.json"


@dataclass(frozen=True, slots=True)
class StepOutcome:
    name: str
    returncode: int | None
    """None when the step was skipped, could not be started, or was killed at its timeout."""
    ok: bool
    duration_s: float
    skipped: bool = False
    timed_out: bool = False
    tail: tuple[str, ...] = ()
    log_file: str | None = None
    error: str | None = None

    def summary(self) -> dict[str, object]:
        doc: dict[str, object] = {"name": self.name, "ok": self.ok}
        if self.skipped:
            doc["skipped"] = True
        else:
            doc["rc"] = self.returncode
            doc["duration_s"] = round(self.duration_s, 3)
        if self.timed_out:
            doc["timed_out"] = True
        return doc


@dataclass(slots=True)
class RunContext:
    """Everything needed to run a stage's steps; built by agent.modes."""

    layout: HostLayout
    package: str
    version: str
    mode: str
    package_root: str
    """Host path of the staged package (cwd of every step)."""
    env: Mapping[str, str]
    """The full environment of every step (before the step's own ``env``)."""
    log: EventLog
    log_keep: int
    stop: Callable[[], bool]
    use_flags: bool = False
    outcomes: list[StepOutcome] = field(default_factory=list)


def chroot_into(root: str, cwd: str) -> Callable[[], None]:
    def enter() -> None:
        # Runs in the child between fork and exec; the agent is single-threaded, which is
        # what makes preexec_fn safe here.
        os.chroot(root)
        os.chdir(cwd)

    return enter


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def pump_output(
    proc: subprocess.Popen[bytes],
    on_line: Callable[[str, str], None],
    timeout_s: float | None,
) -> bool:
    """Forward the child's output line by line until it ends; return True if it timed out."""
    assert proc.stdout is not None
    assert proc.stderr is not None
    sel = selectors.DefaultSelector()
    partial = {"stdout": b"", "stderr": b""}
    for pipe, stream in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
        os.set_blocking(pipe.fileno(), False)
        sel.register(pipe, selectors.EVENT_READ, stream)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    drain_until: float | None = None
    timed_out = False
    try:
        while sel.get_map():
            now = time.monotonic()
            if deadline is not None and now >= deadline and proc.poll() is None:
                timed_out = True
                kill_group(proc)
                deadline = None
            if drain_until is None and proc.poll() is not None:
                drain_until = now + DRAIN_AFTER_EXIT_S
            if drain_until is not None and now >= drain_until:
                break
            waits = [t - now for t in (deadline, drain_until) if t is not None]
            for key, _ in sel.select(timeout=max(0.0, min([1.0, *waits]))):
                stream = str(key.data)
                chunk = os.read(key.fd, _READ_CHUNK)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                *lines, partial[stream] = (partial[stream] + chunk).split(b"\n")
                for raw in lines:
                    on_line(stream, raw.decode("utf-8", "replace"))
    finally:
        sel.close()
    for stream, rest in partial.items():
        if rest:
            on_line(stream, rest.decode("utf-8", "replace"))
    return timed_out


def run_step(ctx: RunContext, step: Step, args: Sequence[str]) -> StepOutcome:
    """Run one step chrooted on the host; never raises for a failing step, only for host errors."""
    layout = ctx.layout
    step_path = f"{ctx.package_root}/steps/{step.path}"
    env = {**ctx.env, **step.env, "NODEWRIGHT_STEP": step.name}
    log = ctx.log.bind(step=step.name)
    log_dir = layout.step_log_dir(ctx.package, ctx.version, ctx.mode, step.name)
    try:
        log_file = StepLogFile.open(layout.local(log_dir), ctx.log_keep)
    except OSError as exc:
        raise HostError(f"cannot create the log file of step {step.name!r}: {exc}") from exc
    # Reported as the host sees it: that is where a human on the node will look.
    host_log = f"{log_dir}/{log_file.path.name}"
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    forwarded = 0

    def on_line(stream: str, text: str) -> None:
        nonlocal forwarded
        log_file.line(stream, text)
        tail.append(f"{stream}: {text[:TAIL_LINE_CHARS]}")
        forwarded += 1
        if forwarded <= MAX_OUTPUT_EVENTS:
            log.info("Step output", extra={"event": "step.output", "stream": stream, "line": text})
        elif forwarded == MAX_OUTPUT_EVENTS + 1:
            log.warning(
                "Stopped forwarding step output",
                extra={"event": "step.output_truncated", "log_file": host_log},
            )

    # Argument *templates* are logged, never substituted values: env may carry secrets.
    log.info(
        "Started step",
        extra={"event": "step.started", "path": step.path, "step_args": list(step.args)},
    )
    log_file.note(f"run {step_path} args={list(step.args)!r} mode={ctx.mode}")
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            [step_path, *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=chroot_into(str(layout.host_root), ctx.package_root),
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        # ENOENT here may also mean the shebang's interpreter is missing on the host.
        reason = (
            f"step {step.name!r}: cannot execute {step_path} on the host "
            f"(check the file and its #! interpreter): {exc.strerror or exc}"
        )
        log_file.note(reason)
        log_file.close()
        outcome = StepOutcome(
            name=step.name,
            returncode=None,
            ok=False,
            duration_s=time.monotonic() - started,
            error=reason,
            log_file=host_log,
        )
        log.error(
            "Finished step",
            extra={"event": "step.finished", "ok": False, "rc": None, "error": reason},
        )
        return outcome
    try:
        timed_out = pump_output(proc, on_line, step.timeout_s)
        rc = proc.wait()
    except BaseException:
        kill_group(proc)
        raise
    finally:
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    duration = time.monotonic() - started
    ok = not timed_out and rc in step.success_codes
    error: str | None = None
    if timed_out:
        error = f"step {step.name!r} timed out after {step.timeout_s:g}s and was killed"
    elif not ok:
        error = (
            f"step {step.name!r} ({step.path}) exited with {rc}, "
            f"expected one of {sorted(step.success_codes)}"
        )
    log_file.note(f"exit {rc} after {duration:.3f}s" + (" (timed out)" if timed_out else ""))
    removed = log_file.close()
    fields: dict[str, object] = {
        "event": "step.finished",
        "ok": ok,
        "rc": None if timed_out else rc,
        "duration_s": round(duration, 3),
        "log_file": host_log,
    }
    if removed:
        fields["logs_rotated"] = len(removed)
    if not ok:
        fields["error"] = error
        fields["tail"] = list(tail)
    (log.info if ok else log.error)("Finished step", extra=fields)
    return StepOutcome(
        name=step.name,
        returncode=None if timed_out else rc,
        ok=ok,
        duration_s=duration,
        timed_out=timed_out,
        tail=tuple(tail) if not ok else (),
        log_file=host_log,
        error=error,
    )


def run_steps(ctx: RunContext, steps: Sequence[Step]) -> None:
    """Run ``steps`` in order, recording outcomes in ``ctx.outcomes``.

    Raises :class:`StepFailed` at the first failing step, :class:`Terminated` when a stop
    was requested between steps, and :class:`UsageError` *before running anything* if an
    ``env:VAR`` argument names an unset variable.
    """
    resolved = [(step, substitute_args(step, {**ctx.env, **step.env})) for step in steps]
    flags_dir = ctx.layout.local(ctx.layout.flags_dir(ctx.package, ctx.version)) / ctx.mode
    for step, args in resolved:
        if ctx.stop():
            raise Terminated(f"stopped by a termination signal before step {step.name!r}")
        flag = flags_dir / flag_name(step)
        if ctx.use_flags and step.run is Run.ONCE and flag.exists():
            ctx.log.info(
                "Skipped step",
                extra={
                    "event": "step.skipped",
                    "step": step.name,
                    "reason": "flag",
                    "flag": str(flag),
                },
            )
            ctx.outcomes.append(
                StepOutcome(name=step.name, returncode=None, ok=True, duration_s=0.0, skipped=True)
            )
            continue
        outcome = run_step(ctx, step, args)
        ctx.outcomes.append(outcome)
        if not outcome.ok:
            raise StepFailed(
                outcome.error or f"step {step.name!r} failed",
                step=step.name,
                tail=list(outcome.tail),
            )
        if ctx.use_flags and step.run is Run.ONCE:
            try:
                write_json_atomic(
                    flag,
                    {
                        "package": ctx.package,
                        "version": ctx.version,
                        "mode": ctx.mode,
                        "step": step.name,
                        "path": step.path,
                        "args": list(step.args),
                        "success_codes": sorted(step.success_codes),
                        "returncode": outcome.returncode,
                        "time": utc_now(),
                    },
                )
            except OSError as exc:
                raise HostError(f"cannot write the idempotence flag {flag}: {exc}") from exc
