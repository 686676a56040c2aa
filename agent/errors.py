"""Exit codes and the exceptions that map onto them.

Every failure the agent can report is one of these exceptions, raised where it is detected
and turned into an exit code and a result in exactly one place (``agent.cli``). The
messages are for humans and always name the file, variable or step at fault; the exit code
is for the executor, which must not need to parse messages to decide what happened.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """The agent's exit codes; documented in docs/packages.md and stable across versions."""

    OK = 0
    """The mode finished: every step succeeded, or the interrupt was carried out or issued."""
    STEP_FAILED = 1
    """A step (or check) returned a code outside its success codes, timed out, or could not
    be executed; an interrupt command failed."""
    USAGE = 2
    """The invocation is wrong: unknown mode, bad flag or variable, an ``env:VAR`` argument
    naming an unset variable, an upgrade without a known from-version."""
    INVALID_PACKAGE = 3
    """The package or its inputs are invalid: config.json, a missing step file, a missing
    expected config file, a stage the mode needs but the package does not define."""
    HOST_ERROR = 4
    """The host side failed: host root missing, state or log directory not writable, a
    static file clashing with a directory on the host."""
    INTERNAL = 70
    """A bug in the agent (an unexpected exception); sysexits' EX_SOFTWARE."""
    TERMINATED = 143
    """SIGTERM (or SIGINT) arrived; the agent stopped between steps (128 + SIGTERM)."""


class AgentError(Exception):
    """Base of the agent's own failures; ``exit_code`` says how the process ends."""

    exit_code: ExitCode = ExitCode.STEP_FAILED


class UsageError(AgentError):
    """The invocation (flags, environment) cannot be acted on."""

    exit_code = ExitCode.USAGE


class PackageError(AgentError):
    """The package or its inputs are invalid; carries every problem found, not just the first."""

    exit_code = ExitCode.INVALID_PACKAGE

    def __init__(self, summary: str, problems: list[str] | None = None) -> None:
        self.problems = list(problems or [])
        detail = "; ".join(self.problems)
        super().__init__(f"{summary}: {detail}" if detail else summary)


class HostError(AgentError):
    """Reading or writing the host's filesystem failed."""

    exit_code = ExitCode.HOST_ERROR


class StepFailed(AgentError):
    """A step or an interrupt command did not succeed."""

    exit_code = ExitCode.STEP_FAILED

    def __init__(self, message: str, *, step: str, tail: list[str] | None = None) -> None:
        super().__init__(message)
        self.step = step
        self.tail = list(tail or [])


class Terminated(AgentError):
    """A termination signal was received; raised at the next point where it is safe to stop."""

    exit_code = ExitCode.TERMINATED
