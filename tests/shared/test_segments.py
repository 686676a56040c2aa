"""Issue 15: one pod per segment of a package's cycle. The executor's and the validator's
cores, driven together over real pod manifests (``shared.podspec``) read as parts
(``shared.pods.parts``): a segment (``apply`` then ``config``) runs in one pod, costs one
executor write (its start) and one validator write (the verdict on its last check), and
says every stage's start and end and every check's pass as events; a failure anywhere in it
is recorded as the stage or check that failed, and a retry starts a pod from there."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import msgspec

from services.executor import core as executor_core
from services.validator import core as validator_core
from shared import events, nodestate, pods, podspec, progress
from shared.decisions import Write
from shared.nodestate import Request, Requests
from shared.pods import PodView
from shared.records.drainer import DrainRecord
from shared.records.executor import ExecutorRecord
from shared.records.scheduler import Selection
from shared.records.validator import ValidatorRecord
from tests.helpers.facts import T0, node, nodewright

CR = "gpu-node-tuning"
PKG = "nvidia-tuned"
SEL = Selection(
    generation=1, compartment="default", batch=1, selected_at=T0, disruptive=True, target="t"
)
DRAINED = DrainRecord(phase="drained", cordoned=True, started=T0, since=T0)
SETTINGS = podspec.PodSettings(namespace="nw", agent_image="registry.example/agent:1")


def _ts(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Node:
    """One node's records and NodeWright pods, as the two cores' decisions leave them."""

    cr: Any = field(default_factory=nodewright)
    executor: ExecutorRecord = field(default_factory=ExecutorRecord)
    validator: ValidatorRecord = field(default_factory=ValidatorRecord)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    writes: dict[str, int] = field(default_factory=lambda: {"executor": 0, "validator": 0})
    said: list[events.Event] = field(default_factory=list)
    requests: Requests = field(default_factory=Requests)
    settings: podspec.PodSettings = SETTINGS

    def retry(self, at: datetime) -> None:
        """``nodewright node retry``, the drainer having honoured it (it has nothing to do)."""
        self.requests = nodestate.add_request(None, Request(seq=0, action="retry", at=at))

    def facts(self) -> progress.NodeFacts:
        drain = msgspec.structs.replace(DRAINED, honoured=self.requests.latest)
        records: dict[str, Any] = {nodestate.SCHEDULER: SEL, nodestate.DRAINER: drain}
        if self.executor != ExecutorRecord():
            records[nodestate.EXECUTOR] = self.executor
        if self.validator != ValidatorRecord():
            records[nodestate.VALIDATOR] = self.validator
        return progress.facts(node("n1", records=records), CR)

    def _parts(self, role: str) -> list[PodView]:
        return [p for pod in self.pods.values() for p in pods.parts(pod) if (p.role == role)]

    def run_executor(self, now: datetime) -> executor_core.Decision:
        d = executor_core.decide(
            cr=self.cr,
            node=self.facts(),
            node_pods=[p for p in self._parts("stage")],
            now=now,
            requests=self.requests,
        )
        if isinstance(d.record, Write):
            self.executor = d.record.record
            self.writes["executor"] += 1
        self.said += [e for said in d.announce.values() for e in said]
        self.said += list(d.publish)
        for req in d.create:
            make = podspec.interrupt_pod if req.role == "interrupt" else podspec.stage_pod
            extra = {} if req.role == "interrupt" else {"node_metadata": "{}"}
            body = make(
                req,
                cr=self.cr,
                node="n1",
                node_annotations={},
                settings=self.settings,
                **extra,
            )
            body["metadata"]["creationTimestamp"] = _ts(now)
            body["status"] = {"phase": "Pending"}
            self.pods.setdefault(req.name, body)
        for name in d.delete:
            self.pods.pop(name, None)
        for name in d.stop:
            # What the kubelet does once activeDeadlineSeconds is past: the pod ends, Failed.
            self.pods[name]["spec"]["activeDeadlineSeconds"] = 1
            self.pods[name]["status"]["phase"] = "Failed"
        return d

    def stopped(self) -> bool:
        """The one pod was stopped and kept (for its logs)."""
        pod = self.the_pod()
        return bool(
            pod["spec"].get("activeDeadlineSeconds") == 1 and pod["status"]["phase"] == "Failed"
        )

    def run_validator(self, now: datetime) -> validator_core.Decision:
        d = validator_core.decide(
            cr=self.cr,
            node=self.facts(),
            check_pods=self._parts("check"),
            now=now,
            requests=self.requests,
        )
        if isinstance(d.record, Write):
            self.validator = d.record.record
            self.writes["validator"] += 1
        self.said += [e for said in d.announce.values() for e in said]
        self.said += list(d.publish)
        return d

    def run(self, now: datetime) -> None:
        """Each core until neither has anything more to write."""
        for _ in range(6):
            before = (self.executor, self.validator)
            self.run_validator(now)
            self.run_executor(now)
            if (self.executor, self.validator) == before:
                return

    def the_pod(self) -> dict[str, Any]:
        (pod,) = self.pods.values()
        return pod

    def progress(self, *codes: int | None, at: datetime) -> None:
        """The pod's containers in order: exit codes of those that ended (None: the next
        one runs), each ending a second after the one before."""
        pod = self.the_pod()
        spec = pod["spec"]
        names = [c["name"] for c in [*(spec.get("initContainers") or []), *spec["containers"]]]
        states: dict[str, dict[str, Any]] = {}
        for i, name in enumerate(names):
            code = codes[i] if i < len(codes) else "waiting"
            if code is None:
                states[name] = {"running": {"startedAt": _ts(at)}}
            elif code == "waiting":
                states[name] = {"waiting": {"reason": "PodInitializing"}}
            else:
                ended = at - timedelta(seconds=len(codes) - i)
                states[name] = {"terminated": {"exitCode": code, "finishedAt": _ts(ended)}}
        failed = any(c for c in codes if c)
        done = len(codes) == len(names) and all(c == 0 for c in codes)
        inits = spec.get("initContainers") or []
        pod["status"] = {
            "phase": "Failed" if failed else "Succeeded" if done else "Pending",
            "initContainerStatuses": [
                {"name": c["name"], "state": states[c["name"]]} for c in inits
            ],
            "containerStatuses": [
                {"name": c["name"], "state": states[c["name"]]} for c in spec["containers"]
            ],
        }

    def kinds(self) -> list[tuple[str, str]]:
        seen: dict[str, tuple[str, str]] = {}
        for e in self.said:
            seen.setdefault(e.id, (e.kind, str(getattr(e, "stage", ""))))
        return list(seen.values())


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_segment_runs_apply_and_config_in_one_pod_for_one_write_each() -> None:
    n = Node()
    n.run(_at(0))
    pod = n.the_pod()
    assert pod["metadata"]["annotations"][pods.ANN_STAGES] == "apply,config"
    assert n.writes == {"executor": 1, "validator": 0}

    # apply exited 0, its check runs; then passed and config runs; then config passed and
    # its check runs: nothing is written, each step is said from the pod.
    for t, codes in ((10, (0, None)), (20, (0, 0, None)), (30, (0, 0, 0, None))):
        n.progress(*codes, at=_at(t))
        n.run(_at(t))
        assert n.writes == {"executor": 1, "validator": 0}, codes
        assert n.facts().executor.packages[PKG].stage == "apply"
    assert n.kinds() == [
        ("stage.started", "apply"),
        ("stage.succeeded", "apply"),
        ("stage.validated", "apply"),
        ("stage.started", "config"),
        ("stage.succeeded", "config"),
    ]

    # The last check passed: the validator's one write records the whole pod; the package
    # reads as installed, and the pod goes. The write's outbox holds what the pod said of
    # its first check too: said from the pod only, a NATS outage then would lose it.
    n.progress(0, 0, 0, 0, at=_at(40))
    final = n.run_validator(_at(40))
    assert [(e.kind, getattr(e, "stage", "")) for e in final.publish] == [
        ("stage.validated", "apply"),
        ("stage.validated", "config"),
        ("node.validated", ""),
    ]
    n.run(_at(40))
    assert n.writes == {"executor": 1, "validator": 1}
    r = n.facts().executor.packages[PKG]
    assert (r.stage, r.state, r.installed) == ("config", "succeeded", "0.9.0")
    assert progress.package_done(progress.desired(n.cr)[PKG], r)
    assert [k for k in n.kinds()[5:]] == [("stage.validated", "config"), ("node.validated", "")]
    n.run(_at(70))
    assert n.pods == {}, "the pod goes once the stream holds what it said"
    assert n.writes == {"executor": 1, "validator": 1}
    # The events a later pass makes again are the same ones (same ids).
    assert len({e.id for e in n.said}) == 7


def test_a_stage_after_the_first_that_fails_is_recorded_and_retried_from_there() -> None:
    n = Node()
    n.run(_at(0))
    first = next(iter(n.pods))
    n.progress(0, 0, 7, at=_at(30))
    n.run(_at(30))
    r = n.executor.packages[PKG]
    assert (r.stage, r.state, r.attempt) == ("config", "failed", 1)
    assert r.reason is not None
    assert r.reason.code == "StageFailed"
    assert [k for k, _ in n.kinds()].count("stage.failed") == 1
    failed = next(e for e in n.said if isinstance(e, events.StageFailed))
    assert failed.stage == "config"
    assert failed.started == _at(28), "config started when apply's check ended"
    assert first in n.pods, "kept for its logs"

    n.retry(_at(40))
    n.run(_at(40))
    n.run(_at(41))
    assert first not in n.pods
    (retry,) = n.pods.values()
    assert retry["metadata"]["annotations"][pods.ANN_STAGES] == "config"
    assert retry["metadata"]["annotations"][pods.ANN_ATTEMPT] == "2"


def test_a_check_that_fails_between_two_stages_stops_the_pod_there() -> None:
    n = Node()
    n.run(_at(0))
    n.progress(0, 3, at=_at(20))
    n.run(_at(20))
    key = nodestate.check_key(PKG, "0.9.0", "apply")
    v = n.validator.checks[key]
    assert (v.verdict, v.attempt) == ("failed", 1)
    assert n.writes == {"executor": 1, "validator": 1}
    r = n.facts().executor.packages[PKG]
    assert (r.stage, r.state) == ("apply", "succeeded")
    (parts,) = [pods.parts(p) for p in n.pods.values()]
    assert [p.phase for p in parts][2:] == ["Pending", "Pending"], "config never runs"
    assert ("stage.started", "config") not in n.kinds()


def test_the_last_check_failing_is_recorded_as_its_stage_and_retried_alone() -> None:
    n = Node()
    n.run(_at(0))
    n.progress(0, 0, 0, 4, at=_at(40))
    n.run(_at(40))
    v = n.validator.checks[nodestate.check_key(PKG, "0.9.0", "config")]
    assert v.verdict == "failed"
    r = n.facts().executor.packages[PKG]
    assert (r.stage, r.state, r.attempt) == ("config", "succeeded", 1)
    n.retry(_at(50))
    n.run(_at(50))
    n.run(_at(51))
    stages = sorted(p["metadata"]["annotations"][pods.ANN_STAGES] for p in n.pods.values())
    assert stages == ["config"], "the failed pod goes with the retry; the new one runs config"


def test_a_stage_after_the_first_times_out_from_its_own_start() -> None:
    n = Node()
    n.cr = nodewright(stageTimeoutSeconds=100)
    n.run(_at(0))
    n.progress(0, 0, None, at=_at(90))  # config runs since 88 s
    n.run(_at(150))
    assert n.executor.packages[PKG].state == "running", "config has run 62 s of its 100"
    n.run(_at(190))
    r = n.executor.packages[PKG]
    assert (r.stage, r.state) == ("config", "failed")
    assert r.reason is not None
    assert r.reason.code == "StageTimeout"
    assert n.stopped(), "a timed-out stage is stopped, its pod kept for its logs"


def test_an_abort_fails_the_stage_the_pod_has_reached_and_a_retry_runs_it_again() -> None:
    """The pod runs config (apply and its check passed, unwritten): ``nodewright node
    abort`` fails config, where the pod is, not apply, the record's last written stage; the
    pod is stopped and kept; the retry runs config again as attempt 2."""
    n = Node()
    n.run(_at(0))
    n.progress(0, 0, None, at=_at(10))  # config runs since 8 s
    n.run(_at(10))
    assert (n.executor.packages[PKG].stage, n.executor.packages[PKG].state) == (
        "apply",
        "running",
    )
    n.requests = nodestate.add_request(None, Request(seq=0, action="abort", at=_at(20)))
    n.run(_at(20))
    r = n.executor.packages[PKG]
    assert (r.stage, r.state, r.attempt) == ("config", "failed", 1)
    assert r.reason is not None
    assert r.reason.code == "StageAborted"
    assert ("stage.failed", "config") in n.kinds()
    assert n.stopped()
    n.requests = nodestate.add_request(n.requests, Request(seq=0, action="retry", at=_at(30)))
    n.run(_at(30))
    n.run(_at(31))
    fresh = [p for p in n.pods.values() if p["spec"].get("activeDeadlineSeconds") is None]
    (pod,) = fresh
    assert pod["metadata"]["annotations"][pods.ANN_STAGES] == "config"
    assert n.executor.packages[PKG].attempt == 2


def test_a_check_between_two_stages_that_times_out_stops_the_pod() -> None:
    """Its pod would otherwise go on to the next stage once the check ended, on a node whose
    record says the check failed."""
    n = Node()
    n.cr = nodewright(stageTimeoutSeconds=100)
    n.run(_at(0))
    n.progress(0, None, at=_at(10))  # apply ended at 9 s, its check runs
    n.run(_at(200))
    v = n.validator.checks[nodestate.check_key(PKG, "0.9.0", "apply")]
    assert v.reason is not None
    assert v.reason.code == "CheckTimeout"
    n.run(_at(230))
    assert n.stopped()


def with_interrupt() -> Any:
    """The NodeWright of :class:`Node` with a service interrupt (kubelet) on its package."""
    return nodewright(
        packages={
            PKG: {
                "version": "0.9.0",
                "image": "ghcr.io/nvidia/nodewright-packages/nvidia-tuned",
                "interrupt": {"type": "service", "services": ["kubelet"]},
            }
        }
    )


def test_a_cycle_with_an_interrupt_runs_it_after_the_segment() -> None:
    n = Node(cr=with_interrupt())
    n.run(_at(0))
    assert n.the_pod()["metadata"]["annotations"][pods.ANN_STAGES] == "apply,config"
    n.progress(0, 0, 0, 0, at=_at(40))
    n.run(_at(40))
    r = n.executor.packages[PKG]
    assert (r.stage, r.state) == ("interrupt", "running")
    assert any(p["metadata"]["labels"][pods.LABEL_ROLE] == "interrupt" for p in n.pods.values())
    assert n.executor.interrupt is not None
