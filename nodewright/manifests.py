"""NodeWright's own manifests on a cluster: install the CRDs, apply samples and CRs.

Used by the sandbox, the benchmark and the tests. ``install_crds`` is idempotent: it creates
or updates the committed CRDs (deploy/crds) and returns once each is Established and its
resource answers a list (discovery and storage can lag the condition briefly). The CRDs and
samples are read from the checkout's deploy/ when there is one, else from the copy the wheel
carries (``nodewright/_data/deploy``, written by setup.py), so an installed ``nodewright``
finds them too.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import yaml

from shared import api
from shared.kube import ApiError, Kube, path_of

REPO = Path(__file__).resolve().parents[1]
PACKAGED = Path(__file__).resolve().parent / "_data"
"""What the wheel carries from the repository (setup.py)."""


def _deploy(name: str) -> Path:
    checkout = REPO / "deploy" / name
    return checkout if checkout.is_dir() else PACKAGED / "deploy" / name


CRD_DIR = _deploy("crds")
SAMPLES_DIR = _deploy("samples")
BUILD_SCRIPT = (
    REPO / "scripts" / "build-rig.sh"
    if (REPO / "scripts" / "build-rig.sh").is_file()
    else PACKAGED / "scripts" / "build-rig.sh"
)
"""scripts/build-rig.sh: of the checkout, or the one the wheel carries (with its tools/)."""
CRDS = path_of(group="apiextensions.k8s.io", plural="customresourcedefinitions")
NODEWRIGHTS = path_of(group=api.GROUP, version=api.VERSION, plural=api.NODEWRIGHT_PLURAL)
POLICIES = path_of(group=api.GROUP, version=api.VERSION, plural=api.DEPLOYMENT_POLICY_PLURAL)


def collection(kind: str) -> str:
    return {"NodeWright": NODEWRIGHTS, "DeploymentPolicy": POLICIES}[kind]


def crd_manifests() -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text()) for p in sorted(CRD_DIR.glob("*.yaml"))]


def samples() -> list[tuple[str, dict[str, Any]]]:
    """(file name, manifest) of every sample, DeploymentPolicies first (NodeWrights use them)."""
    found = [(p.name, yaml.safe_load(p.read_text())) for p in sorted(SAMPLES_DIR.glob("*.yaml"))]
    return sorted(found, key=lambda item: (item[1]["kind"] != "DeploymentPolicy", item[0]))


def sample(file_name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((SAMPLES_DIR / file_name).read_text())
    return loaded


async def install_crds(kube: Kube, *, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    for crd in crd_manifests():
        name = crd["metadata"]["name"]
        while True:
            try:
                await _create_or_update(kube, crd)
                break
            except ApiError as exc:
                # A fresh API server answers 429 while its storage initialises.
                if exc.status not in (429, 503) or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        await _wait_served(kube, name, crd["spec"]["names"]["plural"], deadline)


async def _create_or_update(kube: Kube, crd: dict[str, Any]) -> None:
    name = crd["metadata"]["name"]
    try:
        current = await kube.get(f"{CRDS}/{name}")
    except ApiError as exc:
        if not exc.not_found:
            raise
        await kube.create(CRDS, crd)
        return
    if current["spec"] != {**current["spec"], **crd["spec"]}:
        body = {
            **crd,
            "metadata": {
                **crd["metadata"],
                "resourceVersion": current["metadata"]["resourceVersion"],
            },
        }
        await kube.replace(f"{CRDS}/{name}", body)


async def _wait_served(kube: Kube, name: str, plural: str, deadline: float) -> None:
    while True:
        current = await kube.get(f"{CRDS}/{name}")
        established = any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in (current.get("status") or {}).get("conditions") or ()
        )
        if established:
            try:
                await kube.get(path_of(group=api.GROUP, version=api.VERSION, plural=plural))
                return
            except ApiError as exc:
                if exc.status not in (404, 429, 503):
                    raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"CRD {name} not served after the deadline")
        await asyncio.sleep(0.2)


async def ensure_namespace(kube: Kube, name: str) -> None:
    try:
        await kube.create(path_of(plural="namespaces"), {"metadata": {"name": name}})
    except ApiError as exc:
        if not exc.conflict:
            raise


async def apply(kube: Kube, manifest: dict[str, Any]) -> dict[str, Any]:
    """Create a NodeWright or DeploymentPolicy, or replace its spec if it exists."""
    path = collection(manifest["kind"])
    name = manifest["metadata"]["name"]
    try:
        return await kube.create(path, manifest)
    except ApiError as exc:
        if not exc.conflict:
            raise
    current = await kube.get(f"{path}/{name}")
    return await kube.patch(
        f"{path}/{name}",
        {
            "spec": manifest["spec"],
            "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
        },
    )
