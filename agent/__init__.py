"""The NodeWright on-node agent: runs one stage of one host package, or one interrupt.

The executor service starts the agent inside a privileged pod on the target node with the
host's root filesystem mounted (``/host`` by default) and the package's files readable in
the container (``/nodewright-package``). The agent stages the package onto the host, runs
the stage's steps chrooted into the host, keeps idempotence flags, a version history and
rotated step logs on the host, and reports a machine-readable result (JSON lines on stdout
and a bounded termination message).

This package is deliberately stdlib-only: it must run from a minimal Python image, so it
imports nothing from ``shared``, ``services`` or ``nodewright`` and no third-party library.
It does not decide *what* to run or *when*: the executor chooses the mode; the validator
judges node-level outcomes such as whether a reboot happened (by boot ID, never by the
agent's exit code). The contract is documented in ``docs/packages.md``.
"""

from __future__ import annotations

AGENT_VERSION = "0.1.0"
"""Reported in every result so a node's history can be tied to the agent that wrote it."""
