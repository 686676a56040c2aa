"""``nodewright approve``: which approvals it writes (``plan_cmd.approving``, pure: the CR
and its policy in, by the kernel's rule) and how ``nodewright plan`` shows a compartment
waiting for one. Writing the annotation, and the scheduler acting on it, run on the rig in
``tests/e2e/test_policies.py``."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from nodewright import plan_cmd
from nodewright.connecting import CommandError
from shared import api
from shared.rollout import approvals, book as rollout_book
from tests.helpers.facts import T0, node, nodewright

FINISHED = T0 + timedelta(minutes=5)


def _policy(after: list[int]) -> api.DeploymentPolicy:
    spec = {
        "default": {
            "budget": {"count": 2},
            "strategy": {"fixed": {"batchSize": 2}},
            "approvalAfterBatches": after,
        },
        "compartments": [
            {
                "name": "canary",
                "selector": {"matchLabels": {"rack": "a"}},
                "budget": {"count": 1},
                "approvalAfterBatches": [1],
            }
        ],
    }
    return api.from_dict({"metadata": {"name": "p"}, "spec": spec}, api.DeploymentPolicy)


def _cr(entries: Mapping[str, rollout_book.CompartmentBatch], **notes: str) -> api.NodeWright:
    book = rollout_book.BatchBook(compartments=dict(entries))
    annotations = {rollout_book.BATCHES_ANNOTATION: rollout_book.encode_batch_book(book), **notes}
    return nodewright(deploymentPolicy="p", annotations=annotations)


def _between(after: int, finished: datetime | None = FINISHED) -> rollout_book.CompartmentBatch:
    return rollout_book.CompartmentBatch(
        state=api.BatchState(current_batch=after + 1), finished=finished
    )


def _in_flight(batch: int) -> rollout_book.CompartmentBatch:
    return rollout_book.CompartmentBatch(
        state=api.BatchState(current_batch=batch, batch_size=2), nodes=("n0", "n1")
    )


def test_it_approves_each_compartment_whose_gated_batch_just_finished() -> None:
    cr = _cr({"__default__": _between(2), "canary": _between(1)})
    todo = plan_cmd.approving(cr, _policy([2]), None)
    assert todo.give == {
        "__default__": approvals.Approval(batch=2, finished=FINISHED),
        "canary": approvals.Approval(batch=1, finished=FINISHED),
    }
    assert todo.already == {}
    only = plan_cmd.approving(cr, _policy([2]), "canary")
    assert list(only.give) == ["canary"]


def test_an_approval_already_given_is_no_change() -> None:
    given = approvals.encode({"canary": approvals.Approval(batch=1, finished=FINISHED)})
    cr = _cr({"canary": _between(1)}, **{approvals.APPROVALS_ANNOTATION: given})
    todo = plan_cmd.approving(cr, _policy([]), None)
    assert (dict(todo.give), list(todo.already)) == ({}, ["canary"])


@pytest.mark.parametrize(
    ("entries", "after", "compartment", "says"),
    [
        pytest.param({}, [1], None, "waits for no approval", id="no-batch-yet"),
        pytest.param(
            {"__default__": _in_flight(2)},
            [1, 2],
            None,
            "waits for no approval",
            id="batch-in-flight",
        ),
        pytest.param(
            {"__default__": _between(2)}, [1], None, "waits for no approval", id="not-gated"
        ),
        pytest.param(
            {"__default__": _between(1)},
            [1],
            "canary",
            "compartment canary of NodeWright",
            id="another-compartment-waits",
        ),
        pytest.param(
            {},
            [1],
            "gpu",
            "has no compartment gpu: it has __default__, canary",
            id="unknown-compartment",
        ),
    ],
)
def test_nothing_to_approve_is_one_line_saying_what_to_look_at(
    entries: Mapping[str, rollout_book.CompartmentBatch],
    after: list[int],
    compartment: str | None,
    says: str,
) -> None:
    with pytest.raises(CommandError) as err:
        plan_cmd.approving(_cr(entries), _policy(after), compartment)
    text = str(err.value)
    assert says in text
    assert "\n" not in text
    if "waits for no approval" in text:
        assert "`nodewright plan gpu-node-tuning` shows the batches" in text


def test_the_plan_says_which_batch_waits_for_approval_and_the_command() -> None:
    cr = _cr({"__default__": _between(1, finished=datetime(2026, 1, 1, 11, 0, tzinfo=UTC))})
    nodes: list[dict[str, Any]] = [node(f"n{i:02d}") for i in range(4)]
    doc = plan_cmd.document(cr, _policy([1]), nodes, datetime(2026, 1, 1, 12, 0, tzinfo=UTC))
    (default,) = [c for c in doc["compartments"] if c["name"] == "__default__"]
    command = "nodewright approve gpu-node-tuning --compartment __default__"
    assert default["awaitingApproval"] == {"batch": 1, "command": command}
    lines = plan_cmd.render(doc).splitlines()
    assert lines[3] == (
        f"__default__   fixed      4       2        0      2       awaiting approval of batch 1 "
        f"(`{command}`)"
    )
    # The batches to come are still predicted, as if approved.
    assert lines[-2:] == [
        "__default__   2       2      after approval   n00, n01",
        "__default__   3       2      planned          n02, n03",
    ]
