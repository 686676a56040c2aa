"""What a NodeWright wants on a node, and how far the node has got: pure functions.

Every service needs the same answers — which packages a CR wants at which version and
configuration, whether a node is done, whose turn it is — and they must agree, so the
answers live here, computed only from the CR and the Node object (its labels, status and
the per-service records of ``shared.nodestate``). No I/O, no clock: callers pass ``now``.
"""

from __future__ import annotations

import fnmatch
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import msgspec

from shared import api, nodestate
from shared.nodestate import (
    DrainRecord,
    ExecutorRecord,
    PackageRecord,
    Selection,
    ValidatorRecord,
)

INTERRUPT_PRIORITY: Mapping[str, int] = {
    "reboot": 0,
    "restartAllServices": 1,
    "service": 2,
    "noop": 3,
}
"""Merge order of interrupts due on one node: the lowest number wins."""


@dataclass(frozen=True)
class Desired:
    """One package as the CR wants it."""

    name: str
    version: str
    image: str
    """The image reference pods run: image@digest or image:version."""
    config_digest: str
    config: Mapping[str, str]
    interrupt: api.Interrupt | None
    config_interrupts: Mapping[str, api.Interrupt]
    depends_on: tuple[str, ...]
    uninstall_requested: bool
    spec: api.Package


def _digest(*parts: object) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(msgspec.json.encode(part))
        h.update(b"\0")
    return h.hexdigest()[:16]


def image_ref(pkg: api.Package) -> str:
    return f"{pkg.image}@{pkg.digest}" if pkg.digest else f"{pkg.image}:{pkg.version}"


def desired(cr: api.NodeWright) -> dict[str, Desired]:
    out: dict[str, Desired] = {}
    for name, pkg in sorted(cr.spec.packages.items()):
        out[name] = Desired(
            name=name,
            version=pkg.version,
            image=image_ref(pkg),
            config_digest=_digest(sorted(pkg.config_map.items())),
            config=dict(pkg.config_map),
            interrupt=pkg.interrupt,
            config_interrupts=dict(pkg.config_interrupts),
            depends_on=tuple(sorted(pkg.depends_on)),
            uninstall_requested=bool(pkg.uninstall and pkg.uninstall.requested),
            spec=pkg,
        )
    return out


def target_digest(cr: api.NodeWright) -> str:
    """Identifies the desired package set: when it changes, every node is re-examined."""
    return _digest(
        [
            (d.name, d.version, d.image, d.config_digest, d.uninstall_requested)
            for d in desired(cr).values()
        ]
    )


# ---- observed node ----------------------------------------------------------------------


@dataclass(frozen=True)
class NodeFacts:
    """What the node object says, for one CR."""

    name: str
    labels: Mapping[str, str]
    unschedulable: bool
    ready: bool
    boot_id: str
    taints: tuple[Mapping[str, Any], ...]
    created: str
    selection: Selection | None = None
    drain: DrainRecord | None = None
    executor: ExecutorRecord = field(default_factory=ExecutorRecord)
    validator: ValidatorRecord = field(default_factory=ValidatorRecord)
    malformed: tuple[str, ...] = ()
    """Annotation keys whose record does not decode (hand-edited or foreign)."""

    @property
    def ignored(self) -> bool:
        return self.labels.get(nodestate.IGNORE_LABEL) == "true"


def facts(node: Mapping[str, Any], cr: str) -> NodeFacts:
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    malformed: list[str] = []

    def read(owner: str, record: type[nodestate.R]) -> nodestate.R | None:
        try:
            return nodestate.read(node, owner, cr, record)
        except (msgspec.ValidationError, msgspec.DecodeError):
            malformed.append(nodestate.key(owner, cr))
            return None

    selection = read(nodestate.SCHEDULER, Selection)
    drain = read(nodestate.DRAINER, DrainRecord)
    executor = read(nodestate.EXECUTOR, ExecutorRecord) or ExecutorRecord()
    validator = read(nodestate.VALIDATOR, ValidatorRecord) or ValidatorRecord()
    return NodeFacts(
        name=str(meta.get("name", "")),
        labels=dict(meta.get("labels") or {}),
        unschedulable=bool(spec.get("unschedulable")),
        ready=ready,
        boot_id=str((status.get("nodeInfo") or {}).get("bootID") or ""),
        taints=tuple(spec.get("taints") or ()),
        created=str(meta.get("creationTimestamp") or ""),
        selection=selection,
        drain=drain,
        executor=executor,
        validator=validator,
        malformed=tuple(malformed),
    )


# ---- selectors and taints ---------------------------------------------------------------


def selector_matches(selector: api.LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """Kubernetes label-selector semantics (an empty selector matches everything)."""
    if selector is None:
        return True
    for k, v in selector.match_labels.items():
        if labels.get(k) != v:
            return False
    for req in selector.match_expressions:
        present = req.key in labels
        match req.operator:
            case "In":
                if not present or labels[req.key] not in req.values:
                    return False
            case "NotIn":
                if present and labels[req.key] in req.values:
                    return False
            case "Exists":
                if not present:
                    return False
            case "DoesNotExist":
                if present:
                    return False
    return True


def selector_is_empty(selector: api.LabelSelector | None) -> bool:
    return selector is None or (not selector.match_labels and not selector.match_expressions)


# Taints NodeWright's own pods always tolerate: the cordon and the readiness taint it manages.
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
RUNTIME_REQUIRED_TAINT = f"{nodestate.DOMAIN}/runtime-required"


def tolerates(tolerations: Sequence[api.Toleration], taint: Mapping[str, Any]) -> bool:
    key, effect = taint.get("key", ""), taint.get("effect", "")
    if effect == "PreferNoSchedule":
        return True
    if key in (UNSCHEDULABLE_TAINT, RUNTIME_REQUIRED_TAINT):
        return True
    for tol in tolerations:
        if tol.effect and tol.effect != effect:
            continue
        if tol.operator == "Exists":
            if not tol.key or tol.key == key:
                return True
        elif tol.key == key and tol.value == taint.get("value", ""):
            return True
    return False


def untolerated_taints(cr: api.NodeWright, node: NodeFacts) -> list[str]:
    return sorted(
        f"{t.get('key')}={t.get('value', '')}:{t.get('effect')}"
        for t in node.taints
        if not tolerates(cr.spec.additional_tolerations, t)
    )


# ---- progress ---------------------------------------------------------------------------


def package_done(d: Desired, rec: PackageRecord | None) -> bool:
    """The package is installed at the desired version with the desired configuration."""
    if d.uninstall_requested:
        return rec is None or rec.installed == ""
    return (
        rec is not None
        and rec.installed == d.version
        and rec.config == d.config_digest
        and rec.state == "succeeded"
    )


def packages_done(cr: api.NodeWright, node: NodeFacts) -> bool:
    return all(package_done(d, node.executor.packages.get(n)) for n, d in desired(cr).items())


def node_done(cr: api.NodeWright, node: NodeFacts) -> bool:
    """Every package is done and the validator validated the node for the current target."""
    return packages_done(cr, node) and node.validator.validated == target_digest(cr)


def changed_config_keys(
    d: Desired, rec: PackageRecord | None, applied: Mapping[str, str]
) -> list[str]:
    """Config keys whose content differs from what was applied (``applied``: key -> digest)."""
    keys = set(d.config) | set(applied)
    return sorted(k for k in keys if _digest(d.config.get(k)) != applied.get(k))


def config_key_digests(config: Mapping[str, str]) -> dict[str, str]:
    return {k: _digest(v) for k, v in config.items()}


def interrupt_for_config_change(d: Desired, changed: Sequence[str]) -> api.Interrupt | None:
    """The interrupt a config-only change needs: merged over the matching configInterrupts."""
    due = [
        intr
        for pattern, intr in sorted(d.config_interrupts.items())
        if any(fnmatch.fnmatchcase(k, pattern) for k in changed)
    ]
    return merge_interrupts(due)


def merge_interrupts(interrupts: Sequence[api.Interrupt]) -> api.Interrupt | None:
    """One interrupt for all: reboot > restartAllServices > service (union) > noop."""
    if not interrupts:
        return None
    best = min(interrupts, key=lambda i: INTERRUPT_PRIORITY[i.type])
    if best.type != "service":
        return api.Interrupt(type=best.type)
    services = sorted({s for i in interrupts if i.type == "service" for s in i.services})
    return api.Interrupt(type="service", services=services)


Turn = Literal["scheduler", "drainer", "executor", "validator", "release", "done", "failed"]


def disruptive(cr: api.NodeWright, node: NodeFacts) -> bool:
    """Whether the node must be cordoned and drained before its packages run this time."""
    if not cr.spec.drain.only_for_interrupts:
        return True
    for name, d in desired(cr).items():
        rec = node.executor.packages.get(name)
        if package_done(d, rec):
            continue
        if d.interrupt is not None or d.config_interrupts:
            return True
    return False


def drained(node: NodeFacts) -> bool:
    return node.drain is not None and node.drain.phase == "drained"


def failed(cr: api.NodeWright, node: NodeFacts) -> bool:
    """A drain, a stage, the interrupt or a check failed for what the CR wants now.

    Failures recorded for package versions the CR no longer asks for do not count: changing
    the spec is one way to fix a failure.
    """
    if node.drain is not None and node.drain.phase == "failed":
        return True
    wanted = {(n, d.version) for n, d in desired(cr).items()}
    for name, rec in node.executor.packages.items():
        if rec.state == "failed" and (name, rec.version) in wanted:
            return True
    intr = node.executor.interrupt
    if intr is not None and intr.state == "failed":
        current = node.executor.packages
        if any((p, current[p].version) in wanted for p in intr.packages if p in current):
            return True
    for key, check in node.validator.checks.items():
        pkg, version, _ = key.split("/", 2)
        if check.verdict == "failed" and (pkg, version) in wanted:
            return True
    return False


def turn(cr: api.NodeWright, node: NodeFacts) -> Turn:
    """Whose move it is on this node for this CR.

    scheduler: not admitted yet (or admitted for an old target). drainer: admitted and must
    be cordoned and drained first. executor: stages to run. validator: stages done, node
    validation due. release: validated, the drainer must release its cordon and the
    scheduler its admission. done: nothing left. failed: a stage, check or drain failed and
    needs a retry or a fix.
    """
    target = target_digest(cr)
    if node_done(cr, node):
        if node.drain is not None or node.selection is not None:
            return "release"
        return "done"
    if failed(cr, node):
        return "failed"
    if node.selection is None:
        return "scheduler"
    if node.selection.disruptive and not drained(node):
        return "drainer"
    if not packages_done(cr, node):
        return "executor"
    if node.validator.validated != target:
        return "validator"
    return "release"


def now_iso(now: datetime) -> str:
    return now.isoformat()
