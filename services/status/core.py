"""The status service's decisions, as data: the CR status people and ``kubectl wait`` read,
and what to write on each node.

From one NodeWright, its DeploymentPolicy (None when it references none, or a missing one),
the node views of ``services.status.assessing`` and ``now``:

- :func:`compute_status` / :func:`summarize` give the CR status: node counts, ``3/5``,
  the package list, per-package counts from the executor records, per-compartment progress
  (the batch state is the scheduler's, read from its batch book annotation on the CR),
  at most ``api.MAX_NODE_DETAILS`` node details (failed first, then blocked, in progress,
  waiting) and the conditions: Ready always (True exactly when every target node is
  complete for the current spec), then the problem conditions that hold
  (DeploymentPolicyNotFound, TaintNotTolerated, NodesIgnored, DrainBlocked,
  NodeStateMalformed). A condition's lastTransitionTime is kept while its status does not
  change; the previous status is ``cr.status``;
- :func:`node_updates` gives the node condition ``nodewright.nvidia.com/<cr>`` each node
  should carry, only where it differs (and removes an earlier version's status record);
- :func:`merge_patch` turns the previous status into the new one as a JSON merge patch.

Status is computed, never accumulated: equal input gives an equal output (sorted lists,
bounded texts), so an unchanged world causes no write, and nothing here raises on odd
records. Reading caches, writing and Kubernetes Events are other modules' jobs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

import msgspec

from services.status import assessing
from services.status.assessing import NodeView, Observed
from shared import api, nodepins, nodestate, progress, reasons
from shared.events import Reason
from shared.progress import NodeFacts
from shared.records.status import reported
from shared.rollout import kernel
from shared.rollout.book import CompartmentBatch, read_batch_book
from shared.rollout.rules import DEFAULT_COMPARTMENT, compartment_rules

ConditionStatus = Literal["True", "False", "Unknown"]

_DETAIL_RANK: Final[Mapping[api.NodeState, int]] = {
    "Failed": 0,
    "Blocked": 1,
    "InProgress": 2,
    "Waiting": 3,
    "Unknown": 4,
    "Complete": 5,
}
"""nodeDetails order: what needs attention first."""

_CONDITION_MESSAGE_MAX: Final = 2048
_EXAMPLES: Final = 3
"""Nodes named per state in the Ready message; the rest are counted."""
_CONDITION_NODES: Final = 5
"""Nodes named in the other conditions' messages."""
_PACKAGES_MAX: Final = 256
_COMPARTMENTS_MAX: Final = 64


# ---- the CR status ----------------------------------------------------------------------


def compute_status(
    cr: api.NodeWright,
    policy: api.DeploymentPolicy | None,
    node_facts: Sequence[NodeFacts | Observed],
    now: datetime,
    plan: kernel.Plan | None = None,
) -> api.NodeWrightStatus:
    """The status of ``cr`` from what the nodes say and the rollout kernel's decision
    ``plan`` (None: the kernel's decision over these nodes alone, without the other
    NodeWrights' shared budgets and priority); ``cr.status`` is the previous status (its
    conditions' lastTransitionTime and the compartments' batch state carry over)."""
    observed = [n if isinstance(n, Observed) else Observed(facts=n) for n in node_facts]
    if plan is None:
        plan = kernel.plan(
            cr=cr,
            policy=policy,
            nodes=[o.facts for o in observed],
            book=read_batch_book(cr.metadata.annotations),
            ctx=kernel.Context(
                now=now, policy_missing=bool(cr.spec.deployment_policy) and policy is None
            ),
        )
    return summarize(cr, policy, assessing.assess(cr, observed, now, plan), now, plan)


def summarize(
    cr: api.NodeWright,
    policy: api.DeploymentPolicy | None,
    views: Sequence[NodeView],
    now: datetime,
    plan: kernel.Plan,
) -> api.NodeWrightStatus:
    """The CR status from node views (``assessing.assess``) and the kernel's decision they
    were assessed with; equal input, equal output."""
    now = assessing.to_second(now)
    targets = [v for v in views if v.target]
    by_state: dict[api.NodeState, int] = {}
    for v in targets:
        by_state[v.state] = by_state.get(v.state, 0) + 1
    counts = api.NodeCounts(
        target=len(targets),
        complete=by_state.get("Complete", 0),
        in_progress=by_state.get("InProgress", 0),
        failed=by_state.get("Failed", 0),
        waiting=by_state.get("Waiting", 0),
        blocked=by_state.get("Blocked", 0),
    )
    compartments = _compartments(cr, policy, targets, plan)
    policy_missing = bool(cr.spec.deployment_policy) and policy is None
    state = _rollout_state(cr, counts, compartments)
    pending = sorted(
        (v for v in targets if v.state != "Complete"),
        key=lambda v: (_DETAIL_RANK[v.state], v.name),
    )
    details = [
        api.NodeDetail(
            node=v.name,
            state=v.state,
            reason=v.reason.code,
            message=v.reason.message,
            package=v.package[:43],
            since=v.since,
        )
        for v in pending[: api.MAX_NODE_DETAILS]
    ]
    return api.NodeWrightStatus(
        observed_generation=cr.metadata.generation,
        state=state,
        conditions=_conditions(
            cr, state, counts, pending, targets, policy_missing, now, compartments=compartments
        ),
        node_counts=counts,
        complete_nodes=f"{counts.complete}/{counts.target}",
        package_list=assessing.truncate(
            ",".join(f"{n}:{p.version}" for n, p in sorted(cr.spec.packages.items())), 8192
        ),
        packages=_packages(cr, views),
        compartments=compartments,
        node_details=details,
        node_details_omitted=len(pending) - len(details),
    )


def _rollout_state(
    cr: api.NodeWright, counts: api.NodeCounts, compartments: Sequence[api.CompartmentStatus]
) -> api.RolloutState:
    """Complete when every target node is; then the lifecycle switches; then the state of the
    remaining nodes, the one needing most attention first."""
    if counts.complete == counts.target:
        return "Complete"
    if cr.disabled:
        return "Disabled"
    if cr.paused:
        return "Paused"
    if any(c.batch.stopped for c in compartments):
        return "Stopped"
    if counts.in_progress:
        return "InProgress"
    if counts.failed:
        return "Failed"
    if counts.blocked:
        return "Blocked"
    return "Waiting"


def _packages(cr: api.NodeWright, views: Sequence[NodeView]) -> list[api.PackageStatus]:
    """Every package version present on any node, and every spec version, with node counts."""
    zero = {"present": 0, "complete": 0, "in_progress": 0, "failed": 0, "uninstalling": 0}
    acc: dict[tuple[str, str], dict[str, int]] = {
        (name, pkg.version): dict(zero) for name, pkg in cr.spec.packages.items()
    }

    def bump(name: str, version: str, field: str) -> None:
        if 0 < len(name) <= 43 and 0 < len(version) <= 64:
            acc.setdefault((name, version), dict(zero))[field] += 1

    for v in views:
        for name, rec in v.facts.executor.packages.items():
            uninstall = rec.cycle == "uninstall"
            present = {rec.installed} if rec.installed else set()
            if rec.version != rec.installed and not (uninstall and rec.state == "succeeded"):
                present.add(rec.version)
            for version in present:
                bump(name, version, "present")
            if rec.state == "failed":
                bump(name, rec.version, "failed")
            elif uninstall and rec.installed:
                bump(name, rec.version, "uninstalling")
            elif rec.state == "running":
                bump(name, rec.version, "in_progress")
            elif rec.installed == rec.version and not uninstall:
                bump(name, rec.version, "complete")
    spec = {(n, p.version) for n, p in cr.spec.packages.items()}
    ordered = sorted(acc.items(), key=lambda item: (item[0] not in spec, item[0]))
    kept = sorted(ordered[:_PACKAGES_MAX], key=lambda item: item[0])
    return [
        api.PackageStatus(
            name=name,
            version=version,
            present_nodes=c["present"],
            complete_nodes=c["complete"],
            in_progress_nodes=c["in_progress"],
            failed_nodes=c["failed"],
            uninstalling_nodes=c["uninstalling"],
        )
        for (name, version), c in kept
    ]


def _compartments(
    cr: api.NodeWright,
    policy: api.DeploymentPolicy | None,
    targets: Sequence[NodeView],
    plan: kernel.Plan,
) -> list[api.CompartmentStatus]:
    """Progress per compartment: admitted nodes count where the scheduler admitted them, the
    others where their labels assign them. Budget and waiting reason are the kernel's
    (``plan``), the batch state the scheduler's, read from its batch book on the CR, with
    the counts of the batch in flight as the kernel reads them from its nodes
    (:func:`_batch_state`)."""
    rules = compartment_rules(cr, policy)
    members: dict[str, list[NodeView]] = {r.name: [] for r in rules}
    for v in targets:
        members.setdefault(v.compartment, []).append(v)
    book = read_batch_book(cr.metadata.annotations)
    out: list[api.CompartmentStatus] = []
    for name in sorted(members)[:_COMPARTMENTS_MAX]:
        nodes = members[name]
        states = [v.state for v in nodes]
        complete = states.count("Complete")
        decided = plan.compartment(name)
        entry = book.compartments.get(name)
        wait = decided.waiting if decided is not None else None
        out.append(
            api.CompartmentStatus(
                name=name[:63] or DEFAULT_COMPARTMENT,
                matched_nodes=len(nodes),
                budget_nodes=decided.budget if decided is not None else 0,
                in_progress_nodes=states.count("InProgress"),
                complete_nodes=complete,
                failed_nodes=states.count("Failed"),
                progress_percent=complete * 100 // len(nodes) if nodes else 0,
                batch=_batch_state(entry, decided.batch if decided is not None else None),
                waiting_reason=wait.code if wait is not None else "",
                waiting_message=assessing.truncate(
                    f"{wait.message} ({wait.nodes} nodes, e.g. {wait.example})", 1024
                )
                if wait is not None
                else "",
            )
        )
    return out


def _batch_state(
    entry: CompartmentBatch | None, decided: CompartmentBatch | None
) -> api.BatchState:
    """The batch state the book holds, with the counts of its batch in flight as the kernel
    counted them now (the book keeps a batch's counts from its opening until it closes:
    ``kernel._as_persisted``). What the kernel would open or close next is the scheduler's
    to write; until it has, the book's batch is shown."""
    if entry is None:
        return api.BatchState()
    if decided is None or not entry.nodes or decided.nodes != entry.nodes:
        return entry.state
    return msgspec.structs.replace(
        entry.state,
        batch_succeeded_nodes=decided.state.batch_succeeded_nodes,
        batch_failed_nodes=decided.state.batch_failed_nodes,
    )


# ---- conditions ---------------------------------------------------------------------------


def _condition(
    ctype: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    *,
    cr: api.NodeWright,
    now: datetime,
) -> api.Condition:
    """A condition whose lastTransitionTime is kept while its status does not change."""
    prev = next((c for c in cr.status.conditions if c.type == ctype), None)
    since = prev.last_transition_time if prev is not None and prev.status == status else now
    return api.Condition(
        type=ctype,
        status=status,
        last_transition_time=since,
        reason=assessing.reason_code(reason),
        message=assessing.truncate(message, _CONDITION_MESSAGE_MAX),
        observed_generation=cr.metadata.generation,
    )


def _example(v: NodeView, *, with_message: bool) -> str:
    text = f"{v.name}: {v.reason.code}"
    if with_message and v.reason.message:
        text += ": " + assessing.truncate(v.reason.message, 160)
    return text


def ready_message(counts: api.NodeCounts, pending: Sequence[NodeView]) -> str:
    """``3/5 nodes complete, 1 failed (node-x: ImagePullFailed: ...), 1 waiting (...)``:
    counts per state, naming a few nodes of each (failed and blocked with their message)."""
    parts = [f"{counts.complete}/{counts.target} nodes complete"]
    groups: dict[api.NodeState, list[NodeView]] = {}
    for v in pending:
        groups.setdefault(v.state, []).append(v)
    labels: tuple[tuple[api.NodeState, str], ...] = (
        ("Failed", "failed"),
        ("Blocked", "blocked"),
        ("InProgress", "in progress"),
        ("Waiting", "waiting"),
    )
    for state, label in labels:
        nodes = groups.get(state, [])
        if not nodes:
            continue
        shown = "; ".join(
            _example(v, with_message=state in ("Failed", "Blocked")) for v in nodes[:_EXAMPLES]
        )
        more = f"; {len(nodes) - _EXAMPLES} more" if len(nodes) > _EXAMPLES else ""
        parts.append(f"{len(nodes)} {label} ({shown}{more})")
    return assessing.truncate(", ".join(parts), _CONDITION_MESSAGE_MAX)


def _node_list(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_CONDITION_NODES])
    if len(names) > _CONDITION_NODES:
        shown += f" and {len(names) - _CONDITION_NODES} more"
    return shown


def _conditions(
    cr: api.NodeWright,
    state: api.RolloutState,
    counts: api.NodeCounts,
    pending: Sequence[NodeView],
    targets: Sequence[NodeView],
    policy_missing: bool,
    now: datetime,
    *,
    compartments: Sequence[api.CompartmentStatus] = (),
) -> list[api.Condition]:
    """Ready, always; then the problem conditions that hold now (sorted by type). A problem
    condition is listed only while it is True."""
    ready = _condition(
        api.ConditionType.READY,
        "True" if state == "Complete" else "False",
        state,
        ready_message(counts, pending),
        cr=cr,
        now=now,
    )
    problems: list[api.Condition] = []
    if policy_missing:
        problems.append(
            _condition(
                api.ConditionType.DEPLOYMENT_POLICY_NOT_FOUND,
                "True",
                api.ConditionType.DEPLOYMENT_POLICY_NOT_FOUND,
                f"DeploymentPolicy {cr.spec.deployment_policy} does not exist: no new node "
                "starts until it is created",
                cr=cr,
                now=now,
            )
        )
    by_reason: dict[str, list[str]] = {}
    for v in targets:
        by_reason.setdefault(v.reason.code, []).append(v.name)
    drain_blocked = [
        v.name
        for v in targets
        if v.phase == "Blocked" and v.facts.drain is not None and v.facts.drain.phase == "blocked"
    ]
    for ctype, names, text in (
        (
            api.ConditionType.TAINT_NOT_TOLERATED,
            by_reason.get(reasons.TAINT_NOT_TOLERATED, []),
            "have taints not tolerated by spec.additionalTolerations",
        ),
        (api.ConditionType.NODES_IGNORED, by_reason.get(reasons.NODE_IGNORED, []), "are ignored"),
        (api.ConditionType.DRAIN_BLOCKED, drain_blocked, "cannot be drained"),
        (
            api.ConditionType.NODE_STATE_MALFORMED,
            by_reason.get(reasons.NODE_STATE_MALFORMED, []),
            "carry NodeWright annotations that do not decode",
        ),
    ):
        if names:
            problems.append(
                _condition(
                    ctype,
                    "True",
                    ctype,
                    f"{len(names)} nodes {text}: {_node_list(names)}",
                    cr=cr,
                    now=now,
                )
            )
    problems.extend(_uninstall_conditions(cr, counts, targets, now))
    problems.extend(_stopped_condition(cr, compartments, now))
    return [ready, *sorted(problems, key=lambda c: c.type)]


def _stopped_condition(
    cr: api.NodeWright, compartments: Sequence[api.CompartmentStatus], now: datetime
) -> list[api.Condition]:
    """RolloutStopped while a compartment's stop gate holds."""
    stopped = sorted(c.name for c in compartments if c.batch.stopped)
    if not stopped:
        return []
    return [
        _condition(
            api.ConditionType.ROLLOUT_STOPPED,
            "True",
            api.ConditionType.ROLLOUT_STOPPED,
            f"compartments stopped after consecutive failed batches: {', '.join(stopped)}; fix "
            "the failures, then `nodewright reset-batches NAME`",
            cr=cr,
            now=now,
        )
    ]


def _uninstall_conditions(
    cr: api.NodeWright, counts: api.NodeCounts, targets: Sequence[NodeView], now: datetime
) -> list[api.Condition]:
    """UninstallInProgress while uninstalls (requested, or the deletion's) are pending;
    DeletionBlocked when a deletion cannot finish without someone acting: the NodeWright is
    paused or disabled, or nodes failed or carry undecodable records. Each names what to do."""
    deleting = progress.deleting(cr)
    requested = deleting or any(
        p.uninstall is not None and p.uninstall.requested for p in cr.spec.packages.values()
    )
    pending = counts.target - counts.complete
    if not requested or not pending:
        return []
    out = [
        _condition(
            api.ConditionType.UNINSTALL_IN_PROGRESS,
            "True",
            "Deleting" if deleting else "UninstallRequested",
            f"uninstall pending on {pending} of {counts.target} nodes",
            cr=cr,
            now=now,
        )
    ]
    failed = sorted(v.name for v in targets if v.state == "Failed")
    if failed:
        out.append(
            _condition(
                api.ConditionType.UNINSTALL_FAILED,
                "True",
                api.ConditionType.UNINSTALL_FAILED,
                f"{len(failed)} nodes failed: {_node_list(failed)}",
                cr=cr,
                now=now,
            )
        )
    if not deleting:
        return out
    malformed = sorted(v.name for v in targets if v.reason.code == reasons.NODE_STATE_MALFORMED)
    blocked: tuple[str, str] | None = None
    if cr.disabled:
        blocked = (
            "DisabledWithPendingUninstall",
            "the NodeWright is disabled: remove the annotation "
            f"{api.DISABLE_ANNOTATION} so its uninstalls can run",
        )
    elif cr.paused:
        blocked = (
            "PausedWithPendingUninstall",
            f"the NodeWright is paused: remove the annotation {api.PAUSE_ANNOTATION} "
            "so its uninstalls can run",
        )
    elif failed:
        blocked = (
            "UninstallFailed",
            f"{len(failed)} nodes failed: {_node_list(failed)}; fix and run `nodewright "
            "node retry`, or label them nodewright.nvidia.com/ignore=true to leave them",
        )
    elif malformed:
        blocked = (
            reasons.NODE_STATE_MALFORMED,
            f"{len(malformed)} nodes carry NodeWright annotations that do not decode: "
            f"{_node_list(malformed)}; run `nodewright node reset` on them",
        )
    if blocked is not None:
        out.append(
            _condition(
                api.ConditionType.DELETION_BLOCKED, "True", blocked[0], blocked[1], cr=cr, now=now
            )
        )
    return out


# ---- per-node writes ----------------------------------------------------------------------


@dataclass(frozen=True)
class NodeUpdate:
    """What to change on one node."""

    node: str
    condition: dict[str, Any] | None
    """The node condition to set; None removes it."""
    write_condition: bool
    remove_record: str | None = None
    """The legacy status record to remove (its value, tested by the removal), if any."""


def _rfc3339(at: datetime) -> str:
    return assessing.to_second(at).strftime("%Y-%m-%dT%H:%M:%SZ")


_STATE_TEXT: Final[Mapping[api.NodeState, str]] = {
    "InProgress": "NodeWright is changing the node",
    "Complete": "every package is at its desired version",
}


def node_condition(
    cr: str, view: NodeView, current: Mapping[str, Any] | None, now: datetime
) -> dict[str, Any]:
    """The node condition for ``view``: True when complete; reason the node's state, message
    the machine reason and its text where the node waits, is blocked or failed. A node in
    progress says only that: each stage and check changes the step, and a condition naming it
    would cost a node write each (issue 15); ``nodewright node status`` and the web page name
    the step, from the services' own records. lastTransitionTime is kept while the status is
    unchanged."""
    status: ConditionStatus = "True" if view.phase == "Complete" else "False"
    stamp = _rfc3339(now)
    transition = stamp
    if current is not None and current.get("status") == status:
        transition = str(current.get("lastTransitionTime") or stamp)
    text = _STATE_TEXT.get(view.state)
    if text is None:
        reason = _kept_turn(current) if view.reason.code == reasons.ADMITTING else None
        reason = reason or assessing.recorded(cr, view)
        text = f"{reason.code}: {reason.message}"
    elif view.state == "InProgress":
        text += f" ({cr}); `nodewright node status {view.name}` shows the step"
    return {
        "type": assessing.condition_type(cr),
        "status": status,
        "reason": view.state,
        "message": assessing.truncate(text, assessing.MESSAGE_MAX),
        "lastTransitionTime": transition,
        # Never before the time the view gives: the heartbeat is the memory of what was
        # reported, and a record stamped by a clock ahead of ours must not look newer than
        # the report of it on every pass (see _condition_differs).
        "lastHeartbeatTime": _rfc3339(max(now, view.since)),
    }


def _kept_turn(current: Mapping[str, Any] | None) -> Reason | None:
    """The wait for its compartment's turn the condition reports, kept while the node is
    being admitted: the kernel's Admitting is this pass's plan, which the scheduler's write
    turns into InProgress within moments; writing it first cost a quarter of the nodes one
    more Node write each (issue 15, ``status_condition_changes`` of bench.rollout). The
    NodeWright's ``nodeDetails`` say Admitting. None when the condition reports anything
    else (a node with no condition yet gets none for a while: :data:`ADMIT_GRACE_S`)."""
    before = reported(current)
    if before is None or before.state != "Waiting" or before.reason is None:
        return None
    return before.reason if before.reason.code in assessing.COMPARTMENT_TURN else None


_TROUBLE: Final = frozenset({"Failed", "Blocked"})

ADMIT_GRACE_S: Final = 5.0
"""How long a node with no condition yet may be due for admission before its condition says
Admitting. The kernel's Admitting is this pass's plan, and the scheduler's write makes
InProgress the node's first condition within moments. Writing Admitting first cost every
node of a rollout's first batch one more Node write, and, landing between the scheduler's
fence and its admission, a refused admission taken again half a second later (issue 15:
100 writes and 30 refusals at 1,000 nodes). Past the grace (the scheduler is down, or its
writes fail) the node says what it waits for. The grace runs from the last admission seen
to land, while the scheduler admits (:func:`due_since`)."""


def due_since(
    views: Sequence[NodeView],
    observed: Iterable[Observed],
    before: Mapping[str, datetime],
    now: datetime,
) -> dict[str, datetime]:
    """When each node with no condition yet was first seen due for admission, carried over
    from ``before`` (the last pass's answer); nodes no longer so are dropped.

    Since an admission of the same NodeWright was last seen to land, rather, if that is
    later: the scheduler is then visibly admitting, and a large batch takes a while (1,000
    admissions at 10,000 nodes took 10-17 s, and the nodes at its end each cost one more
    Node write, issue 15). A scheduler that stops admitting (down, its writes refused) leaves
    its nodes silent for :data:`ADMIT_GRACE_S` after its last admission, no longer."""
    bare = {o.name for o in observed if o.condition is None}
    due = [
        v.name for v in views if v.target and v.name in bare and v.reason.code == reasons.ADMITTING
    ]
    # Admitted: out of Waiting, which a node due for admission leaves only by its admission
    # (a node that got its condition meanwhile is the status service's own doing: no sign).
    admitted = any(v.name in before and v.state != "Waiting" for v in views)
    return {name: now if admitted else before.get(name, now) for name in due}


def admitting_report_due(since: Mapping[str, datetime], now: datetime) -> float | None:
    """Seconds until the first node of :func:`due_since` has waited :data:`ADMIT_GRACE_S`
    (None: no node waits for it)."""
    if not since:
        return None
    return max(0.0, ADMIT_GRACE_S - (now - min(since.values())).total_seconds())


def _admission_pending(
    view: NodeView,
    have: Mapping[str, Any] | None,
    since: Mapping[str, datetime] | None,
    now: datetime,
) -> bool:
    """A node with no condition yet that is due for admission, within its grace."""
    if since is None or have is not None or view.reason.code != reasons.ADMITTING:
        return False
    return (now - since.get(view.name, now)).total_seconds() < ADMIT_GRACE_S


def _condition_differs(
    want: Mapping[str, Any], have: Mapping[str, Any] | None, view: NodeView
) -> bool:
    if have is None or any(want[k] != have.get(k) for k in ("status", "reason", "message")):
        return True
    # A new failure or block with the same words (a retry that failed again): rewritten so
    # the condition's time, the memory of what was reported, passes the new one's.
    before = reported(have)
    return view.state in _TROUBLE and before is not None and view.since > before.since


def node_updates(
    cr: str,
    views: Sequence[NodeView],
    observed: Iterable[Observed],
    now: datetime,
    admitting: Mapping[str, datetime] | None = None,
) -> list[NodeUpdate]:
    """The writes that bring each node's condition in line with its view: set on target
    nodes, removed from the others (and from every node when ``views`` is empty because the
    CR is gone), and an earlier version's status record removed everywhere. Nodes already in
    line are left out. With ``admitting`` (:func:`due_since`), a node with no condition yet
    gets none while it is due for admission within :data:`ADMIT_GRACE_S`."""
    by_name = {v.name: v for v in views}
    out: list[NodeUpdate] = []
    for obs in sorted(observed, key=lambda o: o.name):
        view = by_name.get(obs.name)
        if view is None or not view.target:
            if obs.legacy_record is not None or obs.condition is not None:
                out.append(
                    NodeUpdate(
                        node=obs.name,
                        condition=None,
                        write_condition=obs.condition is not None,
                        remove_record=obs.legacy_record,
                    )
                )
            continue
        condition = node_condition(cr, view, obs.condition, now)
        write_condition = _condition_differs(condition, obs.condition, view)
        if write_condition and _admission_pending(view, obs.condition, admitting, now):
            write_condition = False
        if write_condition or obs.legacy_record is not None:
            out.append(
                NodeUpdate(
                    node=obs.name,
                    condition=condition,
                    write_condition=write_condition,
                    remove_record=obs.legacy_record,
                )
            )
    return out


def _urgency(update: NodeUpdate) -> int:
    reason = (update.condition or {}).get("reason")
    if reason in _TROUBLE:
        return 0  # failures are visible at once
    return 2 if reason == "Waiting" else 1


def this_pass(
    updates: Sequence[NodeUpdate], waiting_limit: int
) -> tuple[list[NodeUpdate], list[NodeUpdate]]:
    """``updates`` split into what a pass writes now, in order, and what it leaves to the
    next pass: failed and blocked nodes first, then the nodes in flight or done (and
    removals), then at most ``waiting_limit`` waiting nodes (by node name within each). The
    first pass over a new rollout of 10,000 nodes finds 9,000 waiting nodes; the NodeWright's
    status, written after the pass's node writes, must not wait for all of them. Only
    waiting nodes wait for a later pass, so a status that says every node is complete
    never goes out before their conditions do."""
    ordered = sorted(updates, key=lambda u: (_urgency(u), u.node))
    waiting = [u for u in ordered if _urgency(u) == 2]
    later = waiting[waiting_limit:]
    return ordered[: len(ordered) - len(later)], later


WRITES_PER_TARGETS: Final = 250
"""Target nodes per node condition in flight (:func:`write_concurrency`)."""


def write_concurrency(targets: int, most: int, least: int = 10) -> int:
    """How many node conditions a pass writes at once: one per WRITES_PER_TARGETS target
    nodes, between ``least`` and ``most``. The conditions report the rollout and must not
    slow it (each write competes with the admissions, cordons and pods of the nodes in flight
    for the API server: at 1,000 nodes with 40 at once, the first cordon came 0.5 to 1.2 s
    after the apply, with 10 at 0.3 s; issue 15). Yet they must keep up with it, and the
    conditions to write a second grow with the batches, so with the fleet: at 10,000 nodes,
    10 at once left most nodes without an InProgress condition and the NodeWright's status
    20 s behind."""
    return max(min(least, most), min(most, -(-targets // WRITES_PER_TARGETS)))


def record_removal(cr: str, update: NodeUpdate) -> list[dict[str, Any]]:
    """The JSON patch (RFC 6902) removing ``update``'s legacy status record: it ``test``s the
    annotation is still the value the update saw, so a node that changed meanwhile refuses it
    (422) and the next pass reads it again. Send it encoded by ``shared.nodepins.encode``:
    the API server compares the test's string byte for byte as Go writes it."""
    path = "/metadata/annotations/" + nodepins.pointer(nodestate.key(nodestate.STATUS, cr))
    return [
        {"op": "test", "path": path, "value": update.remove_record},
        {"op": "remove", "path": path},
    ]


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) turning ``old`` into ``new``: changed and added keys,
    removed keys as null, objects recursively, lists whole. Needed because encoded statuses
    leave defaults out: a field that went back to its default must be removed explicitly."""
    patch: dict[str, Any] = {k: None for k in old if k not in new}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif key not in old or before != value:
            patch[key] = value
    return patch
