"""``nodewright node status|retry|reset|ignore|unignore NODE``: look at and recover a node;
``nodewright node list --nodewright CR``: every target node of a NodeWright, one row each.

Recovery is by request, never by editing the services' records: ``retry`` and ``reset``
append a :class:`shared.nodestate.Request` to the node's
``requests.nodewright.nvidia.com/<cr>`` annotation (a merge patch carrying the node's
resourceVersion, re-read and re-tried on a conflict), and each service honours it in its
own record (docs/recovery.md). ``ignore`` / ``unignore`` set or remove the label
``nodewright.nvidia.com/ignore=true``. Every change takes kubectl's ``--dry-run``
(``client``: nothing is sent; ``server``: the API server admits it and stores nothing).
``status`` and ``list`` read the records through ``shared.progress.facts``, and whose turn it
is through ``shared.progress.turn`` (:func:`shown_turn`: a stage recorded as succeeded
(by an earlier version) that waits for its check is the validator's turn; a stage whose
check runs in its pod reads as running until the verdict). Every command says what it changed.

Deciding what a request does on the node is the services' job; this module only writes
requests and labels and describes what will happen.
"""

from __future__ import annotations

import getpass
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec

from nodewright import output
from nodewright.connecting import CommandError, Target, run
from shared import api, nodestate, pods, progress
from shared.kube import ApiError, Kube, path_of
from shared.nodestate import Request, RequestAction
from shared.records.executor import PackageRecord
from shared.records.status import Reported, find_condition, reported, reported_crs

__all__ = ["CommandError", "DryRun"]

NODEWRIGHTS = path_of(group=api.GROUP, version=api.VERSION, plural=api.NODEWRIGHT_PLURAL)
_OWNERS = (
    nodestate.SCHEDULER,
    nodestate.DRAINER,
    nodestate.EXECUTOR,
    nodestate.VALIDATOR,
    nodestate.STATUS,
    nodestate.REQUESTS,
)
_CONFLICT_RETRIES = 5

DryRun = Literal["none", "client", "server"]
"""kubectl's --dry-run: none changes things; client prints what would change and sends
nothing; server sends the change with ``dryRun=All`` (the API server validates and admits
it, and stores nothing)."""


def dry_run_note(dry_run: DryRun) -> str | None:
    """The line a dry run ends with; None when things were changed for real."""
    if dry_run == "client":
        return "Dry run: nothing was sent to the API server, nothing changed."
    if dry_run == "server":
        return "Server dry run: the API server accepted the change and stored nothing."
    return None


async def patch(
    client: Kube, path: str, body: Any, *, dry_run: DryRun, kind: Literal["merge"] = "merge"
) -> None:
    """Patch ``path`` unless this is a client dry run; a server dry run stores nothing."""
    if dry_run == "client":
        return
    await client.patch(path, body, kind=kind, dry_run=dry_run == "server")


async def get_node(client: Kube, name: str) -> dict[str, Any]:
    try:
        return await client.get(path_of(plural="nodes", name=name))
    except ApiError as exc:
        if exc.not_found:
            raise CommandError(f"node {name} not found") from None
        raise


async def get_nodewright(client: Kube, name: str) -> api.NodeWright | None:
    try:
        raw = await client.get(f"{NODEWRIGHTS}/{name}")
    except ApiError as exc:
        if exc.not_found:
            return None
        raise
    try:
        return api.from_dict(raw, api.NodeWright)
    except msgspec.ValidationError as exc:
        raise CommandError(f"NodeWright {name} does not decode: {exc}") from None


def crs_on(node: dict[str, Any]) -> list[str]:
    """NodeWrights with any record or the status service's condition on the node, sorted."""
    names = {cr for owner in _OWNERS for cr in nodestate.crs_with(node, owner)}
    return sorted(names | set(reported_crs(node)))


def chosen(node: dict[str, Any], only: str) -> list[str]:
    crs = crs_on(node)
    if only:
        if only not in crs:
            raise CommandError(
                f"NodeWright {only} has no state on node {node['metadata']['name']}"
                + (f" (it has: {', '.join(crs)})" if crs else "")
            )
        return [only]
    if not crs:
        raise CommandError(f"no NodeWright has state on node {node['metadata']['name']}")
    return crs


def requester() -> str:
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except (KeyError, OSError):
        return socket.gethostname()


async def add_request(
    client: Kube,
    node_name: str,
    cr: str,
    action: RequestAction,
    *,
    package: str = "",
    stage: str = "",
    dry_run: DryRun = "none",
) -> Request:
    """Append a request for ``cr`` on the node; re-read and retry on a conflict. A dry run
    returns the request as it would be written."""
    for _ in range(_CONFLICT_RETRIES):
        node = await get_node(client, node_name)
        current = nodestate.read_requests(node, cr)
        facts = progress.facts(node, cr)
        marks = [
            facts.drain.honoured if facts.drain is not None else 0,
            facts.executor.honoured,
            facts.validator.honoured,
            *facts.marks.values(),
        ]
        new = nodestate.add_request(
            current,
            Request(
                seq=0,
                action=action,
                package=package,
                stage=stage,
                at=datetime.now(UTC),
                by=requester(),
            ),
            floor=max(marks),
        )
        body = nodestate.patch(
            nodestate.REQUESTS, cr, new, resource_version=node["metadata"]["resourceVersion"]
        )
        try:
            await patch(client, path_of(plural="nodes", name=node_name), body, dry_run=dry_run)
        except ApiError as exc:
            if exc.conflict:
                continue
            raise
        return new.requests[-1]
    raise CommandError(f"node {node_name} kept changing; try again")


# ---- what a node's records say ----------------------------------------------------------


@dataclass(frozen=True)
class CrView:
    name: str
    cr: api.NodeWright | None
    facts: progress.NodeFacts
    status: Reported | None
    """What the status service's node condition says."""
    requests: nodestate.Requests


def view(node: dict[str, Any], name: str, cr: api.NodeWright | None) -> CrView:
    return CrView(
        name=name,
        cr=cr,
        facts=progress.facts(node, name),
        status=reported(find_condition(node, name)),
        requests=nodestate.read_requests(node, name),
    )


def failures(v: CrView) -> list[str]:
    """What failed for the NodeWright on the node, as retry would run it again."""
    f = v.facts
    out: list[str] = []
    wanted = {n: d.version for n, d in progress.desired(v.cr).items()} if v.cr is not None else None

    def current(pkg: str, version: str) -> bool:
        return wanted is None or wanted.get(pkg) == version

    if f.drain is not None and f.drain.phase == "failed":
        code = f.drain.reason.code if f.drain.reason else "failed"
        out.append(f"the drain ({code}) starts again with a fresh timeout")
    for name, r in sorted(f.executor.packages.items()):
        if not current(name, r.version):
            continue
        verdict = f.validator.checks.get(nodestate.check_key(name, r.version, r.stage))
        check_failed = (
            r.state == "succeeded"
            and verdict is not None
            and verdict.verdict == "failed"
            and progress.verdict_about(r, verdict)
        )
        if r.state == "failed" or check_failed:
            what = "its check failed" if check_failed else "it failed"
            cause = verdict.reason if check_failed and verdict is not None else r.reason
            why = f": {cause.code}" if cause is not None else ""
            out.append(
                f"package {name} {r.version} stage {r.stage} ({what}{why}) runs again "
                f"as attempt {r.attempt + 1}"
            )
    return out


def _reason(reason: Any) -> str:
    return f"{reason.code}: {reason.message}" if reason is not None else "-"


def pod_now(name: str, r: PackageRecord, parts: Sequence[pods.PodView]) -> pods.PodView | None:
    """The part of package ``name``'s stage pod that runs past its running record ``r``'s
    stage (``shared.pods.past_first``); None when the record is not running, the pod is at
    the record's stage, or there is no such pod."""
    if r.state != "running":
        return None
    return pods.past_first(parts, progress.pod_key(name, r))


def in_pod(name: str, r: PackageRecord, parts: Sequence[pods.PodView]) -> str:
    """What the pod of package ``name``'s running record ``r`` does past the record's stage,
    e.g. ``; in pod P: config running`` (:func:`pod_now`); "" when nothing more is known."""
    now = pod_now(name, r, parts)
    return "" if now is None else f"; in pod {now.name}: {pods.doing(now)}"


def describe(v: CrView, node: dict[str, Any], parts: Sequence[pods.PodView] = ()) -> list[str]:
    """The lines ``node status`` prints for one NodeWright (``parts``: the parts of the
    NodeWright pods on the node, :func:`shared.pods.parts`)."""
    f = v.facts
    lines = [f"NodeWright {v.name}" + ("" if v.cr is not None else " (the NodeWright is gone)")]
    if v.status is not None:
        lines.append(f"  state:    {v.status.state}   since {v.status.since.isoformat()}")
        lines.append(f"  reason:   {_reason(v.status.reason)}")
    else:
        lines.append("  state:    - (the status service has not reported on this node)")
    if v.cr is not None:
        lines.append(f"  turn:     {shown_turn(v.cr, f)}")
    if f.selection is not None:
        s = f.selection
        lines.append(
            f"  admitted: compartment {s.compartment}, batch {s.batch}, "
            + ("" if s.order is None else f"node order {s.order}, ")
            + f"at {s.selected_at.isoformat()}"
            + ("" if s.disruptive else " (no drain)")
        )
    else:
        lines.append("  admitted: no")
    if f.drain is not None:
        d = f.drain
        owner = (
            "holds a cordon (the node was cordoned before NodeWright came: it stays cordoned)"
            if d.cordoned and d.preexisting
            else "holds the cordon"
            if d.cordoned
            else "holds no cordon"
        )
        lines.append(f"  drain:    {d.phase}, {owner}; {_reason(d.reason)}")
    else:
        lines.append("  drain:    no drain record (holds no cordon)")
    for name, r in sorted(f.executor.packages.items()):
        installed = r.installed or "nothing"
        lines.append(
            f"  package {name}: version {r.version}, stage {r.stage} {r.state} "
            f"(attempt {r.attempt}), installed {installed}"
            + (f"; {_reason(r.reason)}" if r.reason is not None else "")
            + in_pod(name, r, [p for p in parts if p.cr == v.name])
        )
    for key, c in sorted(f.validator.checks.items()):
        if c.verdict != "passed":
            lines.append(f"  check {key}: {c.verdict}; {_reason(c.reason)}")
    intr = f.executor.interrupt
    if intr is not None and intr.state != "succeeded":
        lines.append(
            f"  interrupt: {intr.type} {intr.state} for {', '.join(intr.packages)}"
            + (f"; {_reason(intr.reason)}" if intr.reason is not None else "")
        )
    if f.validator.validated:
        lines.append(
            "  validated: "
            + (
                "yes"
                if v.cr is not None and f.validator.validated == progress.target_digest(v.cr)
                else "for an earlier spec"
            )
        )
    if v.requests.requests:
        last = v.requests.requests[-1]
        marks = {
            "drainer": f.drain.honoured if f.drain is not None else None,
            "executor": f.executor.honoured,
            # A blank validator record has nothing to honour (the executor does not wait
            # for it either): it takes the newest mark when it first writes.
            "validator": None if progress.validation_blank(f) else f.validator.honoured,
        }
        behind = [s for s, m in marks.items() if m is not None and m < last.seq]
        lines.append(
            f"  last request: #{last.seq} {last.action}"
            + (f" {last.package}" if last.package else "")
            + (f" --stage {last.stage}" if last.stage else "")
            + f" by {last.by or '?'} at {last.at.isoformat()}; "
            + (f"not yet honoured by {', '.join(behind)}" if behind else "honoured")
        )
    if f.malformed:
        lines.append(f"  undecodable records: {', '.join(f.malformed)} (reset the node)")
    return lines


def package_entries(
    cr: api.NodeWright, f: progress.NodeFacts, parts: Sequence[pods.PodView] = ()
) -> list[dict[str, Any]]:
    """Per package the NodeWright wants (or the executor recorded on the node): its version,
    stage, state and attempt as the executor's record says ("pending" before the first),
    and ``pod``: what its stage pod runs past that stage (:func:`pod_now`; ``parts``: those
    of the NodeWright's pods on the node), else None."""
    wanted = progress.desired(cr)
    out: list[dict[str, Any]] = []
    for name in sorted(set(wanted) | set(f.executor.packages)):
        r = f.executor.packages.get(name)
        now = pod_now(name, r, parts) if r is not None else None
        out.append(
            {
                "name": name,
                "version": r.version if r is not None else wanted[name].version,
                "stage": r.stage if r is not None else "",
                "state": r.state if r is not None else "pending",
                "attempt": r.attempt if r is not None else 0,
                "installed": r.installed if r is not None else "",
                "pod": (
                    {"name": now.name, "part": pods.said(now), "phase": now.phase.lower()}
                    if now is not None
                    else None
                ),
            }
        )
    return out


def package_cell(entry: Mapping[str, Any]) -> str:
    """``name:version stage state`` (``name:version pending`` before the first stage); the
    part its stage pod runs when past the recorded stage (``config running``)."""
    head = f"{entry['name']}:{entry['version']}"
    if not entry["stage"]:
        return f"{head} {entry['state']}"
    again = f" (attempt {entry['attempt']})" if entry["attempt"] > 1 else ""
    now = entry.get("pod")
    if now:
        return f"{head} {now['part']} {now['phase']}{again}"
    return f"{head} {entry['stage']} {entry['state']}{again}"


def shown_turn(cr: api.NodeWright, f: progress.NodeFacts) -> str:
    """Whose move it is, as the TURN column says it: ``shared.progress.turn``, except that a
    node whose executor waits for the check of a stage that succeeded is the validator's turn
    (the executor runs the next stage only once the validator passed the check). Said as the
    turn computes it, TURN read "executor" next to REASON "WaitingForCheck"."""
    turn = progress.turn(cr, f)
    if turn != "executor":
        return turn
    wanted = progress.desired(cr)
    records = [(n, r) for n, r in f.executor.packages.items() if n in wanted]
    if any(r.state == "running" for _, r in records):
        return turn
    intr = f.executor.interrupt
    if intr is not None and intr.state == "running":
        return turn
    for name, r in records:
        if r.state == "succeeded" and not progress.package_done(wanted[name], r):
            verdict = f.validator.checks.get(nodestate.check_key(name, r.version, r.stage))
            if (
                verdict is None
                or not progress.verdict_about(r, verdict)
                or verdict.verdict == "running"
            ):
                return "validator"
    return turn


def list_rows(
    cr: api.NodeWright, nodes: Sequence[dict[str, Any]], parts: Sequence[pods.PodView] = ()
) -> list[dict[str, Any]]:
    """One row per target node of ``cr`` (its node selector), sorted by name: pure.
    ``parts``: those of the NodeWright pods (``shared.pods.parts``), for what each runs."""
    name = cr.metadata.name
    by_node = pods.by_node(parts, name)
    rows: list[dict[str, Any]] = []
    targets = [n for n in nodes if progress.selector_matches(cr.spec.node_selectors, _labels(n))]
    for node in sorted(targets, key=lambda n: str(n["metadata"]["name"])):
        v = view(node, name, cr)
        reason = v.status.reason if v.status is not None else None
        sel = v.facts.selection
        rows.append(
            {
                "node": v.facts.name,
                "state": v.status.state if v.status is not None else None,
                "turn": shown_turn(cr, v.facts),
                "reason": msgspec.to_builtins(reason) if reason is not None else None,
                "since": v.status.since.isoformat() if v.status is not None else None,
                "compartment": sel.compartment if sel is not None else None,
                "batch": sel.batch if sel is not None else None,
                "order": sel.order if sel is not None else None,
                "cordoned": v.facts.unschedulable,
                "packages": package_entries(cr, v.facts, by_node.get(v.facts.name, ())),
            }
        )
    return rows


LIST_HEADERS = ("NODE", "STATE", "TURN", "REASON", "PACKAGES")
LIST_WIDE_HEADERS = (
    "NODE",
    "STATE",
    "TURN",
    "REASON",
    "COMPARTMENT",
    "BATCH",
    "ORDER",
    "CORDONED",
    "PACKAGES",
    "MESSAGE",
)


def render_list(name: str, rows: Sequence[Mapping[str, Any]], *, wide: bool = False) -> str:
    """The ``node list`` table: NODE STATE TURN REASON PACKAGES; wide adds where the node was
    admitted, whether it is cordoned, and the reason's message."""
    if not rows:
        return f"NodeWright {name} selects no node."
    cells = []
    for r in rows:
        reason = r["reason"]
        packages = ", ".join(package_cell(p) for p in r["packages"]) or "-"
        head = [r["node"], r["state"] or "-", r["turn"], reason["code"] if reason else "-"]
        if not wide:
            cells.append([*head, packages])
            continue
        cells.append(
            [
                *head,
                r["compartment"] or "-",
                "-" if r["batch"] is None else str(r["batch"]),
                "-" if r["order"] is None else str(r["order"]),
                "yes" if r["cordoned"] else "no",
                packages,
                (reason or {}).get("message") or "-",
            ]
        )
    return output.table(LIST_WIDE_HEADERS if wide else LIST_HEADERS, cells)


def _labels(node: Mapping[str, Any]) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


async def require_nodewright(client: Kube, name: str) -> api.NodeWright:
    cr = await get_nodewright(client, name)
    if cr is None:
        raise CommandError(
            f"NodeWright {name} not found (`kubectl get nodewrights` lists them; they are "
            "cluster-scoped)"
        )
    return cr


# ---- commands ---------------------------------------------------------------------------


def _say(text: str) -> None:
    output.say(text)


async def pod_parts(client: Kube, namespace: str, node_name: str = "") -> list[pods.PodView]:
    """The parts of the NodeWright stage pods in the services' ``namespace`` (on the node
    ``node_name`` when given); none when they cannot be read (the records say what they
    say without them)."""
    if not namespace:
        return []
    query = {"labelSelector": pods.selector("stage")}
    if node_name:
        query["fieldSelector"] = f"spec.nodeName={node_name}"
    try:
        listed = await client.get(path_of(plural="pods", namespace=namespace), **query)
    except ApiError:
        return []
    return [p for pod in listed.get("items") or [] for p in pods.parts(pod)]


async def status(client: Kube, node_name: str, only: str, namespace: str = "") -> None:
    node = await get_node(client, node_name)
    spec = node.get("spec") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    crs = crs_on(node) if not only else [only]
    _say(
        f"Node {node_name}: "
        + ("cordoned" if spec.get("unschedulable") else "schedulable")
        + (", ignored (label nodewright.nvidia.com/ignore=true)" if _ignored(labels) else "")
    )
    if not crs:
        _say("No NodeWright has state on this node.")
        return
    holders = []
    parts = await pod_parts(client, namespace, node_name)
    for name in crs:
        v = view(node, name, await get_nodewright(client, name))
        if v.facts.drain is not None and v.facts.drain.cordoned:
            holders.append(name)
        for line in describe(v, node, parts):
            _say(line)
    if spec.get("unschedulable"):
        drains = [progress.facts(node, n).drain for n in crs]
        preexisting = any(d is not None and d.preexisting for d in drains)
        who = ", ".join(holders) if holders else "nobody in NodeWright"
        _say(
            f"Cordon: held by {who}"
            + ("; it was cordoned before NodeWright came and stays cordoned" if preexisting else "")
            + ("" if holders else " (someone else cordoned it)")
        )


async def list_nodes(
    client: Kube, nodewright: str, fmt: output.Format, namespace: str = ""
) -> None:
    cr = await require_nodewright(client, nodewright)
    nodes = (await client.get(path_of(plural="nodes")))["items"]
    rows = list_rows(cr, nodes, await pod_parts(client, namespace))
    if fmt in ("json", "yaml"):
        _say(output.document({"nodewright": nodewright, "nodes": rows}, fmt))
    else:
        _say(render_list(nodewright, rows, wide=fmt == "wide"))


def _ignored(labels: dict[str, str]) -> bool:
    return labels.get(nodestate.IGNORE_LABEL) == "true"


async def retry(client: Kube, node_name: str, only: str, dry_run: DryRun) -> None:
    node = await get_node(client, node_name)
    asked = 0
    verb = "Would request" if dry_run != "none" else "Requested"
    for name in chosen(node, only):
        v = view(node, name, await get_nodewright(client, name))
        todo = failures(v)
        if not todo:
            _say(f"NodeWright {name} on node {node_name}: nothing failed, nothing to retry.")
            continue
        req = await add_request(client, node_name, name, "retry", dry_run=dry_run)
        asked += 1
        _say(f"{verb} retry #{req.seq} of NodeWright {name} on node {node_name}:")
        for line in todo:
            _say(f"  - {line}")
    if not asked and only:
        raise CommandError(
            f"nothing failed for NodeWright {only} on {node_name} (`nodewright node status "
            f"{node_name}` shows where it stands)"
        )


def running(v: CrView, package: str = "", parts: Sequence[pods.PodView] = ()) -> list[str]:
    """What runs for the NodeWright on the node, as abort would stop it (of ``package``
    only, when given; ``parts``: the NodeWright pods' parts on the node, to say which stage
    a pod has reached past its record's)."""
    f = v.facts
    out: list[str] = []
    intr = f.executor.interrupt
    merged: set[str] = set()
    if intr is not None and intr.state == "running" and (not package or package in intr.packages):
        merged = set(intr.packages)
        out.append(
            f"the {intr.type} interrupt of {', '.join(intr.packages)} (attempt "
            f"{intr.attempt}) fails; what it already asked of the host happens anyway"
        )
    for name, r in sorted(f.executor.packages.items()):
        if r.state != "running" or name in merged or (package and name != package):
            continue
        now = pod_now(name, r, parts)
        if now is None:
            out.append(f"package {name} {r.version} stage {r.stage} (attempt {r.attempt}) fails")
        else:
            out.append(
                f"package {name} {r.version} stage {now.stage} (attempt {r.attempt}; in pod "
                f"{now.name}: {pods.doing(now)}) fails"
            )
    return out


async def abort(
    client: Kube, node_name: str, only: str, package: str, dry_run: DryRun, namespace: str = ""
) -> None:
    node = await get_node(client, node_name)
    parts = await pod_parts(client, namespace, node_name)
    crs = chosen(node, only)
    if package:
        known = {n for cr in crs for n in progress.facts(node, cr).executor.packages}
        if package not in known:
            raise CommandError(
                f"no package {package} has run on node {node_name}"
                + (f" (packages there: {', '.join(sorted(known))})" if known else "")
            )
    asked = 0
    verb = "Would request" if dry_run != "none" else "Requested"
    for name in crs:
        todo = running(view(node, name, None), package, [p for p in parts if p.cr == name])
        if not todo:
            _say(f"NodeWright {name} on node {node_name}: nothing runs, nothing to abort.")
            continue
        req = await add_request(client, node_name, name, "abort", package=package, dry_run=dry_run)
        asked += 1
        _say(f"{verb} abort #{req.seq} of NodeWright {name} on node {node_name}:")
        for line in todo:
            _say(f"  - {line}")
        _say(
            "  Its pods are stopped and kept for their logs (`nodewright package logs PKG "
            f"--node {node_name}`); `nodewright node retry {node_name}` runs it again."
        )
    if not asked and only:
        raise CommandError(
            f"nothing runs for NodeWright {only} on {node_name} (`nodewright node status "
            f"{node_name}` shows where it stands)"
        )


def run_abort(
    target: Target,
    *,
    node: str,
    nodewright: str = "",
    package: str = "",
    dry_run: DryRun = "none",
    namespace: str = "",
) -> None:
    """Run ``node abort``; CommandError says what went wrong."""

    async def command(client: Kube) -> None:
        await abort(client, node, nodewright, package, dry_run, namespace)
        note = dry_run_note(dry_run)
        if note:
            _say(note)

    run(target, command)


async def reset(client: Kube, node_name: str, only: str, dry_run: DryRun) -> None:
    node = await get_node(client, node_name)
    verb = "Would request" if dry_run != "none" else "Requested"
    for name in chosen(node, only):
        facts = progress.facts(node, name)
        req = await add_request(client, node_name, name, "reset", dry_run=dry_run)
        cordon = (
            "the cordon it holds stays while the node is still admitted and is released as usual"
            if facts.drain is not None and facts.drain.cordoned
            else "it holds no cordon"
        )
        _say(
            f"{verb} reset #{req.seq} of NodeWright {name} on node {node_name}: the executor "
            "and validator forget its packages' stages, checks and validation there, and the "
            f"drain starts again; {cordon}. The node starts over."
        )


async def set_ignored(client: Kube, node_name: str, ignored: bool, dry_run: DryRun) -> None:
    node = await get_node(client, node_name)
    labels = (node.get("metadata") or {}).get("labels") or {}
    if _ignored(labels) == ignored:
        _say(f"Node {node_name} is already {'ignored' if ignored else 'not ignored'}; no change.")
        return
    value = "true" if ignored else None
    await patch(
        client,
        path_of(plural="nodes", name=node_name),
        {"metadata": {"labels": {nodestate.IGNORE_LABEL: value}}},
        dry_run=dry_run,
    )
    would = dry_run != "none"
    if not ignored:
        _say(
            f"{'Would remove' if would else 'Removed'} label {nodestate.IGNORE_LABEL} from node "
            f"{node_name}: NodeWright may admit it to rollouts again."
        )
        return
    busy = [
        n
        for n in crs_on(node)
        if (f := progress.facts(node, n)).selection is not None or f.drain is not None
    ]
    _say(
        f"{'Would label' if would else 'Labelled'} node {node_name} {nodestate.IGNORE_LABEL}=true:"
        " NodeWright admits it to no new rollout work."
        + (
            f" Work already admitted there ({', '.join(busy)}) finishes and is then released;"
            " a failed node keeps its budget slot until it is retried or reset."
            if busy
            else ""
        )
    )


Verb = Literal["status", "list", "retry", "reset", "ignore", "unignore"]


def run_verb(
    target: Target,
    verb: Verb,
    *,
    node: str = "",
    nodewright: str = "",
    fmt: output.Format = "table",
    dry_run: DryRun = "none",
    namespace: str = "",
) -> None:
    """Run ``node VERB``; CommandError says what went wrong."""

    async def command(client: Kube) -> None:
        match verb:
            case "status":
                await status(client, node, nodewright, namespace)
            case "list":
                await list_nodes(client, nodewright, fmt, namespace)
            case "retry":
                await retry(client, node, nodewright, dry_run)
            case "reset":
                await reset(client, node, nodewright, dry_run)
            case "ignore":
                await set_ignored(client, node, True, dry_run)
            case "unignore":
                await set_ignored(client, node, False, dry_run)
        note = dry_run_note(dry_run) if verb not in ("status", "list") else None
        if note:
            _say(note)

    run(target, command)
