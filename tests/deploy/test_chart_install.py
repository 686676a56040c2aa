"""The chart as users get it: packaged (``helm package``), pushed as an OCI artifact to a
registry on loopback (``crane registry serve``), installed from ``oci://`` into a real API
server, its NOTES printed, uninstalled; the ServiceMonitor and PodMonitor checked by the
Prometheus Operator's own CRDs (from its Go module, scripts/build-rig.sh prometheus-crds).

The install goes to a control plane of its own (started here, no nodes: the pods stay
Pending, which is all this needs): the chart's cluster-scoped objects (ClusterRoles, the
webhook configuration) have the names the session rig's tests use for theirs. The real
install on running nodes is tests/e2e/install."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodewright.rig import Rig, default_bin_dir, free_port
from tests.deploy.helm import CHART, Ran, helm, run

pytestmark = [pytest.mark.rig, pytest.mark.timeout(300)]

NS = "nodewright-system"
MONITORING = "monitoring.coreos.com"
CRD_DIR = default_bin_dir().parent / "crds" / "prometheus-operator"
SERVICES = ["drainer", "executor", "scheduler", "status", "validator"]


@pytest.fixture(scope="module")
def own_rig() -> Iterator[Rig]:
    """A control plane for this module alone (no kwok nodes are created)."""
    with Rig() as the_rig:
        yield the_rig


@pytest.fixture(scope="module")
def monitoring_crds(own_rig: Rig) -> Path:
    """The Prometheus Operator's ServiceMonitor and PodMonitor CRDs, installed and established."""
    files = sorted(CRD_DIR.glob("monitoring.coreos.com_*.yaml"))
    assert [f.name for f in files] == [
        "monitoring.coreos.com_podmonitors.yaml",
        "monitoring.coreos.com_servicemonitors.yaml",
    ], f"no Prometheus Operator CRDs in {CRD_DIR}: run scripts/build-rig.sh prometheus-crds"
    kubectl = [str(own_rig.bin_dir / "kubectl"), "--kubeconfig", str(own_rig.endpoints.kubeconfig)]
    for f in files:
        subprocess.run([*kubectl, "apply", "--server-side", "-f", str(f)], check=True)
    subprocess.run(
        [*kubectl, "wait", "--for=condition=Established", "--timeout=60s"]
        + [f"crd/{kind}.{MONITORING}" for kind in ("servicemonitors", "podmonitors")],
        check=True,
    )
    return CRD_DIR


@pytest.fixture(scope="module")
def registry() -> Iterator[str]:
    """``crane registry serve`` on a free loopback port (in memory); yields host:port."""
    address = f"127.0.0.1:{free_port()}"
    crane = default_bin_dir() / "crane"
    assert crane.exists(), f"{crane} is missing: run scripts/build-rig.sh crane"
    proc = subprocess.Popen(
        [str(crane), "registry", "serve", "--address", address],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, f"crane registry serve exited with {proc.returncode}"
            try:
                with urllib.request.urlopen(f"http://{address}/v2/", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "crane registry did not answer in 30s"
            time.sleep(0.1)
        yield address
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def helm_env(tmp_path: Path) -> dict[str, str]:
    """helm's own config, cache and data in the test's directory (no registry logins or
    repositories of the machine)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_")}
    for name in ("CONFIG", "CACHE", "DATA"):
        env[f"HELM_{name}_HOME"] = str(tmp_path / f"helm-{name.lower()}")
    return env


def _kubectl(rig: Rig, *args: str) -> list[str]:
    return [str(rig.bin_dir / "kubectl"), "--kubeconfig", str(rig.endpoints.kubeconfig), *args]


async def _kubectl_ran(rig: Rig, *args: str, stdin: str = "") -> Ran:
    proc = await asyncio.create_subprocess_exec(
        *_kubectl(rig, *args),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate(stdin.encode())
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(), err.decode())


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


# ---- the Prometheus Operator's CRDs ------------------------------------------------------------


async def test_a_monitor_on_a_cluster_without_the_prometheus_operator_is_refused_naming_it(
    rig: Rig,
) -> None:
    """On the session rig, which has no monitoring.coreos.com API: the render stops with what
    to install (before helm would send a ServiceMonitor the API server cannot take)."""
    absent = await _kubectl_ran(rig, "get", "--raw", f"/apis/{MONITORING}")
    assert absent.code != 0
    assert "NotFound" in absent.err or "not found" in absent.err.lower()
    for kind in ("serviceMonitor", "podMonitor"):
        ran = await helm(
            "install",
            "nw",
            str(CHART),
            "-n",
            NS,
            "--dry-run=server",
            "--kubeconfig",
            str(rig.endpoints.kubeconfig),
            "--set",
            f"metrics.{kind}.enabled=true",
        )
        upper = kind[0].upper() + kind[1:]
        assert (
            f"metrics.{kind}.enabled: this cluster has no {upper} API (monitoring.coreos.com/v1): "
            "install the Prometheus Operator (its CRDs) first"
        ) in ran.failed()


async def test_the_monitors_pass_the_prometheus_operators_own_crds(
    own_rig: Rig, monitoring_crds: Path
) -> None:
    assert (monitoring_crds / ".version").read_text().strip() == "v0.85.0"
    text = (
        await helm(
            "template",
            "nw",
            str(CHART),
            "-n",
            NS,
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "metrics.serviceMonitor.labels.release=prometheus",
            "--set",
            "metrics.serviceMonitor.interval=1m30s",
            "--set",
            "metrics.podMonitor.enabled=true",
            "--set",
            "metrics.podMonitor.scrapeTimeout=500ms",
            "-s",
            "templates/servicemonitor.yaml",
            "-s",
            "templates/podmonitor.yaml",
        )
    ).ok()
    await _kubectl_ran(own_rig, "create", "namespace", NS)
    applied = (
        await _kubectl_ran(
            own_rig, "apply", "--server-side", "--dry-run=server", "-f", "-", stdin=text
        )
    ).ok()
    assert sorted(applied.splitlines()) == [
        f"podmonitor.{MONITORING}/nodewright serverside-applied (server dry run)",
        f"servicemonitor.{MONITORING}/nodewright serverside-applied (server dry run)",
    ]
    # The CRDs really judge them: a field they do not have, a malformed duration are refused.
    (sm,) = [d for d in _docs(text) if d["kind"] == "ServiceMonitor"]
    for change, message in (
        ({"scrapeEvery": "30s"}, ".spec.endpoints[0].scrapeEvery: field not declared in schema"),
        ({"interval": "90 seconds"}, 'spec.endpoints[0].interval: Invalid value: "90 seconds"'),
    ):
        bad = copy.deepcopy(sm)
        bad["spec"]["endpoints"][0].update(change)
        refused = await _kubectl_ran(
            own_rig, "apply", "--server-side", "--dry-run=server", "-f", "-", stdin=json.dumps(bad)
        )
        assert message in refused.failed()


# ---- packaged, pushed, installed from the registry ---------------------------------------------


async def test_the_packaged_chart_installs_from_an_oci_registry_and_uninstalls(
    own_rig: Rig,
    monitoring_crds: Path,
    registry: str,
    helm_env: dict[str, str],
    tmp_path: Path,
) -> None:
    kubeconfig = ("--kubeconfig", str(own_rig.endpoints.kubeconfig))
    out = (await helm("package", str(CHART), "-d", str(tmp_path), env=helm_env)).ok()
    tgz = tmp_path / "nodewright-0.1.0.tgz"
    assert f"Successfully packaged chart and saved it to: {tgz}" in out

    pushed = await helm("push", str(tgz), f"oci://{registry}/charts", "--plain-http", env=helm_env)
    assert f"Pushed: {registry}/charts/nodewright:0.1.0" in pushed.ok() + pushed.err
    # An independent client sees a Helm chart artifact there, the one helm pushed.
    crane = str(default_bin_dir() / "crane")
    manifest = json.loads(
        await run(crane, "manifest", "--insecure", f"{registry}/charts/nodewright:0.1.0")
    )
    assert manifest["config"]["mediaType"] == "application/vnd.cncf.helm.config.v1+json"
    assert [layer["mediaType"] for layer in manifest["layers"]] == [
        "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
    ]
    digest = (
        await run(crane, "digest", "--insecure", f"{registry}/charts/nodewright:0.1.0")
    ).strip()
    assert f"Digest: {digest}" in pushed.ok() + pushed.err

    ref = f"oci://{registry}/charts/nodewright"
    t0 = time.monotonic()
    installed = await helm(
        "install",
        "nw",
        ref,
        "--version",
        "0.1.0",
        "--plain-http",
        *kubeconfig,
        "-n",
        NS,
        "--create-namespace",
        "--set",
        "nats.url=nats://nats.nats.svc:4222",
        "--set",
        "metrics.serviceMonitor.enabled=true",
        env=helm_env,
    )
    notes = installed.ok()
    print(f"helm install from {ref}: {time.monotonic() - t0:.1f}s")
    assert "STATUS: deployed" in notes
    assert f"Pulled: {registry}/charts/nodewright:0.1.0" in installed.err + notes
    # NOTES.txt: what to run next, for this release and namespace.
    for line in (
        f"NodeWright 0.1.0 is installed: release nw in namespace {NS}.",
        f"kubectl get deployments,pods -n {NS} -l app.kubernetes.io/instance=nw",
        f"kubectl wait deployments -n {NS} -l app.kubernetes.io/instance=nw "
        "--for=condition=Available --timeout=5m",
        "They need NATS with JetStream at nats://nats.nats.svc:4222 (stream NODEWRIGHT, "
        "3 replicas)",
        "kubectl wait nodewright/<name> --for=condition=Ready --timeout=2h",
        "nodewright node list --nodewright <name>",
        "`kubectl nodewright`",
        f"run `nodewright uninstall-all --wait` before `helm uninstall nw -n {NS}`",
        f"Metrics: ServiceMonitor nodewright in {NS}; your Prometheus must select its labels",
        "Docs: docs/install.md",
    ):
        assert line in notes, f"NOTES lack {line!r}:\n{notes}"

    # Every object of the release exists in the API server, CRDs included.
    release = (await helm("get", "manifest", "nw", "-n", NS, *kubeconfig, env=helm_env)).ok()
    objects = _docs(release)
    kinds = sorted({d["kind"] for d in objects})
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "PodDisruptionBudget",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
        "ValidatingWebhookConfiguration",
    ], kinds
    present = (await _kubectl_ran(own_rig, "get", "-f", "-", "-o", "name", stdin=release)).ok()
    assert len(present.splitlines()) == len(objects)
    assert f"servicemonitor.{MONITORING}/nodewright" in present
    crds = (await _kubectl_ran(own_rig, "get", "crd", "-o", "name")).ok()
    for plural in ("nodewrights", "deploymentpolicies"):
        assert (
            f"customresourcedefinition.apiextensions.k8s.io/{plural}.nodewright.nvidia.com" in crds
        )
    # The controllers made the services' pods (Pending: this control plane has no nodes).
    pods = json.loads((await _kubectl_ran(own_rig, "get", "pods", "-n", NS, "-o", "json")).ok())[
        "items"
    ]
    deadline = time.monotonic() + 60
    while len(pods) < 10 and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        pods = json.loads(
            (await _kubectl_ran(own_rig, "get", "pods", "-n", NS, "-o", "json")).ok()
        )["items"]
    components = sorted(p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods)
    assert components == sorted(SERVICES * 2)
    assert {p["status"]["phase"] for p in pods} == {"Pending"}
    assert {p["spec"]["containers"][0]["image"] for p in pods} == {
        "ghcr.io/nvidia/nodewright:0.1.0"
    }

    listed = json.loads(
        (await helm("list", "-n", NS, "-o", "json", *kubeconfig, env=helm_env)).ok()
    )
    assert [(r["name"], r["chart"], r["status"]) for r in listed] == [
        ("nw", "nodewright-0.1.0", "deployed")
    ]

    gone = await helm("uninstall", "nw", "-n", NS, "--wait", *kubeconfig, env=helm_env)
    assert 'release "nw" uninstalled' in gone.ok()
    left = await _kubectl_ran(own_rig, "get", "-f", "-", "-o", "name", stdin=release)
    assert left.out == ""
    assert left.err.count("NotFound") == len(objects)
    # Helm never deletes crds/: the NodeWrights (none here) would stay.
    crds = (await _kubectl_ran(own_rig, "get", "crd", "-o", "name")).ok()
    assert "customresourcedefinition.apiextensions.k8s.io/nodewrights.nodewright.nvidia.com" in crds
    assert (
        json.loads((await helm("list", "-n", NS, "-o", "json", *kubeconfig, env=helm_env)).ok())
        == []
    )


async def test_the_notes_follow_the_values(own_rig: Rig, helm_env: dict[str, str]) -> None:
    """NOTES.txt with the uninstall hook, both monitors and other replica counts (a client
    dry run against the real API server: rendered, nothing created)."""
    ran = await helm(
        "install",
        "other",
        str(CHART),
        "-n",
        "elsewhere",
        "--dry-run=client",
        "--kubeconfig",
        str(own_rig.endpoints.kubeconfig),
        "--set",
        "uninstallHook.enabled=true",
        "--set",
        "uninstallHook.timeoutSeconds=1800",
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.podMonitor.enabled=true",
        "--set",
        "services.executor.replicas=3",
        "--set",
        "webhook.enabled=false",
        env=helm_env,
    )
    notes = ran.ok().split("NOTES:\n", 1)[1]
    for line in (
        "NodeWright 0.1.0 is installed: release other in namespace elsewhere.",
        "(replicas: drainer 2, executor 3, scheduler 2, status 2, validator 2):",
        "the pre-delete hook is on, so `helm uninstall other -n elsewhere --timeout 31m` first",
        "Metrics: ServiceMonitor and PodMonitor nodewright in elsewhere",
    ):
        assert line in notes, f"NOTES lack {line!r}:\n{notes}"
    assert "admission webhook" not in notes
    assert "nodewright uninstall-all --wait` before" not in notes
