"""Per-node, per-NodeWright state kept on the Node object: the durable truth of a rollout.

Each service owns exactly one annotation per CR on each node and is its only writer, so
writes never conflict across services and a merge patch touching one key is always safe:

=====================================================  ==========  ==============================
annotation                                             owner       meaning
=====================================================  ==========  ==============================
``scheduler.nodewright.nvidia.com/<cr>``               scheduler   admitted into a batch (budget)
``drainer.nodewright.nvidia.com/<cr>``                 drainer     cordon ownership, drain phase
``executor.nodewright.nvidia.com/<cr>``                executor    per-package version and stage
``validator.nodewright.nvidia.com/<cr>``               validator   check verdicts, node validation
``status.nodewright.nvidia.com/<cr>``                  status      the summary people read
=====================================================  ==========  ==============================

Values are compact JSON of the Structs below. NodeWright names are limited to 63 characters
(the CRD enforces it) so ``<cr>`` fits an annotation name. Everything here is pure: parsing
from a Node dict and building merge patches; the HTTP calls are the owners'.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal, TypeVar

import msgspec

from shared.events import Reason

DOMAIN = "nodewright.nvidia.com"
SCHEDULER = f"scheduler.{DOMAIN}"
DRAINER = f"drainer.{DOMAIN}"
EXECUTOR = f"executor.{DOMAIN}"
VALIDATOR = f"validator.{DOMAIN}"
STATUS = f"status.{DOMAIN}"

IGNORE_LABEL = f"{DOMAIN}/ignore"
"""Label ``nodewright.nvidia.com/ignore=true``: NodeWright leaves the node alone."""


def key(owner: str, cr: str) -> str:
    return f"{owner}/{cr}"


class _Record(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    pass


class Selection(_Record, frozen=True, kw_only=True, omit_defaults=True):
    """The scheduler admitted this node for this CR; it counts against budgets until released."""

    generation: int
    compartment: str
    batch: int
    selected_at: datetime
    disruptive: bool
    target: str
    """Digest of the desired package set the node was admitted for."""


DrainPhase = Literal["cordoned", "waiting", "draining", "drained", "blocked", "failed"]


class DrainRecord(_Record, frozen=True, kw_only=True, omit_defaults=True):
    phase: DrainPhase
    cordoned: bool = False
    """This CR holds a cordon on the node (it set, or joined, spec.unschedulable)."""
    preexisting: bool = False
    """The node was cordoned by someone else before NodeWright came: never uncordon it."""
    started: datetime
    """When work on the node began (the drain timeout counts from here)."""
    since: datetime
    """When the current phase began."""
    reason: Reason | None = None


StageState = Literal["running", "succeeded", "failed"]
Cycle = Literal["install", "upgrade", "config", "uninstall"]


class PackageRecord(_Record, frozen=True, kw_only=True, omit_defaults=True):
    version: str
    """The version this record is about: being installed, or installed."""
    stage: str
    """The current or last stage (apply, upgrade, config, interrupt, post-interrupt ...)."""
    state: StageState
    attempt: int = 1
    installed: str = ""
    """The last version that completed every stage on this node ("" if none)."""
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
    reason: Reason | None = None
    updated: datetime


class InterruptRecord(_Record, frozen=True, kw_only=True, omit_defaults=True):
    type: str
    services: tuple[str, ...] = ()
    state: StageState
    boot_id_before: str = ""
    """The node's boot ID when a reboot was ordered: done only once it has changed."""
    packages: tuple[str, ...] = ()
    started: datetime
    reason: Reason | None = None


class ExecutorRecord(_Record, frozen=True, kw_only=True, omit_defaults=True):
    packages: dict[str, PackageRecord] = {}
    interrupt: InterruptRecord | None = None


CheckVerdict = Literal["running", "passed", "failed"]


class CheckRecord(_Record, frozen=True, kw_only=True, omit_defaults=True):
    verdict: CheckVerdict
    at: datetime
    reason: Reason | None = None


class ValidatorRecord(_Record, frozen=True, kw_only=True, omit_defaults=True):
    checks: dict[str, CheckRecord] = {}
    """Keyed by ``<package>/<version>/<stage>``."""
    validated: str = ""
    """The target digest for which the whole node was validated."""
    at: datetime | None = None
    reason: Reason | None = None


NodePhase = Literal[
    "Pending", "Waiting", "Draining", "Running", "Validating", "Complete", "Failed", "Blocked"
]


class StatusRecord(_Record, frozen=True, kw_only=True, omit_defaults=True):
    phase: NodePhase
    reason: Reason | None = None
    since: datetime


R = TypeVar("R", bound=_Record)


def check_key(package: str, version: str, stage: str) -> str:
    return f"{package}/{version}/{stage}"


def annotations_of(node: Mapping[str, Any]) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("annotations") or {}


def read(node: Mapping[str, Any], owner: str, cr: str, record: type[R]) -> R | None:
    """The owner's record for ``cr`` on ``node``; None when absent.

    A record that does not decode (hand-edited, or written by an incompatible version) raises
    :class:`msgspec.ValidationError` / ``DecodeError``: callers surface it, never guess.
    """
    raw = annotations_of(node).get(key(owner, cr))
    if raw is None:
        return None
    return msgspec.json.decode(raw, type=record)


def patch(
    owner: str, cr: str, record: _Record | None, *, resource_version: str = ""
) -> dict[str, Any]:
    """A merge patch setting (or, with None, removing) the owner's record for ``cr``.

    With ``resource_version`` the patch only applies to that version of the node (409
    Conflict otherwise): a decision taken on a stale view is never written.
    """
    value = None if record is None else msgspec.json.encode(record).decode()
    meta: dict[str, Any] = {"annotations": {key(owner, cr): value}}
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"metadata": meta}


def crs_with(node: Mapping[str, Any], owner: str) -> list[str]:
    """Names of the CRs that have a record of ``owner`` on ``node``, sorted."""
    prefix = owner + "/"
    return sorted(k[len(prefix) :] for k in annotations_of(node) if k.startswith(prefix))
