"""Issue 12, case 5: ``nodewright node reset`` repairs a record that does not decode. Every
owner drops its own undecodable record once a reset newer than the mark still readable from
it asks for it; the next pass starts a fresh record that has honoured every request, so the
reset is not repeated."""

from __future__ import annotations

import pytest

from services.drainer import core as drainer_core
from services.executor import core as executor_core
from services.validator import core as validator_core
from shared import nodestate, progress, recovery
from shared.decisions import Remove
from shared.nodestate import Request
from shared.records.drainer import DrainRecord
from shared.records.executor import ExecutorRecord
from shared.records.scheduler import Selection
from shared.rollout import kernel
from shared.rollout.book import BatchBook
from tests.helpers.facts import T0, node, nodewright, written

CR = "gpu-node-tuning"
SEL = Selection(
    generation=1, compartment="__default__", batch=1, selected_at=T0, disruptive=True, target="t"
)
MARKED = '{"honoured": 1, "packages": 7, "checks": 7, "phase": 7, "batch": "x"}'
"""Decodes as JSON, as none of the records: the mark 1 is still readable."""
OWNERS = (nodestate.SCHEDULER, nodestate.DRAINER, nodestate.EXECUTOR, nodestate.VALIDATOR)


def _broken(owner: str, raw: str, *requests: str) -> progress.NodeFacts:
    obj = node("n1", records={nodestate.SCHEDULER: SEL} if owner != nodestate.SCHEDULER else {})
    annotations = obj["metadata"]["annotations"]
    annotations[nodestate.key(owner, CR)] = raw
    reqs = None
    for action in requests:
        reqs = nodestate.add_request(
            reqs,
            Request(seq=0, action=action, at=T0, by="me@host"),  # type: ignore[arg-type]
        )
    if reqs is not None:
        annotations[nodestate.key(nodestate.REQUESTS, CR)] = nodestate.patch(
            nodestate.REQUESTS, CR, reqs
        )["metadata"]["annotations"][nodestate.key(nodestate.REQUESTS, CR)]
    return progress.facts(obj, CR)


def _removed(owner: str, facts: progress.NodeFacts) -> bool:
    """Whether ``owner``'s core removes its record from the node."""
    cr = nodewright()
    match owner:
        case nodestate.SCHEDULER:
            p = kernel.plan(
                cr=cr, policy=None, nodes=[facts], book=BatchBook(), ctx=kernel.Context(now=T0)
            )
            return [r.node for r in p.release] == ["n1"]
        case nodestate.DRAINER:
            d = drainer_core.decide(cr_name=CR, cr=cr, node=facts, others={}, pods=[], now=T0)
            return d.write is not None and isinstance(d.write.record, Remove)
        case nodestate.EXECUTOR:
            return isinstance(
                executor_core.decide(cr=cr, node=facts, node_pods=[], now=T0).record, Remove
            )
        case _:
            return isinstance(
                validator_core.decide(cr=cr, node=facts, check_pods=[], now=T0).record, Remove
            )


@pytest.mark.parametrize("owner", OWNERS)
@pytest.mark.parametrize(
    ("raw", "requests", "removed"),
    [
        pytest.param("{garbage", ("reset",), True, id="garbage-reset"),
        pytest.param("{garbage", (), False, id="garbage-no-request"),
        pytest.param("{garbage", ("retry",), False, id="garbage-retry-is-no-reset"),
        pytest.param(MARKED, ("reset",), False, id="reset-already-seen"),
        pytest.param(MARKED, ("reset", "reset"), True, id="newer-reset"),
    ],
)
def test_an_undecodable_record_goes_once_a_reset_newer_than_it_asks(
    owner: str, raw: str, requests: tuple[str, ...], removed: bool
) -> None:
    facts = _broken(owner, raw, *requests)
    assert nodestate.key(owner, CR) in facts.malformed
    assert recovery.reset_malformed(facts, owner, CR) is removed
    assert _removed(owner, facts) is removed


def test_the_readable_mark_of_a_broken_record() -> None:
    assert nodestate.readable_mark("{garbage") == 0
    assert nodestate.readable_mark('{"honoured": 3, "phase": 7}') == 3
    assert nodestate.readable_mark('{"honoured": true}') == 0
    assert nodestate.readable_mark("[1, 2]") == 0


def test_a_node_with_an_undecodable_admission_holds_its_slot_until_the_reset() -> None:
    cr = nodewright(interruptionBudget={"count": 1})
    broken = _broken(nodestate.SCHEDULER, "{garbage")
    other = progress.facts(node("n2"), CR)
    p = kernel.plan(
        cr=cr, policy=None, nodes=[broken, other], book=BatchBook(), ctx=kernel.Context(now=T0)
    )
    assert p.compartments[0].holders == (("n1", "its admission record does not decode"),)
    assert p.admit == ()
    reason = p.waiting["n1"]
    assert reason.code == "NodeStateMalformed"
    assert "nodewright node reset" in reason.message


def test_a_fresh_record_after_the_reset_has_honoured_it() -> None:
    """The reset is not repeated: the record the executor starts next marks it honoured."""
    cr = nodewright()
    obj = node("n1", records={nodestate.SCHEDULER: SEL})
    reqs = nodestate.add_request(None, Request(seq=0, action="reset", at=T0))
    obj["metadata"]["annotations"][nodestate.key(nodestate.REQUESTS, CR)] = nodestate.patch(
        nodestate.REQUESTS, CR, reqs
    )["metadata"]["annotations"][nodestate.key(nodestate.REQUESTS, CR)]
    obj["metadata"]["annotations"][nodestate.key(nodestate.DRAINER, CR)] = nodestate.patch(
        nodestate.DRAINER,
        CR,
        DrainRecord(phase="drained", cordoned=True, started=T0, since=T0, honoured=1),
    )["metadata"]["annotations"][nodestate.key(nodestate.DRAINER, CR)]
    d = executor_core.decide(cr=cr, node=progress.facts(obj, CR), node_pods=[], now=T0)
    assert d.create, "the node starts over"
    assert written(d.record, ExecutorRecord).honoured == 1


def test_requests_numbered_again_after_a_broken_requests_annotation_stay_above_every_mark() -> None:
    """Without the floor, a request numbered 1 after the annotation was lost would be below
    the marks the services already have, and never honoured."""
    lost = nodestate.add_request(None, Request(seq=0, action="reset", at=T0), floor=5)
    assert lost.latest == 6
    assert lost.after(5) == lost.requests
    kept = nodestate.add_request(lost, Request(seq=0, action="retry", at=T0), floor=2)
    assert kept.latest == 7
