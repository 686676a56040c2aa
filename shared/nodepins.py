"""What a per-node decision read of its node, pinned: the preconditions of the write that
carries it out, as JSON Patch ``test`` operations (RFC 6902) instead of the node's
resourceVersion.

A resourceVersion precondition refuses the write when *anything* of the node changed since
the decision, and in a rollout the node's status changes between every two decisions: the
status service's condition (written once per state of the node, ``services.status``) and
the kubelet's heartbeats. None of the drainer's decisions reads the node's status, and the
executor's and the validator's read only whether it is Ready and its boot ID
(``shared.progress.facts``); yet each such status write refused the next decision's write
with a 409 and cost it a second write (issue 15: 0.3 to 0.5 of the Node writes per node
above one per owner transition).

:func:`of` pins what a decision may have read: the node's labels, annotations and spec
whole, and, with ``status``, its Ready condition's status and its boot ID. The API server
applies a JSON Patch atomically to the current object, so the write lands exactly when
those are still what the decision saw, whatever else changed; when one changed, it answers
422 and the key is decided again on fresh data, as after a 409.

Two things make the pins exact:

- the API server compares a ``test`` operation's strings byte for byte as Go's
  ``encoding/json`` writes them (``<``, ``>``, ``&``, U+2028 and U+2029 escaped, other
  non-ASCII characters raw): :func:`encode` writes them so;
- a node cache that dropped an annotation to save memory (``shared.informer.slim_node``
  drops kubectl's last-applied copy) cannot pin the annotations whole: such a node carries
  :data:`TRIMMED`, and :func:`of` gives no pins for it (the resourceVersion serves).

Not this module's job: sending the patch, or what to do when it is refused
(``shared.nodeshell``); which decision reads the status (each service says so in its
:class:`shared.decisions.NodeDecision`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

JSON = dict[str, Any]

TRIMMED: Final = "nodewright.trimmed"
"""Top-level key a node cache sets on a node whose annotations it did not keep whole."""

_PINNED_METADATA: Final = ("labels", "annotations")

# Go's encoding/json escapes these inside strings; msgspec writes them raw (as UTF-8), and
# writes every other character as Go does (control characters as \u00xx or their short
# escapes, other non-ASCII raw). They can only occur inside strings (keys or values) of a
# JSON text, so replacing them in the whole text is exact.
_GO_ESCAPES: Final = (
    (b"<", b"\\u003c"),
    (b">", b"\\u003e"),
    (b"&", b"\\u0026"),
    ("\u2028".encode(), b"\\u2028"),
    ("\u2029".encode(), b"\\u2029"),
)


def encode(value: Any) -> bytes:
    """``value`` as JSON whose strings are byte for byte what Go's ``encoding/json`` writes
    (the API server compares a ``test`` operation's strings so). Raises ``ValueError`` for
    a value Go would write differently (a string with a lone surrogate, a float)."""
    _check(value)
    text = msgspec.json.encode(value)
    for raw, escaped in _GO_ESCAPES:
        if raw in text:
            text = text.replace(raw, escaped)
    return text


def _check(value: Any) -> None:
    # A float's digits (and a lone surrogate's replacement) differ between the encoders.
    if isinstance(value, float):
        raise ValueError("a float has no exact pin")
    if isinstance(value, dict):
        for k, v in value.items():
            _check(k)
            _check(v)
    elif isinstance(value, list):
        for v in value:
            _check(v)


@dataclass(frozen=True)
class Pins:
    """What one decision read of one node, and the ``test`` operations that pin it."""

    resource_version: str
    """The resourceVersion of the node decided on (the precondition when pins cannot serve:
    see ``shared.nodeshell.KubeNodes``)."""
    labels: Any
    annotations: Any
    spec: Any
    ready: tuple[int, str] | None
    """The Ready condition's index among the node's conditions and its status (None: the
    status is not pinned)."""
    boot_id: str | None

    def tests(self) -> list[JSON]:
        """The ``test`` operations of these pins."""
        ops: list[JSON] = [
            {"op": "test", "path": "/metadata/labels", "value": self.labels},
            {"op": "test", "path": "/metadata/annotations", "value": self.annotations},
            {"op": "test", "path": "/spec", "value": self.spec},
        ]
        if self.ready is not None:
            at = f"/status/conditions/{self.ready[0]}"
            ops += [
                {"op": "test", "path": f"{at}/type", "value": "Ready"},
                {"op": "test", "path": f"{at}/status", "value": self.ready[1]},
            ]
        if self.boot_id is not None:
            ops.append({"op": "test", "path": "/status/nodeInfo/bootID", "value": self.boot_id})
        return ops

    def holds(self, node: Mapping[str, Any] | None) -> bool:
        """Whether ``node`` still has what the decision read (it would pass the tests)."""
        if node is None or node.get(TRIMMED):
            return False
        meta = node.get("metadata") or {}
        if (meta.get("labels"), meta.get("annotations"), node.get("spec")) != (
            self.labels,
            self.annotations,
            self.spec,
        ):
            return False
        status = node.get("status") or {}
        if self.ready is not None:
            conditions = status.get("conditions") or []
            index, ready = self.ready
            if index >= len(conditions) or (
                conditions[index].get("type"),
                conditions[index].get("status"),
            ) != ("Ready", ready):
                return False
        if self.boot_id is not None:
            return str((status.get("nodeInfo") or {}).get("bootID") or "") == self.boot_id
        return True

    def json_patch(self, merge: Mapping[str, Any]) -> bytes | None:
        """The JSON Patch that makes the merge patch ``merge`` (its ``metadata.labels``,
        ``metadata.annotations`` and ``spec``; a ``metadata.resourceVersion`` is dropped) on a
        node holding these pins, preceded by the pins' tests; None when ``merge`` writes
        anything else (no pin covers it), or when it or the pins have a value :func:`encode`
        cannot write (the resourceVersion serves then)."""
        meta = dict(merge.get("metadata") or {})
        meta.pop("resourceVersion", None)
        if set(meta) - set(_PINNED_METADATA) or set(merge) - {"metadata", "spec"}:
            return None
        ops = self.tests()
        target = {"labels": self.labels, "annotations": self.annotations}
        _ops(target, meta, "/metadata", ops)
        if "spec" in merge:
            _ops({"spec": self.spec}, {"spec": merge["spec"]}, "", ops)
        try:
            return encode(ops)
        except ValueError:
            return None


def _ops(target: Mapping[str, Any], patch: Mapping[str, Any], path: str, out: list[JSON]) -> None:
    """The JSON Patch operations of the merge patch ``patch`` (RFC 7386) on ``target``,
    appended to ``out``."""
    for key, value in patch.items():
        at = f"{path}/{pointer(key)}"
        present = target.get(key) is not None
        if value is None:
            if present:
                out.append({"op": "remove", "path": at})
        elif isinstance(value, Mapping) and present and isinstance(target[key], Mapping):
            _ops(target[key], value, at, out)
        else:
            # "add" on an object member replaces it; a merge patch's nulls below a value
            # that replaces a non-object remove nothing there.
            out.append({"op": "add", "path": at, "value": _pruned(value)})


def _pruned(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _pruned(v) for k, v in value.items() if v is not None}
    return value


def pointer(key: str) -> str:
    """``key`` as one JSON Pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def of(node: Mapping[str, Any], *, status: bool) -> Pins | None:
    """The pins of a decision taken on ``node``: its labels, annotations and spec, and with
    ``status`` its Ready condition's status and boot ID. None when they cannot be pinned
    exactly: the cache trimmed the node's annotations, or ``status`` and the node has no
    single Ready condition. (A value :func:`encode` cannot write gives the pins no JSON
    Patch: :meth:`Pins.json_patch`.)"""
    if node.get(TRIMMED):
        return None
    meta = node.get("metadata") or {}
    ready: tuple[int, str] | None = None
    boot_id: str | None = None
    if status:
        node_status = node.get("status") or {}
        found = [
            (i, str(c.get("status")))
            for i, c in enumerate(node_status.get("conditions") or [])
            if c.get("type") == "Ready"
        ]
        if len(found) != 1:
            return None
        ready = found[0]
        boot_id = str((node_status.get("nodeInfo") or {}).get("bootID") or "")
    return Pins(
        resource_version=str(meta.get("resourceVersion") or ""),
        labels=meta.get("labels"),
        annotations=meta.get("annotations"),
        spec=node.get("spec"),
        ready=ready,
        boot_id=boot_id,
    )
