"""Approvals between batches: annotation ``nodewright.nvidia.com/approved-batches`` on a
NodeWright, what a person (``nodewright approve``) writes to let a compartment go on after
a batch its DeploymentPolicy gates (``approvalAfterBatches``).

The value is a JSON object: per compartment, the batch approved and when that batch
finished, as the batch book says (:attr:`shared.rollout.book.CompartmentBatch.finished`)::

    {"__default__": {"batch": 1, "finished": "2026-12-07T12:00:03.120000+00:00"}}

The finish time ties an approval to one run of the batch: after a reset of the batch state
(new package versions, ``nodewright reset-batches``) batch 1 finishes again at another time,
and the approval of the earlier run does not open the next batch.

Pure: decoding, encoding, matching, and which batch a compartment must have approved now
(:func:`gated_batch`: the kernel's rule, which ``nodewright approve`` reads too). Holding
the compartment back is :func:`shared.rollout.phases.open_batch`'s job; writing the
annotation the CLI's (``nodewright.plan_cmd``); refusing a malformed value at admission the
validator's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Final

import msgspec

from shared import api
from shared.rollout.book import CompartmentBatch

APPROVALS_ANNOTATION: Final = f"{api.GROUP}/approved-batches"


class Approval(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One compartment's approval: go on after ``batch``, the run of it that finished at
    ``finished`` (None: a book that did not record it)."""

    batch: Annotated[int, msgspec.Meta(ge=1)]
    finished: datetime | None = None


@dataclass(frozen=True)
class Approvals:
    """The approvals of a NodeWright, and why its annotation did not decode (then none)."""

    by_compartment: Mapping[str, Approval] = field(default_factory=dict)
    error: str = ""


_decoder = msgspec.json.Decoder(dict[str, Approval])


def read(annotations: Mapping[str, str]) -> Approvals:
    """The approvals the annotation holds; absent: none; malformed: none, with the error."""
    raw = annotations.get(APPROVALS_ANNOTATION)
    if not raw:
        return Approvals()
    try:
        return Approvals(by_compartment=_decoder.decode(raw))
    except msgspec.DecodeError as exc:
        return Approvals(
            error=f"annotation {APPROVALS_ANNOTATION} does not decode ({exc}): it must be a "
            'JSON object such as {"__default__": {"batch": 1, "finished": "..."}}; '
            "`nodewright approve` writes it"
        )


def encode(approvals: Mapping[str, Approval]) -> str:
    return msgspec.json.encode(dict(sorted(approvals.items()))).decode()


def approved(approvals: Approvals, compartment: str, batch: int, finished: datetime | None) -> bool:
    """Whether the compartment may go on after ``batch``, the run that finished at
    ``finished``."""
    got = approvals.by_compartment.get(compartment)
    return got is not None and got.batch == batch and got.finished == finished


def gated_batch(rollout: api.Rollout, entry: CompartmentBatch) -> int | None:
    """The batch after which the compartment must be approved before its next batch opens,
    now: its last batch, between batches, when its policy lists it in
    ``approvalAfterBatches``; None otherwise (a batch in flight, none finished yet, or not
    gated). Approved or not is :func:`approved`'s."""
    batch = entry.state.current_batch - 1
    if entry.nodes or batch not in rollout.approval_after_batches:
        return None
    return batch
