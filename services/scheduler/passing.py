"""One pass of the scheduler for one NodeWright: the order its writes go in, so the budget
holds at every instant whichever write is lost and however many replicas write at once.

1. The kernel decides (``decide``: the caller's view of the cluster, now).
2. The releases are written. Only a written release frees a slot: if any was written the
   kernel decides again on the view that now includes them; a lost one still holds its slot
   in that decision (the admissions of the first decision, which counted on every release,
   are dropped with it).
3. The batch book is written with its fence (the admissions to come, each with the node's
   resourceVersion), preconditioned on the NodeWright's resourceVersion. If that write is
   lost nothing is admitted: another pass changed the book, and its admissions are counted
   by whoever decides next.
4. The admissions are written, each preconditioned on the resourceVersion its fence entry
   recorded; a lost one is not counted anywhere once its node changed, and is made again by
   a later pass.

A decision taken on a node cache that is behind the book's watermark (``Plan.behind``)
writes only its releases: the pass is repeated once the cache caught up.

The writes go through a :class:`Writer` (the scheduler's shell; a model of the API server in
the tests). Each admission and release is a write of its own node, so the releases of a pass
may be written concurrently, and then its admissions (the shell passes ``together``, a
bounded gather; this module does no I/O of its own): opening a batch of 100 costs a few
round trips, not 100 (issue 15), and what is counted is unchanged (each write lands or not
on its own precondition). Deciding is the kernel's job.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from shared.rollout import kernel
from shared.rollout.book import BatchBook

Write = Callable[[], Awaitable[bool]]
Together = Callable[[Sequence[Write]], Awaitable[Sequence[bool]]]
"""Runs writes (concurrently or not) and says whether each landed, in their order."""


async def in_turn(writes: Sequence[Write]) -> Sequence[bool]:
    """One write after the other (the default)."""
    return [await w() for w in writes]


class Writer(Protocol):
    """Where a pass writes; every method returns whether the write landed."""

    def book(self) -> BatchBook:
        """The batch book as the pass's view has it now."""
        ...

    async def write_release(self, release: kernel.Release) -> bool: ...

    async def write_book(self, book: BatchBook) -> bool: ...

    async def write_admission(self, admit: kernel.Admit) -> bool: ...


@dataclass(frozen=True)
class Outcome:
    plan: kernel.Plan
    """The decision whose book and admissions the pass wrote (or tried to)."""
    released: tuple[kernel.Release, ...] = ()
    admitted: tuple[kernel.Admit, ...] = ()
    lost: int = 0
    """Writes that did not land: the pass should be repeated soon."""


async def run(
    decide: Callable[[], kernel.Plan], writer: Writer, *, together: Together = in_turn
) -> Outcome:
    plan = decide()
    released: list[kernel.Release] = []
    lost = 0
    if plan.release:
        landed = list(
            await together([functools.partial(writer.write_release, r) for r in plan.release])
        )
        released = [r for r, ok in zip(plan.release, landed, strict=True) if ok]
        lost += landed.count(False)
        if released:
            # The slots of what was released are free now; nothing else is.
            plan = decide()
    if plan.behind:
        # The node cache has not caught up with the book's fence: decide again soon.
        return Outcome(plan, tuple(released), (), lost + 1)
    if plan.book != writer.book() and not await writer.write_book(plan.book):
        return Outcome(plan, tuple(released), (), lost + 1)
    landed = list(
        await together([functools.partial(writer.write_admission, a) for a in plan.admit])
    )
    admitted = [a for a, ok in zip(plan.admit, landed, strict=True) if ok]
    lost += landed.count(False)
    return Outcome(plan, tuple(released), tuple(admitted), lost)
