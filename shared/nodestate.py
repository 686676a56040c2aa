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
from typing import Any, Final, Literal, TypeVar

import msgspec

from shared.events import Reason

DOMAIN = "nodewright.nvidia.com"
SCHEDULER = f"scheduler.{DOMAIN}"
DRAINER = f"drainer.{DOMAIN}"
EXECUTOR = f"executor.{DOMAIN}"
VALIDATOR = f"validator.{DOMAIN}"
STATUS = f"status.{DOMAIN}"
REQUESTS = f"requests.{DOMAIN}"

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
    order: int | None = None
    """The node's zero-based position in the rollout (admission order, monotonic across
    batches; the packages see it as ``NODEWRIGHT_NODE_ORDER``). None: unknown (a record
    written before the field existed); 0 is the rollout's first node, so unknown is not 0."""


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
    honoured: int = 0
    """The newest recovery request (:attr:`Request.seq`) the drainer has acted on."""


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
    cycle_config: str = ""
    """While a cycle runs: the configMap digest it started for. Recorded as ``config`` when
    the cycle ends, so a configMap changed mid-cycle is still seen as a change then (and runs
    its own config cycle) instead of being taken as applied."""
    cycle_keys: dict[str, str] = {}
    """While a cycle runs: ``config_keys`` of the configMap it started for."""
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
    attempt: int = 1
    """Counts retries of a failed interrupt (it is part of the interrupt pod's name)."""


class ExecutorRecord(_Record, frozen=True, kw_only=True, omit_defaults=True):
    packages: dict[str, PackageRecord] = {}
    interrupt: InterruptRecord | None = None
    boot_id: str = ""
    """The node's boot ID when every package was last complete on it (spec.reapplyOnReboot
    compares it with the node's)."""
    honoured: int = 0
    """The newest recovery request (:attr:`Request.seq`) the executor has acted on."""


CheckVerdict = Literal["running", "passed", "failed"]


class CheckRecord(_Record, frozen=True, kw_only=True, omit_defaults=True):
    verdict: CheckVerdict
    at: datetime
    reason: Reason | None = None
    attempt: int = 1
    """The executor's attempt of the stage this verdict is about: a verdict about an
    earlier attempt (before a retry or rerun) no longer counts."""


class ValidatorRecord(_Record, frozen=True, kw_only=True, omit_defaults=True):
    checks: dict[str, CheckRecord] = {}
    """Keyed by ``<package>/<version>/<stage>``."""
    validated: str = ""
    """The target digest for which the whole node was validated."""
    at: datetime | None = None
    reason: Reason | None = None
    honoured: int = 0
    """The newest recovery request (:attr:`Request.seq`) the validator has acted on."""


NodePhase = Literal[
    "Pending", "Waiting", "Draining", "Running", "Validating", "Complete", "Failed", "Blocked"
]


class StatusRecord(_Record, frozen=True, kw_only=True, omit_defaults=True):
    phase: NodePhase
    reason: Reason | None = None
    since: datetime


RequestAction = Literal["retry", "reset", "rerun"]


class Request(_Record, frozen=True, kw_only=True, omit_defaults=True):
    """One recovery request for one NodeWright on one node, written by the CLI.

    retry: what failed (drain, stage, check, interrupt) runs again as a new attempt.
    reset: every service forgets this NodeWright's progress on the node; it starts over.
    rerun: the executor runs ``package``'s cycle (or only ``stage``) again.
    """

    seq: int
    """1, 2, 3 ... per (NodeWright, node): services honour requests above their mark."""
    action: RequestAction
    package: str = ""
    stage: str = ""
    at: datetime
    by: str = ""
    """Who asked (user@host), for people reading the node."""


class Requests(_Record, frozen=True, kw_only=True, omit_defaults=True):
    requests: tuple[Request, ...] = ()
    """Oldest first; at most :data:`MAX_REQUESTS` are kept."""

    @property
    def latest(self) -> int:
        return self.requests[-1].seq if self.requests else 0

    def after(self, honoured: int) -> tuple[Request, ...]:
        """The requests newer than ``honoured``, oldest first."""
        return tuple(r for r in self.requests if r.seq > honoured)


REBOOT_REQUESTER: Final = "nodewright-scheduler (reapplyOnReboot) boot"
"""``Request.by`` of the reset a reboot causes (``spec.reapplyOnReboot``), followed by the new
boot ID: one per boot. The scheduler writes it; the validator reads it to taint the node
again (``autoTaintNewNodes``) until its packages are applied again."""


def reboot_requester(boot_id: str) -> str:
    """``Request.by`` of the reset the scheduler asks for after the node booted ``boot_id``."""
    return f"{REBOOT_REQUESTER} {boot_id}"


RERUN_STAGES = ("apply", "upgrade", "config", "post-interrupt")
"""Stages a rerun may name (the interrupt is shared by every package due on the node: rerun
a package's cycle to run it again)."""

MAX_REQUESTS = 8
"""Requests kept on the node; a service that missed more than this honours the last ones."""


def add_request(current: Requests | None, request: Request) -> Requests:
    """``current`` with ``request`` appended (its ``seq`` replaced by the next number)."""
    existing = current.requests if current is not None else ()
    seq = (existing[-1].seq if existing else 0) + 1
    new = msgspec.structs.replace(request, seq=seq)
    return Requests(requests=(*existing, new)[-MAX_REQUESTS:])


def read_requests(node: Mapping[str, Any], cr: str) -> Requests:
    """The recovery requests for ``cr`` on ``node``; none when absent or undecodable (a
    malformed requests annotation must not stop the rollout; the CLI reports it)."""
    try:
        return read(node, REQUESTS, cr, Requests) or Requests()
    except (msgspec.ValidationError, msgspec.DecodeError):
        return Requests()


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
