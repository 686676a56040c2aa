"""Per-compartment Kubernetes Events: which transitions of the batch state and of a
compartment's wait raise which Event, that a pass seen again raises nothing new, and that
Event names identify a transition whoever computes it."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import msgspec

from services.status import assessing, core, kube_events
from services.status.kube_events import CompartmentChange
from shared import api, nodestate, progress
from shared.records.drainer import DrainRecord
from shared.records.executor import ExecutorRecord, PackageRecord
from shared.records.scheduler import Selection
from shared.records.validator import ValidatorRecord
from shared.rollout import book as rollout_book, rules as rollout_rules
from tests.helpers import status as status_helpers
from tests.helpers.facts import T0, node, nodewright

CR = "gpu-node-tuning"
DEFAULT = rollout_rules.DEFAULT_COMPARTMENT
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class World:
    """A NodeWright and its nodes as the status service sees them, pass after pass: each
    :meth:`step` computes what one status pass computes and writes what it would write (the
    CR status, the node conditions), so the next step compares against it."""

    def __init__(
        self,
        cr: api.NodeWright,
        nodes: Sequence[dict[str, Any]],
        policy: api.DeploymentPolicy | None = None,
    ) -> None:
        self.cr = cr
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.policy = policy
        self.now = T0

    def book(self, **compartments: rollout_book.CompartmentBatch) -> None:
        """The scheduler writes its batch book (``__default__`` is spelled ``default``)."""
        book = rollout_book.BatchBook(
            compartments={DEFAULT if k == "default" else k: v for k, v in compartments.items()},
            reset_token=rollout_book.read_batch_book(self.cr.metadata.annotations).reset_token,
        )
        self.annotate(rollout_book.BATCHES_ANNOTATION, rollout_book.encode_batch_book(book))

    def annotate(self, key: str, value: str) -> None:
        meta = msgspec.structs.replace(
            self.cr.metadata, annotations={**self.cr.metadata.annotations, key: value}
        )
        self.cr = msgspec.structs.replace(self.cr, metadata=meta)

    def records(self, name: str, **records: msgspec.Struct | None) -> None:
        """Other services write their records on a node (None removes one)."""
        annotations = self.nodes[name]["metadata"]["annotations"]
        for owner, record in records.items():
            key = nodestate.key(getattr(nodestate, owner.upper()), CR)
            if record is None:
                annotations.pop(key, None)
            else:
                annotations[key] = msgspec.json.encode(record).decode()

    def changes(self) -> list[CompartmentChange]:
        """What this pass raises, without writing anything."""
        return self._pass()[0]

    def step(self) -> list[CompartmentChange]:
        """One status pass: the changes it raises; its writes are applied."""
        changes, status, updates = self._pass()
        for update in updates:
            status_helpers.written(self.nodes[update.node], CR, update)
        self.cr = msgspec.structs.replace(self.cr, status=status)
        self.now += timedelta(seconds=10)
        return changes

    def _pass(self) -> tuple[list[CompartmentChange], api.NodeWrightStatus, list[Any]]:
        observed = [assessing.observe(n, CR) for n in self.nodes.values()]
        views, plan = status_helpers.assess(self.cr, self.policy, observed, self.now)
        status = core.summarize(self.cr, self.policy, views, self.now, plan)
        changes = kube_events.compartment_changes(self.cr, status.compartments, views, observed)
        return changes, status, core.node_updates(CR, views, observed, self.now)


def _bodies(
    cr: api.NodeWright, changes: Sequence[CompartmentChange], instance: str
) -> list[dict[str, Any]]:
    """The Event bodies the status shell would create for the changes."""
    occurrences = kube_events.for_compartment_changes(cr, changes, at=T0)
    return [kube_events.body(o, instance=instance) for o in occurrences]


def _cr(budget: int = 10, **kw: Any) -> api.NodeWright:
    return nodewright(CR, interruptionBudget={"count": budget}, **kw)


BASE = _cr()
TARGET = progress.target_digest(BASE)
DIGEST = progress.desired(BASE)["nvidia-tuned"].config_digest
DRAINED = DrainRecord(phase="drained", cordoned=True, started=T0, since=T0)


def _sel(batch: int, compartment: str = DEFAULT) -> Selection:
    return Selection(
        generation=1,
        compartment=compartment,
        batch=batch,
        selected_at=T0,
        disruptive=True,
        target=TARGET,
    )


def _exe(state: str) -> ExecutorRecord:
    fields: dict[str, Any] = {"version": "0.9.0", "stage": "apply", "state": state, "updated": T0}
    if state == "succeeded":
        fields.update(stage="config", installed="0.9.0", config=DIGEST)
    return ExecutorRecord(packages={"nvidia-tuned": msgspec.convert(fields, PackageRecord)})


def _batch(
    number: int,
    nodes: Sequence[str] = (),
    *,
    planned: int = 0,
    ok: int = 0,
    failed: int = 0,
    consecutive: int = 0,
    last_failed: bool = False,
    stopped: bool = False,
) -> rollout_book.CompartmentBatch:
    state = api.BatchState(
        current_batch=number,
        batch_size=len(nodes),
        total_succeeded_nodes=ok,
        total_failed_nodes=failed,
        consecutive_failed_batches=consecutive,
        last_batch_failed=last_failed,
        stopped=stopped,
        stop_reason="FailedBatchesLimit" if stopped else "",
        stop_message="2 consecutive batches below 100% success" if stopped else "",
    )
    return rollout_book.CompartmentBatch(state=state, nodes=tuple(nodes), planned=planned)


def _admit(w: World, name: str, batch: int, compartment: str = DEFAULT) -> None:
    w.records(name, scheduler=_sel(batch, compartment), drainer=DRAINED, executor=_exe("running"))


def _finish(w: World, name: str) -> None:
    """The node is done and released."""
    w.records(
        name,
        scheduler=None,
        drainer=None,
        executor=_exe("succeeded"),
        validator=ValidatorRecord(validated=TARGET, at=T0),
    )


def _fail(w: World, name: str) -> None:
    w.records(name, executor=_exe("failed"))


def _summary(changes: Sequence[CompartmentChange]) -> list[tuple[str, str, str, str]]:
    return [
        (c.compartment, c.reason, c.type_, c.annotations.get(kube_events.ANNOTATION_BATCH, ""))
        for c in changes
    ]


def _world(*names: str, cr: api.NodeWright = BASE) -> World:
    return World(cr, [node(n) for n in names])


# ---- batches -----------------------------------------------------------------------------------


def test_a_batch_opening_raises_batch_started_with_its_number_size_and_nodes_once() -> None:
    w = _world("a", "b", "c")
    assert w.step() == [], "nothing started yet"
    w.book(default=_batch(1, ["a", "b"], planned=2))
    _admit(w, "a", 1)
    _admit(w, "b", 1)
    (started,) = w.step()
    assert (started.compartment, started.reason, started.type_) == (
        DEFAULT,
        "BatchStarted",
        "Normal",
    )
    assert started.message == (
        f"NodeWright {CR}: compartment {DEFAULT} started batch 1 with 2 nodes, budget 10: a, b"
    )
    assert started.annotations == {
        kube_events.ANNOTATION_COMPARTMENT: DEFAULT,
        kube_events.ANNOTATION_BATCH: "1",
        kube_events.ANNOTATION_BATCH_SIZE: "2",
    }
    assert w.step() == [], "the next pass sees the status it wrote: nothing new"


def test_a_batch_ending_raises_batch_finished_with_successes_and_failures() -> None:
    w = _world("a", "b", "c", "d")
    w.book(default=_batch(1, ["a", "b"], planned=2))
    _admit(w, "a", 1)
    _admit(w, "b", 1)
    w.step()
    _finish(w, "a")
    _fail(w, "b")
    w.book(default=_batch(2, ["c"], planned=2, ok=1, failed=1))
    _admit(w, "c", 2)
    finished, started = w.step()
    assert _summary([finished, started]) == [
        (DEFAULT, "BatchFinished", "Normal", "1"),
        (DEFAULT, "BatchStarted", "Normal", "2"),
    ]
    assert finished.message == (
        f"NodeWright {CR}: compartment {DEFAULT} finished batch 1: 1 succeeded, 1 failed; passed"
    )
    assert finished.annotations[kube_events.ANNOTATION_SUCCEEDED] == "1"
    assert finished.annotations[kube_events.ANNOTATION_FAILED] == "1"
    assert "batch 2 with 1 nodes (nominal size 2)" in started.message


def test_a_failed_batch_is_a_warning_and_reaching_the_threshold_stops_the_compartment() -> None:
    w = _world("a", "b", "c")
    w.book(default=_batch(1, ["a"], planned=1))
    _admit(w, "a", 1)
    w.step()
    _fail(w, "a")
    w.book(default=_batch(2, ["b"], planned=1, failed=1, consecutive=1, last_failed=True))
    _admit(w, "b", 2)
    finished, _ = w.step()
    assert (finished.reason, finished.type_) == ("BatchFinished", "Warning")
    assert finished.message.endswith(
        "0 succeeded, 1 failed; below the success threshold (1 consecutive failed batches)"
    )
    _fail(w, "b")
    w.book(default=_batch(3, planned=1, failed=2, consecutive=2, last_failed=True, stopped=True))
    changes = w.step()
    assert _summary(changes) == [
        (DEFAULT, "BatchFinished", "Warning", "2"),
        (DEFAULT, "CompartmentStopped", "Warning", "3"),
    ]
    assert changes[1].message == (
        f"NodeWright {CR}: compartment {DEFAULT} stopped before batch 3: FailedBatchesLimit: "
        "2 consecutive batches below 100% success"
    )
    # Node c now waits because the compartment stopped: the stop says so, no wait Event.
    assert w.step() == []


def test_batches_missed_between_two_passes_are_reported_together() -> None:
    w = _world(*"abcdefg")
    w.book(default=_batch(1, ["a"], planned=1))
    _admit(w, "a", 1)
    w.step()
    for name in "abc":
        _finish(w, name)
    w.book(default=_batch(3, ["d", "e", "f"], planned=3, ok=3))
    for name in "def":
        _admit(w, name, 3)
    finished, started = w.step()
    assert finished.message.endswith("finished batches 1 to 2: 3 succeeded, 0 failed; passed")
    assert finished.annotations[kube_events.ANNOTATION_BATCH] == "2"
    assert started.annotations[kube_events.ANNOTATION_BATCH] == "3"


def test_the_last_batch_finishes_and_the_compartment_completes_when_the_state_resets() -> None:
    w = _world("a", "b")
    w.book(default=_batch(1, ["a"], planned=1))
    _admit(w, "a", 1)
    w.step()
    _finish(w, "a")
    w.book(default=_batch(2, ["b"], planned=2, ok=1))
    _admit(w, "b", 2)
    w.step()
    # Validated but still admitted: done for the scheduler, which resets the batch state on
    # completion; not complete for status until it is released.
    w.records("b", executor=_exe("succeeded"), validator=ValidatorRecord(validated=TARGET, at=T0))
    w.book()
    (finished,) = w.step()
    assert finished.reason == "BatchFinished"
    assert finished.message.endswith("finished batch 2: 1 succeeded, 0 failed; passed")
    _finish(w, "b")
    (completed,) = w.step()
    assert (completed.reason, completed.type_) == ("CompartmentCompleted", "Normal")
    assert completed.message == (
        f"NodeWright {CR}: compartment {DEFAULT} completed: 2 of 2 nodes complete"
    )
    assert w.step() == []
    # A node joins the compartment; once it is done too, the compartment completes anew.
    w.nodes["c"] = node("c")
    assert w.step() == []
    _finish(w, "c")
    (again,) = w.step()
    assert again.reason == "CompartmentCompleted"
    assert again.key != completed.key


def test_a_reset_by_command_starts_batch_one_again_under_a_new_event_name() -> None:
    w = _world("a", "b", "c")
    w.book(default=_batch(1, ["a"], planned=1))
    _admit(w, "a", 1)
    (first,) = w.step()
    _fail(w, "a")
    w.book(default=_batch(2, ["b"], planned=1, failed=1, consecutive=1, last_failed=True))
    _admit(w, "b", 2)
    w.step()
    w.annotate(rollout_book.RESET_ANNOTATION, "reset-1")
    reset = rollout_book.BatchBook(
        compartments={DEFAULT: _batch(1, ["a"], planned=1)}, reset_token="reset-1"
    )
    w.annotate(rollout_book.BATCHES_ANNOTATION, rollout_book.encode_batch_book(reset))
    (again,) = w.step()
    assert _summary([again]) == [(DEFAULT, "BatchStarted", "Normal", "1")]
    assert again.message == first.message
    assert again.key != first.key, "the same batch 1 of another rollout epoch is a new Event"


# ---- waits ---------------------------------------------------------------------------------


def test_only_a_wait_that_a_person_ends_is_an_event_outside_verbose_mode() -> None:
    def change(reason: str, waiting: str = "") -> kube_events.CompartmentChange:
        notes = {kube_events.ANNOTATION_WAITING: waiting} if waiting else {}
        return kube_events.CompartmentChange(
            compartment=DEFAULT,
            reason=reason,
            type_="Normal",
            message="",
            key="k",
            annotations=notes,
        )

    approval = change("CompartmentWaiting", "BatchAwaitingApproval")
    for c in (approval, change("BatchStarted"), change("CompartmentStopped")):
        assert kube_events.raised(c, verbose=False), c
    for c in (
        change("CompartmentWaiting", "Paused"),
        change("CompartmentWaiting", "BatchSoaking"),
        change("CompartmentCompleted"),
    ):
        assert not kube_events.raised(c, verbose=False), c
        assert kube_events.raised(c, verbose=True), c


def test_a_wait_is_reported_when_its_reason_changes_and_not_while_it_lasts() -> None:
    w = _world("a", "b")
    assert w.step() == [], "waiting for the first batch is no news"
    assert w.cr.status.compartments[0].waiting_reason == ""
    w.annotate(api.PAUSE_ANNOTATION, "true")
    (paused,) = w.step()
    assert (paused.reason, paused.type_) == ("CompartmentWaiting", "Normal")
    assert paused.message == (
        f"NodeWright {CR}: compartment {DEFAULT} waits (before batch 1): Paused: "
        "the NodeWright is paused (2 nodes, e.g. a)"
    )
    assert paused.annotations[kube_events.ANNOTATION_WAITING] == "Paused"
    (comp,) = w.cr.status.compartments
    assert (comp.waiting_reason, comp.waiting_message) == (
        "Paused",
        "the NodeWright is paused (2 nodes, e.g. a)",
    ), "the status says the same as the Event"
    assert w.step() == [], "still paused: nothing new"
    w.annotate(api.DISABLE_ANNOTATION, "true")
    (disabled,) = w.step()
    assert disabled.annotations[kube_events.ANNOTATION_WAITING] == "Disabled"


def test_a_closed_window_and_a_full_budget_hold_a_compartment_back() -> None:
    policy = api.from_dict(
        {
            "metadata": {"name": "p"},
            "spec": {
                "default": {"budget": {"count": 1}},
                "compartments": [
                    {
                        "name": "night",
                        "selector": {"matchLabels": {"rack": "night"}},
                        "budget": {"count": 1},
                    }
                ],
                # Never open at T0 (midnight UTC).
                "maintenanceWindows": [{"start": "12:00", "end": "13:00", "timeZone": "UTC"}],
            },
        },
        api.DeploymentPolicy,
    )
    cr = _cr(deploymentPolicy="p")
    w = World(cr, [node("a"), node("n1", labels={"rack": "night"})], policy)
    changes = w.step()
    assert sorted(_summary(changes)) == [
        (DEFAULT, "CompartmentWaiting", "Normal", "1"),
        ("night", "CompartmentWaiting", "Normal", "1"),
    ]
    assert all("WaitingForWindow: outside every maintenance window" in c.message for c in changes)
    assert {c.name: (c.waiting_reason, c.waiting_message) for c in w.cr.status.compartments} == {
        DEFAULT: ("WaitingForWindow", "outside every maintenance window (1 nodes, e.g. a)"),
        "night": ("WaitingForWindow", "outside every maintenance window (1 nodes, e.g. n1)"),
    }
    # A NotReady node holds the only slot once the window is open, and the wait says so.
    w.policy = msgspec.structs.replace(
        policy, spec=msgspec.structs.replace(policy.spec, maintenance_windows=[])
    )
    w.nodes["a"]["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    w.nodes["b"] = node("b")
    (budget,) = w.step()
    assert (budget.compartment, budget.annotations[kube_events.ANNOTATION_WAITING]) == (
        DEFAULT,
        "BudgetExhausted",
    )
    assert "1 of 1 budgeted nodes of compartment __default__ are busy: a: NotReady" in (
        budget.message
    )


def test_waiting_for_the_batch_in_flight_or_a_full_budget_during_it_is_no_news() -> None:
    w = _world("a", "b", "c", cr=_cr(budget=1))
    w.book(default=_batch(1, ["a"], planned=1))
    _admit(w, "a", 1)
    (started,) = w.step()
    assert started.reason == "BatchStarted"
    views, _ = status_helpers.assess(
        w.cr, None, [assessing.observe(n, CR) for n in w.nodes.values()], w.now
    )
    assert {v.name: v.reason.code for v in views if v.name != "a"} == {
        "b": "WaitingForBatch",
        "c": "WaitingForBatch",
    }, "the premise: the others wait for the batch in flight (which holds the whole budget)"
    assert w.step() == []
    (comp,) = w.cr.status.compartments
    assert comp.waiting_reason == "", "waiting for the batch in flight is no reason"


# ---- per compartment, names, bodies ----------------------------------------------------------


def _two_compartments() -> tuple[api.DeploymentPolicy, World]:
    policy = api.from_dict(
        {
            "metadata": {"name": "p"},
            "spec": {
                "default": {"budget": {"count": 2}},
                "compartments": [
                    {
                        "name": "canary",
                        "selector": {"matchLabels": {"canary": "true"}},
                        "budget": {"count": 1},
                        "strategy": {"fixed": {"batchSize": 1}},
                    }
                ],
            },
        },
        api.DeploymentPolicy,
    )
    nodes = [node("c1", labels={"canary": "true"}), node("d1"), node("d2")]
    return policy, World(_cr(deploymentPolicy="p"), nodes, policy)


def test_each_compartment_tells_its_own_story() -> None:
    _, w = _two_compartments()
    w.book(canary=_batch(1, ["c1"], planned=1), default=_batch(1, ["d1", "d2"], planned=2))
    _admit(w, "c1", 1, "canary")
    _admit(w, "d1", 1)
    _admit(w, "d2", 1)
    assert _summary(w.step()) == [
        (DEFAULT, "BatchStarted", "Normal", "1"),
        ("canary", "BatchStarted", "Normal", "1"),
    ]
    _finish(w, "c1")
    w.book(canary=_batch(2, planned=1, ok=1), default=_batch(1, ["d1", "d2"], planned=2))
    assert _summary(w.step()) == [
        ("canary", "BatchFinished", "Normal", "1"),
        ("canary", "CompartmentCompleted", "Normal", ""),
    ]


def test_event_names_identify_the_transition_whoever_computes_it() -> None:
    w = _world(*"abcd")
    w.book(default=_batch(1, ["a"], planned=1))
    _admit(w, "a", 1)
    w.step()
    _finish(w, "a")
    w.book(default=_batch(2, ["b"], planned=2, ok=1))
    _admit(w, "b", 2)
    fresh = w.changes()
    # Another replica whose previous status is older (it missed batch 1 opening) words the
    # end of batch 1 differently but names the same Events.
    stale = World(
        msgspec.structs.replace(w.cr, status=api.NodeWrightStatus()), list(w.nodes.values())
    ).changes()
    assert [c.reason for c in stale] == [c.reason for c in fresh]
    assert [c.key for c in stale] == [c.key for c in fresh]
    bodies = _bodies(w.cr, fresh, "status-0")
    again = _bodies(w.cr, stale, "status-1")
    assert [b["metadata"]["name"] for b in bodies] == [b["metadata"]["name"] for b in again]
    assert len({b["metadata"]["name"] for b in bodies}) == 2
    # The same transitions of a recreated NodeWright (another uid) are new Events.
    other = msgspec.structs.replace(
        w.cr, metadata=msgspec.structs.replace(w.cr.metadata, uid="uid-2")
    )
    recreated = _bodies(other, World(other, list(w.nodes.values())).changes(), "status-0")
    assert not {b["metadata"]["name"] for b in recreated} & {b["metadata"]["name"] for b in bodies}


def test_compartment_events_are_valid_bounded_events_on_the_nodewright() -> None:
    long = [f"node-{i:03d}-" + "x" * 240 for i in range(8)]
    w = _world(*long)
    w.book(default=_batch(1, long, planned=8))
    for name in long:
        _admit(w, name, 1)
    (started,) = w.step()
    assert len(started.message) == kube_events.MESSAGE_MAX
    assert started.message.endswith("...")
    (body,) = _bodies(w.cr, [started], "status-0")
    assert DNS_SUBDOMAIN.match(body["metadata"]["name"])
    assert body["metadata"]["namespace"] == "default"
    assert body["metadata"]["labels"] == {kube_events.LABEL_NODEWRIGHT: CR}
    assert body["metadata"]["annotations"] == {
        **started.annotations,
        kube_events.ANNOTATION_OCCURRENCE: body["metadata"]["annotations"][
            kube_events.ANNOTATION_OCCURRENCE
        ],
    }
    assert body["regarding"] == {
        "apiVersion": api.API_VERSION,
        "kind": "NodeWright",
        "name": CR,
        "uid": "uid-1",
    }
    assert (body["reason"], body["type"], body["action"]) == ("BatchStarted", "Normal", "RunBatch")
    assert body["eventTime"] == "2026-01-01T00:00:00.000000Z"
    assert "series" not in body
