"""The ``nodewright`` command line.

Subcommands:
  sandbox   run NodeWright locally on simulated nodes, with a live view of a rollout.
  events    follow the event stream, decoded.
  plan      dry run of a rollout's batches; reset-batches starts them over.
  pause     pause a NodeWright (nothing new starts, work in progress finishes); resume.
  disable   disable a NodeWright (it is skipped until enabled); enable.
  node      list a NodeWright's nodes; look at a node and recover it: status, retry,
            reset, ignore, unignore.
  package   validate a package directory; a package's status on each node and its pods'
            logs; rerun a package (or one stage of it) on a node.
  uninstall-all
            delete every NodeWright (their finalizers uninstall their packages) and, once
            they are gone, every DeploymentPolicy: before removing NodeWright itself.

docs/cli.md describes every command.

Each subcommand lives in its own module; this one only parses arguments and dispatches.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from nodewright import (
    events_cmd,
    lifecycle_cmd,
    node_cmd,
    package_cmd,
    plan_cmd,
    sandbox,
    teardown_cmd,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nodewright",
        description="NodeWright: a Kubernetes-native package manager for the host layer.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sandbox.add_parser(sub)
    events_cmd.add_parser(sub)
    plan_cmd.add_parser(sub)
    lifecycle_cmd.add_parser(sub)
    node_cmd.add_parser(sub)
    package_cmd.add_parser(sub)
    teardown_cmd.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = args.handler
    code: int = handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
