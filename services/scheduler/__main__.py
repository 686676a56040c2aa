"""Entry point: `python -m services.scheduler`."""

from services.scheduler import service

raise SystemExit(service.main())
