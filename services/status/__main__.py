"""Entry point: `python -m services.status`."""

from services.status import service

raise SystemExit(service.main())
