"""The budget is a hard cap at every instant: the scheduler's pass (``passing.run``, the code
the shell runs) against a model of the API server, with two replicas whose writes
interleave, caches that lag behind, writes lost to other writers and passes that retry.

The scheduler's release fast path writes releases between any two of these writes too.

The model keeps what the API server keeps: every node's facts with a resourceVersion (etcd's
revision: every write of any object takes the next one), and the NodeWright's batch book
with the NodeWright's resourceVersion. A write with a stale precondition is refused (409). A
replica decides on what its informers had at some past moment (the nodes possibly older
than the NodeWright: they are separate watches), plus what it wrote itself (the shell writes
through to its cache). Between any two writes the rest of the world moves: the other
services finish or fail admitted nodes, retries recover failed ones, reruns send finished
nodes through admission again, kubelet heartbeats change nodes (which makes a write in
flight lose its race). After every single change the nodes holding a slot of each
compartment are counted from what is written, never from what any replica believes.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import Phase, given, settings, strategies as st

from services.scheduler import passing
from shared import api, progress
from shared.progress import NodeFacts
from shared.records.executor import ExecutorRecord, PackageRecord
from shared.rollout import kernel, rules, simulation, slots
from shared.rollout.book import BatchBook
from tests.helpers.facts import T0, node, nodewright

CR = "gpu-node-tuning"


@dataclass(frozen=True)
class Snapshot:
    nodes: dict[str, NodeFacts]
    book: BatchBook
    cr_version: int
    revision: int
    """Every change up to this revision is in the snapshot."""


@dataclass
class World:
    """What the API server holds, and every state it went through."""

    cr: api.NodeWright
    policy: api.DeploymentPolicy | None
    nodes: dict[str, NodeFacts]
    book: BatchBook = field(default_factory=BatchBook)
    cr_version: int = 1
    revision: int = 1
    """etcd's revision: every write of any object takes the next one."""
    history: list[Snapshot] = field(default_factory=list)
    worst: dict[str, int] = field(default_factory=dict)
    """Per compartment, the most nodes that ever held a slot at once."""

    def __post_init__(self) -> None:
        self.changed()

    def snapshot(self) -> Snapshot:
        return Snapshot(dict(self.nodes), self.book, self.cr_version, self.revision)

    def write(self, name: str, **changes: Any) -> NodeFacts:
        """Write node ``name``; it takes the next revision as its resourceVersion."""
        self.revision += 1
        self.nodes[name] = replace(
            self.nodes[name],
            resource_version=str(self.revision),
            **changes,
        )
        return self.nodes[name]

    def budgets(self) -> dict[str, int]:
        rule_list = rules.compartment_rules(self.cr, self.policy)
        assigned = rules.assign_compartments(rule_list, list(self.nodes.values()))
        return {
            r.name: rules.budget_nodes(
                r.rollout.budget, sum(1 for c in assigned.values() if c == r.name)
            )
            for r in rule_list
        }

    def holding(self) -> dict[str, int]:
        """Nodes holding a slot per compartment, from what is written (no fence: the fence
        is a promise, not a disruption)."""
        rule_list = rules.compartment_rules(self.cr, self.policy)
        known = {r.name for r in rule_list}
        assigned = rules.assign_compartments(rule_list, list(self.nodes.values()))
        out = {r.name: 0 for r in rule_list}
        for n in self.nodes.values():
            if slots.hold(self.cr, n, {}) is not None:
                out[rules.compartment_of(n, assigned, known)] += 1
        return out

    def changed(self) -> None:
        self.history.append(self.snapshot())
        budgets = self.budgets()
        for comp, count in self.holding().items():
            self.worst[comp] = max(self.worst.get(comp, 0), count)
            assert count <= budgets[comp], (
                f"compartment {comp}: {count} nodes hold a slot, budget {budgets[comp]}"
            )


@dataclass
class View:
    """A replica's cache: past snapshots (of the nodes, and of the NodeWright) plus its own
    writes; ``seen`` is the revision up to which its node cache has every change."""

    nodes: dict[str, NodeFacts]
    book: BatchBook
    cr_version: int
    seen: int

    @classmethod
    def of(cls, s: Snapshot) -> View:
        return cls(dict(s.nodes), s.book, s.cr_version, s.revision)


Gate = Callable[[], Any]


class ModelWriter:
    """``passing.Writer`` against the model, each write waiting for its turn."""

    def __init__(self, world: World, view: View, turn: Callable[[], Any]) -> None:
        self.world, self.view, self.turn = world, view, turn

    def book(self) -> BatchBook:
        return self.view.book

    async def _node_write(self, name: str, version: str, **changes: Any) -> bool:
        await self.turn()
        current = self.world.nodes[name]
        if current.resource_version != version:
            return False  # 409: the node changed since the view the decision was taken on
        self.view.nodes[name] = self.world.write(name, **changes)  # written through
        self.world.changed()
        return True

    async def write_release(self, release: kernel.Release) -> bool:
        seen = self.view.nodes[release.node].resource_version
        return await self._node_write(release.node, seen, selection=None)

    async def write_book(self, book: BatchBook) -> bool:
        await self.turn()
        if self.world.cr_version != self.view.cr_version:
            return False
        self.world.revision += 1
        self.world.book, self.world.cr_version = book, self.world.cr_version + 1
        self.view.book, self.view.cr_version = book, self.world.cr_version
        self.world.changed()
        return True

    async def write_admission(self, admit: kernel.Admit) -> bool:
        return await self._node_write(admit.node, admit.resource_version, selection=admit.selection)


class Turns:
    """Lets exactly one replica move at a time, at the moments the driver chooses."""

    def __init__(self) -> None:
        self.waiting: dict[int, asyncio.Future[None]] = {}
        self.arrived = asyncio.Event()

    def gate(self, replica: int) -> Callable[[], Any]:
        async def turn() -> None:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.waiting[replica] = fut
            self.arrived.set()
            await fut

        return turn

    async def settle(self, tasks: list[asyncio.Task[None]]) -> None:
        """Until every replica waits for its turn (each runs to its next write meanwhile);
        a replica that failed (a budget exceeded under it) fails the test."""
        while len(self.waiting) < len(tasks):
            for task in tasks:
                if task.done():
                    task.result()  # raises what ended it
            self.arrived.clear()
            arrived = asyncio.ensure_future(self.arrived.wait())
            await asyncio.wait([arrived, *tasks], return_when=asyncio.FIRST_COMPLETED)
            arrived.cancel()

    def release(self, replica: int) -> None:
        self.waiting.pop(replica).set_result(None)


def _failed(cr: api.NodeWright) -> ExecutorRecord:
    d = next(iter(progress.desired(cr).values()))
    rec = PackageRecord(version=d.version, stage="apply", state="failed", updated=T0)
    return ExecutorRecord(packages={d.name: rec})


def _finished(world: World, name: str) -> None:
    """The drainer, executor and validator finish the node (the drainer lets go of it)."""
    done = simulation.as_done(world.cr, world.nodes[name])
    world.write(
        name,
        unschedulable=done.unschedulable,
        drain=done.drain,
        executor=done.executor,
        validator=done.validator,
    )


def _world_moves(world: World, rng: random.Random) -> None:
    """One change by someone else than the scheduler."""
    cr = world.cr
    names = sorted(world.nodes)
    roll = rng.random()
    admitted = [n for n in names if world.nodes[n].selection is not None]
    busy = [
        n
        for n in admitted
        if not progress.node_done(cr, world.nodes[n]) and not progress.failed(cr, world.nodes[n])
    ]
    failed = [n for n in admitted if progress.failed(cr, world.nodes[n])]
    # Not on a node cordoned by someone else: restarting its work would make it hold a slot
    # again without any admission, like a new cordon, which no scheduler can refuse.
    released = [
        n
        for n in names
        if world.nodes[n].selection is None
        and progress.node_done(cr, world.nodes[n])
        and not world.nodes[n].unschedulable
    ]
    if roll < 0.45 and busy:
        _finished(world, rng.choice(busy))
    elif roll < 0.55 and busy:
        world.write(rng.choice(busy), executor=_failed(cr))
    elif roll < 0.65 and failed:
        _finished(world, rng.choice(failed))  # retried and fixed
    elif roll < 0.72 and released:
        # `nodewright package rerun` on a finished, released node: it goes through admission
        # again, possibly into the batch still in flight.
        world.write(rng.choice(released), executor=ExecutorRecord())
    else:
        world.write(rng.choice(names))  # a heartbeat: the node changes, nothing it means does
    world.changed()


def _fast_release(world: World, rng: random.Random, lag: int) -> None:
    """The scheduler's release fast path (``Scheduler._release_now``), outside any pass: one
    node's release, decided on what a node cache had up to ``lag`` changes ago, written with
    that resourceVersion as its precondition."""
    back = rng.randint(0, min(lag, len(world.history) - 1))
    seen = world.history[-1 - back].nodes
    name = rng.choice(sorted(seen))
    due = kernel.releases(world.cr, [seen[name]])
    if due and world.nodes[name].resource_version == seen[name].resource_version:
        world.write(name, selection=None)
        world.changed()


async def _at_once() -> None:
    return None


def _decider(world: World, view: View) -> Callable[[], kernel.Plan]:
    """The kernel's decision on ``view`` (as it is when called)."""
    return lambda: kernel.plan(
        cr=world.cr,
        policy=world.policy,
        nodes=list(view.nodes.values()),
        book=view.book,
        ctx=kernel.Context(now=T0, nodes_seen=str(view.seen)),
    )


async def _replica(world: World, turns: Turns, me: int, rng: random.Random, lag: int) -> None:
    turn = turns.gate(me)
    ctx = kernel.Context(now=T0)
    while True:
        await turn()
        # What this replica's informers had, up to ``lag`` changes ago: the node informer and
        # the NodeWright informer are separate watches, so the nodes may be older than the
        # batch book (never newer: the book is only written after what it is based on).
        book_back = rng.randint(0, min(lag, len(world.history) - 1))
        nodes_back = rng.randint(book_back, min(lag, len(world.history) - 1))
        seen, nodes = world.history[-1 - book_back], world.history[-1 - nodes_back]
        view = View(dict(nodes.nodes), seen.book, seen.cr_version, nodes.revision)
        writer = ModelWriter(world, view, turn)
        decided = 0

        def decide(view: View = view) -> kernel.Plan:
            nonlocal decided
            decided += 1
            if decided > 1 and rng.random() < 0.5:
                # The cache caught up meanwhile (it still has what this replica wrote).
                latest = world.history[-1]
                view.nodes, view.book, view.cr_version, view.seen = (
                    dict(latest.nodes),
                    latest.book,
                    latest.cr_version,
                    latest.revision,
                )
            return kernel.plan(
                cr=world.cr,
                policy=world.policy,
                nodes=list(view.nodes.values()),
                book=view.book,
                ctx=replace(ctx, nodes_seen=str(view.seen)),
            )

        await passing.run(decide, writer, together=_in_any_order(rng))


def _in_any_order(rng: random.Random) -> passing.Together:
    """Writes of one pass landing in any order, as the scheduler's concurrent writes may."""

    async def together(writes: Sequence[passing.Write]) -> list[bool]:
        order = list(range(len(writes)))
        rng.shuffle(order)
        landed: dict[int, bool] = {}
        for i in order:
            landed[i] = await writes[i]()
        return [landed[i] for i in range(len(writes))]

    return together


async def _drive(world: World, rng: random.Random, *, replicas: int, steps: int, lag: int) -> None:
    turns = Turns()
    tasks = [
        asyncio.create_task(_replica(world, turns, i, random.Random(rng.random()), lag))
        for i in range(replicas)
    ]
    try:
        for _ in range(steps):
            await turns.settle(tasks)
            who = rng.randrange(replicas + 2)
            if who == replicas:
                _world_moves(world, rng)
            elif who == replicas + 1:
                _fast_release(world, rng, lag)
            else:
                turns.release(who)
                await asyncio.sleep(0)
        # Then one replica alone, up to date, while the world finishes what it admits: the
        # fence never holds a slot for ever, so the rollout completes.
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for _ in range(400):
            if all(progress.node_done(world.cr, n) for n in world.nodes.values()):
                break
            for name, n in list(world.nodes.items()):
                if n.selection is not None and not progress.node_done(world.cr, n):
                    _finished(world, name)
                    world.changed()
            view = View.of(world.history[-1])
            await passing.run(_decider(world, view), ModelWriter(world, view, _at_once))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _policy(spec: dict[str, Any]) -> api.DeploymentPolicy:
    return api.from_dict({"metadata": {"name": "p"}, "spec": spec}, api.DeploymentPolicy)


@st.composite
def fleets(draw: st.DrawFn) -> World:
    n = draw(st.integers(2, 12))
    with_policy = draw(st.booleans())
    cordoned = draw(st.sets(st.integers(0, n - 1), max_size=1))
    labels = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    if with_policy:
        kinds = st.sampled_from(
            [None, {"fixed": {"batchSize": 2}}, {"linear": {"initialBatch": 1}}]
        )
        compartment: dict[str, Any] = {
            "name": "rack-a",
            "selector": {"matchLabels": {"rack": "a"}},
            "budget": {"count": draw(st.integers(1, 3))},
        }
        default: dict[str, Any] = {"budget": {"count": draw(st.integers(1, 3))}}
        for rollout in (compartment, default):
            strategy = draw(kinds)
            if strategy is not None:
                rollout["strategy"] = strategy
        policy = _policy({"default": default, "compartments": [compartment]})
        cr = nodewright(deploymentPolicy="p")
    else:
        policy = None
        cr = nodewright(interruptionBudget={"count": draw(st.integers(1, 3))})
    nodes = {
        f"n{i:02d}": progress.facts(
            node(
                f"n{i:02d}",
                labels={"rack": "a"} if labels[i] and with_policy else {},
                unschedulable=i in cordoned,
                created=f"2026-01-01T00:00:{i:02d}Z",
            ),
            CR,
        )
        for i in range(n)
    }
    return World(cr=cr, policy=policy, nodes=nodes)


@settings(max_examples=150, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(fleets(), st.randoms(use_true_random=False), st.integers(0, 6))
def test_two_replicas_lost_writes_and_retries_never_exceed_a_budget(
    world: World, rng: random.Random, lag: int
) -> None:
    asyncio.run(_drive(world, rng, replicas=2, steps=250, lag=lag))
    assert all(progress.node_done(world.cr, n) for n in world.nodes.values()), "completes"
    holding = [n for n in world.nodes.values() if slots.being_admitted(n, world.book.admitting)]
    assert holding == [], "no fence entry holds a slot once every admission landed"


def test_a_release_that_lost_its_race_keeps_its_slot_and_nothing_is_admitted_into_it() -> None:
    """Issue 12, case 1: a pass released s5-04 and admitted s5-05 in its place; the release
    lost a race with another writer of s5-04 and returned quietly, the admission went ahead,
    and three nodes of a budget of two held admissions for 175 ms."""
    cr = nodewright(interruptionBudget={"count": 2})
    nodes = {f"s5-{i:02d}": progress.facts(node(f"s5-{i:02d}"), CR) for i in range(6)}
    world = World(cr=cr, policy=None, nodes=nodes)

    async def at_once() -> None:
        return None

    def decide(view: View) -> Callable[[], kernel.Plan]:
        return lambda: kernel.plan(
            cr=cr,
            policy=None,
            nodes=list(view.nodes.values()),
            book=view.book,
            ctx=kernel.Context(now=T0),
        )

    view = View.of(world.history[-1])
    first = asyncio.run(passing.run(decide(view), ModelWriter(world, view, at_once)))
    assert [a.node for a in first.admitted] == ["s5-00", "s5-01"]
    # s5-00 finishes; s5-01 fails and keeps its slot.
    _finished(world, "s5-00")
    world.write("s5-01", executor=_failed(cr))
    world.changed()
    view = View.of(world.history[-1])

    class Racing(ModelWriter):
        async def write_release(self, release: kernel.Release) -> bool:
            # The drainer wrote s5-00 a moment before: the release's precondition fails.
            self.world.write(release.node)
            self.world.changed()
            return await super().write_release(release)

    second = asyncio.run(passing.run(decide(view), Racing(world, view, at_once)))
    assert [r.node for r in second.plan.release] == ["s5-00"]
    assert second.released == ()
    assert second.admitted == (), "nothing admitted into a slot that was not freed"
    assert second.lost == 1
    assert world.worst[rules.DEFAULT_COMPARTMENT] == 2
    # The next pass releases it and only then admits.
    view = View.of(world.history[-1])
    third = asyncio.run(passing.run(decide(view), ModelWriter(world, view, at_once)))
    assert [r.node for r in third.released] == ["s5-00"]
    assert [a.node for a in third.admitted] == ["s5-02"]
    assert world.worst[rules.DEFAULT_COMPARTMENT] == 2


def test_a_replica_on_a_stale_view_counts_the_admissions_another_one_is_writing() -> None:
    """The fence: replica A wrote the book and is about to admit; replica B decides on nodes
    that do not show A's admissions yet, but on the book A wrote."""
    cr = nodewright(interruptionBudget={"count": 1})
    nodes = {f"n{i}": progress.facts(node(f"n{i}"), CR) for i in range(3)}
    world = World(cr=cr, policy=None, nodes=nodes)
    stale = View.of(world.history[-1])
    a_plan = kernel.plan(
        cr=cr,
        policy=None,
        nodes=list(stale.nodes.values()),
        book=stale.book,
        ctx=kernel.Context(now=T0),
    )
    (admit,) = a_plan.admit
    assert a_plan.book.admitting == {admit.node: admit.resource_version}
    # A wrote the book, not yet the admission; B's node cache is old, its CR cache new.
    world.book, world.cr_version = a_plan.book, world.cr_version + 1
    world.changed()
    b_plan = kernel.plan(
        cr=cr,
        policy=None,
        nodes=list(stale.nodes.values()),
        book=world.book,
        ctx=kernel.Context(now=T0),
    )
    others = [a.node for a in b_plan.admit if a.node != admit.node]
    assert others == [], "no second node while the first may still be admitted"
    (comp,) = b_plan.compartments
    assert comp.holders == ((admit.node, "being admitted"),)
    # Once the admission landed the fence entry goes, and the admission itself counts.
    world.write(admit.node, selection=admit.selection)
    after = kernel.plan(
        cr=cr,
        policy=None,
        nodes=list(world.nodes.values()),
        book=world.book,
        ctx=kernel.Context(now=T0),
    )
    assert after.book.admitting == {}
    assert after.compartments[0].holders == ((admit.node, "admitted"),)


@pytest.mark.parametrize("cordoned", ["gpu-1", "gpu-3"])
def test_a_hand_cordoned_node_this_nodewright_finished_holds_no_slot(cordoned: str) -> None:
    """Issue 12, case 4: 3 nodes, one cordoned by hand, the default budget (one at a time):
    only the cordoned node completed and the other two waited for good, saying nothing about
    which node held the slot."""
    cr = nodewright()
    names = ["gpu-1", "gpu-2", "gpu-3"]
    nodes = {n: progress.facts(node(n, unschedulable=n == cordoned), CR) for n in names}
    world = World(cr=cr, policy=None, nodes=nodes)
    before = kernel.plan(
        cr=cr,
        policy=None,
        nodes=list(world.nodes.values()),
        book=world.book,
        ctx=kernel.Context(now=T0),
    )
    # Not done yet: the cordoned node holds the slot, and joins the batch at no cost.
    assert before.compartments[0].holders == ((cordoned, "cordoned by someone else"),)
    assert [a.node for a in before.admit] == [cordoned]
    waiting = before.waiting
    assert {r.code for r in waiting.values()} == {"WaitingForBatch"}

    async def at_once() -> None:
        return None

    for _ in range(12):
        for name, n in list(world.nodes.items()):
            if n.selection is not None and not progress.node_done(cr, n):
                _finished(world, name)
                world.changed()
        view = View.of(world.history[-1])
        asyncio.run(passing.run(_decider(world, view), ModelWriter(world, view, _at_once)))
    assert all(progress.node_done(cr, n) for n in world.nodes.values())
    assert world.nodes[cordoned].unschedulable, "someone else's cordon stays"


def test_every_budget_wait_names_the_nodes_holding_the_slots_and_why() -> None:
    cr = nodewright(interruptionBudget={"count": 2})
    raw = [
        node("gpu-1", ready=False),
        node("gpu-2", unschedulable=True),
        node("gpu-3"),
    ]
    facts = [progress.facts(n, CR) for n in raw]
    p = kernel.plan(cr=cr, policy=None, nodes=facts, book=BatchBook(), ctx=kernel.Context(now=T0))
    # gpu-2 (cordoned by someone else) joins at no cost; gpu-3 would be a third.
    assert [a.node for a in p.admit] == ["gpu-2"]
    reason = p.waiting["gpu-3"]
    assert reason.code == "WaitingForBatch"
    # The batch (of the free slots) is in flight; between batches the compartment says why.
    placed = replace(facts[1], selection=p.admit[0].selection)
    q = kernel.plan(
        cr=cr,
        policy=None,
        nodes=[facts[0], placed, facts[2]],
        book=BatchBook(),
        ctx=kernel.Context(now=T0),
    )
    (comp,) = q.compartments
    assert comp.waiting is not None
    assert comp.waiting.code == "BudgetExhausted"
    assert comp.waiting.message == (
        "2 of 2 budgeted nodes of compartment __default__ are busy: "
        "gpu-1: NotReady; gpu-2: admitted"
    )
    assert q.waiting["gpu-3"].details["holders"] == "gpu-1,gpu-2"
