"""The executor's record on a node: per package version, stage, state and attempt, the
merged interrupt, the boot the packages completed in (``executor.nodewright.nvidia.com/<cr>``).

Written only by the executor; every other service reads it through ``shared.progress.NodeFacts``.

Import-linter lets no other service import this module: one writer per record.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from shared.events import Reason
from shared.nodestate import Record

StageState = Literal["running", "succeeded", "failed"]
Cycle = Literal["install", "upgrade", "config", "uninstall"]


class PackageRecord(Record, frozen=True, kw_only=True, omit_defaults=True):
    version: str
    """The version this record is about: being installed, or installed."""
    stage: str
    """The current or last stage (apply, upgrade, config, interrupt, post-interrupt ...)."""
    state: StageState
    attempt: int = 1
    installed: str = ""
    """The last version that completed every stage on this node ("" if none). Read it
    through ``shared.progress.facts``: a cycle whose last stage passed its check is complete
    there even while the record still says what it said before that check."""
    config: str = ""
    """Digest of the configMap content last applied."""
    previous: str = ""
    """The version before an upgrade started (passed to upgrade steps)."""
    cycle: Cycle = "install"
    """What the current run of stages does: apply, upgrade, re-configure, or uninstall."""
    interrupt: str = ""
    """The interrupt type this cycle needs ("" none), decided when the cycle started: the
    package's interrupt (install/upgrade) or the configInterrupts matching changed keys."""
    interrupt_services: tuple[str, ...] = ()
    config_keys: dict[str, str] = {}
    """Per configMap key, the digest of the content last applied (to find changed keys)."""
    cycle_config: str = ""
    """While a cycle runs: the configMap digest it started for. Recorded as ``config`` when
    the cycle ends, so a configMap changed mid-cycle is still seen as a change then (and runs
    its own config cycle) instead of being taken as applied."""
    cycle_keys: dict[str, str] = {}
    """While a cycle runs: ``config_keys`` of the configMap it started for."""
    reason: Reason | None = None
    updated: datetime
    spec: str = ""
    """``Desired.spec_digest`` of the package spec the current attempt runs with: a failed
    attempt whose spec was changed since (a corrected image) starts over by itself. Empty in
    records written before it existed."""
    cycle_started: datetime | None = None
    """When the current cycle started: part of its pods' names, so a later cycle of the same
    version (a reinstall after an uninstall) never reuses an earlier cycle's pod names. None
    in records written before it existed (their pods keep their names)."""


class InterruptRecord(Record, frozen=True, kw_only=True, omit_defaults=True):
    type: str
    services: tuple[str, ...] = ()
    state: StageState
    boot_id_before: str = ""
    """The node's boot ID when a reboot was ordered: done only once it has changed."""
    packages: tuple[str, ...] = ()
    started: datetime
    reason: Reason | None = None
    attempt: int = 1
    """Counts retries of a failed interrupt (it is part of the interrupt pod's name)."""


class ExecutorRecord(Record, frozen=True, kw_only=True, omit_defaults=True):
    packages: dict[str, PackageRecord] = {}
    interrupt: InterruptRecord | None = None
    boot_id: str = ""
    """The node's boot ID when every package was last complete on it (spec.reapplyOnReboot
    compares it with the node's)."""
    honoured: int = 0
    """The newest recovery request (:attr:`Request.seq`) the executor has acted on."""
    reset_boot: str = ""
    """The typed cause of a reboot reset: the boot ID the node had rebooted into when the
    executor, with ``spec.reapplyOnReboot``, forgot its packages so they run again
    (``shared.recovery.rebooted``). The validator forgets its verdicts once for it and keeps
    the node tainted (``autoTaintNewNodes``) until the packages are back."""
