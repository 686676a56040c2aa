"""NodeWright installed with Helm, running as pods on real nodes against a three-server
JetStream cluster from the official NATS chart: a rollout, an upgrade in the middle of it,
faults production brings (NATS servers and service pods deleted), and the uninstall hook.
The budget is sampled every 100 ms throughout."""

from __future__ import annotations

import asyncio
import functools
import math
import random
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import nats
import pytest
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

from nodewright import events_cmd, manifests
from nodewright.rig import Rig, nodes
from nodewright.rig.realnode import LABEL_REAL
from shared import api, nodestate, progress, subjects
from shared.kube import ApiError, Kube, path_of
from shared.records.scheduler import Selection
from tests.e2e.conftest import NODES, Sampler, pod_ledger, read_cr
from tests.e2e.install.conftest import (
    CHART,
    NAMESPACE,
    REPO,
    USERS_SECRET,
    NatsCluster,
    install,
    service_pods,
    tool,
)
from tests.helpers.cli import cli
from tests.helpers.podlog import pod_log
from tests.helpers.waiting import Pending, eventually

T = TypeVar("T")

pytestmark = pytest.mark.timeout(900)

EXAMPLE = REPO / "deploy" / "samples" / "nodewright-gpu-node-tuning.yaml"
GPU = {"nodepool": "gpu"}


IMAGE_SITE = "opt/nodewright/site"


def _image_processes() -> dict[int, str]:
    """The machine's processes running services from the services image (the real nodes'
    containers are processes of this machine): pid -> the module run (``services`` for the
    one-process layout)."""
    found: dict[int, str] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            module = argv[argv.index(b"-m") + 1].decode()
            runs_services = module == "services" or module.startswith("services.")
            if runs_services and (proc / "root" / IMAGE_SITE).is_dir():
                found[int(proc.name)] = module
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not a `python -m`
    return found


async def _kwok_nodes(kapi: Kube, count: int) -> list[str]:
    names = [f"gpu-{i:02d}" for i in range(count)]
    await nodes.create_nodes(kapi, names, labels=GPU)
    await nodes.wait_ready(kapi, names)
    return names


async def _disrupted(kapi: Kube, cr: str) -> int:
    """Nodes this NodeWright holds a budget slot on right now (its admissions)."""
    listed = await kapi.get(NODES, labelSelector="nodepool=gpu")
    return sum(1 for n in listed["items"] if nodestate.read(n, nodestate.SCHEDULER, cr, Selection))


async def _cordoned(kapi: Kube) -> list[str]:
    listed = await kapi.get(NODES, labelSelector="nodepool=gpu")
    return [n["metadata"]["name"] for n in listed["items"] if n["spec"].get("unschedulable")]


async def _done(kapi: Kube, cr: str) -> int:
    obj = await read_cr(kapi, cr)
    listed = await kapi.get(NODES, labelSelector="nodepool=gpu")
    return sum(1 for n in listed["items"] if progress.turn(obj, progress.facts(n, cr)) == "done")


async def _ready(kapi: Kube, cr: str) -> bool:
    obj = await read_cr(kapi, cr)
    return any(c.type == "Ready" and c.status == "True" for c in obj.status.conditions)


async def _all_ready(kapi: Kube) -> bool:
    pods = await service_pods(kapi)
    return len(pods) == 10 and all(
        any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (p.get("status") or {}).get("conditions") or []
        )
        for p in pods
    )


async def test_the_readme_example_rolls_out_with_the_installed_services_through_an_upgrade(
    rig: Rig, clean: Kube, nats_cluster: NatsCluster
) -> None:
    kapi = clean
    t0 = time.monotonic()
    await install(rig)
    print(f"helm install of NodeWright: {time.monotonic() - t0:.1f}s", file=sys.stderr)
    pods = await service_pods(kapi)
    assert sorted(p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods) == sorted(
        2 * ["scheduler", "drainer", "executor", "validator", "status"]
    ), "the chart's default replica counts"
    real = {
        n["metadata"]["name"] for n in (await kapi.get(NODES, labelSelector=LABEL_REAL))["items"]
    }
    assert {p["spec"]["nodeName"] for p in pods} <= real, "every service runs on a real node"
    # The image's bytecode: without it every start compiled the modules again (0.3 s of CPU
    # and 0.8 MiB per process, docs/metrics.md "Memory of the services").
    running = _image_processes()
    services = ["scheduler", "drainer", "executor", "validator", "status"]
    assert {f"services.{s}" for s in services} <= set(running.values()), running
    for pid in running:
        site = Path(f"/proc/{pid}/root") / IMAGE_SITE
        assert (site / "shared" / "__pycache__" / "kube.cpython-311.pyc").is_file(), pid

    # The admission webhook is served by the validator's pod, through its Service.
    no_policy = EXAMPLE.read_text().replace(
        "interruptionBudget:\n    percent: 33", "deploymentPolicy: nope"
    )
    refused = await tool(rig, "kubectl", "apply", "-f", "-", check=False, stdin=no_policy)
    assert "spec.deploymentPolicy" in refused
    assert "does not exist" in refused
    hook = await kapi.get(
        path_of(
            group="admissionregistration.k8s.io",
            plural="validatingwebhookconfigurations",
            name="nodewright-validator",
        )
    )
    assert hook["webhooks"][0]["clientConfig"]["service"]["name"] == "nodewright-validator"

    # As many as the process fleet's run of the same example (tests/e2e/test_event_trail.py):
    # their wall times compare.
    names = await _kwok_nodes(kapi, 30)
    budget = math.ceil(0.33 * len(names))
    async with (
        pod_ledger(kapi, NAMESPACE) as ledger,
        Sampler(lambda: _disrupted(kapi, "gpu-node-tuning"), interval_s=0.1) as sampler,
    ):
        t0 = time.monotonic()
        await tool(rig, "kubectl", "apply", "-f", str(EXAMPLE))

        async def some_done() -> bool:
            return await _done(kapi, "gpu-node-tuning") > 0

        await eventually(some_done, timeout_s=300, what="the first nodes to be done")
        assert await _done(kapi, "gpu-node-tuning") < len(names), "upgraded in the middle"
        # helm upgrade in the middle of the rollout: a changed value restarts every
        # Deployment, one pod at a time.
        await tool(
            rig, "helm", "upgrade", "nodewright", str(CHART), "-n", NAMESPACE, "--reuse-values",
            "--set", "logLevel=DEBUG", "--wait", "--timeout", "300s",
        )  # fmt: skip
        assert all(
            {e["name"]: e.get("value") for e in p["spec"]["containers"][0]["env"]}[
                "NODEWRIGHT_LOG_LEVEL"
            ]
            == "DEBUG"
            for p in await service_pods(kapi)
        )
        out = await tool(
            rig,
            "kubectl",
            "wait",
            "--for=condition=Ready",
            "nodewright/gpu-node-tuning",
            "--timeout=600s",
        )
        wall = time.monotonic() - t0
        assert "condition met" in out
    print(
        f"in-cluster rollout of the README example on {len(names)} nodes: {wall:.1f}s",
        file=sys.stderr,
    )
    assert ledger.duplicates() == {}, "no pod created twice"
    assert ledger.repeated() == {}, "no step run twice (a new attempt or cycle)"
    assert len(ledger.of_role("stage", "apply")) == len(names), "one apply stage per node"
    assert max(sampler.samples) <= budget, (max(sampler.samples), budget)
    assert await _cordoned(kapi) == []
    # The CLI works against the installed system.
    listed = await cli(rig, "node", "list", "--nodewright", "gpu-node-tuning", "-n", NAMESPACE)
    assert listed.code == 0, listed.err
    assert all(name in listed.out for name in names)


async def _asked_again(
    ask: Callable[[JetStreamContext], Awaitable[T]], nats_cluster: NatsCluster
) -> T:
    """Ask JetStream's API, again for up to a minute while it does not answer: right after a
    server came back, the stream may be electing its leader (any client would retry)."""
    for _ in range(11):
        try:
            async with nats_cluster.client() as nc:
                return await ask(nc.jetstream(timeout=5))
        except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError):
            await asyncio.sleep(5)
    async with nats_cluster.client() as nc:
        return await ask(nc.jetstream(timeout=5))


async def _stream(nats_cluster: NatsCluster) -> tuple[int, int]:
    """The stream's message count and last sequence."""
    info = await _asked_again(lambda js: js.stream_info("NODEWRIGHT"), nats_cluster)
    return int(info.state.messages), int(info.state.last_seq)


async def _has_seq(nats_cluster: NatsCluster, seq: int) -> bool:
    """The stream still holds message ``seq``."""
    msg = await _asked_again(lambda js: js.get_msg("NODEWRIGHT", seq), nats_cluster)
    return bool(msg.seq == seq)


async def _nats_ready(kapi: Kube, name: str) -> bool:
    try:
        pod = await kapi.get(path_of(plural="pods", namespace="nats", name=name))
    except ApiError:
        return False
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


async def test_the_installed_system_survives_lost_nats_servers_and_service_pods(
    rig: Rig, clean: Kube, nats_cluster: NatsCluster
) -> None:
    kapi = clean
    await install(rig)
    names = await _kwok_nodes(kapi, 16)
    cr = {
        "apiVersion": api.API_VERSION,
        "kind": "NodeWright",
        "metadata": {"name": "faults"},
        "spec": {
            "nodeSelectors": {"matchLabels": GPU},
            "interruptionBudget": {"count": 3},
            "packages": {"tuning": {"version": "1.0.0", "image": "registry.example/tuning"}},
        },
    }
    rng = random.Random(1616)
    kills: list[str] = []
    lost_servers: list[str] = []
    async with (
        pod_ledger(kapi, NAMESPACE) as ledger,
        Sampler(lambda: _disrupted(kapi, "faults"), interval_s=0.1) as sampler,
    ):
        await kapi.create(manifests.NODEWRIGHTS, cr)
        for round_ in range(20):
            await asyncio.sleep(rng.uniform(1.0, 3.0))
            if round_ in (5, 12):
                # A NATS server goes (a different one each time); nothing acked may be lost.
                await nats_cluster.refresh(kapi)
                messages, last = await _stream(nats_cluster)
                victim = f"nats-{round_ % 3}"
                await kapi.delete(
                    path_of(plural="pods", namespace="nats", name=victim), {"gracePeriodSeconds": 0}
                )
                lost_servers.append(victim)
                back = functools.partial(_nats_ready, kapi, victim)
                await eventually(back, timeout_s=180, what=f"{victim} back")
                await nats_cluster.refresh(kapi)
                after, _ = await _stream(nats_cluster)
                assert after >= messages, "no acknowledged event was lost"
                if last:  # sequence 0: nothing stored yet, so nothing to lose
                    assert await _has_seq(nats_cluster, last)
            pods = await service_pods(kapi)
            if pods:
                victim_pod = rng.choice(pods)["metadata"]["name"]
                await kapi.delete(
                    path_of(plural="pods", namespace=NAMESPACE, name=victim_pod),
                    {"gracePeriodSeconds": 0},
                )
                kills.append(victim_pod)

        async def ready() -> bool | Pending:
            return await _ready(kapi, "faults") or Pending(
                f"status {(await read_cr(kapi, 'faults')).status.conditions}"
            )

        await eventually(
            ready, timeout_s=600, interval_s=1, what="the rollout to finish after the faults"
        )
    print(
        f"faults: {len(kills)} service pods force-deleted, NATS servers lost {lost_servers}, "
        f"max disrupted {max(sampler.samples)} of budget 3 over {len(sampler.samples)} samples",
        file=sys.stderr,
    )
    assert len(kills) == 20
    assert max(sampler.samples) <= 3
    messages, last = await _stream(nats_cluster)
    assert messages > 0, "the rollout's events are stored"
    assert await _has_seq(nats_cluster, last)
    assert ledger.duplicates() == {}
    assert ledger.repeated() == {}, "no step run twice (a new attempt or cycle)"
    assert await _cordoned(kapi) == []
    assert len(names) == 16


async def test_helm_uninstall_runs_the_pre_delete_hook_and_a_reinstall_works(
    rig: Rig, clean: Kube, nats_cluster: NatsCluster
) -> None:
    kapi = clean
    await install(
        rig, "--set", "uninstallHook.enabled=true", "--set", "uninstallHook.timeoutSeconds=300"
    )
    names = await _kwok_nodes(kapi, 4)
    cr = {
        "apiVersion": api.API_VERSION,
        "kind": "NodeWright",
        "metadata": {"name": "removable"},
        "spec": {
            "nodeSelectors": {"matchLabels": GPU},
            "interruptionBudget": {"count": 2},
            "packages": {
                "tuning": {
                    "version": "1.0.0",
                    "image": "registry.example/tuning",
                    "uninstall": {"enabled": True},
                }
            },
        },
    }
    async with pod_log(kapi, NAMESPACE) as log:
        await kapi.create(manifests.NODEWRIGHTS, cr)
        await eventually(
            lambda: _ready(kapi, "removable"), timeout_s=300, what="the package installed"
        )
        out = await tool(
            rig, "helm", "uninstall", "nodewright", "-n", NAMESPACE, "--wait", "--timeout", "8m"
        )
        assert "uninstalled" in out
        uninstalls = sorted(e.node for e in log.created(role="stage", stage="uninstall"))
    assert uninstalls == names, "the hook's uninstall-all uninstalled the package on every node"
    with pytest.raises(ApiError) as gone:
        await kapi.get(f"{manifests.NODEWRIGHTS}/removable")
    assert gone.value.not_found
    assert await service_pods(kapi) == []
    assert await _cordoned(kapi) == []

    # A re-install picks up where a new user would start.
    await install(rig)
    await eventually(lambda: _all_ready(kapi), timeout_s=120, what="the re-installed services")
    await tool(rig, "kubectl", "apply", "-f", str(EXAMPLE))
    out = await tool(
        rig,
        "kubectl",
        "wait",
        "--for=condition=Ready",
        "nodewright/gpu-node-tuning",
        "--timeout=300s",
    )
    assert "condition met" in out


async def test_each_service_has_its_own_nats_user_and_the_reader_can_only_read(
    rig: Rig, clean: Kube, nats_cluster: NatsCluster
) -> None:
    """The users `nodewright nats-users` made, enforced by the three servers: nobody gets in
    without credentials, the drainer cannot publish an executor event, and the operators'
    reader follows the stream and changes nothing. The services' own permissions are what
    every install test here runs with."""
    kapi = clean
    await install(rig)
    names = await _kwok_nodes(kapi, 2)
    await tool(rig, "kubectl", "apply", "-f", str(EXAMPLE))
    await eventually(lambda: _ready(kapi, "gpu-node-tuning"), timeout_s=300, what="a rollout")
    await nats_cluster.refresh(kapi)

    async def anonymous() -> None:
        nc = await nats.connect(
            servers=nats_cluster.urls, max_reconnect_attempts=1, connect_timeout=3
        )
        await nc.close()

    with pytest.raises((nats.errors.NoServersError, nats.errors.Error, OSError)):
        await anonymous()

    passwords = nats_cluster.secrets[USERS_SECRET]
    violations: list[str] = []

    async def on_error(exc: Exception) -> None:
        violations.append(str(exc))

    async with nats_cluster.client(
        user="nodewright-drainer", password=passwords["drainer"], error_cb=on_error
    ) as drainer:
        js = drainer.jetstream()
        own = await js.publish(subjects.event(cr="x", node=names[0], kind="node.drained"), b"{}")
        assert own.stream == "NODEWRIGHT", "its own kind is allowed"
        with pytest.raises(
            (
                nats.errors.TimeoutError,
                nats.js.errors.NoStreamResponseError,
                nats.errors.NoRespondersError,
            )
        ):
            await js.publish(
                subjects.event(cr="x", node=names[0], kind="stage.succeeded"), b"{}", timeout=2
            )
    # nats-py words it "nats: permissions violation for publish to ..."; the server
    # "Permissions Violation for Publish": either case.
    assert any("permissions violation for publish" in v.lower() for v in violations), violations

    reader = nats_cluster.secrets[f"{USERS_SECRET}-reader"]
    violations.clear()
    async with nats_cluster.client(
        user=reader["user"], password=reader["password"], error_cb=on_error
    ) as nc:
        js = nc.jetstream()
        info = await js.stream_info("NODEWRIGHT")
        assert info.state.messages > 0
        # It follows the stream from the start, as `nodewright events --all` does.
        sub = await js.subscribe(
            events_cmd.subject_filter("", ""),
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.ALL,
        )
        first = await sub.next_msg(timeout=10)
        assert first.subject.startswith(subjects.EVENTS)
        await sub.unsubscribe()
        with pytest.raises(
            (nats.errors.TimeoutError, nats.js.errors.APIError, nats.errors.NoRespondersError)
        ):
            await nc.jetstream(timeout=2).delete_stream("NODEWRIGHT")
        with pytest.raises(
            (
                nats.errors.TimeoutError,
                nats.js.errors.NoStreamResponseError,
                nats.errors.NoRespondersError,
            )
        ):
            await js.publish(
                subjects.event(cr="x", node=names[0], kind="node.selected"), b"{}", timeout=2
            )
    assert any("permissions violation" in v.lower() for v in violations), violations
    async with nats_cluster.client() as admin:
        assert (await admin.jetstream().stream_info("NODEWRIGHT")).config.name == "NODEWRIGHT"


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


async def _assert_the_webhook_refuses_a_missing_policy(rig: Rig) -> None:
    no_policy = EXAMPLE.read_text().replace(
        "interruptionBudget:\n    percent: 33", "deploymentPolicy: nope"
    )
    refused = await tool(rig, "kubectl", "apply", "-f", "-", check=False, stdin=no_policy)
    assert "spec.deploymentPolicy" in refused, refused
    assert "does not exist" in refused, refused


async def test_the_one_process_layout_rolls_out_and_switching_layouts_is_a_helm_upgrade(
    rig: Rig, clean: Kube, nats_cluster: NatsCluster
) -> None:
    """`layout: oneProcess` as docs/install.md says: one pod runs all five services (one
    ServiceAccount bound to their roles, the NATS user nodewright-services enforced by the
    servers), serves the webhook, and rolls the README example out; switching to the
    per-service layout in the middle of the rollout is a `helm upgrade` that loses nothing."""
    kapi = clean
    await install(rig, "--set", "layout=oneProcess")
    (pod,) = await service_pods(kapi)
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "services"
    assert pod["spec"]["serviceAccountName"] == "nodewright-services"
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["NODEWRIGHT_NATS_USER"] == "nodewright-services"
    (pid,) = [p for p, module in _image_processes().items() if module == "services"]
    print(f"one-process pod on a real node, ready: VmRSS {_rss_mib(pid):.1f} MiB", file=sys.stderr)

    await _assert_the_webhook_refuses_a_missing_policy(rig)

    names = await _kwok_nodes(kapi, 12)
    budget = math.ceil(0.33 * len(names))
    async with (
        pod_ledger(kapi, NAMESPACE) as ledger,
        Sampler(lambda: _disrupted(kapi, "gpu-node-tuning"), interval_s=0.1) as sampler,
    ):
        await tool(rig, "kubectl", "apply", "-f", str(EXAMPLE))

        async def some_done() -> bool:
            return await _done(kapi, "gpu-node-tuning") > 0

        await eventually(some_done, timeout_s=300, what="the first nodes to be done")
        assert await _done(kapi, "gpu-node-tuning") < len(names), "switched in the middle"
        print(f"one process: VmRSS {_rss_mib(pid):.1f} MiB mid-rollout", file=sys.stderr)
        await tool(
            rig, "helm", "upgrade", "nodewright", str(CHART), "-n", NAMESPACE, "--reuse-values",
            "--set", "layout=perService", "--wait", "--timeout", "300s",
        )  # fmt: skip
        await eventually(functools.partial(_all_ready, kapi), timeout_s=120, what="10 pods")
        out = await tool(
            rig, "kubectl", "wait", "--for=condition=Ready", "nodewright/gpu-node-tuning",
            "--timeout=600s",
        )  # fmt: skip
        assert "condition met" in out
    assert ledger.duplicates() == {}, "no pod created twice"
    assert ledger.repeated() == {}, "no step run twice (a new attempt or cycle)"
    assert len(ledger.of_role("stage", "apply")) == len(names), "one apply stage per node"
    assert max(sampler.samples) <= budget, (max(sampler.samples), budget)
    assert await _cordoned(kapi) == []
    accounts = await kapi.get(path_of(plural="serviceaccounts", namespace=NAMESPACE))
    assert "nodewright-services" not in {a["metadata"]["name"] for a in accounts["items"]}
    # The webhook's certificate Secret was owned by the one-process Deployment, now gone: the
    # validators adopted it (or made a new one), and the webhook still answers.
    await _assert_the_webhook_refuses_a_missing_policy(rig)
