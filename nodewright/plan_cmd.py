"""``nodewright plan NAME``: a dry run of a NodeWright's rollout, and
``nodewright reset-batches NAME``: the command that resets its batch state.

``plan`` reads the NodeWright, its DeploymentPolicy, every node and the scheduler's batch
book, and prints the compartments (strategy, budget, batch state) and the batches the
rollout will run from the current state, assuming every batch succeeds, with the nodes of
each (``services.scheduler.planner.simulate``: the same planner the scheduler runs). It
writes nothing. ``-o json`` prints the same as JSON for tools. :func:`plan_for` does the
reads; :func:`document` (pure) builds the document and :func:`render` the text.

``reset-batches`` sets the annotation ``nodewright.nvidia.com/reset-batch-state`` to the
current time; the scheduler then starts every compartment at batch 1 again (also one that
stopped after failed batches). Deciding is the planner's job; this module only reads,
prints, and sets that one annotation.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from nodewright import manifests
from services.scheduler import planner
from shared import api, progress
from shared.config import KubeSettings
from shared.kube import Kube, connect, path_of


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plan", help="dry run: the batches a NodeWright's rollout will run")
    p.add_argument("name", help="the NodeWright")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG", ""))
    p.set_defaults(handler=run)
    r = sub.add_parser("reset-batches", help="start every compartment at batch 1 again")
    r.add_argument("name", help="the NodeWright")
    r.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG", ""))
    r.set_defaults(handler=run_reset)


def run(args: Any) -> int:
    try:
        doc = asyncio.run(_plan(args.name, args.kubeconfig))
    except LookupError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    print(json.dumps(doc, indent=2) if args.output == "json" else render(doc))
    return 0


def run_reset(args: Any) -> int:
    async def reset() -> None:
        async with connect(KubeSettings(kubeconfig=args.kubeconfig)) as kube:
            token = datetime.now(UTC).isoformat()
            body = {"metadata": {"annotations": {progress.RESET_ANNOTATION: token}}}
            await kube.patch(f"{manifests.NODEWRIGHTS}/{args.name}", body)

    asyncio.run(reset())
    print(f"batch state of {args.name} will be reset")
    return 0


async def plan_for(kube: Kube, name: str, now: datetime) -> dict[str, Any]:
    """The plan of NodeWright ``name`` as a JSON-ready document."""
    try:
        raw = await kube.get(f"{manifests.NODEWRIGHTS}/{name}")
    except Exception as exc:
        raise LookupError(f"NodeWright {name} not found: {exc}") from exc
    cr = api.from_dict(raw, api.NodeWright)
    policy = None
    if cr.spec.deployment_policy:
        try:
            policy = api.from_dict(
                await kube.get(f"{manifests.POLICIES}/{cr.spec.deployment_policy}"),
                api.DeploymentPolicy,
            )
        except Exception as exc:
            raise LookupError(f"DeploymentPolicy {cr.spec.deployment_policy}: {exc}") from exc
    nodes = (await kube.get(path_of(plural="nodes")))["items"]
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
    book = progress.read_batch_book(cr.metadata.annotations)
    batches, first = planner.simulate(
        cr=cr, policy=policy, nodes=facts, book=book, ctx=planner.Context(now=now)
    )
    windows = policy.spec.maintenance_windows if policy is not None else []
    # Busy nodes and batch state as they are now (what the status shows), not after the
    # first simulated decision: the dry run changes nothing.
    rules = progress.compartment_rules(cr, policy)
    targets = planner.targets(cr, facts)
    assigned = progress.assign_compartments(rules, targets)
    known = {r.name for r in rules}
    busy = Counter(progress.compartment_of(n, assigned, known) for n in targets if progress.busy(n))
    return {
        "nodewright": name,
        "paused": cr.paused,
        "disabled": cr.disabled,
        "inMaintenanceWindow": progress.in_window(windows, now),
        "compartments": [
            {
                "name": c.name,
                "strategy": c.strategy or "none",
                "matchedNodes": c.matched,
                "budgetNodes": c.budget,
                "busyNodes": busy[c.name],
                "batch": msgspec.to_builtins(
                    book.compartments.get(c.name, progress.CompartmentBatch()).state
                ),
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


async def _plan(name: str, kubeconfig: str) -> dict[str, Any]:
    async with connect(KubeSettings(kubeconfig=kubeconfig)) as kube:
        return await plan_for(kube, name, datetime.now(UTC))


def render(doc: dict[str, Any]) -> str:
    lines = [f"NodeWright {doc['nodewright']}"]
    if doc["paused"] or doc["disabled"]:
        lines.append("  paused" if doc["paused"] else "  disabled")
    if not doc["inMaintenanceWindow"]:
        lines.append("  outside every maintenance window: batches start when one opens")
    lines.append("COMPARTMENT          STRATEGY     NODES  BUDGET  BUSY  BATCH  STOPPED")
    for c in doc["compartments"]:
        b = c["batch"]
        lines.append(
            f"{c['name']:<20} {c['strategy']:<12} {c['matchedNodes']:>5}  {c['budgetNodes']:>6}"
            f"  {c['busyNodes']:>4}  {b.get('currentBatch', 1):>5}  {b.get('stopped', False)}"
        )
    lines.append("")
    lines.append("BATCHES (assuming each succeeds)")
    for b in doc["batches"]:
        flag = " (in flight)" if b["inFlight"] else ""
        lines.append(
            f"  {b['compartment']} batch {b['batch']}: {b['size']} nodes{flag}: "
            + ", ".join(b["nodes"])
        )
    if not doc["batches"]:
        lines.append("  none: nothing left to do")
    return "\n".join(lines)
