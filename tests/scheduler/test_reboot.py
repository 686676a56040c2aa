"""spec.reapplyOnReboot: a node that rebooted since its packages completed starts over, once
per boot (pure cores, no I/O)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from services.executor import core as executor_core
from services.scheduler import core
from shared import nodestate, progress
from shared.nodestate import ExecutorRecord, PackageRecord, Requests, Selection, ValidatorRecord
from tests.helpers.facts import T0, node, nodewright

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


def test_a_node_rebooted_since_completion_gets_one_reset_per_boot() -> None:
    cr = nodewright(reapplyOnReboot=True)
    rebooted = _facts(cr, boot_id="boot-2", recorded="boot-1")
    assert progress.turn(cr, rebooted) == "done"
    first = core.reboot_reset(cr, rebooted, Requests(), T0)
    assert first is not None
    (req,) = first.requests
    assert (req.action, req.seq) == ("reset", 1)
    assert req.by.endswith("boot-2")
    assert core.reboot_reset(cr, rebooted, first, T0 + timedelta(seconds=5)) is None, "once"
    # A later reboot is a new boot: another reset.
    again = _facts(cr, boot_id="boot-3", recorded="boot-2")
    second = core.reboot_reset(cr, again, first, T0)
    assert second is not None
    assert [r.seq for r in second.requests] == [1, 2]


def test_no_reset_without_the_option_an_unchanged_boot_or_a_node_not_done() -> None:
    cr = nodewright(reapplyOnReboot=True)
    assert (
        core.reboot_reset(nodewright(), _facts(cr, boot_id="b2", recorded="b1"), Requests(), T0)
        is None
    )
    assert core.reboot_reset(cr, _facts(cr, boot_id="b1", recorded="b1"), Requests(), T0) is None
    assert core.reboot_reset(cr, _facts(cr, boot_id="b2", recorded=""), Requests(), T0) is None
    ignored = _facts(cr, boot_id="b2", recorded="b1", labels={nodestate.IGNORE_LABEL: "true"})
    assert core.reboot_reset(cr, ignored, Requests(), T0) is None
    selected = Selection(
        generation=1,
        compartment="__default__",
        batch=1,
        selected_at=T0,
        disruptive=True,
        target="x",
    )
    busy = _facts(cr, boot_id="b2", recorded="b1", records={nodestate.SCHEDULER: selected})
    assert core.reboot_reset(cr, busy, Requests(), T0) is None, "mid-rollout: not done yet"
    other = _facts(cr, boot_id="b2", recorded="b1", labels={"nodepool": "cpu"})
    assert core.reboot_reset(cr, other, Requests(), T0) is None, "not a target"


def test_the_executor_records_the_boot_its_packages_completed_in() -> None:
    cr = nodewright()
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
            nodestate.check_key("nvidia-tuned", d.version, "config"): nodestate.CheckRecord(
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
    assert decision.record is not None
    assert decision.record.packages["nvidia-tuned"].installed == d.version
    assert decision.record.boot_id == "boot-7"
    mid = executor_core.decide(
        cr=cr,
        node=progress.facts(node("n2", boot_id="boot-7", records={nodestate.SCHEDULER: sel}), CR),
        node_pods=[],
        now=T0,
    )
    assert mid.record is not None
    assert mid.record.boot_id == "", "nothing complete yet"
