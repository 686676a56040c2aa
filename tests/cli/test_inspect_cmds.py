"""``nodewright node list``, ``package status`` and ``package logs`` against the real API
server, on kwok nodes carrying the records the services would write (written here with
their own encoders) and pods built by the executor's own manifest builder."""

from __future__ import annotations

import json
from typing import Any

from nodewright.rig import Rig
from shared import api, nodestate, pods, podspec, progress
from shared.events import Reason
from shared.kube import Kube, path_of
from shared.records.executor import ExecutorRecord, PackageRecord
from shared.records.scheduler import Selection
from shared.rollout import rules as rollout_rules
from tests.cli.conftest import Objects, cli
from tests.helpers.facts import T0, reported
from tests.helpers.waiting import eventually

PACKAGES = {
    "tuning": {"version": "1.0.0", "image": "registry.example/tuning"},
    "driver": {"version": "2.0.0", "image": "registry.example/driver"},
}
FAILED = Reason(code="StageFailed", message="pod p exited with code 1")


def _selection() -> Selection:
    return Selection(
        generation=1,
        compartment=rollout_rules.DEFAULT_COMPARTMENT,
        batch=1,
        selected_at=T0,
        disruptive=False,
        target="t",
    )


def _pkg(stage: str, state: Any, attempt: int = 1) -> PackageRecord:
    reason = FAILED if state == "failed" else None
    return PackageRecord(
        version="1.0.0", stage=stage, state=state, attempt=attempt, reason=reason, updated=T0
    )


async def _fleet(objects: Objects) -> tuple[str, list[str]]:
    """A NodeWright on three nodes: a runs tuning's apply, b has nothing yet, c failed
    tuning's apply twice; x is in another pool. Returns the CR and [a, b, c, x]."""
    cr = (await objects.nodewright("insp", PACKAGES)).metadata.name
    a, b, c = [await objects.node(n, cr) for n in ("n-a", "n-b", "n-c")]
    x = await objects.node("n-x", objects.name("elsewhere"))
    for node in (a, c):
        await objects.record(node, nodestate.SCHEDULER, cr, _selection())
    running = ExecutorRecord(packages={"tuning": _pkg("apply", "running")})
    await objects.record(a, nodestate.EXECUTOR, cr, running)
    await objects.report(a, reported("InProgress", cr=cr))
    failed = ExecutorRecord(packages={"tuning": _pkg("apply", "failed", attempt=2)})
    await objects.record(c, nodestate.EXECUTOR, cr, failed)
    await objects.report(c, reported("Failed", FAILED, cr=cr))
    return cr, [a, b, c, x]


async def test_node_list_has_one_row_per_target_node(rig: Rig, objects: Objects) -> None:
    cr, (a, b, c, _) = await _fleet(objects)
    got = await cli(rig, "node", "list", "--nodewright", cr)
    assert got.code == 0, got
    pad = " " * (len(a) - len("NODE"))
    assert got.out.splitlines() == [
        f"NODE{pad}   STATE        TURN        REASON        PACKAGES",
        f"{a}   InProgress   executor    -             "
        "driver:2.0.0 pending, tuning:1.0.0 apply running",
        f"{b}   -            scheduler   -             driver:2.0.0 pending, tuning:1.0.0 pending",
        f"{c}   Failed       failed      StageFailed   "
        "driver:2.0.0 pending, tuning:1.0.0 apply failed (attempt 2)",
    ]

    js = await cli(rig, "node", "list", "--nodewright", cr, "-o", "json")
    assert js.code == 0, js
    doc = json.loads(js.out)
    assert doc["nodewright"] == cr
    assert [(n["node"], n["state"], n["turn"]) for n in doc["nodes"]] == [
        (a, "InProgress", "executor"),
        (b, None, "scheduler"),
        (c, "Failed", "failed"),
    ]
    assert doc["nodes"][2]["reason"] == {"code": "StageFailed", "message": FAILED.message}
    assert doc["nodes"][2]["packages"][1] == {
        "name": "tuning",
        "version": "1.0.0",
        "stage": "apply",
        "state": "failed",
        "attempt": 2,
        "installed": "",
        "pod": None,
    }


async def test_node_list_of_a_missing_nodewright(rig: Rig, objects: Objects) -> None:
    got = await cli(rig, "node", "list", "--nodewright", objects.name("absent"))
    assert (got.code, got.out) == (1, "")
    assert got.err == (
        f"nodewright: NodeWright {objects.name('absent')} not found (`kubectl get nodewrights` "
        "lists them; they are cluster-scoped)\n"
    )


async def test_package_status_per_node(rig: Rig, objects: Objects) -> None:
    cr, (a, b, c, x) = await _fleet(objects)
    got = await cli(rig, "package", "status", "tuning", "--nodewright", cr)
    assert got.code == 0, got
    pad = " " * (len(a) - len("NODE"))
    assert got.out.splitlines() == [
        f"NODE{pad}   PACKAGE   VERSION   STAGE   STATE     ATTEMPT",
        f"{a}   tuning    1.0.0     apply   running   1",
        f"{b}   tuning    1.0.0     -       pending   -",
        f"{c}   tuning    1.0.0     apply   failed    2",
    ]

    only = await cli(rig, "package", "status", "tuning", "--nodewright", cr, "--node", c)
    assert only.out.splitlines()[1:] == [f"{c}   tuning    1.0.0     apply   failed   2"]

    js = await cli(
        rig,
        "package",
        "status",
        "driver",
        "--nodewright",
        cr,
        "--node",
        x,
        "--node",
        a,
        "-o",
        "json",
    )
    assert js.code == 0, js
    assert [(r["node"], r["version"], r["state"]) for r in json.loads(js.out)["nodes"]] == [
        (a, "2.0.0", "pending"),
        (x, "2.0.0", "not a target"),
    ]


async def test_package_status_errors_say_what_is_wrong(rig: Rig, objects: Objects) -> None:
    cr, _ = await _fleet(objects)
    unknown = await cli(rig, "package", "status", "nope", "--nodewright", cr)
    assert (unknown.code, unknown.err) == (
        1,
        f"nodewright: NodeWright {cr} has no package nope (it has: driver, tuning)\n",
    )
    absent = objects.name("absent")
    node = await cli(rig, "package", "status", "tuning", "--nodewright", cr, "--node", absent)
    assert (node.code, node.err) == (1, f"nodewright: node {absent} not found\n")


# ---- logs -------------------------------------------------------------------------------


async def _stage_pod(
    kapi: Kube,
    cr: api.NodeWright,
    node: str,
    namespace: str,
    *,
    package: str,
    role: pods.Role = "stage",
) -> str:
    """Create the pod the executor would create for ``package``'s apply on ``node``; return
    its name."""
    d = progress.desired(cr)[package]
    name = pods.pod_name(
        cr=cr.metadata.name,
        node=node,
        role=role,
        package=package,
        stage="apply",
        version=d.version,
        attempt=1,
    )
    req = podspec.PodRequest(
        role=role,
        package=package,
        stage="apply",
        version=d.version,
        attempt=1,
        image=d.image,
        desired=d,
        name=name,
    )
    settings = podspec.PodSettings(namespace=namespace, agent_image="registry.example/agent:1")
    body = podspec.stage_pod(
        req, cr=cr, node=node, node_annotations={}, settings=settings, node_metadata="{}"
    )
    await kapi.create(path_of(plural="pods", namespace=namespace), body)
    return name


async def test_package_logs_name_each_pod_whose_log_cannot_be_fetched(
    rig: Rig, objects: Objects, kapi: Kube, namespace: str
) -> None:
    obj = await objects.nodewright("logs", PACKAGES)
    cr = obj.metadata.name
    a = await objects.node("n-a", cr)
    c = await objects.node("n-c", cr)
    stage = await _stage_pod(kapi, obj, a, namespace, package="tuning")
    await _stage_pod(kapi, obj, a, namespace, package="driver")  # another package
    await _stage_pod(kapi, obj, c, namespace, package="tuning")  # another node

    async def running() -> bool:
        listed = await kapi.get(path_of(plural="pods", namespace=namespace))
        return len(listed["items"]) == 3 and all(
            p.get("status", {}).get("phase") == "Running" for p in listed["items"]
        )

    await eventually(running, what="kwok to run the three pods")

    got = await cli(rig, "package", "logs", "tuning", "--node", a, "--namespace", namespace)
    assert got.code == 1, got
    # tuning's pod on a as its stage (kwok ends init containers at once) then its running
    # check, and only them.
    headers = [line for line in got.out.splitlines() if line.startswith("==> ")]
    assert headers == [
        f"==> pod {stage}: NodeWright {cr}, package tuning 1.0.0, stage apply, attempt 1, "
        "Succeeded <==",
        f"==> pod {stage}: NodeWright {cr}, package tuning 1.0.0, check of stage apply, "
        "attempt 1, Running <==",
    ]
    errors = got.err.splitlines()
    for container in ("apply", "apply-check"):
        assert any(
            e.startswith(
                f"nodewright: cannot fetch the log of pod {stage} ({container}): the API server "
                "said "
            )
            for e in errors
        ), got.err
    assert errors[-1] == (
        f"nodewright: the logs of 2 of 2 containers could not be fetched: {stage} (apply), "
        f"{stage} (apply-check)"
    )


async def test_node_list_says_what_a_stage_pod_runs_past_the_recorded_stage(
    rig: Rig, objects: Objects, kapi: Kube, namespace: str
) -> None:
    """a's record says tuning's apply runs; its pod (kwok ends the init containers at once)
    runs apply's check: the row says so, read from the pods in ``-n``."""
    cr, (a, _, _, _) = await _fleet(objects)
    obj = await kapi.get(f"/apis/{api.GROUP}/{api.VERSION}/nodewrights/{cr}")
    pod = await _stage_pod(kapi, api.from_dict(obj, api.NodeWright), a, namespace, package="tuning")

    async def checking() -> bool:
        got = await kapi.get(path_of(plural="pods", namespace=namespace, name=pod))
        return bool(got.get("status", {}).get("phase") == "Running")

    await eventually(checking, what="kwok to run the stage pod")
    got = await cli(rig, "node", "list", "--nodewright", cr, "-n", namespace)
    assert got.code == 0, got
    (row,) = [line for line in got.out.splitlines() if line.startswith(a)]
    assert row.endswith("driver:2.0.0 pending, tuning:1.0.0 apply-check running"), row
    js = await cli(rig, "node", "list", "--nodewright", cr, "-n", namespace, "-o", "json")
    entry = json.loads(js.out)["nodes"][0]["packages"][1]
    assert (entry["stage"], entry["state"]) == ("apply", "running")
    assert entry["pod"] == {"name": pod, "part": "apply-check", "phase": "running"}
    elsewhere = await cli(rig, "node", "list", "--nodewright", cr, "-n", objects.name("none"))
    (bare,) = [line for line in elsewhere.out.splitlines() if line.startswith(a)]
    assert bare.endswith("tuning:1.0.0 apply running"), "no pod there: the record's stage"


async def test_package_logs_without_pods_say_where_to_look(
    rig: Rig, objects: Objects, kapi: Kube, namespace: str
) -> None:
    obj = await objects.nodewright("logs", PACKAGES)
    a = await objects.node("n-a", obj.metadata.name)
    await _stage_pod(kapi, obj, a, namespace, package="tuning")
    got = await cli(
        rig, "package", "logs", "tuning", "--node", a, "--namespace", namespace, "--stage", "config"
    )
    assert (got.code, got.out) == (1, "")
    assert got.err == (
        f"nodewright: no pod of package tuning on node {a} in namespace {namespace}, stage "
        "config. The executor keeps a stage's pod while it runs and after it failed, and "
        "deletes it once the node has moved on; `nodewright package status tuning "
        f"--nodewright CR --node {a}` shows where the package stands (pods in another "
        "namespace: --namespace)\n"
    )
    other = await cli(
        rig,
        "package",
        "logs",
        "tuning",
        "--node",
        a,
        "--namespace",
        namespace,
        "--nodewright",
        objects.name("other"),
    )
    assert other.code == 1
    assert f"in namespace {namespace}, NodeWright {objects.name('other')}." in other.err
    absent = objects.name("absent")
    node = await cli(rig, "package", "logs", "tuning", "--node", absent)
    assert (node.code, node.err) == (1, f"nodewright: node {absent} not found\n")
