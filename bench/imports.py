"""What each import adds to a process's resident memory, in the order given.

``python -m bench.imports msgspec asyncio aiohttp ...`` imports each module in turn and prints
the process's VmRSS after it and what it added (anonymous and file-backed pages apart, from
``/proc/self/status``): a module imported earlier is not counted again, so the order says
whose cost is whose. To measure a services image rather than this checkout, run the same file
inside the image's root (it needs nothing but the standard library), e.g. with the image
unpacked into ``ROOT`` and ``/proc`` mounted there::

    chroot ROOT env -i PYTHONPATH=/opt/nodewright/site python3 - msgspec aiohttp < bench/imports.py

docs/metrics.md "Memory of the services" has the figures. Not a test: nothing is compared.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

FIELDS = ("VmRSS", "RssAnon", "RssFile")


def resident() -> dict[str, float]:
    """This process's resident memory in MiB, by kind, as the kernel counts it now."""
    out: dict[str, float] = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in FIELDS:
                out[name] = int(value.split()[0]) / 1024
    return out


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m bench.imports MODULE [MODULE ...]", file=sys.stderr)
        return 2
    before = resident()
    print(f"{'(interpreter)':32} {before['VmRSS']:7.1f} MiB")
    for name in argv:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            print(f"bench.imports: cannot import {name}: {exc}", file=sys.stderr)
            return 1
        now = resident()
        added = "  ".join(f"{k} +{now[k] - before[k]:.1f}" for k in FIELDS)
        print(f"{name:32} {now['VmRSS']:7.1f} MiB  ({added})")
        before = now
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
