"""``nodewright pause|resume|disable|enable NAME``: stop and start a whole rollout.

``pause`` and ``disable`` set the annotation ``nodewright.nvidia.com/pause: "true"`` or
``nodewright.nvidia.com/disable: "true"`` on the NodeWright (``shared.api``:
:data:`~shared.api.PAUSE_ANNOTATION`, :data:`~shared.api.DISABLE_ANNOTATION`); ``resume`` and
``enable`` remove it. Each is idempotent (a NodeWright already in the asked state is left
alone and says so) and prints what the new state means for the rollout (docs/rollouts.md
§"Priority, sequencing, pause, disable"). What the services do while a NodeWright is paused
or disabled is theirs to decide; this module only sets and removes the two annotations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from nodewright import node_cmd, output
from nodewright.connecting import Target, run
from nodewright.node_cmd import DryRun
from shared import api

if TYPE_CHECKING:
    from shared.kube import Kube


@dataclass(frozen=True)
class Switch:
    """One lifecycle command: the annotation it sets (``on``) or removes."""

    verb: str
    annotation: str
    on: bool
    state: str
    """The NodeWright's state once the command is done: "paused", "not paused" ..."""
    undo: str
    """The command that undoes this one."""
    meaning: str


PAUSED_MEANS = (
    "nothing new starts: no batch opens, no node is admitted, no drain or stage starts. "
    "Work in progress finishes: stage pods already running run to the end and are checked, "
    "then their nodes wait, keeping their budget slots. It still holds back NodeWrights of a "
    "later priority (it is not done)."
)
RESUMED_MEANS = (
    "batches open and nodes are admitted again within the budget; waiting drains and stages "
    "continue where they stopped."
)
DISABLED_MEANS = (
    "it is skipped: nothing starts (no batch, admission, drain, stage or check), stage pods "
    "already running run to the end; its batch state is kept as it is and finished nodes are "
    "still released. NodeWrights of a later priority no longer wait for it."
)
ENABLED_MEANS = "it rolls out again, from the batch state it was disabled in."

SWITCHES = {
    s.verb: s
    for s in (
        Switch("pause", api.PAUSE_ANNOTATION, True, "paused", "resume", PAUSED_MEANS),
        Switch("resume", api.PAUSE_ANNOTATION, False, "not paused", "pause", RESUMED_MEANS),
        Switch("disable", api.DISABLE_ANNOTATION, True, "disabled", "enable", DISABLED_MEANS),
        Switch("enable", api.DISABLE_ANNOTATION, False, "not disabled", "disable", ENABLED_MEANS),
    )
}

HELP = {
    "pause": "pause a NodeWright's rollout: nothing new starts, work in progress finishes",
    "resume": "resume a paused NodeWright's rollout",
    "disable": "disable a NodeWright: it is skipped until it is enabled again",
    "enable": "enable a disabled NodeWright again",
}


def is_on(annotations: dict[str, str], switch: Switch) -> bool:
    """Whether the switch's annotation is set the way the services read it ("true")."""
    return annotations.get(switch.annotation) == "true"


def message(
    name: str,
    switch: Switch,
    annotations: dict[str, str],
    *,
    changed: bool,
    dry_run: DryRun = "none",
) -> list[str]:
    """What the command prints, given the NodeWright's annotations after it ran: pure."""
    value = f'{switch.annotation}: "true"'
    if not changed:
        lines = [f"NodeWright {name} is already {switch.state}; no change."]
    else:
        past = switch.state if switch.on else f"{switch.verb}d"  # paused, resumed ...
        what = f"set annotation {value}" if switch.on else f"removed annotation {value}"
        head = f"Would have {past}" if dry_run != "none" else past.capitalize()
        lines = [f"{head} NodeWright {name} ({what}): {switch.meaning}"]
        if switch.on:
            lines.append(f"Undo with `nodewright {switch.undo} {name}`.")
    other = SWITCHES["disable"] if switch.annotation == api.PAUSE_ANNOTATION else SWITCHES["pause"]
    if is_on(annotations, other):
        lines.append(
            f"It is also {other.state}: nothing starts until `nodewright {other.undo} {name}`."
        )
    return lines


async def switch_cr(
    client: Kube, name: str, switch: Switch, *, dry_run: DryRun = "none"
) -> list[str]:
    """Set or remove the switch's annotation on NodeWright ``name``; the lines to print."""
    cr = await node_cmd.require_nodewright(client, name)
    annotations = dict(cr.metadata.annotations)
    if is_on(annotations, switch) == switch.on:
        return message(name, switch, annotations, changed=False)
    await node_cmd.patch(
        client,
        f"{node_cmd.NODEWRIGHTS}/{name}",
        {"metadata": {"annotations": {switch.annotation: "true" if switch.on else None}}},
        dry_run=dry_run,
    )
    if switch.on:
        annotations[switch.annotation] = "true"
    else:
        annotations.pop(switch.annotation, None)
    lines = message(name, switch, annotations, changed=True, dry_run=dry_run)
    note = node_cmd.dry_run_note(dry_run)
    return [*lines, note] if note else lines


def run_switch(target: Target, verb: str, name: str, *, dry_run: DryRun = "none") -> None:
    async def command(client: Kube) -> None:
        for line in await switch_cr(client, name, SWITCHES[verb], dry_run=dry_run):
            output.say(line)

    run(target, command)
