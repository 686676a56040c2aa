"""``nodewright plan NAME``: a dry run of a NodeWright's rollout; ``nodewright
reset-batches NAME``: the command that resets its batch state; and ``nodewright approve
NAME``: the approval a compartment waits for between batches.

``plan`` reads the NodeWright, its DeploymentPolicy, every node and the scheduler's batch
book, and prints the compartments (strategy, budget, batch state) and the batches the
rollout will run from the current state, assuming every batch succeeds, with the nodes of
each (``shared.rollout.simulation.simulate``: the same rollout kernel the scheduler decides
with). It writes nothing. ``-o json|yaml`` prints the same as a document for tools.
:func:`plan_for` does the reads; :func:`document` (pure) builds the document and
:func:`render` the text.

``reset-batches`` sets the annotation ``nodewright.nvidia.com/reset-batch-state`` to the
current time (``--dry-run``: it only says so); the scheduler then starts every compartment at
batch 1 again (also one that stopped after failed batches).

``approve`` finds, by the kernel's rule, the compartments whose last batch their
DeploymentPolicy gates (``approvalAfterBatches``) and writes their approval into the
annotation ``nodewright.nvidia.com/approved-batches`` (``shared.rollout.approvals``).

Deciding is the kernel's job; this module only reads, prints, and sets those two
annotations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec

from nodewright import manifests, node_cmd, output
from nodewright.connecting import CommandError, Target, run
from nodewright.node_cmd import DryRun
from shared import api, progress, reasons
from shared.events import Reason
from shared.kube import ApiError, Kube, path_of
from shared.rollout import approvals, kernel, rules, simulation
from shared.rollout.book import RESET_ANNOTATION, CompartmentBatch, read_batch_book


def run_plan(target: Target, name: str, fmt: output.Format) -> None:
    async def command(client: Kube) -> None:
        doc = await plan_for(client, name, datetime.now(UTC))
        output.say(
            output.document(doc, fmt)
            if fmt in ("json", "yaml")
            else render(doc, wide=fmt == "wide")
        )

    run(target, command)


def run_reset(target: Target, name: str, dry_run: DryRun) -> None:
    async def command(client: Kube) -> None:
        await node_cmd.require_nodewright(client, name)
        token = datetime.now(UTC).isoformat()
        body = {"metadata": {"annotations": {RESET_ANNOTATION: token}}}
        await node_cmd.patch(client, f"{manifests.NODEWRIGHTS}/{name}", body, dry_run=dry_run)
        if dry_run == "none":
            output.say(
                f"Set annotation {RESET_ANNOTATION} on NodeWright {name}: the "
                "scheduler starts every compartment at batch 1 again (`nodewright plan "
                f"{name}` shows the batches)."
            )
        else:
            output.say(
                f"Would set annotation {RESET_ANNOTATION} on NodeWright {name}: the "
                "scheduler would start every compartment at batch 1 again."
            )
        note = node_cmd.dry_run_note(dry_run)
        if note:
            output.say(note)

    run(target, command)


async def plan_for(kube: Kube, name: str, now: datetime) -> dict[str, Any]:
    """The plan of NodeWright ``name`` as a JSON-ready document."""
    # The nodes first, then the NodeWright: the scheduler writes the batch book before the
    # admissions it fences, so a book read after the nodes is never older than what they show.
    nodes = (await kube.get(path_of(plural="nodes")))["items"]
    cr = await node_cmd.require_nodewright(kube, name)
    return document(cr, await _policy_of(kube, cr), nodes, now)


async def _policy_of(kube: Kube, cr: api.NodeWright) -> api.DeploymentPolicy | None:
    """The DeploymentPolicy ``cr`` names (None: it names none)."""
    if not cr.spec.deployment_policy:
        return None
    try:
        raw = await kube.get(f"{manifests.POLICIES}/{cr.spec.deployment_policy}")
    except ApiError as exc:
        if not exc.not_found:
            raise
        raise CommandError(
            f"NodeWright {cr.metadata.name} names DeploymentPolicy "
            f"{cr.spec.deployment_policy}, which does not exist: create it, or change "
            "spec.deploymentPolicy"
        ) from None
    try:
        return api.from_dict(raw, api.DeploymentPolicy)
    except msgspec.ValidationError as exc:
        raise CommandError(
            f"DeploymentPolicy {cr.spec.deployment_policy} does not decode: {exc}"
        ) from None


@dataclass(frozen=True)
class Approving:
    """What ``nodewright approve`` does: the approvals to write, and the compartments that
    already have theirs."""

    give: Mapping[str, approvals.Approval]
    already: Mapping[str, approvals.Approval]


def approving(
    cr: api.NodeWright, policy: api.DeploymentPolicy | None, compartment: str | None
) -> Approving:
    """The approval each compartment of ``cr`` (or only ``compartment``) waits for now, by
    the kernel's rule (:func:`shared.rollout.approvals.gated_batch`); pure. A
    :class:`CommandError` when there is nothing to approve, saying why."""
    name = cr.metadata.name
    compartments = {r.name: r.rollout for r in rules.compartment_rules(cr, policy)}
    if compartment is not None and compartment not in compartments:
        raise CommandError(
            f"NodeWright {name} has no compartment {compartment}: it has "
            f"{', '.join(sorted(compartments))}"
        )
    book = read_batch_book(cr.metadata.annotations)
    found = approvals.read(cr.metadata.annotations)
    give: dict[str, approvals.Approval] = {}
    already: dict[str, approvals.Approval] = {}
    for comp, rollout in sorted(compartments.items()):
        if compartment is not None and comp != compartment:
            continue
        entry = book.compartments.get(comp, CompartmentBatch())
        batch = approvals.gated_batch(rollout, entry)
        if batch is None:
            continue
        approval = approvals.Approval(batch=batch, finished=entry.finished)
        if approvals.approved(found, comp, batch, entry.finished):
            already[comp] = approval
        else:
            give[comp] = approval
    if not give and not already:
        where = f"compartment {compartment} of " if compartment is not None else ""
        raise CommandError(
            f"{where}NodeWright {name} waits for no approval now: no batch its "
            "DeploymentPolicy gates (approvalAfterBatches) has finished and awaits one "
            f"(`nodewright plan {name}` shows the batches)"
        )
    return Approving(give=give, already=already)


def run_approve(target: Target, name: str, compartment: str | None, dry_run: DryRun) -> None:
    async def command(client: Kube) -> None:
        for line in await approve(client, name, compartment, dry_run=dry_run):
            output.say(line)

    run(target, command)


async def approve(
    client: Kube, name: str, compartment: str | None, *, dry_run: DryRun = "none"
) -> list[str]:
    """Write the approvals NodeWright ``name`` waits for; the lines to print."""
    attempts = 3
    while True:
        cr = await node_cmd.require_nodewright(client, name)
        todo = approving(cr, await _policy_of(client, cr), compartment)
        if not todo.give:
            break
        # The annotation holds every compartment's approval: written against the
        # resourceVersion read, so an approval written meanwhile is never lost.
        given = {**approvals.read(cr.metadata.annotations).by_compartment, **todo.give}
        body = {
            "metadata": {
                "resourceVersion": cr.metadata.resource_version,
                "annotations": {approvals.APPROVALS_ANNOTATION: approvals.encode(given)},
            }
        }
        try:
            await node_cmd.patch(client, f"{manifests.NODEWRIGHTS}/{name}", body, dry_run=dry_run)
        except ApiError as exc:
            attempts -= 1
            if exc.conflict and attempts:
                continue  # the NodeWright changed (the scheduler's book): read it again
            raise
        break
    verb = "Would approve" if dry_run != "none" else "Approved"
    lines = [
        f"{verb} batch {a.batch} of compartment {comp} of NodeWright {name} (finished "
        f"{_when(a.finished)}): its next batch opens once any soak is over."
        for comp, a in todo.give.items()
    ]
    lines += [
        f"Batch {a.batch} of compartment {comp} of NodeWright {name} is already approved; "
        "no change."
        for comp, a in todo.already.items()
    ]
    lines.append(f"`nodewright plan {name}` shows the batches.")
    note = node_cmd.dry_run_note(dry_run)
    return [*lines, note] if note else lines


def _when(at: datetime | None) -> str:
    return at.isoformat(timespec="seconds") if at is not None else "at an unrecorded time"


def document(
    cr: api.NodeWright,
    policy: api.DeploymentPolicy | None,
    nodes: Sequence[Mapping[str, Any]],
    now: datetime,
) -> dict[str, Any]:
    """The plan document of ``cr`` over the Node objects ``nodes``: pure, no I/O."""
    name = cr.metadata.name
    facts = [progress.facts(n, name) for n in nodes]
    book = read_batch_book(cr.metadata.annotations)
    ctx = kernel.Context(now=now, policy_missing=bool(cr.spec.deployment_policy) and policy is None)
    batches, first = simulation.simulate(cr=cr, policy=policy, nodes=facts, book=book, ctx=ctx)
    windows = policy.spec.maintenance_windows if policy is not None else []
    # Busy nodes and batch state as they are now (what the status shows), not after the
    # first simulated decision: the dry run changes nothing.
    return {
        "nodewright": name,
        "paused": cr.paused,
        "disabled": cr.disabled,
        "inMaintenanceWindow": rules.in_window(windows, now),
        "compartments": [
            {
                "name": c.name,
                "strategy": c.strategy or "none",
                "matchedNodes": c.matched,
                "budgetNodes": c.budget,
                "busyNodes": c.busy,
                "batch": msgspec.to_builtins(
                    book.compartments.get(c.name, CompartmentBatch()).state
                ),
                "soakingUntil": _soaking_until(c.unopened),
                "awaitingApproval": _awaiting_approval(c.unopened),
            }
            for c in first.compartments
        ],
        "batches": [
            {
                "compartment": b.compartment,
                "batch": b.batch,
                "size": len(b.nodes),
                "nodes": list(b.nodes),
                "orders": list(b.orders),
                "inFlight": b.in_flight,
                "afterApproval": b.after_approval,
            }
            for b in batches
        ],
    }


def _soaking_until(wait: Reason | None) -> str | None:
    """The end of the compartment's soak (``batchSoakSeconds``) when it soaks now."""
    if wait is None or wait.code != reasons.BATCH_SOAKING:
        return None
    return wait.details.get("until")


def _awaiting_approval(wait: Reason | None) -> dict[str, Any] | None:
    """The batch the compartment waits to have approved (``approvalAfterBatches``), and the
    command that approves it."""
    if wait is None or wait.code != reasons.BATCH_AWAITING_APPROVAL:
        return None
    return {"batch": int(wait.details["batch"]), "command": wait.details["command"]}


def compartment_state(c: Mapping[str, Any], batches: Sequence[Mapping[str, Any]]) -> str:
    """What a compartment does now, in words: stopped (and why), a batch in flight, batches
    to come, or nothing left."""
    b = c["batch"]
    if b.get("stopped"):
        return f"stopped ({b.get('stopReason') or 'Stopped'})"
    if b.get("batchSize"):
        return "batch in flight"
    if c.get("awaitingApproval"):
        a = c["awaitingApproval"]
        return f"awaiting approval of batch {a['batch']} (`{a['command']}`)"
    if c.get("soakingUntil"):
        until = datetime.fromisoformat(c["soakingUntil"])
        return f"soaking until {until.isoformat(timespec='seconds')}"
    if any(x["compartment"] == c["name"] for x in batches):
        return "next batch pending"
    return "done" if not c["busyNodes"] else "finishing"


def render(doc: Mapping[str, Any], *, wide: bool = False) -> str:
    """The plan as text: the NodeWright's state, a table of its compartments and one of the
    batches to come; wide adds each batch's node orders."""
    lines = [f"NodeWright {doc['nodewright']}"]
    if doc["paused"] or doc["disabled"]:
        lines.append("  paused" if doc["paused"] else "  disabled")
    if not doc["inMaintenanceWindow"]:
        lines.append("  outside every maintenance window: batches start when one opens")
    compartments = [
        [
            c["name"],
            c["strategy"],
            c["matchedNodes"],
            c["budgetNodes"],
            c["busyNodes"],
            c["batch"].get("currentBatch", 1),
            compartment_state(c, doc["batches"]),
        ]
        for c in doc["compartments"]
    ]
    lines.append(
        output.table(
            ("COMPARTMENT", "STRATEGY", "NODES", "BUDGET", "BUSY", "BATCH", "STATE"),
            compartments,
        )
    )
    lines.append("")
    if not doc["batches"]:
        lines.append("BATCHES (assuming each succeeds): none, nothing left to do")
        return "\n".join(lines)
    lines.append("BATCHES (assuming each succeeds)")
    batches = []
    for b in doc["batches"]:
        nodes = ", ".join(b["nodes"])
        row = [
            b["compartment"],
            b["batch"],
            b["size"],
            "in flight"
            if b["inFlight"]
            else "after approval"
            if b.get("afterApproval")
            else "planned",
        ]
        if wide:
            row.append(", ".join(str(o) for o in b["orders"]) or "-")
        batches.append([*row, nodes])
    headers = ("COMPARTMENT", "BATCH", "SIZE", "STATE", *(("ORDERS",) if wide else ()), "NODES")
    lines.append(output.table(headers, batches))
    return "\n".join(lines)
