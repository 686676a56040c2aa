"""Entry point: `python -m services.executor`."""

from services.executor import service

raise SystemExit(service.main())
