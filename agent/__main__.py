"""Entry point: ``python -m agent <mode> [flags]`` (see ``agent.cli`` and docs/packages.md)."""

from agent.cli import main

raise SystemExit(main())
