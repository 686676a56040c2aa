"""What a node's metadata ConfigMap for one NodeWright holds, and when it must be rewritten.

Package steps see the node they run on through this ConfigMap (docs/packages.md, "Node
metadata"): the executor writes one per (NodeWright, node) in its namespace before it
creates a stage pod there, the stage and check pods mount it, and the agent copies it next
to the staged package. Its single key ``node.json`` holds:

- the node's name, all its labels, and its annotations except NodeWright's own (every key
  under ``nodewright.nvidia.com`` or one of its subdomains: the services' per-node records
  are large, change with every step, and would rewrite the ConfigMap each time) and
  ``kubectl.kubernetes.io/last-applied-configuration`` (a copy of an older node object);
- the NodeWright's name and every package of its spec: name, version, and the image
  reference its pods run.

The ConfigMap is owned by the Node only, so the garbage collector deletes it when the node
goes. It is not also owned by the NodeWright: the garbage collector deletes an object only
once *all* its owners are gone, so a second owner would keep it alive as long as the
NodeWright lives. The executor deletes the ConfigMaps of a NodeWright that is gone itself.

Pure: dicts in, dicts out; the shell (``services.executor.service``) reads and writes them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from shared import api, pods, podspec, progress
from shared.nodestate import DOMAIN

LEFT_OUT_ANNOTATIONS: Final = frozenset({"kubectl.kubernetes.io/last-applied-configuration"})
"""Annotations never copied besides NodeWright's own (see the module docstring)."""
_COMPARED: Final = ("labels", "annotations", "ownerReferences")
"""The metadata fields the executor owns on the ConfigMap (besides ``data``)."""


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


def fingerprint(cr: api.NodeWright, node: Mapping[str, Any]) -> int:
    """A hash of everything :func:`config_map` reads: equal while the ConfigMap it gives is
    the same (a different one with the same hash is a 2**-64 chance), so the shell need not
    build and compare the document on every pass over the node (issue 15)."""
    meta = node.get("metadata") or {}
    packages = frozenset(
        (name, pkg.version, progress.image_ref(pkg)) for name, pkg in cr.spec.packages.items()
    )
    return hash(
        (
            cr.metadata.name,
            packages,
            str(meta.get("name", "")),
            str(meta.get("uid", "")),
            frozenset((meta.get("labels") or {}).items()),
            frozenset(_foreign(meta).items()),
        )
    )


def document(cr: api.NodeWright, node: Mapping[str, Any]) -> dict[str, Any]:
    """The content of ``node.json`` for ``cr``'s packages on ``node`` (a Node object)."""
    meta = node.get("metadata") or {}
    annotations = _foreign(meta)
    return {
        "name": str(meta.get("name", "")),
        "labels": {k: str(v) for k, v in sorted((meta.get("labels") or {}).items())},
        "annotations": annotations,
        "nodewright": cr.metadata.name,
        "packages": {
            name: {"name": name, "version": pkg.version, "image": progress.image_ref(pkg)}
            for name, pkg in sorted(cr.spec.packages.items())
        },
    }


def config_map(*, cr: api.NodeWright, node: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    """The node metadata ConfigMap as it should be now."""
    meta = node.get("metadata") or {}
    name = str(meta.get("name", ""))
    text = json.dumps(document(cr, node), indent=2, sort_keys=True, ensure_ascii=False)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": podspec.node_metadata_name(cr.metadata.name, name),
            "namespace": namespace,
            "labels": {
                pods.LABEL_MANAGED: pods.MANAGED_BY,
                pods.LABEL_ROLE: podspec.NODE_METADATA_ROLE,
                pods.LABEL_CR: cr.metadata.name,
                podspec.LABEL_NODE: podspec.node_label(name),
            },
            "annotations": {pods.ANN_NODE: name},
            # No blockOwnerDeletion: it would need update rights on nodes/finalizers, and
            # nothing has to wait for this ConfigMap before the Node goes.
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": name, "uid": str(meta.get("uid", ""))}
            ],
        },
        "data": {podspec.NODE_METADATA_KEY: text + "\n"},
    }


def replacement(desired: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any] | None:
    """The body that replaces ``current`` (an update, preconditioned on its resourceVersion)
    with ``desired``; None when ``current`` already says the same, so nothing is written."""
    have, want = current.get("metadata") or {}, desired["metadata"]
    same = (current.get("data") or {}) == desired["data"] and not current.get("binaryData")
    same = same and all((have.get(f) or None) == (want.get(f) or None) for f in _COMPARED)
    if same:
        return None
    return {
        **desired,
        "metadata": {**want, "resourceVersion": str(have.get("resourceVersion", ""))},
    }


def key_of(config_map: Mapping[str, Any]) -> tuple[str, str] | None:
    """The (NodeWright, node) a node metadata ConfigMap is for; None for any other object."""
    meta = config_map.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(pods.LABEL_ROLE) != podspec.NODE_METADATA_ROLE:
        return None
    cr = str(labels.get(pods.LABEL_CR) or "")
    node = str((meta.get("annotations") or {}).get(pods.ANN_NODE) or "")
    return (cr, node) if cr and node else None
