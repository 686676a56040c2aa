"""The CRD and sample helpers the tests use: the product's own (``nodewright.manifests``),
so the sandbox, the benchmark and the tests install and load manifests the same way."""

from __future__ import annotations

from nodewright.manifests import (
    CRD_DIR,
    CRDS,
    NODEWRIGHTS,
    POLICIES,
    REPO,
    SAMPLES_DIR,
    collection,
    crd_manifests,
    install_crds,
    samples,
)

__all__ = [
    "CRDS",
    "CRD_DIR",
    "NODEWRIGHTS",
    "POLICIES",
    "REPO",
    "SAMPLES_DIR",
    "collection",
    "crd_manifests",
    "install_crds",
    "samples",
]
