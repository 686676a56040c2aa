"""Entry point: `python -m services [SERVICE ...]` runs several services in one process.

With no argument it runs all five. Each service is built exactly as in a process of its own
(its settings, its consumers, its leases, its records) and still talks to the others only
through NATS and Kubernetes; what the process shares is its baseline (the interpreter and
the clients, ~45 MB), one API connection, one NATS connection, one probe and metrics server
and each list and watch that several services make (``shared.informer.InformerHub``). It
suits a small cluster or a laptop; a fleet runs one Deployment per service, so each stage
scales and fails on its own (docs/install.md "One process for all services"). Which service
does what is not this module's business.
"""

from __future__ import annotations

import argparse
import os
import sys

from services.drainer import service as drainer
from services.executor import service as executor
from services.scheduler import service as scheduler
from services.status import service as status
from services.validator import service as validator
from shared import runtime

SERVICES: dict[str, runtime.Service] = {
    s.SERVICE.name: s.SERVICE for s in (scheduler, drainer, executor, validator, status)
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services",
        description="Run NodeWright services in one process (all five by default).",
    )
    parser.add_argument("services", nargs="*", metavar="SERVICE", help=", ".join(SERVICES))
    args = parser.parse_args(argv)
    names: list[str] = list(dict.fromkeys(args.services)) or list(SERVICES)
    unknown = [n for n in names if n not in SERVICES]
    if unknown:
        parser.error(f"unknown service {unknown[0]!r}; choose from {', '.join(SERVICES)}")
    return runtime.main_many(
        name="nodewright", services=[SERVICES[n] for n in names], environ=os.environ
    )


if __name__ == "__main__":
    sys.exit(main())
