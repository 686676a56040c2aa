"""What a package's pods see of their node: the ``node.json`` document, and how a pod carries it.

Package steps and checks see the node they run on and the NodeWright they belong to
(docs/packages.md, "Node metadata"). The document is written into the pod itself, as the
annotation :data:`ANNOTATION` of the stage pod, when the pod is created, and the
pod mounts it with the downward API at ``/nodewright-node-metadata/node.json`` (the agent
copies it next to the staged package). Nothing else is written for it: no object per node
to create, keep current and delete (one API request per node and package less, issue 15),
and a step sees the node as it was when its pod was made, which is when it was asked to run.

The document holds:

- the node's name, all its labels, and its annotations except NodeWright's own (every key
  under ``nodewright.nvidia.com`` or one of its subdomains: the services' per-node records
  are large and change with every step) and
  ``kubectl.kubernetes.io/last-applied-configuration`` (a copy of an older node object);
- the NodeWright's name and every package of its spec: name, version, and the image
  reference its pods run.

Pure: dicts in, dicts out; building the pod is :mod:`shared.podspec`'s job.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from shared import api, progress
from shared.nodestate import DOMAIN

ANNOTATION: Final = f"{DOMAIN}/node-metadata"
"""The pod annotation holding the document (the downward API volume's only item)."""
FILE: Final = "node.json"
"""The document's file name in the mounted directory."""
LEFT_OUT_ANNOTATIONS: Final = frozenset({"kubectl.kubernetes.io/last-applied-configuration"})
"""Annotations never copied besides NodeWright's own (see the module docstring)."""
MAX_TEXT: Final = 192 * 1024
"""The most ``node.json`` may take: the API server refuses a pod whose annotations exceed
256 KiB in all, and a node's own annotations may take up to that. Above it, the node's
annotations are left out (``annotationsOmitted``), so the pod is never refused for it."""


def nodewright_owned(key: str) -> bool:
    """The annotation key is NodeWright's own: its prefix is the domain or a subdomain."""
    prefix, slash, _ = key.rpartition("/")
    return bool(slash) and (prefix == DOMAIN or prefix.endswith(f".{DOMAIN}"))


def _foreign(meta: Mapping[str, Any]) -> dict[str, str]:
    """The node's annotations the document holds (none of NodeWright's own)."""
    return {
        k: str(v)
        for k, v in sorted((meta.get("annotations") or {}).items())
        if not nodewright_owned(k) and k not in LEFT_OUT_ANNOTATIONS
    }


def document(cr: api.NodeWright, node: Mapping[str, Any]) -> dict[str, Any]:
    """The content of ``node.json`` for ``cr``'s packages on ``node`` (a Node object)."""
    meta = node.get("metadata") or {}
    return {
        "name": str(meta.get("name", "")),
        "labels": {k: str(v) for k, v in sorted((meta.get("labels") or {}).items())},
        "annotations": _foreign(meta),
        "nodewright": cr.metadata.name,
        "packages": {
            name: {"name": name, "version": pkg.version, "image": progress.image_ref(pkg)}
            for name, pkg in sorted(cr.spec.packages.items())
        },
    }


def text(cr: api.NodeWright, node: Mapping[str, Any]) -> str:
    """``node.json`` as the file reads: the document, indented, keys sorted, one final
    newline; without the node's annotations when it would exceed :data:`MAX_TEXT`."""
    doc = document(cr, node)
    said = _dumps(doc)
    if len(said.encode()) > MAX_TEXT:
        said = _dumps({**doc, "annotations": {}, "annotationsOmitted": True})
    return said


def _dumps(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def volume(name: str) -> dict[str, Any]:
    """The pod volume presenting the pod's :data:`ANNOTATION` as :data:`FILE`."""
    return {
        "name": name,
        "downwardAPI": {
            "items": [
                {"path": FILE, "fieldRef": {"fieldPath": f"metadata.annotations['{ANNOTATION}']"}}
            ]
        },
    }
