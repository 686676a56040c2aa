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


def _import_aiohttp_without_the_system_cas() -> None:
    """Import aiohttp with OpenSSL's default trust store empty, then put the settings back.

    At import aiohttp builds two module-level TLS contexts for requests that give none, and
    both load the system's CA bundle: 2 MiB of every process where the system has one (a
    host, a ``python:*-slim`` image; issue 15, docs/metrics.md "The system's CA bundle").
    The services never use them: every connection they open brings its own context (the
    kubeconfig's or the service account's CA, NATS's ``tls_ca_file``), built after this,
    with the operator's ``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` as they were. Should a request
    ever go out without a context, it now fails to verify instead of trusting the public CAs.
    """
    names = ("SSL_CERT_FILE", "SSL_CERT_DIR")
    saved = {name: os.environ.get(name) for name in names}
    os.environ["SSL_CERT_FILE"] = os.devnull  # an empty bundle
    os.environ["SSL_CERT_DIR"] = os.devnull  # not a directory: no certificate looked up there
    try:
        import aiohttp.connector  # noqa: F401  (the import is the point)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


_import_aiohttp_without_the_system_cas()
