"""spec.reapplyOnReboot: a node that rebooted since its packages completed starts over, once
per boot; the executor resets its own record and keeps the typed cause (``reset_boot``), which
the validator follows (pure cores, no I/O)."""

from __future__ import annotations

from typing import Any

from services.executor import core as executor_core
from shared import events, nodestate, progress, recovery
from shared.decisions import Keep
from shared.records.executor import ExecutorRecord, PackageRecord
from shared.records.scheduler import Selection
from shared.records.validator import CheckRecord, ValidatorRecord
from tests.helpers.facts import T0, node, nodewright, selection, written

CR = "gpu-node-tuning"


def _done_records(cr: Any, boot_id: str) -> dict[str, Any]:
    d = progress.desired(cr)["nvidia-tuned"]
    return {
        nodestate.EXECUTOR: ExecutorRecord(
            packages={
                "nvidia-tuned": PackageRecord(
                    version=d.version,
                    stage="config",
                    state="succeeded",
                    installed=d.version,
                    config=d.config_digest,
                    updated=T0,
                )
            },
            boot_id=boot_id,
        ),
        nodestate.VALIDATOR: ValidatorRecord(validated=progress.target_digest(cr)),
    }


def _facts(cr: Any, *, boot_id: str, recorded: str, **kw: Any) -> progress.NodeFacts:
    records = _done_records(cr, recorded)
    records.update(kw.pop("records", {}))
    return progress.facts(node("n1", boot_id=boot_id, records=records, **kw), CR)


def _decide(cr: Any, facts: progress.NodeFacts) -> executor_core.Decision:
    return executor_core.decide(cr=cr, node=facts, node_pods=[], now=T0)


def test_a_node_rebooted_since_completion_is_reset_once_per_boot_with_a_typed_cause() -> None:
    cr = nodewright(reapplyOnReboot=True)
    rebooted = _facts(cr, boot_id="boot-2", recorded="boot-1")
    assert recovery.rebooted(cr, rebooted) == "boot-2"
    first = _decide(cr, rebooted)
    reset = written(first.record, ExecutorRecord)
    assert reset == ExecutorRecord(reset_boot="boot-2"), "packages forgotten, the cause kept"
    (event,) = first.publish
    assert isinstance(event, events.NodeRebooted)
    assert (event.boot_id_before, event.boot_id) == ("boot-1", "boot-2")
    # The reset record no longer says the packages completed in boot-1: no second reset.
    after = _facts(cr, boot_id="boot-2", recorded="", records={nodestate.EXECUTOR: reset})
    assert recovery.rebooted(cr, after) == ""
    # Done again in boot-2, then rebooted into boot-3: the next reset.
    again = _facts(cr, boot_id="boot-3", recorded="boot-2")
    assert written(_decide(cr, again).record, ExecutorRecord).reset_boot == "boot-3"


def test_no_reset_without_the_option_an_unchanged_boot_or_a_node_not_done() -> None:
    assert recovery.rebooted(nodewright(), _facts(nodewright(), boot_id="b2", recorded="b1")) == ""
    cr = nodewright(reapplyOnReboot=True)
    assert recovery.rebooted(cr, _facts(cr, boot_id="b1", recorded="b1")) == ""
    assert recovery.rebooted(cr, _facts(cr, boot_id="b2", recorded="")) == ""
    ignored = _facts(cr, boot_id="b2", recorded="b1", labels={nodestate.IGNORE_LABEL: "true"})
    assert recovery.rebooted(cr, ignored) == ""
    sel = selection("x")
    busy = _facts(cr, boot_id="b2", recorded="b1", records={nodestate.SCHEDULER: sel})
    assert recovery.rebooted(cr, busy) == "", "mid-rollout: not done yet"
    other = _facts(cr, boot_id="b2", recorded="b1", labels={"nodepool": "cpu"})
    assert recovery.rebooted(cr, other) == "", "not a target"


def test_the_executor_starts_nothing_until_the_validator_forgot_the_reboots_validation() -> None:
    cr = nodewright(reapplyOnReboot=True)
    sel = Selection(
        generation=1,
        compartment="__default__",
        batch=1,
        selected_at=T0,
        disruptive=False,
        target=progress.target_digest(cr),
    )
    validated = ValidatorRecord(validated=progress.target_digest(cr))
    records: dict[str, Any] = {
        nodestate.SCHEDULER: sel,
        nodestate.EXECUTOR: ExecutorRecord(reset_boot="boot-2"),
        nodestate.VALIDATOR: validated,
    }
    behind = progress.facts(node("n1", boot_id="boot-2", records=records), CR)
    assert _decide(cr, behind).create == (), "the old validation would end the node at once"
    records[nodestate.VALIDATOR] = ValidatorRecord(reset_boot="boot-2")
    followed = progress.facts(node("n1", boot_id="boot-2", records=records), CR)
    assert [r.stage for r in _decide(cr, followed).create] == ["apply"]


def test_the_executor_records_the_boot_its_packages_completed_in() -> None:
    cr = nodewright(reapplyOnReboot=True)
    d = progress.desired(cr)["nvidia-tuned"]
    at_config = ExecutorRecord(
        packages={
            "nvidia-tuned": PackageRecord(
                version=d.version,
                stage="config",
                state="succeeded",
                installed="",
                config="",
                previous="",
                cycle_config=d.config_digest,
                updated=T0,
            )
        }
    )
    sel = Selection(
        generation=1,
        compartment="__default__",
        batch=1,
        selected_at=T0,
        disruptive=False,
        target="x",
    )
    checks = ValidatorRecord(
        checks={
            nodestate.check_key("nvidia-tuned", d.version, "config"): CheckRecord(
                verdict="passed", at=T0
            )
        }
    )
    facts = progress.facts(
        node(
            "n1",
            boot_id="boot-7",
            records={
                nodestate.SCHEDULER: sel,
                nodestate.EXECUTOR: at_config,
                nodestate.VALIDATOR: checks,
            },
        ),
        CR,
    )
    decision = executor_core.decide(cr=cr, node=facts, node_pods=[], now=T0)
    record = written(decision.record, ExecutorRecord)
    assert record.packages["nvidia-tuned"].installed == d.version
    assert record.boot_id == "boot-7"
    mid = executor_core.decide(
        cr=cr,
        node=progress.facts(node("n2", boot_id="boot-7", records={nodestate.SCHEDULER: sel}), CR),
        node_pods=[],
        now=T0,
    )
    assert written(mid.record, ExecutorRecord).boot_id == "", "nothing complete yet"
    # Without reapplyOnReboot nobody reads the boot: the packages' end costs no write.
    quiet = executor_core.decide(cr=nodewright(), node=facts, node_pods=[], now=T0)
    assert isinstance(quiet.record, Keep)
