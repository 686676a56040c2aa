"""``nodewright package validate DIR [-o json]``, ``nodewright package rerun NAME --node
NODE [--nodewright CR] [--stage STAGE]``, ``nodewright package status NAME --nodewright CR``
and ``nodewright package logs NAME --node NODE``.

``validate`` checks a package directory before it is built into an image and published,
with the agent's own rules (``agent.validate``: the same check the agent runs before every
mode), and lists every problem, each naming its file or JSON path. Exit 0 when the package is
valid, 3 when it is not (the agent's exit code for an invalid package).

``rerun`` asks the executor, through a recovery request on the node (see ``nodewright.node_cmd`` and
docs/recovery.md), to run one package's cycle again on one node — or only one stage of it
and the stages after it — and says what will run. A finished node goes back through
admission and its drain first, within the rollout's budget. Deciding is the executor's job.

``status NAME --nodewright CR [--node NODE ...] [-o json]`` prints, per target node (or per
named node), where the package stands as the executor's record on the node says: version,
stage, state and attempt (and, in JSON, the installed version, the reason and the stage
check's verdict).

``logs NAME --node NODE [--nodewright CR] [--stage STAGE] [--tail N]`` prints the logs of the
package's stage and check pods on the node through the pods/log API. The pods are found by
their labels (``shared.pods.labels``: NodeWright, role, package, stage) and the node they are
bound to (``spec.nodeName``), never by guessing names. A log that cannot be fetched is named
with its pod, and the command then exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from agent.errors import ExitCode
from agent.validate import validate_package_dir
from nodewright import node_cmd
from nodewright.node_cmd import CommandError
from shared import api, nodestate, pods, progress
from shared.config import ServiceSettings
from shared.kube import ApiError, Kube, path_of


def add_parser(sub: Any) -> None:
    package = sub.add_parser(
        "package", help="validate a package; its status, logs and reruns on nodes"
    )
    verbs = package.add_subparsers(dest="verb", required=True)
    text = "check a package directory before it is published"
    v = verbs.add_parser("validate", help=text, description=text)
    v.add_argument("package_dir", metavar="DIR", help="the package directory (with config.json)")
    v.add_argument("-o", "--output", choices=("text", "json"), default="text")
    v.set_defaults(handler=run_validate)
    text = "run a package's cycle (or one stage of it) again on a node"
    p = verbs.add_parser("rerun", help=text, description=text)
    p.add_argument("name", help="package name")
    p.add_argument("--node", required=True, help="node name")
    p.add_argument(
        "--nodewright", default="", help="the NodeWright (needed when several have the package)"
    )
    p.add_argument(
        "--stage",
        default="",
        choices=("", *nodestate.RERUN_STAGES),
        help="run only this stage and the ones after it (default: the whole cycle)",
    )
    node_cmd.add_common(p)
    p.set_defaults(handler=run)
    text = "show where a package stands on each node of a NodeWright"
    p = verbs.add_parser("status", help=text, description=text)
    p.add_argument("name", help="package name")
    p.add_argument("--nodewright", required=True, help="the NodeWright")
    p.add_argument(
        "--node",
        action="append",
        default=[],
        help="only this node (repeatable; default: every target node of the NodeWright)",
    )
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    node_cmd.add_common(p)
    p.set_defaults(handler=run_status)
    text = "print the logs of a package's stage and check pods on a node"
    p = verbs.add_parser("logs", help=text, description=text)
    p.add_argument("name", help="package name")
    p.add_argument("--node", required=True, help="node name")
    p.add_argument("--nodewright", default="", help="only pods of this NodeWright")
    p.add_argument("--stage", default="", choices=("", *STAGES), help="only pods of this stage")
    p.add_argument(
        "--tail",
        type=int,
        default=-1,
        metavar="N",
        help="the last N lines of each log (default -1: all of it)",
    )
    p.add_argument(
        "-n",
        "--namespace",
        default=ServiceSettings().namespace,
        help="namespace of NodeWright's pods (the services' NODEWRIGHT_NAMESPACE; "
        "default %(default)s)",
    )
    node_cmd.add_common(p)
    p.set_defaults(handler=run_logs)


STAGES = (*nodestate.RERUN_STAGES, "uninstall")
"""Stages a package's pods run (the interrupt pod is the node's, not a package's)."""


async def rerun(client: Kube, args: argparse.Namespace) -> None:
    node = await node_cmd.get_node(client, args.node)
    crs = [
        cr
        for cr in node_cmd.crs_on(node)
        if args.name in progress.facts(node, cr).executor.packages
    ]
    if args.nodewright:
        if args.nodewright not in crs:
            raise CommandError(
                f"NodeWright {args.nodewright} has not run package {args.name} on {args.node}"
            )
        crs = [args.nodewright]
    if not crs:
        raise CommandError(f"no NodeWright has run package {args.name} on node {args.node}")
    if len(crs) > 1:
        raise CommandError(
            f"several NodeWrights run package {args.name} on {args.node} ({', '.join(crs)}):"
            " pick one with --nodewright"
        )
    (cr,) = crs
    rec = progress.facts(node, cr).executor.packages[args.name]
    req = await node_cmd.add_request(
        client, args.node, cr, "rerun", package=args.name, stage=args.stage
    )
    what = (
        f"stage {args.stage} (and the stages after it)"
        if args.stage
        else "its install from apply"
        if rec.state == "succeeded" and rec.installed == rec.version
        else f"its {rec.cycle} cycle from the start"
    )
    print(
        f"Requested rerun #{req.seq} of package {args.name} {rec.version} of NodeWright {cr} "
        f"on node {args.node}: {what} runs again as attempt {rec.attempt + 1}; the node is "
        "validated again afterwards.",
        flush=True,
    )


def run(args: argparse.Namespace) -> int:
    async def command(client: Kube) -> None:
        await rerun(client, args)

    return node_cmd.execute(args, command)


# ---- status -----------------------------------------------------------------------------


def status_row(
    cr: api.NodeWright, package: str, node: Mapping[str, Any], target: bool
) -> dict[str, Any]:
    """Where ``package`` stands on ``node`` in the executor's record: pure."""
    f = progress.facts(node, cr.metadata.name)
    r = f.executor.packages.get(package)
    if r is None:
        wanted = progress.desired(cr).get(package)
        return {
            "node": f.name,
            "package": package,
            "version": wanted.version if wanted is not None else "",
            "stage": "",
            "state": "pending" if target else "not a target",
            "attempt": 0,
            "installed": "",
            "reason": None,
            "check": None,
        }
    check = f.validator.checks.get(nodestate.check_key(package, r.version, r.stage))
    return {
        "node": f.name,
        "package": package,
        "version": r.version,
        "stage": r.stage,
        "state": r.state,
        "attempt": r.attempt,
        "installed": r.installed,
        "reason": msgspec.to_builtins(r.reason) if r.reason is not None else None,
        # A verdict about an earlier attempt no longer counts (CheckRecord.attempt).
        "check": check.verdict if check is not None and check.attempt == r.attempt else None,
    }


def status_rows(
    cr: api.NodeWright, package: str, nodes: Sequence[Mapping[str, Any]], only: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """One row per target node of ``cr`` (or per node named in ``only``), sorted by name."""
    rows = []
    for node in sorted(nodes, key=lambda n: str(n["metadata"]["name"])):
        labels = (node.get("metadata") or {}).get("labels") or {}
        target = progress.selector_matches(cr.spec.node_selectors, labels)
        if (node["metadata"]["name"] in only) if only else target:
            rows.append(status_row(cr, package, node, target))
    return rows


def render_status(rows: Sequence[Mapping[str, Any]]) -> str:
    """The ``package status`` table: NODE PACKAGE VERSION STAGE STATE ATTEMPT."""
    cells = [
        [
            r["node"],
            r["package"],
            r["version"] or "-",
            r["stage"] or "-",
            r["state"],
            str(r["attempt"]) if r["attempt"] else "-",
        ]
        for r in rows
    ]
    return node_cmd.table(("NODE", "PACKAGE", "VERSION", "STAGE", "STATE", "ATTEMPT"), cells)


async def status(client: Kube, args: argparse.Namespace) -> None:
    cr = await node_cmd.require_nodewright(client, args.nodewright)
    if args.node:
        nodes = [await node_cmd.get_node(client, n) for n in dict.fromkeys(args.node)]
    else:
        nodes = (await client.get(path_of(plural="nodes")))["items"]
    recorded = any(args.name in progress.facts(n, args.nodewright).executor.packages for n in nodes)
    if args.name not in cr.spec.packages and not recorded:
        has = ", ".join(sorted(cr.spec.packages)) or "none"
        raise CommandError(
            f"NodeWright {args.nodewright} has no package {args.name} (it has: {has})"
        )
    rows = status_rows(cr, args.name, nodes, args.node)
    if args.output == "json":
        print(json.dumps({"nodewright": args.nodewright, "nodes": rows}, indent=2), flush=True)
    elif not rows:
        print(f"NodeWright {args.nodewright} selects no node.", flush=True)
    else:
        print(render_status(rows), flush=True)


def run_status(args: argparse.Namespace) -> int:
    async def command(client: Kube) -> None:
        await status(client, args)

    return node_cmd.execute(args, command)


# ---- logs -------------------------------------------------------------------------------


def log_selector(package: str, *, nodewright: str = "", stage: str = "") -> str:
    """The label selector of a package's stage and check pods (``shared.pods.labels``)."""
    parts = [
        f"{pods.LABEL_MANAGED}={pods.MANAGED_BY}",
        f"{pods.LABEL_ROLE} in (stage,check)",
        f"{pods.LABEL_PACKAGE}={package}",
    ]
    if nodewright:
        parts.append(f"{pods.LABEL_CR}={nodewright}")
    if stage:
        parts.append(f"{pods.LABEL_STAGE}={stage}")
    return ",".join(parts)


def log_pods(listed: Sequence[Mapping[str, Any]], node: str) -> list[pods.PodView]:
    """The pods on ``node``, oldest first (attempts in the order they ran)."""
    views = [pods.view(p) for p in listed]
    mine = [v for v in views if v.node == node]
    return sorted(mine, key=lambda v: (v.created or datetime.min.replace(tzinfo=UTC), v.name))


def log_header(pod: pods.PodView) -> str:
    what = f"stage {pod.stage}" if pod.role == "stage" else f"check of stage {pod.stage}"
    return (
        f"==> pod {pod.name}: NodeWright {pod.cr}, package {pod.package} {pod.version}, "
        f"{what}, attempt {pod.attempt}, {pod.phase} <=="
    )


def log_query(container: str, tail: int) -> dict[str, str | int | bool]:
    query: dict[str, str | int | bool] = {"container": container}
    if tail >= 0:
        query["tailLines"] = tail
    return query


async def logs(client: Kube, args: argparse.Namespace) -> None:
    if args.tail < -1:
        raise CommandError(f"--tail {args.tail}: give a number of lines, or -1 for all of it")
    await node_cmd.get_node(client, args.node)
    selector = log_selector(args.name, nodewright=args.nodewright, stage=args.stage)
    listed = await client.get(
        path_of(plural="pods", namespace=args.namespace),
        labelSelector=selector,
        fieldSelector=f"spec.nodeName={args.node}",
    )
    found = log_pods(listed["items"], args.node)
    if not found:
        narrowed = "".join(
            f", {what} {value}"
            for what, value in (("NodeWright", args.nodewright), ("stage", args.stage))
            if value
        )
        raise CommandError(
            f"no pod of package {args.name} on node {args.node} in namespace "
            f"{args.namespace}{narrowed}. The executor keeps a stage's pod while it runs and "
            "after it failed, and deletes it once the node has moved on; `nodewright package "
            f"status {args.name} --nodewright CR --node {args.node}` shows where the package "
            "stands (pods in another namespace: --namespace)"
        )
    containers = {
        p["metadata"]["name"]: ((p.get("spec") or {}).get("containers") or [{}])[0].get("name")
        for p in listed["items"]
    }
    unfetched: list[str] = []
    for pod in found:
        print(log_header(pod), flush=True)
        path = path_of(plural="pods", namespace=args.namespace, name=pod.name, subresource="log")
        try:
            text = await client.get_text(
                path, log_query(str(containers.get(pod.name) or "agent"), args.tail)
            )
        except ApiError as exc:
            unfetched.append(pod.name)
            print(
                f"nodewright: cannot fetch the log of pod {pod.name}: the API server said "
                f"{exc.status}: {exc.message} (simulated nodes, such as kwok's, keep no logs; "
                f"`kubectl -n {args.namespace} describe pod {pod.name}` shows its state)",
                file=sys.stderr,
                flush=True,
            )
            continue
        sys.stdout.write(text if not text or text.endswith("\n") else text + "\n")
        sys.stdout.flush()
    if unfetched:
        raise CommandError(
            f"the logs of {len(unfetched)} of {len(found)} pods could not be fetched: "
            + ", ".join(unfetched)
        )


def run_logs(args: argparse.Namespace) -> int:
    async def command(client: Kube) -> None:
        await logs(client, args)

    return node_cmd.execute(args, command)


def run_validate(args: argparse.Namespace) -> int:
    problems = validate_package_dir(args.package_dir)
    if args.output == "json":
        doc = {"package_dir": args.package_dir, "ok": not problems, "problems": problems}
        print(json.dumps(doc, indent=2), flush=True)
    elif problems:
        print(f"{args.package_dir}: {len(problems)} problems", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
    else:
        print(f"{args.package_dir}: valid", flush=True)
    return int(ExitCode.OK if not problems else ExitCode.INVALID_PACKAGE)
