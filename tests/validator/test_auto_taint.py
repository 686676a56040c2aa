"""autoTaintNewNodes: the validator taints only nodes that are new to a runtimeRequired
NodeWright (created after it, not done with it yet, not ignored, not tainted),
marks them so they are never tainted twice, and lifts the taint after validation; with
reapplyOnReboot a node that rebooted is tainted again, once per boot, until it is done."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import msgspec
import pytest

from services.validator import core
from services.validator.service import Validator
from shared import api, nodestate, progress
from shared.decisions import Keep
from shared.records.executor import ExecutorRecord, PackageRecord
from shared.records.scheduler import Selection
from shared.records.validator import ValidatorRecord
from tests.helpers.facts import T0, node, nodewright, written

CR = "gpu-node-tuning"
CR_CREATED = T0 + timedelta(hours=1)
BEFORE, SAME_SECOND, AFTER = "2026-01-01T00:59:59Z", "2026-01-01T01:00:00Z", "2026-01-01T01:00:01Z"
TAINT = dict(core.READINESS_TAINT)
SEL = Selection(
    generation=1, compartment="default", batch=1, selected_at=T0, disruptive=True, target="t"
)


def _cr(name: str = CR, created: Any = CR_CREATED, **spec: Any) -> api.NodeWright:
    spec = {"runtimeRequired": True, "autoTaintNewNodes": True, **spec}
    cr = nodewright(name, **spec)
    meta = msgspec.structs.replace(cr.metadata, creation_timestamp=created)
    return msgspec.structs.replace(cr, metadata=meta)


def _node(created: str = AFTER, annotations: dict[str, str] | None = None, **kw: Any) -> Any:
    raw = node("n1", created=created, **kw)
    raw["metadata"]["annotations"].update(annotations or {})
    return raw


def _decide(cr: api.NodeWright, raw: dict[str, Any], **kw: Any) -> core.Decision:
    facts = progress.facts(raw, cr.metadata.name)
    return core.decide(
        cr=cr,
        node=facts,
        check_pods=[],
        now=CR_CREATED + timedelta(minutes=5),
        has_readiness_taint=core.has_readiness_taint(facts.taints),
        annotations=nodestate.annotations_of(raw),
        **kw,
    )


def _apply(raw: dict[str, Any], d: core.Decision, cr: str = CR) -> dict[str, Any]:
    """The node after the shell carried out the decision's taint change."""
    raw = {**raw, "metadata": {**raw["metadata"]}, "spec": {**raw["spec"]}}
    annotations = dict(raw["metadata"]["annotations"])
    taints = list(raw["spec"]["taints"])
    if d.add_readiness_taint:
        annotations[core.AUTO_TAINTED] = cr
        if d.boot_id:
            annotations[core.AUTO_TAINTED_BOOT] = d.boot_id
        taints.append(TAINT)
    if d.remove_readiness_taint:
        taints = [t for t in taints if t["key"] != TAINT["key"]]
    raw["metadata"]["annotations"], raw["spec"]["taints"] = annotations, taints
    return raw


def test_a_new_node_is_tainted_and_nothing_else_happens() -> None:
    d = _decide(_cr(), _node(AFTER))
    assert d.add_readiness_taint
    assert (d.record, d.publish) == (Keep(), ())
    assert not d.remove_readiness_taint


def test_a_node_created_in_the_same_second_as_the_nodewright_counts_as_new() -> None:
    assert _decide(_cr(), _node(SAME_SECOND)).add_readiness_taint


def test_a_node_older_than_the_nodewright_is_not_tainted() -> None:
    assert not _decide(_cr(), _node(BEFORE)).add_readiness_taint


def test_a_node_admitted_by_the_scheduler_before_the_taint_came_is_still_tainted() -> None:
    raw = _node(records={nodestate.SCHEDULER: SEL})
    assert _decide(_cr(), raw).add_readiness_taint


@pytest.mark.parametrize(
    ("owner", "record"),
    [
        (
            nodestate.EXECUTOR,
            ExecutorRecord(
                packages={
                    "nvidia-tuned": PackageRecord(
                        version="0.9.0", stage="apply", state="running", updated=T0
                    )
                }
            ),
        ),
        (nodestate.EXECUTOR, ExecutorRecord(honoured=3)),
        (nodestate.VALIDATOR, ValidatorRecord(honoured=3)),
    ],
    ids=["executor-working", "executor-reset", "validator-reset"],
)
def test_a_new_node_other_services_started_on_before_the_taint_came_is_still_tainted(
    owner: str, record: msgspec.Struct
) -> None:
    # The validator may come after the scheduler and the executor: the packages are not in
    # place yet, so the node still must not take workloads.
    raw = _node(records={nodestate.SCHEDULER: SEL, owner: record})
    assert _decide(_cr(), raw).add_readiness_taint


def test_a_new_node_already_done_with_the_nodewright_is_not_tainted() -> None:
    cr = _cr()
    validated = ValidatorRecord(validated=progress.target_digest(cr), at=T0)
    raw = _node(records={nodestate.EXECUTOR: DONE_EXE, nodestate.VALIDATOR: validated})
    assert progress.node_done(cr, progress.facts(raw, CR)), "the premise"
    assert not _decide(cr, raw).add_readiness_taint


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(_node(taints=[TAINT]), id="tainted-by-provisioning"),
        pytest.param(
            _node(taints=[{"key": TAINT["key"], "value": "true", "effect": "NoExecute"}]),
            id="tainted-with-another-effect",
        ),
        pytest.param(_node(annotations={core.AUTO_TAINTED: CR}), id="auto-tainted-before"),
        pytest.param(_node(annotations={core.AUTO_TAINTED: "other"}), id="by-another-nodewright"),
        pytest.param(_node(labels={nodestate.IGNORE_LABEL: "true"}), id="ignored"),
        pytest.param(_node(labels={"nodepool": "cpu"}), id="not-selected"),
        pytest.param(_node(created=""), id="no-creation-time"),
        pytest.param(_node(created="yesterday"), id="bad-creation-time"),
    ],
)
def test_nodes_that_are_not_new_or_not_ours_to_taint_are_left_alone(raw: dict[str, Any]) -> None:
    d = _decide(_cr(), raw)
    assert not d.add_readiness_taint
    assert not d.remove_readiness_taint


@pytest.mark.parametrize(
    "cr",
    [
        pytest.param(_cr(runtimeRequired=False, autoTaintNewNodes=False), id="plain"),
        pytest.param(_cr(autoTaintNewNodes=False), id="runtime-required-only"),
        # The CRD refuses this combination; the core must not depend on that.
        pytest.param(_cr(runtimeRequired=False), id="auto-taint-only"),
        pytest.param(
            _cr(annotations={api.DISABLE_ANNOTATION: "true"}),
            id="disabled",
        ),
        pytest.param(_cr(created=None), id="no-creation-time"),
    ],
)
def test_only_an_enabled_runtime_required_auto_taint_nodewright_taints(
    cr: api.NodeWright,
) -> None:
    assert not _decide(cr, _node(AFTER)).add_readiness_taint


def test_a_nodewright_being_deleted_taints_nothing() -> None:
    cr = _cr()
    meta = msgspec.structs.replace(cr.metadata, deletion_timestamp=CR_CREATED)
    assert not _decide(msgspec.structs.replace(cr, metadata=meta), _node(AFTER)).add_readiness_taint


def test_a_node_is_tainted_once_and_never_again_after_the_taint_was_lifted() -> None:
    cr = _cr()
    raw = _apply(_node(AFTER), _decide(cr, _node(AFTER)))
    assert core.has_readiness_taint(raw["spec"]["taints"])
    assert raw["metadata"]["annotations"][core.AUTO_TAINTED] == CR
    assert not _decide(cr, raw).add_readiness_taint
    # Not done yet: the taint stays.
    assert not _decide(cr, raw, runtime_required_done=False).remove_readiness_taint
    lifted = _decide(cr, raw, runtime_required_done=True)
    assert lifted.remove_readiness_taint
    raw = _apply(raw, lifted)
    assert not core.has_readiness_taint(raw["spec"]["taints"])
    # The records are gone (a hand edit, a reset that removed them): still never again.
    assert not any(k.startswith(nodestate.EXECUTOR) for k in raw["metadata"]["annotations"])
    assert not _decide(cr, raw).add_readiness_taint
    # Nor for a second auto-taint NodeWright created before the node (the mark is per node).
    assert not _decide(_cr("second", created=T0), raw).add_readiness_taint


def test_a_second_nodewright_created_later_does_not_taint_nodes_already_there() -> None:
    later = _cr("second", created=CR_CREATED + timedelta(days=1))
    assert not _decide(later, _node(AFTER)).add_readiness_taint


def test_the_validator_lifts_its_own_taint_even_once_the_nodewright_dropped_runtime_required() -> (
    None
):
    raw = _node(annotations={core.AUTO_TAINTED: CR}, taints=[TAINT])
    plain = _cr(runtimeRequired=False, autoTaintNewNodes=False)
    assert _decide(plain, raw, runtime_required_done=True).remove_readiness_taint
    # A provisioning taint is not the validator's to lift for a plain NodeWright.
    provisioned = _node(taints=[TAINT])
    assert not _decide(plain, provisioned, runtime_required_done=True).remove_readiness_taint


def test_an_orphaned_auto_taint_is_lifted_only_when_no_runtime_required_nodewright_needs_it() -> (
    None
):
    mine = {core.AUTO_TAINTED: CR}

    def lift(annotations: dict[str, str], tainted: bool, done: bool) -> bool:
        return core.lift_orphaned_taint(
            CR, annotations=annotations, has_readiness_taint=tainted, runtime_required_done=done
        )

    assert lift(mine, tainted=True, done=True)
    assert not lift(mine, tainted=True, done=False)
    assert not lift(mine, tainted=False, done=True)
    assert not lift({core.AUTO_TAINTED: "other"}, tainted=True, done=True)
    assert not lift({}, tainted=True, done=True)


def test_the_mark_cannot_be_taken_for_a_nodewright_record() -> None:
    raw = _node(annotations={core.AUTO_TAINTED: CR})
    for owner in (nodestate.SCHEDULER, nodestate.DRAINER, nodestate.EXECUTOR, nodestate.VALIDATOR):
        assert nodestate.crs_with(raw, owner) == []


def test_the_shell_looks_at_new_nodes_and_at_nodes_carrying_its_taint() -> None:
    cr = _cr()
    keys = Validator._readiness_keys
    assert keys(_node(AFTER), [cr]) == [(CR, "n1")]
    assert keys(_node(BEFORE), [cr]) == []
    assert keys(_node(AFTER), []) == []
    tainted = _node(BEFORE, annotations={core.AUTO_TAINTED: "gone"}, taints=[TAINT])
    assert keys(tainted, []) == [("gone", "n1")]
    lifted = _node(AFTER, annotations={core.AUTO_TAINTED: CR})
    assert keys(lifted, [cr]) == []


# ---- reapplyOnReboot: tainted again after a reboot ------------------------------------------

DONE_EXE = ExecutorRecord(
    packages={
        "nvidia-tuned": PackageRecord(
            version="0.9.0",
            stage="config",
            state="succeeded",
            installed="0.9.0",
            config=progress.desired(_cr())["nvidia-tuned"].config_digest,
            updated=T0,
        )
    },
    boot_id="boot-1",
    honoured=1,
)


def _reset_for(boot: str, executor: ExecutorRecord | None = None) -> ExecutorRecord:
    """The executor's record once it reset the node for ``boot`` (the typed cause)."""
    return msgspec.structs.replace(executor or ExecutorRecord(honoured=1), reset_boot=boot)


def _rebooted(boot: str = "boot-2", **records: msgspec.Struct) -> dict[str, Any]:
    """An old node, auto-tainted once when it joined, now in boot ``boot``; the validator
    has followed the executor's reboot reset, if any."""
    executor = records.get("executor")
    if isinstance(executor, ExecutorRecord) and executor.reset_boot:
        validator = records.get("validator") or ValidatorRecord()
        assert isinstance(validator, ValidatorRecord)
        records["validator"] = msgspec.structs.replace(validator, reset_boot=executor.reset_boot)
    raw: dict[str, Any] = _node(
        BEFORE,
        annotations={core.AUTO_TAINTED: CR, core.AUTO_TAINTED_BOOT: "boot-1"},
        boot_id=boot,
        records={getattr(nodestate, owner.upper()): rec for owner, rec in records.items()},
    )
    return raw


def test_a_rebooted_node_is_tainted_again_once_per_boot_until_it_is_done() -> None:
    cr = _cr(reapplyOnReboot=True)
    # The executor reset the node for boot-2 (no packages left).
    raw = _rebooted(executor=_reset_for("boot-2"))
    d = _decide(cr, raw)
    assert d.add_readiness_taint
    assert d.boot_id == "boot-2"
    raw = _apply(raw, d)
    assert raw["metadata"]["annotations"][core.AUTO_TAINTED_BOOT] == "boot-2"
    # Lifted once done, and not tainted again in the same boot.
    lifted = _decide(cr, raw, runtime_required_done=True)
    assert lifted.remove_readiness_taint
    raw = _apply(raw, lifted)
    assert not _decide(cr, raw).add_readiness_taint
    # The next boot is another story, once the executor reset the node for it.
    raw = _rebooted("boot-3", executor=_reset_for("boot-3"))
    raw["metadata"]["annotations"][core.AUTO_TAINTED_BOOT] = "boot-2"
    assert _decide(cr, raw).add_readiness_taint


def test_the_validator_forgets_its_verdicts_once_for_the_executors_reboot_reset() -> None:
    cr = _cr(reapplyOnReboot=True)
    validated = ValidatorRecord(validated=progress.target_digest(cr), at=T0, honoured=1)
    raw = _node(
        BEFORE,
        boot_id="boot-2",
        records={
            nodestate.EXECUTOR: _reset_for("boot-2"),
            nodestate.VALIDATOR: validated,
        },
    )
    d = _decide(cr, raw)
    assert written(d.record, ValidatorRecord) == ValidatorRecord(honoured=1, reset_boot="boot-2")
    followed = _node(
        BEFORE,
        boot_id="boot-2",
        records={
            nodestate.EXECUTOR: _reset_for("boot-2"),
            nodestate.VALIDATOR: written(d.record, ValidatorRecord),
        },
    )
    assert isinstance(_decide(cr, followed).record, Keep), "once"


@pytest.mark.parametrize(
    ("cr", "raw"),
    [
        pytest.param(_cr(), _rebooted(executor=_reset_for("boot-2")), id="no-reapply"),
        pytest.param(
            _cr(reapplyOnReboot=True, autoTaintNewNodes=False),
            _rebooted(executor=_reset_for("boot-2")),
            id="no-auto-taint",
        ),
        pytest.param(
            _cr(reapplyOnReboot=True),
            _rebooted(executor=ExecutorRecord(honoured=1)),
            id="no-reset-made",
        ),
        pytest.param(
            _cr(reapplyOnReboot=True),
            _rebooted(executor=_reset_for("boot-1")),
            id="reset-of-an-earlier-boot",
        ),
        pytest.param(
            _cr(reapplyOnReboot=True),
            _rebooted(
                "boot-2",
                executor=_reset_for("boot-2", DONE_EXE),
                # Reset for boot-2, then applied and validated again.
                validator=ValidatorRecord(
                    validated=progress.target_digest(_cr(reapplyOnReboot=True)), at=T0, honoured=1
                ),
            ),
            id="done-in-this-boot",
        ),
    ],
)
def test_a_reboot_taints_only_with_reapply_auto_taint_and_the_reset_of_this_boot(
    cr: api.NodeWright, raw: dict[str, Any]
) -> None:
    assert not _decide(cr, raw).add_readiness_taint


def test_the_done_premise_of_the_reboot_cases_holds() -> None:
    cr = _cr(reapplyOnReboot=True)
    validated = ValidatorRecord(validated=progress.target_digest(cr), at=T0)
    facts = progress.facts(_rebooted(executor=DONE_EXE, validator=validated), CR)
    assert progress.node_done(cr, facts)
