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
``status.nodewright.nvidia.com/<cr>``                  status      none: written by earlier
                                                                   versions, now only removed
=====================================================  ==========  ==============================

(The status service's summary of a node is its node condition ``nodewright.nvidia.com/<cr>``,
``shared.records.status``.)

Values are compact JSON of each owner's record (``shared.records.<owner>``; a service imports
only its own, import-linter enforces it). This module holds what they all share: the keys,
decoding and merge patches, and the recovery requests the CLI writes for every owner to
honour (``requests.nodewright.nvidia.com/<cr>``). NodeWright names are limited to 63
characters (the CRD enforces it) so ``<cr>`` fits an annotation name. Everything here is
pure: parsing from a Node dict and building merge patches; the HTTP calls are the owners'.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal, TypeVar

import msgspec

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


class Record(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The base of every per-node record: compact JSON, defaults left out, frozen."""


RequestAction = Literal["retry", "reset", "rerun", "abort"]


class Request(Record, frozen=True, kw_only=True, omit_defaults=True):
    """One recovery request for one NodeWright on one node, written by the CLI.

    retry: what failed (drain, stage, check, interrupt) runs again as a new attempt.
    reset: every service forgets this NodeWright's progress on the node; it starts over.
    rerun: the executor runs ``package``'s cycle (or only ``stage``) again.
    abort: the executor fails what runs now (of ``package``, or of every package, and the
    interrupt) with reason StageAborted and stops its pods, kept for their logs.
    """

    seq: int
    """1, 2, 3 ... per (NodeWright, node): services honour requests above their mark."""
    action: RequestAction
    package: str = ""
    stage: str = ""
    at: datetime
    by: str = ""
    """Who asked (user@host), for people reading the node."""


class Requests(Record, frozen=True, kw_only=True, omit_defaults=True):
    requests: tuple[Request, ...] = ()
    """Oldest first; at most :data:`MAX_REQUESTS` are kept."""

    @property
    def latest(self) -> int:
        return self.requests[-1].seq if self.requests else 0

    def after(self, honoured: int) -> tuple[Request, ...]:
        """The requests newer than ``honoured``, oldest first."""
        return tuple(r for r in self.requests if r.seq > honoured)


RERUN_STAGES = ("apply", "upgrade", "config", "post-interrupt")
"""Stages a rerun may name (the interrupt is shared by every package due on the node: rerun
a package's cycle to run it again)."""

MAX_REQUESTS = 8
"""Requests kept on the node; a service that missed more than this honours the last ones."""


def add_request(current: Requests | None, request: Request, *, floor: int = 0) -> Requests:
    """``current`` with ``request`` appended (its ``seq`` replaced by the next number, above
    ``floor`` too: the highest mark an owner has honoured, for when ``current`` was lost to
    an annotation that does not decode and numbering from 1 again would go unnoticed)."""
    existing = current.requests if current is not None else ()
    seq = max(existing[-1].seq if existing else 0, floor) + 1
    new = msgspec.structs.replace(request, seq=seq)
    return Requests(requests=(*existing, new)[-MAX_REQUESTS:])


def read_requests(node: Mapping[str, Any], cr: str) -> Requests:
    """The recovery requests for ``cr`` on ``node``; none when absent or undecodable (a
    malformed requests annotation must not stop the rollout; the CLI reports it)."""
    try:
        return read(node, REQUESTS, cr, Requests) or Requests()
    except (msgspec.ValidationError, msgspec.DecodeError):
        return Requests()


R = TypeVar("R", bound=Record)


def check_key(package: str, version: str, stage: str) -> str:
    return f"{package}/{version}/{stage}"


def readable_mark(raw: str) -> int:
    """The ``honoured`` mark of a record that does not decode as its type, if the JSON still
    says one; else 0 (every request is then newer than it)."""
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return 0
    mark = value.get("honoured") if isinstance(value, dict) else None
    return mark if isinstance(mark, int) and not isinstance(mark, bool) else 0


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
    owner: str, cr: str, record: Record | None, *, resource_version: str = ""
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
