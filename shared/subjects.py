"""NATS subject scheme for NodeWright events.

Every event lives on ``nw.ev.<cr>.<node>.<kind>``, where ``<kind>`` is the event's dotted kind
(``node.selected``, ``stage.succeeded`` ...) and ``<cr>``/``<node>`` are encoded tokens:
Kubernetes names may contain dots, which NATS treats as separators, so ``.`` and the other
characters NATS reserves are percent-encoded (``gpu.a`` -> ``gpu%2Ea``). Events about a whole
CR use the node token ``-`` (never a valid node name). Poison messages are copied to
``nw.dlq.<service>``. Operators subscribe with wildcards, e.g.
``nats sub 'nw.ev.gpu-node-tuning.>'``.

This module only builds and parses subjects; what is published when is the services' job.
"""

from __future__ import annotations

from dataclasses import dataclass

ROOT = "nw"
EVENTS = f"{ROOT}.ev"
DEAD_LETTERS = f"{ROOT}.dlq"
ALL = f"{ROOT}.>"
NO_NODE = "-"

# Characters that would split or wildcard a subject token, plus the escape character itself.
_RESERVED = {"%": "%25", ".": "%2E", "*": "%2A", ">": "%3E", " ": "%20", "\t": "%09"}


def encode(token: str) -> str:
    """Encode a Kubernetes name (or any text) as one NATS subject token."""
    if not token:
        raise ValueError("subject tokens must not be empty")
    return "".join(_RESERVED.get(ch, ch) for ch in token)


def decode(token: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(token):
        if token[i] == "%":
            if i + 3 > len(token):
                raise ValueError(f"truncated escape in subject token {token!r}")
            out.append(chr(int(token[i + 1 : i + 3], 16)))
            i += 3
        else:
            out.append(token[i])
            i += 1
    return "".join(out)


def event(*, cr: str, node: str | None, kind: str) -> str:
    """The subject of one event."""
    return f"{EVENTS}.{encode(cr)}.{encode(node) if node else NO_NODE}.{kind}"


def kind_filter(kind: str) -> str:
    """A filter matching ``kind`` events of every CR and node."""
    return f"{EVENTS}.*.*.{kind}"


def dead_letter(service: str) -> str:
    return f"{DEAD_LETTERS}.{encode(service)}"


@dataclass(frozen=True)
class Address:
    """What a subject says about an event, readable even when its payload is garbage."""

    cr: str
    node: str | None
    kind: str


def parse(subject: str) -> Address | None:
    """Parse an event subject; None when it is not one."""
    parts = subject.split(".")
    if len(parts) < 5 or ".".join(parts[:2]) != EVENTS:
        return None
    try:
        cr = decode(parts[2])
        node = None if parts[3] == NO_NODE else decode(parts[3])
    except ValueError:
        return None
    return Address(cr=cr, node=node, kind=".".join(parts[4:]))
