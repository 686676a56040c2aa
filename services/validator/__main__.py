"""Entry point: `python -m services.validator`."""

from services.validator import service

raise SystemExit(service.main())
