"""``nodewright package validate DIR [-o json]`` and ``nodewright package rerun NAME --node
NODE [--nodewright CR] [--stage STAGE]``.

``validate`` checks a package directory before it is built into an image and published,
with the agent's own rules (``agent.validate``: the same check the agent runs before every
mode), and lists every problem, each naming its file or JSON path. Exit 0 when the package is
valid, 3 when it is not (the agent's exit code for an invalid package).

``rerun`` asks the executor, through a recovery request on the node (see ``nodewright.node_cmd`` and
docs/recovery.md), to run one package's cycle again on one node — or only one stage of it
and the stages after it — and says what will run. A finished node goes back through
admission and its drain first, within the rollout's budget. Deciding is the executor's job.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from agent.errors import ExitCode
from agent.validate import validate_package_dir
from nodewright import node_cmd
from nodewright.node_cmd import CommandError
from shared import nodestate, progress
from shared.kube import Kube


def add_parser(sub: Any) -> None:
    package = sub.add_parser("package", help="act on one package on one node")
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
