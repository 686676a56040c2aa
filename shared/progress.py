"""What a NodeWright wants on a node, and how far the node has got: pure functions.

Every service needs the same answers — which packages a CR wants at which version and
configuration, whether a node is done, whose turn it is, when its work is over and its
records are released — and they must agree, so the answers live here, computed only from the
CR and the Node object (its labels, status and the per-service records of
``shared.nodestate``). No I/O, no clock: callers pass ``now``.

Not this module's job: the rollout rules (budgets, compartments, batches, windows,
priority), which are the rollout kernel's (``shared.rollout``).
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar

import msgspec

from shared import api, nodestate, pods
from shared.nodestate import Requests
from shared.records.drainer import DrainRecord
from shared.records.executor import ExecutorRecord, PackageRecord
from shared.records.scheduler import Selection
from shared.records.validator import CheckRecord, ValidatorRecord

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
    spec_digest: str = ""
    """Identifies everything of the package's spec a stage pod runs with (image, digest,
    configuration, environment, resources, timeouts ...): a stage that failed with another
    spec starts over by itself (``PackageRecord.spec``)."""
    pod_digest: str = ""
    """Identifies what a stage pod of the package runs (:func:`pod_digest`), carried by the
    pod (``shared.pods.ANN_SPEC``): a stage still running in a pod of another one is
    stopped and starts over with this one."""


def _digest(*parts: object) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(msgspec.json.encode(part))
        h.update(b"\0")
    return h.hexdigest()[:16]


def image_ref(pkg: api.Package) -> str:
    return f"{pkg.image}@{pkg.digest}" if pkg.digest else f"{pkg.image}:{pkg.version}"


class _PerObject:
    """Memo of a pure function of one CR object, for the life of that object.

    A pass over N nodes asks for the same CR's desired packages and target digest N times;
    recomputing them (hashing every configMap) dominated a 1,000-node pass. Keyed by the
    object's identity (CR models hold dicts, so they are not hashable) and holding the
    object itself, so an id is never reused while cached; a few entries suffice.
    """

    def __init__(self, size: int = 64) -> None:
        self._size = size
        self._entries: dict[int, tuple[object, object]] = {}

    def get(self, obj: object) -> object | None:
        hit = self._entries.get(id(obj))
        return hit[1] if hit is not None and hit[0] is obj else None

    def put(self, obj: object, value: object) -> None:
        if len(self._entries) >= self._size:
            self._entries.pop(next(iter(self._entries)))
        self._entries[id(obj)] = (obj, value)


_DESIRED = _PerObject()
_TARGET = _PerObject()


def desired(cr: api.NodeWright) -> dict[str, Desired]:
    """The packages ``cr`` wants, by name (memoised per CR object; treat as read-only)."""
    cached = _DESIRED.get(cr)
    if cached is not None:
        return cached  # type: ignore[return-value]
    result = _desired(cr)
    _DESIRED.put(cr, result)
    return result


def deleting(cr: api.NodeWright) -> bool:
    """The NodeWright is being deleted: its finalizer uninstalls what can be uninstalled."""
    return cr.metadata.deletion_timestamp is not None


def _desired(cr: api.NodeWright) -> dict[str, Desired]:
    out: dict[str, Desired] = {}
    gone = deleting(cr)
    for name, pkg in sorted(cr.spec.packages.items()):
        enabled = bool(pkg.uninstall and pkg.uninstall.enabled)
        if gone and not enabled:
            # Being deleted: a package without uninstall steps stays as it is on the nodes
            # that have it and is installed nowhere else.
            continue
        out[name] = Desired(
            name=name,
            version=pkg.version,
            image=image_ref(pkg),
            config_digest=_digest(sorted(pkg.config_map.items())),
            config=dict(pkg.config_map),
            interrupt=pkg.interrupt,
            config_interrupts=dict(pkg.config_interrupts),
            depends_on=tuple(sorted(pkg.depends_on)),
            uninstall_requested=gone or bool(pkg.uninstall and pkg.uninstall.requested),
            spec=pkg,
            spec_digest=spec_digest(pkg),
            pod_digest=pod_digest(pkg),
        )
    return out


def pod_digest(pkg: api.Package) -> str:
    """Identifies what a stage pod of ``pkg`` runs: its image (and digest), environment and
    resources. Not its configuration (a changed one gets a config cycle of its own after the
    running stage), nor timeouts, interrupts or dependencies (they decide around the pod)."""
    return _digest(
        pkg.image, pkg.digest, msgspec.to_builtins(pkg.env), msgspec.to_builtins(pkg.resources)
    )


def spec_digest(pkg: api.Package) -> str:
    """Identifies a package's spec except what a new version or an uninstall request
    changes anyway (those start their own cycles)."""
    fields = msgspec.to_builtins(pkg)
    for name in ("version", "uninstall"):
        fields.pop(name, None)
    return _digest(fields)


def target_digest(cr: api.NodeWright) -> str:
    """Identifies the desired package set: when it changes, every node is re-examined."""
    cached = _TARGET.get(cr)
    if isinstance(cached, str):
        return cached
    result = _target_digest(cr)
    _TARGET.put(cr, result)
    return result


def _target_digest(cr: api.NodeWright) -> str:
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
    marks: Mapping[str, int] = field(default_factory=dict)
    """Per key of :attr:`malformed`, the recovery mark (``honoured``) still readable from the
    broken record (0 when nothing is): a reset newer than it makes the owner drop the record
    (``shared.recovery.reset_malformed``)."""
    resource_version: str = ""
    """The node's resourceVersion these facts were read from."""
    requests: Requests = field(default_factory=Requests)
    """The recovery requests for this CR on the node (``nodestate.read_requests``)."""
    derived: dict[str, tuple[object, Any]] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    """What each :func:`_per_facts` function last computed on these facts, with the
    :func:`derivation_key` of the NodeWright it computed it for."""

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
    marks: dict[str, int] = {}

    def read(owner: str, record: type[nodestate.R]) -> nodestate.R | None:
        try:
            return nodestate.read(node, owner, cr, record)
        except (msgspec.ValidationError, msgspec.DecodeError):
            key = nodestate.key(owner, cr)
            malformed.append(key)
            marks[key] = nodestate.readable_mark(nodestate.annotations_of(node).get(key, ""))
            return None

    selection = read(nodestate.SCHEDULER, Selection)
    drain = read(nodestate.DRAINER, DrainRecord)
    validator = read(nodestate.VALIDATOR, ValidatorRecord) or ValidatorRecord()
    executor = finished_cycles(
        read(nodestate.EXECUTOR, ExecutorRecord) or ExecutorRecord(), validator.checks
    )
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
        marks=marks,
        resource_version=str(meta.get("resourceVersion") or ""),
        requests=nodestate.read_requests(node, cr),
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
        # Mid-cycle (a stage of a rerun, reinstall or cancelled uninstall succeeded, its
        # check or later stages pending): the executor clears ``previous`` when a cycle ends.
        and not rec.previous
    )


INTERRUPT_STAGE: Final = "interrupt"
POST_INTERRUPT: Final = "post-interrupt"
CHECKED_STAGES: Final = frozenset({"apply", "upgrade", "config", POST_INTERRUPT, "uninstall"})
"""The stages whose success the validator checks (``<stage>-check``) before the next one."""


def next_stage(r: PackageRecord) -> str | None:
    """The stage after ``r``'s current one in its cycle; None when it is the cycle's last:
    ``apply``/``upgrade -> config [-> interrupt -> post-interrupt]``, ``uninstall [->
    interrupt]``."""
    match r.stage:
        case "apply" | "upgrade":
            return "config"
        case "config":
            return INTERRUPT_STAGE if r.interrupt else None
        case "interrupt":
            return POST_INTERRUPT
        case "uninstall":
            return INTERRUPT_STAGE if r.interrupt else None
        case _:
            return None


def segment(r: PackageRecord) -> tuple[str, ...]:
    """The stages one pod runs from ``r``'s current stage on (``shared.pods.ANN_STAGES``):
    that stage and the checked stages that follow it with nothing in between but checks
    (``apply, config``; ``config``; ``post-interrupt``; ``uninstall``); an interrupt ends a
    segment. A failed stage or check stops its pod; a retry runs a new one from the stage
    that failed, or whose check did."""
    out = [r.stage]
    nxt = next_stage(r)
    while nxt is not None and nxt in CHECKED_STAGES and nxt not in out:
        out.append(nxt)
        nxt = next_stage(msgspec.structs.replace(r, stage=nxt))
    return tuple(out)


def finish_cycle(r: PackageRecord, *, config: str, config_keys: Mapping[str, str]) -> PackageRecord:
    """``r`` once its cycle ended: its version installed with ``config`` applied."""
    return msgspec.structs.replace(
        r,
        installed=r.version,
        config=config,
        config_keys=dict(config_keys),
        cycle_config="",
        cycle_keys={},
        previous="",
        reason=None,
    )


def finished_cycles(record: ExecutorRecord, checks: Verdicts) -> ExecutorRecord:
    """The executor's record as every service reads it, with what the validator's verdicts
    say the executor did not write (issue 15: a Node write each, and a hop of latency):

    - a stage still recorded as running whose check has a verdict (passed or failed) for
      that attempt and cycle succeeded: its check runs in the same pod and starts only once
      the stage exited 0 (``shared.pods.parts``), so the verdict is the record of the
      stage's end;
    - likewise a verdict on a later stage of the same pod (:func:`segment`, same attempt
      and cycle): that stage ran, so every stage before it in the pod succeeded and passed
      its check; the record reads as at that stage;
    - a package whose cycle's last stage succeeded and whose check passed for that attempt
      counts as finished (installed, its configuration applied).

    The executor's next write of the record for another reason carries this form. Uninstall
    cycles end by the record's removal, which the executor does write; records written
    before ``cycle_config`` existed are finished by the executor as before.
    """
    if not checks or not record.packages:
        return record
    changed: dict[str, PackageRecord] = {}
    for name, r in record.packages.items():
        v: CheckRecord | None = None
        if r.state == "running" and r.stage in CHECKED_STAGES and r.cycle_started is not None:
            # Only a verdict that names this cycle: one of another cycle with the same
            # stage and attempt (not yet dropped by the validator) says nothing of this run.
            cycle = cycle_of(r)
            for stage in reversed(segment(r)):
                said = checks.get(nodestate.check_key(name, r.version, stage))
                if (
                    said is not None
                    and said.verdict != "running"
                    and said.cycle == cycle
                    and said.attempt == r.attempt
                ):
                    r = msgspec.structs.replace(r, stage=stage, state="succeeded", updated=said.at)
                    changed[name] = r
                    v = said
                    break
        else:
            v = checks.get(nodestate.check_key(name, r.version, r.stage))
            if v is not None and not verdict_about(r, v):
                v = None
        if (
            v is None
            or r.state != "succeeded"
            or r.cycle == "uninstall"
            or not r.cycle_config
            or next_stage(r) is not None
            or v.verdict != "passed"
        ):
            continue
        changed[name] = msgspec.structs.replace(
            finish_cycle(r, config=r.cycle_config, config_keys=r.cycle_keys), updated=v.at
        )
    if not changed:
        return record
    return msgspec.structs.replace(record, packages={**record.packages, **changed})


_KEY = _PerObject()


def derivation_key(cr: api.NodeWright) -> str:
    """All that :func:`turn`, :func:`node_done`, :func:`packages_done` and :func:`failed`
    read of ``cr``: every desired package field they compare (the target digest's and each
    package's spec digest) and whether it is being deleted. Two NodeWright objects with one
    key get the same answers from them on any node; a status, batch book or annotation
    change keeps the key (memoised per CR object)."""
    cached = _KEY.get(cr)
    if isinstance(cached, str):
        return cached
    result = _digest(
        target_digest(cr),
        [(d.name, d.spec_digest) for d in desired(cr).values()],
        deleting(cr),
    )
    _KEY.put(cr, result)
    return result


V = TypeVar("V")


def _per_facts(
    fn: Callable[[api.NodeWright, NodeFacts], V],
) -> Callable[[api.NodeWright, NodeFacts], V]:
    """``fn`` computed once per facts object and :func:`derivation_key`: facts are
    immutable, and the services' caches hand out the same ones until the node changes
    (``shared.rollout.fleet.FactsCache``), so the rollout kernel, which asks each of these
    several times per node and pass, computes each once per change of the node or of what
    the NodeWright wants (half a 1,000-node decision, issue 15). Keyed by what is read of
    the NodeWright, not by its object: its status and batch book change every second or
    two, which at 10,000 nodes recomputed every node on almost every pass; and a key keeps
    no NodeWright object alive (a memo per object kept every status version through the
    facts of the nodes that did not change: 70 MB at 1,000 nodes). Only the last key asked
    about is remembered."""
    name = fn.__name__

    @functools.wraps(fn)
    def memoised(cr: api.NodeWright, node: NodeFacts) -> V:
        key = derivation_key(cr)
        hit = node.derived.get(name)
        if hit is not None and hit[0] == key:
            value: V = hit[1]
            return value
        value = fn(cr, node)
        node.derived[name] = (key, value)
        return value

    return memoised


@_per_facts
def pull_images(cr: api.NodeWright, node: NodeFacts) -> tuple[tuple[str, str], ...]:
    """What ``spec.drain.prePullImages`` pulls onto the node before its drain: (package,
    image) of each package with work left on it (an install, upgrade, configuration or
    uninstall), by package; () without the option or with nothing left to do."""
    if not cr.spec.drain.pre_pull_images:
        return ()
    return tuple(
        (name, d.image)
        for name, d in sorted(desired(cr).items())
        if not package_done(d, node.executor.packages.get(name))
    )


def packages_done(cr: api.NodeWright, node: NodeFacts) -> bool:
    return all(package_done(d, node.executor.packages.get(n)) for n, d in desired(cr).items())


@_per_facts
def node_done(cr: api.NodeWright, node: NodeFacts) -> bool:
    """Every package is done and the validator validated the node for the current target.

    While the NodeWright is being deleted a node is done once its uninstall-enabled packages
    are gone (each uninstall stage was checked; there is no node validation to wait for): a
    node that never had them is done at once and is neither admitted nor cordoned.
    """
    if deleting(cr):
        return packages_done(cr, node)
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


def cycle_interrupt(d: Desired, rec: PackageRecord | None) -> api.Interrupt | None:
    """The interrupt the package's cycle on a node whose record is ``rec`` runs: on the
    version the node has installed (a configuration change), the configInterrupts of the
    keys that changed since they were applied, merged (none matching: no interrupt); an
    install or upgrade runs the package's interrupt. The executor starts each cycle with it;
    the scheduler reads it to know whether the node must be drained first."""
    if rec is not None and rec.installed == d.version:
        return interrupt_for_config_change(d, changed_config_keys(d, rec, rec.config_keys))
    return d.interrupt


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
        if d.uninstall_requested:
            if d.interrupt is not None:  # an uninstall runs the package's interrupt
                return True
            continue
        if cycle_interrupt(d, rec) is not None:
            return True
    return False


def drained(node: NodeFacts) -> bool:
    return node.drain is not None and node.drain.phase == "drained"


Verdicts = Mapping[str, CheckRecord]
"""The validator's check verdicts on a node (``ValidatorRecord.checks``), as other services
read them."""


def validation_blank(node: NodeFacts) -> bool:
    """The validator's record on the node says nothing yet (no verdict, no validation),
    whatever recovery mark or reboot it has followed."""
    v = node.validator
    return not v.checks and not v.validated and v.at is None and v.reason is None


PULL_IMAGES_DETAIL: Final = "pullImages"
"""The detail of a drain that failed pulling the package images before it
(``spec.drain.prePullImages``): which images (:func:`shared.pods.pull_version`)."""


def stale_pull_failure(cr: api.NodeWright, node: NodeFacts) -> bool:
    """The drain failed pulling the package images before it, and the images the CR wants
    pulled changed since (or it pulls none before drains any more): correcting an image in
    the spec is a fix, and the drain starts over by itself."""
    d = node.drain
    if d is None or d.phase != "failed" or d.reason is None:
        return False
    pulled = d.reason.details.get(PULL_IMAGES_DETAIL)
    if pulled is None:
        return False
    images = [image for _, image in pull_images(cr, node)]
    return not images or pods.pull_version(images) != pulled


@_per_facts
def failed(cr: api.NodeWright, node: NodeFacts) -> bool:
    """A drain, a stage, the interrupt or a check failed for what the CR wants now.

    Failures recorded for package versions the CR no longer asks for, or for another spec of
    the package (:func:`stale_failure`), do not count: changing the spec is one way to fix a
    failure, and the executor starts such a package over by itself; so does a drain that
    failed pulling images the spec no longer has (:func:`stale_pull_failure`), which the
    drainer starts over.
    """
    if node.drain is not None and node.drain.phase == "failed" and not stale_pull_failure(cr, node):
        return True
    want = desired(cr)
    wanted = {(n, d.version) for n, d in want.items()}
    for name, rec in node.executor.packages.items():
        failure = rec.state == "failed" and (name, rec.version) in wanted
        if failure and not stale_failure(want[name], rec):
            return True
    current = node.executor.packages
    intr = node.executor.interrupt
    if (
        intr is not None
        and intr.state == "failed"
        and any(
            (p, current[p].version) in wanted and not stale_failure(want[p], current[p])
            for p in intr.packages
            if p in current
        )
    ):
        return True
    for key, check in node.validator.checks.items():
        pkg, version, _ = key.split("/", 2)
        if check.verdict == "failed" and (pkg, version) in wanted:
            checked = current.get(pkg)
            if checked is None or not stale_failure(want[pkg], checked):
                return True
    return False


def stale_failure(d: Desired, rec: PackageRecord) -> bool:
    """The record's current attempt ran with another spec of the package than the CR has
    now (a corrected image, say): whatever failed is about the old spec. Records without a
    spec (written before it was recorded) are never stale."""
    return bool(rec.spec) and rec.spec != d.spec_digest


@_per_facts
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


def release_due(cr: api.NodeWright, node: NodeFacts) -> bool:
    """The NodeWright's work on the node is over for its current target: the drainer
    releases its record (and its cordon), then the scheduler its admission. One rule for
    both, so neither lets go before the other may."""
    return turn(cr, node) in ("release", "done")


# Where a stage comes in its cycle (the interrupt runs between config and post-interrupt).
_STAGE_RANK: dict[str, int] = {
    "apply": 0,
    "upgrade": 0,
    "uninstall": 0,
    "config": 1,
    "interrupt": 2,
    "post-interrupt": 3,
}


def cycle_of(r: PackageRecord) -> str:
    """The cycle a package record is in, as stage pods carry it."""
    return r.cycle_started.isoformat() if r.cycle_started is not None else ""


def pod_key(name: str, r: PackageRecord) -> tuple[str, str, str, int, str]:
    """The key (``shared.pods.PodView.key``) of the stage pod that runs package ``name``'s
    record ``r``: package, stage, version, attempt, cycle."""
    return (name, r.stage, r.version, r.attempt, cycle_of(r))


def verdict_about(r: PackageRecord, v: CheckRecord) -> bool:
    """The check verdict ``v`` (found under ``r``'s current stage and version) is about
    ``r``'s current run of that stage: its attempt, and its cycle. A verdict naming no cycle
    (written before :attr:`CheckRecord.cycle` existed) is about a stage recorded as ended
    only: the validator has named the cycle of every verdict on a stage still recorded as
    running since the executor stopped writing the stage's end."""
    if v.attempt != r.attempt:
        return False
    return v.cycle == cycle_of(r) if v.cycle else r.state != "running"


def stage_passed(
    r: PackageRecord | None, *, stage: str, version: str, attempt: int, cycle: str
) -> bool:
    """The package record ``r`` has moved past ``stage``'s ``attempt`` of its current cycle
    (a later stage, or a later attempt of it): that attempt's stage pods are
    needed by no record from now on, since a record only moves forward and a new attempt or
    cycle runs under new pod names."""
    if r is None or not cycle or cycle != cycle_of(r) or version != r.version:
        return False
    if stage == r.stage:
        return attempt < r.attempt
    return _STAGE_RANK.get(stage, 9) < _STAGE_RANK.get(r.stage, -1)
