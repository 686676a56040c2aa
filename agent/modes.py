"""Run one package mode end to end: validate, stage, lay files, run steps, record history.

Order for every package mode (``apply``, ``config``, ``upgrade``, ``uninstall``,
``post-interrupt`` and their ``-check`` twins):

1. Load config.json and check every step file of *every* stage and every expected config
   file -- a broken package fails before it touches the host.
2. Take the package lock on the host (one agent per package per node).
3. Stage the package on the host (``<state>/<cr>/packages/<pkg>/<version>/``: config.json,
   ``steps/`` made executable, ``config/`` from the CR's configMap, ``node-metadata/`` from
   the node metadata ConfigMap) so steps can run chrooted; the copy is replaced whole on
   every run.
4. In ``apply``, ``upgrade`` and ``config``, lay the package's ``root/`` onto the host.
5. Run the stage's steps (or checks) -- see ``agent.steps`` for flags and environment.
6. After a successful check, record history; ``upgrade-check`` drops other versions'
   staged copies and flags, ``uninstall-check`` drops the package's state entirely.

A package without an ``upgrade`` stage is upgraded by running its ``apply`` stage (a new
version has no flags, so its apply steps run); ``uninstall`` of a package without an
uninstall stage fails -- nothing would be removed, and success would be a lie.

Not this module's job: parsing flags (``agent.settings``), exit codes and the termination
message (``agent.cli``), interrupts (``agent.interrupts``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from agent.config import (
    ConfigInvalid,
    PackageConfig,
    Stage,
    StageSpec,
    Step,
    compare_semver,
    load_config,
)
from agent.errors import HostError, PackageError, UsageError
from agent.events import EventLog, utc_now
from agent.files import copy_tree, host_lock, lay_files, replace_dir
from agent.history import (
    Action,
    Entry,
    History,
    HistoryCorrupt,
    read_history,
    set_aside,
    with_entry,
    write_history,
)
from agent.layout import HostLayout
from agent.result import Result
from agent.settings import VARIABLES, AgentSettings, Mode
from agent.steps import HOST_PATH, RunContext, run_steps
from agent.validate import ROOT_DIR, STEPS_DIR, step_file_problems

LAYS_ROOT: Final = frozenset({Mode.APPLY, Mode.UPGRADE, Mode.CONFIG})
HISTORY_ACTIONS: Final = {
    Mode.APPLY_CHECK: Action.INSTALL,
    Mode.UPGRADE_CHECK: Action.UPGRADE,
    Mode.CONFIG_CHECK: Action.CONFIG,
    Mode.UNINSTALL_CHECK: Action.UNINSTALL,
}
NODE_METADATA_DIR: Final = "node-metadata"
"""Where the node metadata ConfigMap's files are staged, in the staged package."""
# Agent inputs that describe the container, not the host: a step must not see them.
_CONTAINER_ONLY: Final = frozenset(VARIABLES) - {"NODEWRIGHT_CR", "NODEWRIGHT_RUN_ID"}


def stage_for(mode: Mode, config: PackageConfig) -> tuple[Stage, StageSpec]:
    """The stage whose steps a mode runs (with the upgrade->apply fallback)."""
    stage = mode.stage
    assert stage is not None
    spec = config.stage(stage)
    if spec is not None:
        return stage, spec
    if stage is Stage.UPGRADE:
        return Stage.APPLY, config.stage(Stage.APPLY) or StageSpec()
    if stage is Stage.UNINSTALL:
        raise PackageError(f"package {config.name} {config.version} has no uninstall stage")
    return stage, StageSpec()


def step_environment(
    *,
    environ: Mapping[str, str],
    settings: AgentSettings,
    layout: HostLayout,
    config: PackageConfig,
    stage: Stage,
    from_version: str | None,
) -> dict[str, str]:
    """The environment every step of this run starts from: the pod's env (the CR's ``env``
    arrives there) without container-only agent inputs, plus the host view of the run."""
    env = {k: v for k, v in environ.items() if k not in _CONTAINER_ONLY}
    root = layout.package_root(config.name, config.version)
    env.update(
        {
            "PATH": HOST_PATH,
            "NODEWRIGHT_CR": settings.cr,
            "NODEWRIGHT_MODE": settings.mode.value,
            "NODEWRIGHT_STAGE": stage.value,
            "NODEWRIGHT_PACKAGE": config.name,
            "NODEWRIGHT_PACKAGE_VERSION": config.version,
            "NODEWRIGHT_PACKAGE_ROOT": root,
            "NODEWRIGHT_STEPS_DIR": f"{root}/{STEPS_DIR}",
            "NODEWRIGHT_CONFIG_DIR": f"{root}/config",
            "NODEWRIGHT_NODE_METADATA_DIR": f"{root}/{NODE_METADATA_DIR}",
            "NODEWRIGHT_DATA_DIR": layout.package_data(config.name),
        }
    )
    if settings.run_id:
        env["NODEWRIGHT_RUN_ID"] = settings.run_id
    if settings.node_order is not None:
        env["NODEWRIGHT_NODE_ORDER"] = str(settings.node_order)
    if from_version is not None:
        env["NODEWRIGHT_FROM_VERSION"] = from_version
        env["NODEWRIGHT_TO_VERSION"] = config.version
    return env


def _load_history(layout: HostLayout, package: str, log: EventLog) -> History:
    path = layout.local(layout.history_file(package))
    try:
        return read_history(path, package)
    except HistoryCorrupt as exc:
        aside = set_aside(path)
        log.warning(
            "Set aside corrupt history",
            extra={"event": "history.corrupt", "error": str(exc), "moved_to": str(aside)},
        )
        return History(package=package, current_version=None)


def resolve_from_version(
    settings: AgentSettings, history: History, to_version: str, log: EventLog
) -> str:
    """The version an upgrade starts from: the executor's word, else the host's history."""
    if settings.from_version is not None:
        chosen = settings.from_version
        if history.current_version not in (None, chosen, to_version):
            log.warning(
                "Overrode history version",
                extra={
                    "event": "upgrade.from_version_mismatch",
                    "from_version": chosen,
                    "history_version": history.current_version,
                },
            )
    elif history.current_version == to_version and history.entries:
        # A retried upgrade-check after history already recorded this upgrade.
        last = history.entries[-1]
        if last.action is not Action.UPGRADE or last.from_version is None:
            raise UsageError(
                f"upgrade to {to_version}: the host history says it is already installed"
            )
        chosen = last.from_version
    elif history.current_version is not None:
        chosen = history.current_version
    else:
        raise UsageError(
            "upgrade needs the installed version: set NODEWRIGHT_FROM_VERSION (--from-version); "
            "the host has no history for this package"
        )
    try:
        order = compare_semver(chosen, to_version)
    except ValueError as exc:
        raise UsageError(f"upgrade from {chosen!r}: {exc}") from None
    if order >= 0:
        raise UsageError(
            f"upgrade from {chosen} to {to_version} is not an upgrade "
            "(a downgrade is an uninstall followed by an apply)"
        )
    return chosen


def _stage_package(settings: AgentSettings, layout: HostLayout, config: PackageConfig) -> int:
    dest = layout.local(layout.package_root(config.name, config.version))

    def build(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        shutil.copyfile(settings.package_dir / "config.json", tmp / "config.json")
        steps = settings.package_dir / STEPS_DIR
        if steps.is_dir():
            copy_tree(steps, tmp / STEPS_DIR, file_mode=0o755)
        else:
            (tmp / STEPS_DIR).mkdir()
        if settings.config_dir.is_dir():
            copy_tree(settings.config_dir, tmp / "config", file_mode=0o640)
        else:
            (tmp / "config").mkdir()
        # As the pod saw it when the agent started (a mounted ConfigMap changes later on).
        if settings.node_metadata_dir.is_dir():
            copy_tree(settings.node_metadata_dir, tmp / NODE_METADATA_DIR, file_mode=0o644)
        else:
            (tmp / NODE_METADATA_DIR).mkdir()

    replace_dir(build, dest)
    return sum(len(files) for _, _, files in os.walk(dest))


def _cleanup(layout: HostLayout, config: PackageConfig, mode: Mode) -> None:
    """Drop state an upgrade or uninstall made obsolete."""
    local = layout.local
    if mode is Mode.UNINSTALL_CHECK:
        for host_dir in (
            layout.flags_dir(config.name),
            layout.packages_of(config.name),
            layout.package_data(config.name),
        ):
            shutil.rmtree(local(host_dir), ignore_errors=True)
    elif mode is Mode.UPGRADE_CHECK:
        for host_dir in (layout.flags_dir(config.name), layout.packages_of(config.name)):
            base = local(host_dir)
            if base.is_dir():
                for entry in base.iterdir():
                    if entry.name != config.version:
                        shutil.rmtree(entry, ignore_errors=True)


def run_package_mode(
    settings: AgentSettings,
    *,
    environ: Mapping[str, str],
    log: EventLog,
    stop: Callable[[], bool],
    result: Result,
) -> None:
    """Run ``settings.mode`` for the package; raise an ``AgentError`` on any failure."""
    mode = settings.mode
    if not settings.host_root.is_dir():
        raise HostError(
            f"host root {settings.host_root} is not a directory (is the host's / mounted?)"
        )
    try:
        config = load_config(settings.package_dir)
    except ConfigInvalid as exc:
        raise PackageError("invalid package config", exc.problems) from None
    result.package, result.version = config.name, config.version
    log = log.bind(package=config.name, version=config.version)
    if settings.to_version is not None and settings.to_version != config.version:
        raise PackageError(
            f"the package in {settings.package_dir} is version {config.version}, "
            f"but NODEWRIGHT_TO_VERSION says {settings.to_version}"
        )
    problems = step_file_problems(settings.package_dir, config)
    missing = [f for f in config.expected_config_files if not (settings.config_dir / f).is_file()]
    problems += [f"{settings.config_dir / f}: expected config file not found" for f in missing]
    if problems:
        raise PackageError("the package cannot run", problems)
    stage, spec = stage_for(mode, config)
    steps = spec.check if mode.is_check else spec.steps
    layout = HostLayout(
        host_root=settings.host_root,
        state_dir=settings.state_dir,
        log_dir=settings.log_dir,
        cr=settings.cr,
    )
    try:
        lock = layout.local(layout.lock_file(config.name))
    except OSError as exc:
        raise HostError(f"cannot resolve the state directory on the host: {exc}") from exc

    def waiting() -> None:
        log.info("Waiting for package lock", extra={"event": "lock.waiting", "lock": str(lock)})

    try:
        with host_lock(lock, stop=stop, on_wait=waiting):
            _run_locked(
                settings,
                environ=environ,
                log=log,
                stop=stop,
                result=result,
                config=config,
                layout=layout,
                stage=stage,
                steps=steps,
            )
    except OSError as exc:
        raise HostError(f"host filesystem error: {exc}") from exc


def _run_locked(
    settings: AgentSettings,
    *,
    environ: Mapping[str, str],
    log: EventLog,
    stop: Callable[[], bool],
    result: Result,
    config: PackageConfig,
    layout: HostLayout,
    stage: Stage,
    steps: tuple[Step, ...],
) -> None:
    mode = settings.mode
    history = _load_history(layout, config.name, log)
    from_version = None
    if mode.stage is Stage.UPGRADE:
        from_version = resolve_from_version(settings, history, config.version, log)
        result.from_version = from_version
    files = _stage_package(settings, layout, config)
    log.info(
        "Staged package",
        extra={
            "event": "package.staged",
            "path": layout.package_root(config.name, config.version),
            "files": files,
        },
    )
    root_dir = settings.package_dir / ROOT_DIR
    if mode in LAYS_ROOT and root_dir.is_dir():
        written = lay_files(root_dir, layout.local)
        log.info(
            "Laid static files",
            extra={"event": "files.laid", "files": written[:50], "count": len(written)},
        )
    if stage is not mode.stage:
        log.info(
            "Used apply stage for upgrade",
            extra={
                "event": "stage.fallback",
                "stage": stage.value,
                "reason": "package has no upgrade stage",
            },
        )
    ctx = RunContext(
        layout=layout,
        package=config.name,
        version=config.version,
        mode=mode.value,
        package_root=layout.package_root(config.name, config.version),
        env=step_environment(
            environ=environ,
            settings=settings,
            layout=layout,
            config=config,
            stage=stage,
            from_version=from_version,
        ),
        log=log,
        log_keep=settings.log_keep,
        stop=stop,
        use_flags=mode is Mode.APPLY and not settings.force_rerun,
    )
    if not steps:
        log.info("Ran no steps", extra={"event": "stage.empty", "stage": stage.value})
    try:
        run_steps(ctx, steps)
    finally:
        result.steps = [o.summary() for o in ctx.outcomes]
    action = HISTORY_ACTIONS.get(mode)
    if action is not None:
        entry = Entry(
            version=config.version,
            action=action,
            time=utc_now(),
            from_version=from_version,
            run_id=settings.run_id,
        )
        updated = with_entry(history, entry)
        write_history(layout.local(layout.history_file(config.name)), updated)
        result.history = {"current_version": updated.current_version, "recorded": action.value}
        log.info(
            "Recorded history",
            extra={
                "event": "history.recorded",
                "action": action.value,
                "current_version": updated.current_version,
            },
        )
        _cleanup(layout, config, mode)
