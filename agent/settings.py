"""The agent's invocation contract: modes, flags and ``NODEWRIGHT_*`` variables, decoded once.

Every setting can come from a flag or from its variable (the flag wins), because the
executor sets variables on the pod while a human debugging on a node types flags. All
variables starting with ``NODEWRIGHT_`` are reserved: an unknown one is a usage error, so a
misspelt ``NODEWRIGHT_HOSTROOT`` fails the pod instead of silently meaning ``/host``.
The environment is injectable (``environ``) and read nowhere else.

Not this module's job: acting on the settings (``agent.modes``, ``agent.cli``).
"""

from __future__ import annotations

import argparse
import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent.config import Stage, normalize_version
from agent.errors import UsageError
from agent.interrupts import Interrupt, parse_interrupt


class Mode(enum.StrEnum):
    APPLY = "apply"
    APPLY_CHECK = "apply-check"
    CONFIG = "config"
    CONFIG_CHECK = "config-check"
    UPGRADE = "upgrade"
    UPGRADE_CHECK = "upgrade-check"
    UNINSTALL = "uninstall"
    UNINSTALL_CHECK = "uninstall-check"
    POST_INTERRUPT = "post-interrupt"
    POST_INTERRUPT_CHECK = "post-interrupt-check"
    INTERRUPT = "interrupt"

    @property
    def stage(self) -> Stage | None:
        """The package stage of this mode; None for ``interrupt``."""
        if self is Mode.INTERRUPT:
            return None
        return Stage(self.value.removesuffix("-check"))

    @property
    def is_check(self) -> bool:
        return self.value.endswith("-check")


CR_RE: Final = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
"""A Kubernetes object name (DNS subdomain); it is also a directory name on the host."""
ID_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
"""Interrupt and run IDs: safe as a directory name, long enough for a UID plus a suffix."""
ORDER_RE: Final = re.compile(r"[0-9]{1,9}")
"""NODEWRIGHT_NODE_ORDER: a non-negative integer."""
TRUE, FALSE = frozenset({"1", "true", "yes"}), frozenset({"0", "false", "no", ""})

# variable -> (flag, default, help); the single list both the parser and docs/packages.md follow.
VARIABLES: Final[dict[str, tuple[str, str | None, str]]] = {
    "NODEWRIGHT_CR": ("--cr", None, "NodeWright CR name; namespaces all host state (required)"),
    "NODEWRIGHT_HOST_ROOT": ("--host-root", "/host", "where the host's / is mounted"),
    "NODEWRIGHT_PACKAGE_DIR": ("--package-dir", "/nodewright-package", "the package's files"),
    "NODEWRIGHT_CONFIG_DIR": ("--config-dir", "/nodewright-config", "the CR configMap's files"),
    "NODEWRIGHT_NODE_METADATA_DIR": (
        "--node-metadata-dir",
        "/nodewright-node-metadata",
        "the node metadata ConfigMap's files (node.json)",
    ),
    "NODEWRIGHT_STATE_DIR": ("--state-dir", "/var/lib/nodewright", "host path of agent state"),
    "NODEWRIGHT_LOG_DIR": ("--log-dir", "/var/log/nodewright", "host path of step logs"),
    "NODEWRIGHT_LOG_KEEP": ("--log-keep", "5", "log files kept per step (1-1000)"),
    "NODEWRIGHT_TERMINATION_LOG": (
        "--termination-log",
        "/dev/termination-log",
        "where the final result is written ('' = nowhere)",
    ),
    "NODEWRIGHT_RUN_ID": ("--run-id", "", "opaque ID echoed in events, result and history"),
    "NODEWRIGHT_FROM_VERSION": ("--from-version", "", "upgrade modes: the installed version"),
    "NODEWRIGHT_TO_VERSION": ("--to-version", "", "expected package version (guards the image)"),
    "NODEWRIGHT_NODE_ORDER": (
        "--node-order",
        "",
        "the node's zero-based position in the rollout (passed to steps)",
    ),
    "NODEWRIGHT_FORCE_RERUN": ("--force-rerun", "false", "run apply steps despite their flags"),
    "NODEWRIGHT_INTERRUPT": ("--interrupt", "", 'interrupt mode: {"type": ..., "services": [...]}'),
    "NODEWRIGHT_INTERRUPT_ID": ("--interrupt-id", "", "interrupt mode: ID of this interrupt"),
}


@dataclass(frozen=True, slots=True)
class AgentSettings:
    mode: Mode
    cr: str
    host_root: Path
    package_dir: Path
    config_dir: Path
    node_metadata_dir: Path
    state_dir: str
    log_dir: str
    log_keep: int
    termination_log: Path | None
    run_id: str | None
    from_version: str | None
    to_version: str | None
    node_order: int | None
    force_rerun: bool
    interrupt: Interrupt | None
    interrupt_id: str | None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m agent",
        description="NodeWright on-node agent: run one stage of a host package, or an interrupt.",
        epilog="Every flag can also be given as the NODEWRIGHT_* variable it names. "
        "Exit codes: 0 ok, 1 step failed, 2 usage, 3 invalid package, 4 host error, "
        "70 agent bug, 143 terminated. See docs/packages.md.",
    )
    sub = parser.add_subparsers(dest="mode", required=True, metavar="MODE")
    common = argparse.ArgumentParser(add_help=False)
    for var, (flag, default, help_) in VARIABLES.items():
        shown = f" (default {default!r})" if default else ""
        common.add_argument(flag, dest=var, default=None, help=f"{help_}; ${var}{shown}")
    for mode in Mode:
        sub.add_parser(mode.value, parents=[common], help=f"run the {mode.value} mode")
    validate = sub.add_parser(
        "validate", help="check a package directory; exit 0 if valid, 3 if not"
    )
    validate.add_argument("package_dir", metavar="DIR")
    return parser


def _bool(var: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in TRUE:
        return True
    if lowered in FALSE:
        return False
    raise UsageError(f"{var}={text!r} is not a boolean (use true or false)")


def _host_path(var: str, text: str) -> str:
    if not text.startswith("/") or "\0" in text:
        raise UsageError(f"{var}={text!r} must be an absolute host path")
    return text


def load_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> AgentSettings:
    """Merge flags over variables over defaults and validate; errors name the variable."""
    unknown = sorted(k for k in environ if k.startswith("NODEWRIGHT_") and k not in VARIABLES)
    if unknown:
        raise UsageError(
            f"unknown NODEWRIGHT_* variables: {', '.join(unknown)} "
            "(the prefix is reserved for the agent's settings; see docs/packages.md)"
        )

    def get(var: str) -> str:
        flag_value = getattr(args, var, None)
        if flag_value is not None:
            return str(flag_value)
        if var in environ:
            return environ[var]
        return VARIABLES[var][1] or ""

    mode = Mode(args.mode)
    cr = get("NODEWRIGHT_CR")
    if not cr:
        raise UsageError("NODEWRIGHT_CR (--cr) is required: the NodeWright CR this run belongs to")
    if CR_RE.fullmatch(cr) is None:
        raise UsageError(f"NODEWRIGHT_CR={cr!r} is not a valid Kubernetes object name")
    try:
        keep = int(get("NODEWRIGHT_LOG_KEEP"))
    except ValueError:
        raise UsageError(
            f"NODEWRIGHT_LOG_KEEP={get('NODEWRIGHT_LOG_KEEP')!r} is not an integer"
        ) from None
    if not 1 <= keep <= 1000:
        raise UsageError(f"NODEWRIGHT_LOG_KEEP={keep} must be between 1 and 1000")
    run_id = get("NODEWRIGHT_RUN_ID") or None
    if run_id is not None and ID_RE.fullmatch(run_id) is None:
        raise UsageError(f"NODEWRIGHT_RUN_ID={run_id!r} must match {ID_RE.pattern}")
    versions: dict[str, str | None] = {}
    for var in ("NODEWRIGHT_FROM_VERSION", "NODEWRIGHT_TO_VERSION"):
        value = get(var) or None
        try:
            # Accepted as the CR spells versions: an optional 'v', and 1.2 meaning 1.2.0.
            versions[var] = None if value is None else normalize_version(value)
        except ValueError:
            raise UsageError(f"{var}={value!r} is not a semantic version (x.y.z)") from None
    order_text = get("NODEWRIGHT_NODE_ORDER").strip()
    node_order: int | None = None
    if order_text:
        if ORDER_RE.fullmatch(order_text) is None:
            raise UsageError(f"NODEWRIGHT_NODE_ORDER={order_text!r} is not a non-negative integer")
        node_order = int(order_text)
    interrupt_text, interrupt_id = get("NODEWRIGHT_INTERRUPT"), get("NODEWRIGHT_INTERRUPT_ID")
    interrupt: Interrupt | None = None
    if mode is Mode.INTERRUPT:
        if not interrupt_text:
            raise UsageError("interrupt mode needs NODEWRIGHT_INTERRUPT (--interrupt)")
        interrupt = parse_interrupt(interrupt_text)
        if not interrupt_id:
            raise UsageError("interrupt mode needs NODEWRIGHT_INTERRUPT_ID (--interrupt-id)")
        if ID_RE.fullmatch(interrupt_id) is None:
            raise UsageError(f"NODEWRIGHT_INTERRUPT_ID={interrupt_id!r} must match {ID_RE.pattern}")
    elif interrupt_text or interrupt_id:
        raise UsageError(
            f"NODEWRIGHT_INTERRUPT(_ID) is only for the interrupt mode, not {mode.value}"
        )
    termination = get("NODEWRIGHT_TERMINATION_LOG")
    return AgentSettings(
        mode=mode,
        cr=cr,
        host_root=Path(get("NODEWRIGHT_HOST_ROOT")),
        package_dir=Path(get("NODEWRIGHT_PACKAGE_DIR")),
        config_dir=Path(get("NODEWRIGHT_CONFIG_DIR")),
        node_metadata_dir=Path(get("NODEWRIGHT_NODE_METADATA_DIR")),
        state_dir=_host_path("NODEWRIGHT_STATE_DIR", get("NODEWRIGHT_STATE_DIR")),
        log_dir=_host_path("NODEWRIGHT_LOG_DIR", get("NODEWRIGHT_LOG_DIR")),
        log_keep=keep,
        termination_log=Path(termination) if termination else None,
        run_id=run_id,
        from_version=versions["NODEWRIGHT_FROM_VERSION"],
        to_version=versions["NODEWRIGHT_TO_VERSION"],
        node_order=node_order,
        force_rerun=_bool("NODEWRIGHT_FORCE_RERUN", get("NODEWRIGHT_FORCE_RERUN")),
        interrupt=interrupt,
        interrupt_id=interrupt_id or None,
    )


def termination_log_of(args: argparse.Namespace | None, environ: Mapping[str, str]) -> Path | None:
    """Where to write the result even when the rest of the settings are invalid."""
    flag = getattr(args, "NODEWRIGHT_TERMINATION_LOG", None) if args is not None else None
    text = (
        flag
        if flag is not None
        else environ.get("NODEWRIGHT_TERMINATION_LOG", "/dev/termination-log")
    )
    return Path(text) if text else None
