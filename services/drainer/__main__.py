"""Entry point: `python -m services.drainer`."""

from services.drainer import service

raise SystemExit(service.main())
