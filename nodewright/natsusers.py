"""``nodewright nats-users``: the NATS users of an install, one per service and a reader.

Writes two files into a directory:

* ``nats-users-values.yaml``, values for the official NATS chart (``helm upgrade nats ...
  -f nats-users-values.yaml``): a ``config.merge.authorization`` block with each user's
  bcrypt hash and its permissions (shared.grants). Hashes only: the file can live in Git.
* ``nodewright-nats-users.yaml``, the Secrets that hold the passwords: ``<secret>`` in
  NodeWright's namespace with one key per service (the chart mounts each service's own:
  ``nats.auth.secretName``), and ``<secret>-reader`` with the reader's, for operators who
  follow the stream (``nodewright events``). Apply it, then keep it out of Git.

Passwords are random (``secrets.token_urlsafe``); running it again makes new ones. Not this
module's job: installing anything (docs/install.md, "NATS users").
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import bcrypt
import yaml

from shared import grants

VALUES_FILE = "nats-users-values.yaml"
SECRETS_FILE = "nodewright-nats-users.yaml"
BCRYPT_COST = 11
"""nats-server checks a hashed password on every connect; 11 is its own tool's default."""


def passwords() -> dict[str, str]:
    # The one-process user is always made, so switching the chart's layout is an upgrade of
    # NodeWright alone, not of NATS: each pod mounts only its own key of the Secret.
    users = (*grants.SERVICES, grants.ONE_PROCESS, grants.READER)
    return {who: secrets.token_urlsafe(24) for who in users}


def hash_password(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(BCRYPT_COST)).decode()


def nats_values(hashes: dict[str, str], *, stream: str) -> dict[str, Any]:
    return {"config": {"merge": {"authorization": grants.authorization(hashes, stream=stream)}}}


def secret_manifests(plain: dict[str, str], *, name: str, namespace: str) -> list[dict[str, Any]]:
    services = {who: pw for who, pw in plain.items() if who != grants.READER}
    labels = {"app.kubernetes.io/name": "nodewright", "app.kubernetes.io/component": "nats-auth"}

    def secret(secret_name: str, data: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": secret_name, "namespace": namespace, "labels": labels},
            "type": "Opaque",
            "stringData": data,
        }

    return [
        secret(name, services),
        secret(
            f"{name}-reader", {"user": grants.user(grants.READER), "password": plain[grants.READER]}
        ),
    ]


def write(
    directory: Path, *, secret: str = "nodewright-nats-users", namespace: str = "nodewright-system",
    stream: str = "NODEWRIGHT",
) -> tuple[Path, Path]:  # fmt: skip
    """Make new passwords; write the NATS values (hashes) and the Secrets (passwords)."""
    directory.mkdir(parents=True, exist_ok=True)
    plain = passwords()
    hashes = {who: hash_password(pw) for who, pw in plain.items()}
    values = directory / VALUES_FILE
    values.write_text(
        "# NodeWright's NATS users for the official NATS chart (bcrypt hashes; shared/grants)\n"
        + yaml.safe_dump(nats_values(hashes, stream=stream), sort_keys=False)
    )
    manifests = directory / SECRETS_FILE
    manifests.write_text(
        "# The passwords of NodeWright's NATS users: apply, then keep this file out of Git.\n"
        + yaml.safe_dump_all(secret_manifests(plain, name=secret, namespace=namespace))
    )
    manifests.chmod(0o600)
    return values, manifests
