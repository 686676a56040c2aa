"""``nodewright plan NAME``: a dry run of a NodeWright's rollout, and
``nodewright reset-batches NAME``: the command that resets its batch state.

``plan`` reads the NodeWright, its DeploymentPolicy, every node and the scheduler's batch
book, and prints the compartments (strategy, budget, batch state) and the batches the
rollout will run from the current state, assuming every batch succeeds, with the nodes of
each (``shared.rollout.simulation.simulate``: the same rollout kernel the scheduler decides
with). It writes nothing. ``-o json|yaml`` prints the same as a document for tools.
:func:`plan_for` does the reads; :func:`document` (pure) builds the document and
:func:`render` the text.

``reset-batches`` sets the annotation ``nodewright.nvidia.com/reset-batch-state`` to the
current time (``--dry-run``: it only says so); the scheduler then starts every compartment at
batch 1 again (also one that stopped after failed batches). Deciding is the kernel's job;
this module only reads, prints, and sets that one annotation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from nodewright import manifests, node_cmd, output
from nodewright.connecting import CommandError, Target, run
from nodewright.node_cmd import DryRun
from shared import api, progress, reasons
from shared.events import Reason
from shared.kube import ApiError, Kube, path_of
from shared.rollout import kernel, rules, simulation
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
    policy = None
    if cr.spec.deployment_policy:
        try:
            raw = await kube.get(f"{manifests.POLICIES}/{cr.spec.deployment_policy}")
        except ApiError as exc:
            if not exc.not_found:
                raise
            raise CommandError(
                f"NodeWright {name} names DeploymentPolicy {cr.spec.deployment_policy}, which "
                "does not exist: create it, or change spec.deploymentPolicy"
            ) from None
        try:
            policy = api.from_dict(raw, api.DeploymentPolicy)
        except msgspec.ValidationError as exc:
            raise CommandError(
                f"DeploymentPolicy {cr.spec.deployment_policy} does not decode: {exc}"
            ) from None
    return document(cr, policy, nodes, now)


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
            }
            for b in batches
        ],
    }


def _soaking_until(wait: Reason | None) -> str | None:
    """The end of the compartment's soak (``batchSoakSeconds``) when it soaks now."""
    if wait is None or wait.code != reasons.BATCH_SOAKING:
        return None
    return wait.details.get("until")


def compartment_state(c: Mapping[str, Any], batches: Sequence[Mapping[str, Any]]) -> str:
    """What a compartment does now, in words: stopped (and why), a batch in flight, batches
    to come, or nothing left."""
    b = c["batch"]
    if b.get("stopped"):
        return f"stopped ({b.get('stopReason') or 'Stopped'})"
    if b.get("batchSize"):
        return "batch in flight"
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
            "in flight" if b["inFlight"] else "planned",
        ]
        if wide:
            row.append(", ".join(str(o) for o in b["orders"]) or "-")
        batches.append([*row, nodes])
    headers = ("COMPARTMENT", "BATCH", "SIZE", "STATE", *(("ORDERS",) if wide else ()), "NODES")
    lines.append(output.table(headers, batches))
    return "\n".join(lines)
