"""What ``nodewright pause|resume|disable|enable``, ``node list``, ``package status`` and
``package logs`` print and select, from the pure functions behind them (no I/O): known CRs
and Node objects in, exact lines out. The same commands run against the API server in
``test_lifecycle_cmds.py`` and ``test_inspect_cmds.py``."""

from __future__ import annotations

from typing import Any

import click
import msgspec
import pytest

from nodewright import cli, lifecycle_cmd, node_cmd, output, package_cmd
from shared import api, nodestate, pods
from shared.config import ServiceSettings
from shared.events import Reason
from shared.records.executor import ExecutorRecord, PackageRecord
from shared.records.scheduler import Selection
from shared.records.validator import CheckRecord, ValidatorRecord
from tests.helpers.facts import T0, node, nodewright, reported
from tests.helpers.segment import CYCLE, segment_pod

PACKAGES = {
    "tuning": {"version": "1.0.0", "image": "registry.example/tuning"},
    "driver": {"version": "2.0.0", "image": "registry.example/driver"},
}
FAILED = Reason(code="StageFailed", message="pod p exited with code 1")


def _cr() -> api.NodeWright:
    return nodewright(packages=PACKAGES)


def _selection() -> Selection:
    return Selection(
        generation=1,
        compartment="__default__",
        batch=1,
        selected_at=T0,
        disruptive=False,
        target="t",
    )


def _pkg(stage: str, state: Any, *, attempt: int = 1, version: str = "1.0.0") -> PackageRecord:
    reason = FAILED if state == "failed" else None
    return PackageRecord(
        version=version, stage=stage, state=state, attempt=attempt, reason=reason, updated=T0
    )


def _nodes() -> list[dict[str, Any]]:
    """n-a runs tuning's apply, n-b has nothing yet, n-c failed tuning's apply twice; n-x is
    not a target (another node pool)."""
    return [
        node(
            "n-c",
            records={
                nodestate.SCHEDULER: _selection(),
                nodestate.EXECUTOR: ExecutorRecord(
                    packages={"tuning": _pkg("apply", "failed", attempt=2)}
                ),
            },
            conditions=[reported("Failed", FAILED)],
        ),
        node("n-x", labels={"nodepool": "cpu"}),
        node("n-b"),
        node(
            "n-a",
            records={
                nodestate.SCHEDULER: _selection(),
                nodestate.EXECUTOR: ExecutorRecord(packages={"tuning": _pkg("apply", "running")}),
            },
            conditions=[reported("InProgress")],
        ),
    ]


# ---- pause, resume, disable, enable -----------------------------------------------------


def test_pause_says_what_being_paused_means_and_how_to_undo_it() -> None:
    lines = lifecycle_cmd.message(
        "gpu", lifecycle_cmd.SWITCHES["pause"], {api.PAUSE_ANNOTATION: "true"}, changed=True
    )
    assert lines == [
        'Paused NodeWright gpu (set annotation nodewright.nvidia.com/pause: "true"): nothing '
        "new starts: no batch opens, no node is admitted, no drain or stage starts. Work in "
        "progress finishes: stage pods already running run to the end and are checked, then "
        "their nodes wait, keeping their budget slots. It still holds back NodeWrights of a "
        "later priority (it is not done).",
        "Undo with `nodewright resume gpu`.",
    ]


def test_disable_says_the_nodewright_is_skipped() -> None:
    lines = lifecycle_cmd.message(
        "gpu", lifecycle_cmd.SWITCHES["disable"], {api.DISABLE_ANNOTATION: "true"}, changed=True
    )
    assert lines == [
        'Disabled NodeWright gpu (set annotation nodewright.nvidia.com/disable: "true"): it is '
        "skipped: nothing starts (no batch, admission, drain, stage or check), stage pods "
        "already running run to the end; its batch state is kept as it is and finished nodes "
        "are still released. NodeWrights of a later priority no longer wait for it.",
        "Undo with `nodewright enable gpu`.",
    ]


def test_resume_of_a_disabled_nodewright_says_it_stays_disabled() -> None:
    lines = lifecycle_cmd.message(
        "gpu", lifecycle_cmd.SWITCHES["resume"], {api.DISABLE_ANNOTATION: "true"}, changed=True
    )
    assert lines == [
        'Resumed NodeWright gpu (removed annotation nodewright.nvidia.com/pause: "true"): '
        "batches open and nodes are admitted again within the budget; waiting drains and "
        "stages continue where they stopped.",
        "It is also disabled: nothing starts until `nodewright enable gpu`.",
    ]


def test_enable_of_a_paused_nodewright_says_it_stays_paused() -> None:
    lines = lifecycle_cmd.message(
        "gpu", lifecycle_cmd.SWITCHES["enable"], {api.PAUSE_ANNOTATION: "true"}, changed=True
    )
    assert lines == [
        'Enabled NodeWright gpu (removed annotation nodewright.nvidia.com/disable: "true"): '
        "it rolls out again, from the batch state it was disabled in.",
        "It is also paused: nothing starts until `nodewright resume gpu`.",
    ]


@pytest.mark.parametrize(
    ("verb", "state"),
    [
        ("pause", "paused"),
        ("resume", "not paused"),
        ("disable", "disabled"),
        ("enable", "not disabled"),
    ],
)
def test_a_switch_already_in_place_changes_nothing(verb: str, state: str) -> None:
    lines = lifecycle_cmd.message("gpu", lifecycle_cmd.SWITCHES[verb], {}, changed=False)
    assert lines == [f"NodeWright gpu is already {state}; no change."]


@pytest.mark.parametrize(
    ("annotations", "verb", "on"),
    [
        ({api.PAUSE_ANNOTATION: "true"}, "pause", True),
        ({api.PAUSE_ANNOTATION: "false"}, "pause", False),
        ({api.PAUSE_ANNOTATION: "True"}, "pause", False),
        ({api.DISABLE_ANNOTATION: "true"}, "pause", False),
        ({api.DISABLE_ANNOTATION: "true"}, "enable", True),
    ],
)
def test_a_switch_is_on_exactly_as_the_services_read_it(
    annotations: dict[str, str], verb: str, on: bool
) -> None:
    switch = lifecycle_cmd.SWITCHES[verb]
    assert lifecycle_cmd.is_on(annotations, switch) is on
    cr = nodewright(annotations=annotations)
    reads = cr.paused if switch.annotation == api.PAUSE_ANNOTATION else cr.disabled
    assert reads is on


def test_each_verb_is_a_command_of_the_cli_with_the_usual_flags() -> None:
    assert set(cli.SWITCH_HELP) == set(lifecycle_cmd.SWITCHES)
    for verb in lifecycle_cmd.SWITCHES:
        command = cli.cli.commands[verb]
        ctx = command.make_context(
            verb, ["gpu", "--kubeconfig", "k", "--context", "c", "--dry-run"]
        )
        assert ctx.params == {"name": "gpu", "kubeconfig": "k", "context": "c", "dry_run": "client"}
        ctx = command.make_context(verb, ["gpu", "--dry-run=server"])
        assert ctx.params["dry_run"] == "server"


def test_every_command_that_talks_to_the_cluster_takes_n_after_it_as_kubectl_does() -> None:
    """``kubectl nodewright node list -n nodewright-system`` must not fail on ``-n``: the
    install test's user did exactly that. Commands that read a namespace get it, from after
    the command or before it."""
    seen = 0
    groups = [cli.cli, *(c for c in cli.cli.commands.values() if isinstance(c, click.Group))]
    for group in groups:
        for name, command in group.commands.items():
            if isinstance(command, click.Group) or not any(
                p.name == "kubeconfig" for p in command.params
            ):
                continue
            flags = {flag for p in command.params for flag in getattr(p, "opts", ())}
            assert "-n" in flags, f"{group.name} {name}"
            seen += 1
    assert seen >= 12
    version = cli.cli.commands["version"]

    def namespace(before: list[str], after: list[str]) -> str:
        # One invocation: a root context and the command's (click shares ``meta`` in it).
        root = cli.cli.make_context("nodewright", [*before, "version"])
        return cli._namespace(version.make_context("version", after, parent=root))

    assert namespace(["-n", "before"], ["-n", "after"]) == "after"
    assert namespace(["-n", "before"], []) == "before"
    assert namespace([], []) == cli.DEFAULT_NAMESPACE


# ---- node list --------------------------------------------------------------------------


def test_table_pads_every_column_but_the_last() -> None:
    out = output.table(("A", "BB", "C"), [["xyz", "1", "last one"], ["x", "22222", "z"]])
    assert out.splitlines() == [
        "A     BB      C",
        "xyz   1       last one",
        "x     22222   z",
    ]


@pytest.mark.parametrize(
    ("entry", "cell"),
    [
        (
            {"name": "t", "version": "1", "stage": "", "state": "pending", "attempt": 0},
            "t:1 pending",
        ),
        (
            {"name": "t", "version": "1", "stage": "apply", "state": "running", "attempt": 1},
            "t:1 apply running",
        ),
        (
            {"name": "t", "version": "1", "stage": "config", "state": "failed", "attempt": 3},
            "t:1 config failed (attempt 3)",
        ),
    ],
)
def test_package_cell(entry: dict[str, Any], cell: str) -> None:
    assert node_cmd.package_cell(entry) == cell


def test_node_list_has_one_row_per_target_node() -> None:
    rows = node_cmd.list_rows(_cr(), _nodes())
    assert node_cmd.render_list("gpu-node-tuning", rows).splitlines() == [
        "NODE   STATE        TURN        REASON        PACKAGES",
        "n-a    InProgress   executor    -             "
        "driver:2.0.0 pending, tuning:1.0.0 apply running",
        "n-b    -            scheduler   -             driver:2.0.0 pending, tuning:1.0.0 pending",
        "n-c    Failed       failed      StageFailed   "
        "driver:2.0.0 pending, tuning:1.0.0 apply failed (attempt 2)",
    ]


def test_node_list_json_carries_the_records_fields() -> None:
    rows = node_cmd.list_rows(_cr(), _nodes())
    assert [r["node"] for r in rows] == ["n-a", "n-b", "n-c"]
    assert rows[2] == {
        "node": "n-c",
        "state": "Failed",
        "turn": "failed",
        "reason": {"code": "StageFailed", "message": "pod p exited with code 1"},
        "since": T0.isoformat(),
        "compartment": "__default__",
        "batch": 1,
        "order": None,
        "cordoned": False,
        "packages": [
            {
                "name": "driver",
                "version": "2.0.0",
                "stage": "",
                "state": "pending",
                "attempt": 0,
                "installed": "",
                "pod": None,
            },
            {
                "name": "tuning",
                "version": "1.0.0",
                "stage": "apply",
                "state": "failed",
                "attempt": 2,
                "installed": "",
                "pod": None,
            },
        ],
    }
    assert rows[1]["state"] is None
    assert rows[1]["reason"] is None


def test_node_list_of_a_nodewright_without_nodes() -> None:
    assert node_cmd.render_list("gpu", []) == "NodeWright gpu selects no node."


def test_a_package_the_nodewright_no_longer_wants_is_still_listed_as_recorded() -> None:
    cr = nodewright(packages={"driver": PACKAGES["driver"]})
    old = node(
        "n-a",
        records={
            nodestate.EXECUTOR: ExecutorRecord(packages={"tuning": _pkg("apply", "succeeded")})
        },
    )
    (row,) = node_cmd.list_rows(cr, [old])
    cells = [node_cmd.package_cell(p) for p in row["packages"]]
    assert cells == ["driver:2.0.0 pending", "tuning:1.0.0 apply succeeded"]


# ---- package status ---------------------------------------------------------------------


def test_package_status_has_one_row_per_target_node() -> None:
    rows = package_cmd.status_rows(_cr(), "tuning", _nodes())
    assert package_cmd.render_status(rows).splitlines() == [
        "NODE   PACKAGE   VERSION   STAGE   STATE     ATTEMPT",
        "n-a    tuning    1.0.0     apply   running   1",
        "n-b    tuning    1.0.0     -       pending   -",
        "n-c    tuning    1.0.0     apply   failed    2",
    ]


def test_package_status_of_named_nodes_only_even_one_that_is_not_a_target() -> None:
    rows = package_cmd.status_rows(_cr(), "tuning", _nodes(), ["n-x", "n-c"])
    assert package_cmd.render_status(rows).splitlines() == [
        "NODE   PACKAGE   VERSION   STAGE   STATE          ATTEMPT",
        "n-c    tuning    1.0.0     apply   failed         2",
        "n-x    tuning    1.0.0     -       not a target   -",
    ]


def test_package_status_json_has_the_reason_and_the_current_attempts_check() -> None:
    done = PackageRecord(
        version="1.0.0",
        stage="post-interrupt",
        state="succeeded",
        attempt=2,
        installed="1.0.0",
        updated=T0,
    )
    key = nodestate.check_key("tuning", "1.0.0", "post-interrupt")
    records: dict[str, msgspec.Struct] = {
        nodestate.EXECUTOR: ExecutorRecord(packages={"tuning": done}),
        nodestate.VALIDATOR: ValidatorRecord(
            checks={key: CheckRecord(verdict="passed", at=T0, attempt=2)}
        ),
    }
    stale: dict[str, msgspec.Struct] = {
        **records,
        nodestate.VALIDATOR: ValidatorRecord(
            checks={key: CheckRecord(verdict="failed", at=T0, attempt=1)}
        ),
    }
    fresh, old = package_cmd.status_rows(
        _cr(), "tuning", [node("n-1", records=records), node("n-2", records=stale)]
    )
    assert fresh == {
        "node": "n-1",
        "package": "tuning",
        "version": "1.0.0",
        "stage": "post-interrupt",
        "state": "succeeded",
        "attempt": 2,
        "installed": "1.0.0",
        "reason": None,
        "check": "passed",
    }
    # A verdict about attempt 1 says nothing about attempt 2, which succeeded: its check runs
    # (the validator records no start, only the verdict).
    assert old["check"] == "running"
    (failed,) = package_cmd.status_rows(_cr(), "tuning", _nodes(), ["n-c"])
    assert failed["reason"] == {"code": "StageFailed", "message": "pod p exited with code 1"}


# ---- package logs -----------------------------------------------------------------------


def _pod(
    name: str, *, node: str, package: str = "tuning", stage: str = "apply", role: Any = "stage"
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": pods.labels(cr="gpu", role=role, package=package, stage=stage),
            "annotations": {pods.ANN_NODE: node, pods.ANN_VERSION: "1.0.0", pods.ANN_ATTEMPT: "2"},
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"nodeName": node, "containers": [{"name": "agent"}]},
        "status": {"phase": "Failed"},
    }


def test_the_log_selector_narrows_by_the_executors_labels() -> None:
    assert package_cmd.log_selector("tuning") == (
        "app.kubernetes.io/managed-by=nodewright,nodewright.nvidia.com/role in (stage,check),"
        "nodewright.nvidia.com/package=tuning"
    )
    assert package_cmd.log_selector("tuning", nodewright="gpu") == (
        "app.kubernetes.io/managed-by=nodewright,nodewright.nvidia.com/role in (stage,check),"
        "nodewright.nvidia.com/package=tuning,nodewright.nvidia.com/nodewright=gpu"
    )


def _segment_pod(*codes: int) -> dict[str, Any]:
    """tuning's pod on n-1 running apply then config, whose first ``codes`` containers exited."""
    return segment_pod(_cr(), "tuning", *codes)


def test_package_logs_show_each_stage_and_check_of_a_pod_once_it_started() -> None:
    pod = _segment_pod(0, 0)
    shown = [(v.role, v.stage, v.phase) for v in package_cmd.log_pods([pod], "n-1")]
    assert shown == [
        ("stage", "apply", "Succeeded"),
        ("check", "apply", "Succeeded"),
        ("stage", "config", "Running"),
    ]
    assert [package_cmd.log_container(v, [pod]) for v in package_cmd.log_pods([pod], "n-1")] == [
        "apply",
        "apply-check",
        "config",
    ]
    only = package_cmd.log_pods([pod], "n-1", "config")
    assert [(v.role, v.stage) for v in only] == [("stage", "config")], "--stage config"


@pytest.mark.parametrize(
    ("codes", "said"),
    [
        pytest.param((), "", id="apply-runs-as-recorded"),
        pytest.param((0,), "; in pod seg: apply-check running", id="apply-check-runs"),
        pytest.param((0, 0), "; in pod seg: config running", id="config-runs"),
        pytest.param((0, 0, 4), "; in pod seg: config failed", id="config-failed"),
    ],
)
def test_node_status_says_what_a_pod_runs_past_the_recorded_stage(
    codes: tuple[int, ...], said: str
) -> None:
    """A pod runs apply, its check, config and its check, and only the first start is
    written: node status reads the rest from the pod."""
    r = msgspec.structs.replace(_pkg("apply", "running"), cycle_started=CYCLE)
    obj = node("n-1", records={nodestate.EXECUTOR: ExecutorRecord(packages={"tuning": r})})
    cr = _cr()
    parts = pods.parts(_segment_pod(*codes))
    lines = node_cmd.describe(node_cmd.view(obj, cr.metadata.name, cr), obj, parts)
    (line,) = [x for x in lines if x.startswith("  package tuning:")]
    assert line == (
        "  package tuning: version 1.0.0, stage apply running (attempt 1), installed nothing" + said
    )


@pytest.mark.parametrize(
    ("codes", "cell", "pod"),
    [
        pytest.param((), "tuning:1.0.0 apply running", None, id="apply-runs-as-recorded"),
        pytest.param(
            (0, 0),
            "tuning:1.0.0 config running",
            {"name": "seg", "part": "config", "phase": "running"},
            id="config-runs",
        ),
        pytest.param(
            (0, 0, 4),
            "tuning:1.0.0 config failed",
            {"name": "seg", "part": "config", "phase": "failed"},
            id="config-failed",
        ),
    ],
)
def test_node_list_says_what_a_pod_runs_past_the_recorded_stage(
    codes: tuple[int, ...], cell: str, pod: dict[str, str] | None
) -> None:
    """The PACKAGES column (and ``pod`` in JSON) reads a segment pod as ``node status``
    does; the record's own stage and state stay in the JSON."""
    r = msgspec.structs.replace(_pkg("apply", "running"), cycle_started=CYCLE)
    obj = node(
        "n-1",
        records={
            nodestate.SCHEDULER: _selection(),
            nodestate.EXECUTOR: ExecutorRecord(packages={"tuning": r}),
        },
    )
    parts = pods.parts(_segment_pod(*codes))
    elsewhere = pods.parts(segment_pod(_cr(), "tuning", 0, 0, node="n-2", name="other"))
    (row,) = node_cmd.list_rows(_cr(), [obj], [*parts, *elsewhere])
    entry = next(e for e in row["packages"] if e["name"] == "tuning")
    assert (entry["stage"], entry["state"], entry["pod"]) == ("apply", "running", pod)
    assert node_cmd.package_cell(entry) == cell
    (bare,) = node_cmd.list_rows(_cr(), [obj])
    assert node_cmd.package_cell(bare["packages"][1]) == "tuning:1.0.0 apply running"


def test_log_pods_are_the_nodes_oldest_first() -> None:
    later = _pod("b-first-by-name", node="n-1")
    later["metadata"]["creationTimestamp"] = "2026-01-01T00:00:05Z"
    listed = [later, _pod("z-older", node="n-1"), _pod("elsewhere", node="n-2")]
    assert [p.name for p in package_cmd.log_pods(listed, "n-1")] == ["z-older", "b-first-by-name"]


def test_a_log_header_names_the_pod_and_what_it_ran() -> None:
    stage = pods.view(_pod("p1", node="n-1"))
    check = pods.view(_pod("p2", node="n-1", role="check", stage="config"))
    assert package_cmd.log_header(stage) == (
        "==> pod p1: NodeWright gpu, package tuning 1.0.0, stage apply, attempt 2, Failed <=="
    )
    assert package_cmd.log_header(check) == (
        "==> pod p2: NodeWright gpu, package tuning 1.0.0, check of stage config, attempt 2, "
        "Failed <=="
    )


def test_log_query_tails_only_when_asked() -> None:
    assert package_cmd.log_query("agent", -1) == {"container": "agent"}
    assert package_cmd.log_query("agent", 0) == {"container": "agent", "tailLines": 0}
    assert package_cmd.log_query("agent", 20) == {"container": "agent", "tailLines": 20}


def test_log_stages_are_the_stages_package_pods_run() -> None:
    assert package_cmd.STAGES == ("apply", "upgrade", "config", "post-interrupt", "uninstall")
    # The command line repeats them so that parsing imports nothing.
    assert cli.LOG_STAGES == package_cmd.STAGES
    assert cli.RERUN_STAGES == nodestate.RERUN_STAGES
    assert ServiceSettings().namespace == cli.DEFAULT_NAMESPACE
    logs = cli.cli.commands["package"].commands["logs"]  # type: ignore[attr-defined]
    ctx = logs.make_context(
        "logs", ["tuning", "--node", "n-1", "--stage", "config", "--tail", "5", "-f"]
    )
    assert ctx.params | {"kubeconfig": None, "context": None} == {
        "name": "tuning",
        "node_name": "n-1",
        "nodewright": "",
        "stage": "config",
        "tail": 5,
        "follow": True,
        "raw": False,
        "kubeconfig": None,
        "context": None,
    }
    raw = logs.make_context("logs", ["tuning", "--node", "n-1", "--raw"])
    assert raw.params["raw"] is True
    with pytest.raises(click.BadParameter):
        logs.make_context("logs", ["tuning", "--node", "n", "--stage", "x"])


def test_times_are_not_compared_naively() -> None:
    # log_pods sorts a pod without a creation time first; it must not mix naive and aware.
    bare = _pod("bare", node="n-1")
    del bare["metadata"]["creationTimestamp"]
    dated = _pod("dated", node="n-1")
    assert [p.name for p in package_cmd.log_pods([dated, bare], "n-1")] == ["bare", "dated"]


@pytest.mark.parametrize(
    ("order", "line"),
    [
        pytest.param(
            0,
            "  admitted: compartment __default__, batch 1, node order 0, "
            f"at {T0.isoformat()} (no drain)",
            id="first-node",
        ),
        pytest.param(
            None,
            f"  admitted: compartment __default__, batch 1, at {T0.isoformat()} (no drain)",
            id="unknown-order",
        ),
    ],
)
def test_node_status_shows_the_admissions_node_order_when_known(
    order: int | None, line: str
) -> None:
    sel = msgspec.structs.replace(_selection(), order=order)
    obj = node("n-a", labels={"pool": "gpu"}, records={nodestate.SCHEDULER: sel})
    cr = _cr()
    lines = node_cmd.describe(node_cmd.view(obj, cr.metadata.name, cr), obj)
    assert [x for x in lines if x.startswith("  admitted:")] == [line]


def _waiting_for_check(verdict: CheckRecord | None) -> dict[str, Any]:
    checks = {nodestate.check_key("tuning", "1.0.0", "apply"): verdict} if verdict else {}
    return node(
        "n-a",
        records={
            nodestate.SCHEDULER: _selection(),
            nodestate.EXECUTOR: ExecutorRecord(packages={"tuning": _pkg("apply", "succeeded")}),
            nodestate.VALIDATOR: ValidatorRecord(checks=checks),
        },
        conditions=[reported("InProgress")],
    )


@pytest.mark.parametrize(
    ("verdict", "turn"),
    [
        pytest.param(None, "validator", id="no-verdict-yet"),
        pytest.param(CheckRecord(verdict="running", at=T0), "validator", id="check-running"),
        pytest.param(
            CheckRecord(verdict="passed", at=T0, attempt=0),
            "validator",
            id="verdict-of-old-attempt",
        ),
        pytest.param(CheckRecord(verdict="passed", at=T0), "executor", id="check-passed"),
    ],
)
def test_a_stage_waiting_for_its_check_is_the_validators_turn(
    verdict: CheckRecord | None, turn: str
) -> None:
    """TURN read "executor" while the stage waited for its check: the check is the
    validator's."""
    cr = nodewright(packages={"tuning": PACKAGES["tuning"]})
    (row,) = node_cmd.list_rows(cr, [_waiting_for_check(verdict)])
    assert (row["turn"], row["state"], row["reason"]) == (turn, "InProgress", None)


def test_node_list_wide_adds_admission_cordon_and_message() -> None:
    rows = node_cmd.list_rows(_cr(), _nodes())
    lines = node_cmd.render_list("gpu-node-tuning", rows, wide=True).splitlines()
    assert lines[0].split() == [
        "NODE",
        "STATE",
        "TURN",
        "REASON",
        "COMPARTMENT",
        "BATCH",
        "ORDER",
        "CORDONED",
        "PACKAGES",
        "MESSAGE",
    ]
    assert lines[3].split()[:8] == [
        "n-c",
        "Failed",
        "failed",
        "StageFailed",
        "__default__",
        "1",
        "-",
        "no",
    ]
    assert lines[3].endswith("pod p exited with code 1")
    assert all(line == line.rstrip() for line in lines)


def test_documents_print_as_json_and_yaml_alike() -> None:
    import json

    import yaml

    rows = node_cmd.list_rows(_cr(), _nodes())
    doc = {"nodewright": "gpu", "nodes": rows}
    assert json.loads(output.document(doc, "json")) == doc
    assert yaml.safe_load(output.document(doc, "yaml")) == doc


@pytest.mark.parametrize(
    ("verb", "first"),
    [
        (
            "pause",
            'Would have paused NodeWright gpu (set annotation nodewright.nvidia.com/pause: "true")',
        ),
        (
            "resume",
            "Would have resumed NodeWright gpu (removed annotation "
            'nodewright.nvidia.com/pause: "true")',
        ),
    ],
)
def test_a_dry_run_says_what_would_have_changed(verb: str, first: str) -> None:
    lines = lifecycle_cmd.message(
        "gpu", lifecycle_cmd.SWITCHES[verb], {}, changed=True, dry_run="client"
    )
    assert lines[0].startswith(first + ": ")


@pytest.mark.parametrize(
    ("validator", "says"),
    [
        pytest.param(None, "honoured", id="blank-validator-has-nothing-to-honour"),
        pytest.param(
            ValidatorRecord(checks={"tuning/1.0.0/apply": CheckRecord(verdict="passed", at=T0)}),
            "not yet honoured by validator",
            id="validator-with-verdicts-behind",
        ),
    ],
)
def test_node_status_names_only_the_services_behind_a_request_that_have_something_to_honour(
    validator: ValidatorRecord | None, says: str
) -> None:
    """A blank validator record has nothing to honour: it takes the newest mark when it first
    writes (the executor does not wait for it either)."""
    records: dict[str, msgspec.Struct] = {
        nodestate.SCHEDULER: _selection(),
        nodestate.EXECUTOR: ExecutorRecord(
            packages={"tuning": _pkg("apply", "failed")}, honoured=1
        ),
    }
    if validator is not None:
        records[nodestate.VALIDATOR] = validator
    obj = node("n-a", records=records)
    requests = nodestate.add_request(None, nodestate.Request(seq=0, action="abort", at=T0))
    obj["metadata"]["annotations"][nodestate.key(nodestate.REQUESTS, "gpu-node-tuning")] = (
        msgspec.json.encode(requests).decode()
    )
    cr = _cr()
    lines = node_cmd.describe(node_cmd.view(obj, cr.metadata.name, cr), obj)
    (line,) = [x for x in lines if x.startswith("  last request:")]
    assert line.startswith("  last request: #1 abort by ? at")
    assert line.endswith(f"; {says}"), line
