"""The five NodeWright services. Each is independent of the others (import-linter enforces
it) and talks to them only through events on NATS JetStream and state in Kubernetes.

Importing this package also sets what every service process shares before its libraries
load (each entry point, ``python -m services`` and ``python -m services.<name>``, imports it
first); which service does what is not this module's business.
"""

import os

# frozenlist (aiohttp's lists of signal handlers, built a few times at start and iterated
# per request) ships a C++ extension that loads libstdc++: 0.6 to 1.0 MB of every process's
# memory (issue 15; docs/metrics.md "TLS reads of one record") for no speed that matters here.
# Its pure-Python lists are the same type. An operator's own setting wins.
os.environ.setdefault("FROZENLIST_NO_EXTENSIONS", "1")
