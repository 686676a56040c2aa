"""``nodewright approve NAME`` against the real API server: it writes the approval of the
batch the compartment waits on (as the scheduler's batch book records it) and leaves every
other annotation alone, is idempotent, says in one line when nothing waits, and a
NodeWright that changed between its read and its write is read again, not overwritten.
The scheduler acting on the approval runs in ``tests/e2e/test_policies.py``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from nodewright import manifests, node_cmd, plan_cmd
from nodewright.rig import Rig
from shared import api
from shared.kube import Kube
from shared.rollout import approvals, book as rollout_book
from tests.cli.conftest import Objects, cli

PACKAGES = {"tuning": {"version": "1.0.0", "image": "registry.example/tuning"}}
OTHER = "example.com/owner"
FINISHED = datetime(2026, 12, 7, 12, 0, 3, 120000, tzinfo=UTC)


@pytest.fixture
async def gated(kapi: Kube, objects: Objects) -> AsyncIterator[str]:
    """A DeploymentPolicy that gates batch 1 (its name)."""
    name = objects.name("gate")
    body = {
        "apiVersion": api.API_VERSION,
        "kind": "DeploymentPolicy",
        "metadata": {"name": name},
        "spec": {"default": {"budget": {"count": 2}, "approvalAfterBatches": [1]}},
    }
    await kapi.create(manifests.POLICIES, body)
    try:
        yield name
    finally:
        await kapi.delete_if_present(f"{manifests.POLICIES}/{name}")


async def _waiting(kapi: Kube, objects: Objects, policy: str, after: int) -> str:
    """A NodeWright under ``policy`` whose batch book says batch ``after`` just finished."""
    book = rollout_book.BatchBook(
        compartments={
            "__default__": rollout_book.CompartmentBatch(
                state=api.BatchState(current_batch=after + 1), finished=FINISHED
            )
        }
    )
    annotations = {rollout_book.BATCHES_ANNOTATION: rollout_book.encode_batch_book(book)}
    cr = await objects.nodewright("appr", PACKAGES, annotations={OTHER: "team-a", **annotations})
    name = cr.metadata.name
    await kapi.patch(f"{manifests.NODEWRIGHTS}/{name}", {"spec": {"deploymentPolicy": policy}})
    return name


async def test_approve_writes_the_approval_of_the_finished_batch_once(
    rig: Rig, kapi: Kube, objects: Objects, gated: str
) -> None:
    cr = await _waiting(kapi, objects, gated, after=1)
    dry = await cli(rig, "approve", cr, "--dry-run")
    assert dry.code == 0, dry
    assert dry.out.splitlines()[0].startswith("Would approve batch 1 of compartment __default__")
    assert approvals.APPROVALS_ANNOTATION not in await objects.annotations(cr)

    done = await cli(rig, "approve", cr)
    assert done.code == 0, done
    assert done.out.splitlines() == [
        f"Approved batch 1 of compartment __default__ of NodeWright {cr} (finished "
        "2026-12-07T12:00:03+00:00): its next batch opens once any soak is over.",
        f"`nodewright plan {cr}` shows the batches.",
    ]
    notes = await objects.annotations(cr)
    assert notes[OTHER] == "team-a"
    assert approvals.read(notes).by_compartment == {
        "__default__": approvals.Approval(batch=1, finished=FINISHED)
    }

    again = await cli(rig, "approve", cr, "--compartment", "__default__")
    assert again.code == 0, again
    assert again.out.splitlines()[0] == (
        f"Batch 1 of compartment __default__ of NodeWright {cr} is already approved; no change."
    )


async def test_nothing_to_approve_is_one_line_on_stderr(
    rig: Rig, kapi: Kube, objects: Objects, gated: str
) -> None:
    cr = await _waiting(kapi, objects, gated, after=2)  # batch 2 is not gated
    got = await cli(rig, "approve", cr)
    assert got.code == 1, got
    assert got.out == ""
    assert got.err.startswith(f"nodewright: NodeWright {cr} waits for no approval"), got.err
    assert got.err.count("\n") == 1, got.err
    missing = await cli(rig, "approve", cr, "--compartment", "gpu")
    assert missing.err == (
        f"nodewright: NodeWright {cr} has no compartment gpu: it has __default__\n"
    ), missing.err


async def test_a_nodewright_changed_since_it_was_read_is_read_again_not_overwritten(
    kapi: Kube, objects: Objects, gated: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The approval is written against the resourceVersion read: the scheduler writing its
    book meanwhile makes the API server refuse it (409), and ``approve`` reads again."""
    cr = await _waiting(kapi, objects, gated, after=1)
    stale = await node_cmd.require_nodewright(kapi, cr)
    await kapi.patch(
        f"{manifests.NODEWRIGHTS}/{cr}", {"metadata": {"annotations": {"example.com/x": "1"}}}
    )
    reads: list[str] = []
    real = node_cmd.require_nodewright

    async def first_stale(client: Kube, name: str) -> api.NodeWright:
        reads.append(name)
        return stale if len(reads) == 1 else await real(client, name)

    monkeypatch.setattr(node_cmd, "require_nodewright", first_stale)
    lines = await plan_cmd.approve(kapi, cr, None)
    assert len(reads) == 2, "read again after the 409"
    assert lines[0].startswith("Approved batch 1")
    notes = await objects.annotations(cr)
    assert notes["example.com/x"] == "1", "the change made meanwhile is kept"
    assert "__default__" in approvals.read(notes).by_compartment
