"""``nodewright pause|resume|disable|enable NAME`` against the real API server: each sets or
removes exactly its annotation on the NodeWright, leaves every other annotation alone, is
idempotent, and a missing NodeWright is an error that says where to look."""

from __future__ import annotations

from nodewright.rig import Rig
from shared import api
from tests.cli.conftest import Objects, cli

PACKAGES = {"tuning": {"version": "1.0.0", "image": "registry.example/tuning"}}
OTHER = "example.com/owner"


async def test_pause_and_resume_set_and_remove_the_pause_annotation(
    rig: Rig, objects: Objects
) -> None:
    cr = (await objects.nodewright("life", PACKAGES, annotations={OTHER: "team-a"})).metadata.name

    paused = await cli(rig, "pause", cr)
    assert paused.code == 0, paused
    assert paused.out.splitlines()[0].startswith(
        f'Paused NodeWright {cr} (set annotation nodewright.nvidia.com/pause: "true"): nothing '
        "new starts"
    )
    assert paused.out.splitlines()[1] == f"Undo with `nodewright resume {cr}`."
    assert await objects.annotations(cr) == {OTHER: "team-a", api.PAUSE_ANNOTATION: "true"}

    again = await cli(rig, "pause", cr)
    assert (again.code, again.out) == (0, f"NodeWright {cr} is already paused; no change.\n")
    assert await objects.annotations(cr) == {OTHER: "team-a", api.PAUSE_ANNOTATION: "true"}

    resumed = await cli(rig, "resume", cr)
    assert resumed.code == 0, resumed
    assert resumed.out == (
        f'Resumed NodeWright {cr} (removed annotation nodewright.nvidia.com/pause: "true"): '
        "batches open and nodes are admitted again within the budget; waiting drains and "
        "stages continue where they stopped.\n"
    )
    assert await objects.annotations(cr) == {OTHER: "team-a"}

    again = await cli(rig, "resume", cr)
    assert (again.code, again.out) == (0, f"NodeWright {cr} is already not paused; no change.\n")
    assert await objects.annotations(cr) == {OTHER: "team-a"}


async def test_disable_and_enable_are_independent_of_pause(rig: Rig, objects: Objects) -> None:
    cr = (await objects.nodewright("life", PACKAGES)).metadata.name
    assert (await cli(rig, "pause", cr)).code == 0

    disabled = await cli(rig, "disable", cr)
    assert disabled.code == 0, disabled
    lines = disabled.out.splitlines()
    assert lines[0].startswith(
        f'Disabled NodeWright {cr} (set annotation nodewright.nvidia.com/disable: "true"): it '
        "is skipped"
    )
    assert lines[1:] == [
        f"Undo with `nodewright enable {cr}`.",
        f"It is also paused: nothing starts until `nodewright resume {cr}`.",
    ]
    assert await objects.annotations(cr) == {
        api.PAUSE_ANNOTATION: "true",
        api.DISABLE_ANNOTATION: "true",
    }

    enabled = await cli(rig, "enable", cr)
    assert enabled.code == 0, enabled
    assert enabled.out.splitlines() == [
        f'Enabled NodeWright {cr} (removed annotation nodewright.nvidia.com/disable: "true"): '
        "it rolls out again, from the batch state it was disabled in.",
        f"It is also paused: nothing starts until `nodewright resume {cr}`.",
    ]
    assert await objects.annotations(cr) == {api.PAUSE_ANNOTATION: "true"}
    again = await cli(rig, "enable", cr)
    assert again.out.splitlines()[0] == f"NodeWright {cr} is already not disabled; no change."


async def test_a_pause_annotation_other_than_true_is_replaced(rig: Rig, objects: Objects) -> None:
    # The services read only "true" as paused: "false" is not paused, and pause sets "true".
    cr = (
        await objects.nodewright("life", PACKAGES, annotations={api.PAUSE_ANNOTATION: "false"})
    ).metadata.name
    resumed = await cli(rig, "resume", cr)
    assert resumed.out == f"NodeWright {cr} is already not paused; no change.\n"
    assert (await cli(rig, "pause", cr)).code == 0
    assert await objects.annotations(cr) == {api.PAUSE_ANNOTATION: "true"}


async def test_a_missing_nodewright_is_an_error_that_says_where_to_look(
    rig: Rig, objects: Objects
) -> None:
    for verb in ("pause", "resume", "disable", "enable"):
        got = await cli(rig, verb, objects.name("absent"))
        assert (got.code, got.out) == (1, "")
        assert got.err == (
            f"nodewright: NodeWright {objects.name('absent')} not found (`kubectl get "
            "nodewrights` lists them; they are cluster-scoped)\n"
        )
