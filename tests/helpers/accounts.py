"""Users with exactly the rights a test gives them: a ServiceAccount in the test's namespace,
a ClusterRole of the given rules bound to it, and a bearer token for it from the TokenRequest
API (what ``kubectl create token`` does), also as a kubeconfig for the rig."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodewright.rig import Rig
from shared.kube import ApiError, Kube, path_of

RBAC = "rbac.authorization.k8s.io"


@dataclass(frozen=True)
class Account:
    name: str
    namespace: str
    token: str
    kubeconfig: Path

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"


@contextlib.asynccontextmanager
async def account(
    rig: Rig,
    kapi: Kube,
    *,
    namespace: str,
    name: str,
    rules: Sequence[dict[str, Any]],
    directory: Path,
) -> AsyncIterator[Account]:
    """A ServiceAccount allowed ``rules`` cluster-wide (no rules: nothing at all)."""
    role = f"{namespace}-{name}"
    await kapi.create(
        path_of(plural="serviceaccounts", namespace=namespace), {"metadata": {"name": name}}
    )
    await kapi.create(
        path_of(group=RBAC, plural="clusterroles"),
        {"metadata": {"name": role}, "rules": list(rules)},
    )
    await kapi.create(
        path_of(group=RBAC, plural="clusterrolebindings"),
        {
            "metadata": {"name": role},
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    )
    try:
        issued = await kapi.create(
            path_of(plural="serviceaccounts", namespace=namespace, name=name, subresource="token"),
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": 3600},
            },
        )
        token = str(issued["status"]["token"])
        kubeconfig = rig.write_kubeconfig(directory / f"kubeconfig-{name}", user=name, token=token)
        yield Account(name=name, namespace=namespace, token=token, kubeconfig=kubeconfig)
    finally:
        for plural in ("clusterrolebindings", "clusterroles"):
            with contextlib.suppress(ApiError):
                await kapi.delete(path_of(group=RBAC, plural=plural, name=role))
