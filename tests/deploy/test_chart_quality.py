"""Chart quality without a cluster: plain ``helm template`` and ``helm lint --strict`` work with
the chart's defaults (no ``--kube-version``), the Kubernetes minimum applies whenever helm
renders for a real cluster, ``values.schema.json`` refuses wrong values naming them and admits
the documented variants, the chart README lists every value with its default, and the
ServiceMonitor/PodMonitor select exactly the services.

The rig's helm (built from source) renders without a cluster for Kubernetes v1.20.0, below
the chart's minimum of 1.35: the case the issue reported."""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.helm import CHART, helm

VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
README = (CHART / "README.md").read_text()
SERVICES = ["drainer", "executor", "scheduler", "status", "validator"]
# A second, independent validator of the schema (helm's is Go's santhosh-tekuri/jsonschema);
# imported by name because it ships no type information.
jsonschema = importlib.import_module("jsonschema")
SCHEMA_ERROR = "values don't meet the specifications of the schema(s)"

# ---- helm template / lint without --kube-version ---------------------------------------------


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


async def test_plain_helm_template_renders_the_defaults() -> None:
    ran = await helm("template", "nodewright", str(CHART))
    docs = _docs(ran.ok())
    deployments = sorted(d["metadata"]["name"] for d in docs if d["kind"] == "Deployment")
    assert deployments == [f"nodewright-{s}" for s in SERVICES]


async def test_helm_lint_strict_passes_with_the_defaults() -> None:
    out = (await helm("lint", "--strict", str(CHART))).ok()
    assert "1 chart(s) linted, 0 chart(s) failed" in out


async def test_helm_renders_for_no_cluster_at_a_default_kube_version_below_the_minimum(
    tmp_path: Path,
) -> None:
    """What made plain `helm template` fail: without a cluster, helm's default Kubernetes
    version is below 1.35, and the kubeVersion constraint Chart.yaml had refused it."""
    assert "kubeVersion" not in yaml.safe_load((CHART / "Chart.yaml").read_text())
    (tmp_path / "Chart.yaml").write_text(
        "apiVersion: v2\nname: probe\nversion: 0.1.0\nkubeVersion: '>=1.35.0-0'\n"
    )
    err = (await helm("template", "p", str(tmp_path))).failed()
    assert "chart requires kubeVersion: >=1.35.0-0 which is incompatible with Kubernetes v1." in err


CLUSTER = ("--api-versions", "apiregistration.k8s.io/v1")
"""What makes helm render for a real cluster without one: the API group every API server
serves and helm's built-in list lacks (Argo CD passes the cluster's --api-versions)."""


@pytest.mark.parametrize("version", ["1.34.9", "v1.30.0", "1.34.0-eks-4096722"])
async def test_a_cluster_below_1_35_is_refused_naming_its_version(version: str) -> None:
    err = (await helm("template", "nw", str(CHART), "--kube-version", version, *CLUSTER)).failed()
    # helm keeps major.minor.patch of --kube-version (a cluster's own version keeps its suffix)
    shown = "v" + version.removeprefix("v").split("-")[0]
    assert (
        f"NodeWright needs Kubernetes >= 1.35 (package pods mount package images as image "
        f"volumes); this cluster is {shown}"
    ) in err


@pytest.mark.parametrize("version", ["1.35.0", "v1.35.2-eks-1c2b3a4", "1.35.1+k3s1", "1.36.3"])
async def test_a_cluster_of_1_35_or_newer_renders(version: str) -> None:
    out = (await helm("template", "nw", str(CHART), "--kube-version", version, *CLUSTER)).ok()
    assert "kind: Deployment" in out


async def test_without_a_cluster_any_kube_version_renders() -> None:
    """The check needs the cluster's API versions; `helm template --kube-version X` alone does
    not say it renders for a cluster (docs/install.md, "kubectl only", passes both)."""
    out = (await helm("template", "nw", str(CHART), "--kube-version", "1.30.0")).ok()
    assert "kind: Deployment" in out


# ---- values.schema.json ----------------------------------------------------------------------


def test_the_schema_is_a_valid_draft_2020_12_schema_the_defaults_meet() -> None:
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    jsonschema.Draft202012Validator(SCHEMA).validate(VALUES)


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/$defs/"), ref
        node = SCHEMA["$defs"][ref.removeprefix("#/$defs/")]
    return node


def _closed_objects(
    values: dict[str, Any], node: dict[str, Any], path: str = ""
) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    node = _resolve(node)
    if node.get("additionalProperties") is False:
        yield path, values, node
        for key, sub in node.get("properties", {}).items():
            if isinstance(values.get(key), dict):
                yield from _closed_objects(values[key], sub, f"{path}.{key}".lstrip("."))


def test_the_schema_names_exactly_the_keys_of_values_yaml_where_it_is_closed() -> None:
    """The chart's own objects list every key as a property and as required; the Kubernetes
    objects it passes through (resources, affinity, capabilities) name their fields."""
    closed = list(_closed_objects(VALUES, SCHEMA))
    own = {p for p, _, node in closed if "required" in node}
    assert own >= {"", "image", "nats", "services", "services.status", "webhook", "metrics"}
    assert {"affinity", "services.status.resources"} <= {p for p, _, _ in closed} - own
    for path, values, node in closed:
        named = set(node.get("properties", {})) - {"global"}
        where = path or "top level"
        if "required" in node:
            assert named == set(values), f"{where}: schema {named} vs values {set(values)}"
            assert set(node["required"]) == set(values), f"{where}: required"
        else:
            assert set(values) <= named, f"{where}: values {set(values)} beyond {named}"


WRONG: list[tuple[tuple[str, ...], str]] = [
    (("--set", "logLevel=verbose"), "- at '/logLevel': value must be one of 'DEBUG', 'INFO'"),
    (("--set", "logLevel=info"), "- at '/logLevel': value must be one of"),
    (
        ("--set", "packageStaging=copies"),
        "- at '/packageStaging': value must be one of 'image-volume', 'copy'",
    ),
    (("--set", "hostRoot=srv/host"), "- at '/hostRoot': 'srv/host' does not match pattern"),
    (("--set", "hostRoot="), "- at '/hostRoot': '' does not match pattern"),
    (
        ("--set", "services.scheduler.replicas=0"),
        "- at '/services/scheduler/replicas': minimum: got 0, want 1",
    ),
    (
        ("--set", "services.status.replicas=11"),
        "- at '/services/status/replicas': maximum: got 11, want 10",
    ),
    (
        ("--set", "services.drainer.replicas=two"),
        "- at '/services/drainer/replicas': got string, want integer",
    ),
    (
        ("--set", "services.schedular.replicas=1"),
        "- at '/services': additional properties 'schedular' not allowed",
    ),
    (("--set", "webhook.port=443"), "- at '/webhook/port': minimum: got 443, want 1,024"),
    (("--set", "webhook.port=70000"), "- at '/webhook/port': maximum: got 70,000, want 65,535"),
    (
        ("--set", "webhook.timeoutSeconds=31"),
        "- at '/webhook/timeoutSeconds': maximum: got 31, want 30",
    ),
    (
        ("--set", "webhook.enable=true"),
        "- at '/webhook': additional properties 'enable' not allowed",
    ),
    (
        ("--set", "resyncIntervalSeconds=0"),
        "- at '/resyncIntervalSeconds': minimum: got 0, want 5",
    ),
    (
        ("--set", "imagePullGraceSeconds=1.5"),
        "- at '/imagePullGraceSeconds': got string, want integer",
    ),
    (
        ("--set", "nats.streamReplicas=0"),
        "- at '/nats/streamReplicas': minimum: got 0, want 1",
    ),
    (
        ("--set", "nats.url=http://nats:4222"),
        "- at '/nats/url': 'http://nats:4222' does not match pattern",
    ),
    (("--set", "nats.stream=NODE.WRIGHT"), "- at '/nats/stream': 'NODE.WRIGHT' does not match"),
    (
        ("--set", "image.pullPolicy=Sometimes"),
        "- at '/image/pullPolicy': value must be one of 'Always', 'IfNotPresent', 'Never'",
    ),
    (("--set", "image.tag=2"), "- at '/image/tag': got number, want string"),
    (
        ("--set", "image.repository=ghcr.io/nvidia/nodewright:0.2.0"),
        "- at '/image/repository': 'ghcr.io/nvidia/nodewright:0.2.0' does not match pattern",
    ),
    (("--set", "simulatedNodes=yes"), "- at '/simulatedNodes': got string, want boolean"),
    (("--set", "verbose=true"), "- at '': additional properties 'verbose' not allowed"),
    (
        ("--set-json", 'imagePolicy.validationActions=["Block"]'),
        "- at '/imagePolicy/validationActions/0': value must be one of 'Deny', 'Warn', 'Audit'",
    ),
    (
        ("--set-json", "imagePolicy.allowedRegistries=[5]"),
        "- at '/imagePolicy/allowedRegistries/0': got number, want string",
    ),
    (
        ("--set", "uninstallHook.timeoutSeconds=0"),
        "- at '/uninstallHook/timeoutSeconds': minimum: got 0, want 1",
    ),
    (
        ("--set", "metrics.serviceMonitor.interval=30x"),
        "- at '/metrics/serviceMonitor/interval': '30x' does not match pattern",
    ),
    (
        ("--set", "metrics.podMonitor.labels.release=1"),
        "- at '/metrics/podMonitor/labels/release': got number, want string",
    ),
    (
        ("--set", "services.executor.resources.requests.cpu=lots"),
        "- at '/services/executor/resources/requests/cpu': 'lots' does not match pattern",
    ),
    (
        ("--set-json", 'tolerations=[{"key":"gpu","operator":"Equals"}]'),
        "- at '/tolerations/0/operator': value must be one of 'Exists', 'Equal'",
    ),
    (
        ("--set", "dashboards.namespace=Monitoring"),
        "- at '/dashboards/namespace': 'Monitoring' does not match pattern",
    ),
]


@pytest.mark.parametrize(("args", "message"), WRONG, ids=[" ".join(a) for a, _ in WRONG])
async def test_a_wrong_value_is_refused_naming_it(args: tuple[str, ...], message: str) -> None:
    err = (await helm("template", "nw", str(CHART), *args)).failed()
    assert SCHEMA_ERROR in err
    assert message in err, err


@pytest.mark.parametrize(
    ("args", "message"),
    [WRONG[0], WRONG[8], WRONG[11]],
    ids=["logLevel", "unknown service", "webhook timeout"],
)
async def test_helm_lint_refuses_a_wrong_value_too(args: tuple[str, ...], message: str) -> None:
    ran = await helm("lint", "--strict", str(CHART), *args)
    assert ran.code != 0
    assert message in ran.out + ran.err


async def test_a_webhook_port_on_the_health_port_is_refused_naming_both() -> None:
    """A check across values, in templates/checks.yaml (the schema checks each on its own).
    The templates' own checks behind the schema: test_image_policy.py, test_uninstall_hook.py."""
    err = (await helm("template", "nw", str(CHART), "--set", "webhook.port=8080")).failed()
    assert (
        "webhook.port: 8080 is the services' health and metrics port (http); pick another port "
        "for the webhook (default 9443)"
    ) in err
    # With the webhook off the port is unused.
    assert (
        await helm(
            "template",
            "nw",
            str(CHART),
            "--set",
            "webhook.port=8080",
            "--set",
            "webhook.enabled=false",
        )
    ).ok()


DOCUMENTED: list[tuple[str, ...]] = [
    # docs/install.md, "Helm" and "Images"
    ("--set", "nats.url=nats://nats.nats.svc:4222"),
    (
        "--set",
        "image.repository=registry.example.com:5000/platform/nodewright",
        "--set",
        "agentImage=registry.example.com:5000/platform/nodewright/agent:0.1.0",
    ),
    ("--set", "packageStaging=copy"),
    # docs/install.md, "Restricting package images"
    (
        "--set",
        "imagePolicy.enabled=true",
        "--set-json",
        'imagePolicy.allowedRegistries=["ghcr.io/nvidia/","registry.example.com:5000/platform/"]',
        "--set",
        "imagePolicy.requireDigest=true",
    ),
    (
        "--set",
        "imagePolicy.enabled=true",
        "--set",
        "imagePolicy.requireDigest=true",
        "--set-json",
        'imagePolicy.validationActions=["Warn","Audit"]',
    ),
    # docs/install.md, "Uninstalling"; values.yaml's dashboards and metrics
    ("--set", "uninstallHook.enabled=true", "--set", "uninstallHook.timeoutSeconds=1800"),
    (
        "--set",
        "dashboards.enabled=true",
        "--set",
        "dashboards.namespace=monitoring",
        "--set",
        "dashboards.annotations.grafana_folder=NodeWright",
    ),
    (
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.serviceMonitor.labels.release=prometheus",
        "--set",
        "metrics.serviceMonitor.interval=1m30s",
    ),
    ("--set", "metrics.podMonitor.enabled=true", "--set", "metrics.podMonitor.scrapeTimeout=500ms"),
    # the README's notes: numeric tags as strings, several NATS URLs, helm's global values
    ("--set-string", "image.tag=2", "--set", "image.pullPolicy=Always"),
    ("--set", "nats.url=tls://n1.nats:4222\\,tls://n2.nats:4222", "--set", "nats.streamReplicas=1"),
    ("--set", "global.imageRegistry=registry.example.com"),
    # test beds (the rig's installs) and the Kubernetes objects passed through
    (
        "--set",
        "simulatedNodes=true",
        "--set",
        "hostRoot=/var/lib/nodewright-host",
        "--set",
        "logLevel=DEBUG",
        "--set",
        "resyncIntervalSeconds=10",
    ),
    (
        "--set-json",
        'tolerations=[{"key":"nodepool","operator":"Equal","value":"system","effect":"NoSchedule"}]',
        "--set",
        "nodeSelector.nodepool=system",
        "--set-json",
        'affinity={"podAntiAffinity":{"preferredDuringSchedulingIgnoredDuringExecution":[]}}',
        "--set-json",
        'imagePullSecrets=[{"name":"regcred"}]',
        "--set",
        "services.executor.replicas=3",
        "--set",
        "services.executor.resources.limits.cpu=1",
        "--set",
        "webhook.enabled=false",
        "--set",
        "podDisruptionBudget.enabled=false",
    ),
    ("--set", "agentImage=ghcr.io/nvidia/nodewright/agent@sha256:" + "ab" * 32),
]


@pytest.mark.parametrize("args", DOCUMENTED, ids=lambda a: " ".join(a)[:60])
async def test_the_documented_variants_pass_the_schema(args: tuple[str, ...]) -> None:
    out = (await helm("template", "nw", str(CHART), *args)).ok()
    assert "kind: Deployment" in out


# ---- the chart README lists every value -------------------------------------------------------

ROW = re.compile(
    r"^\| `(?P<key>[^`]+)` \| (?P<type>[a-z]+) \| `(?P<default>[^`]*)` \| (?P<text>.+) \|$"
)
TYPES = {"string": str, "boolean": bool, "integer": int, "object": dict, "list": list}


def _readme_rows(text: str) -> dict[str, tuple[str, str, str]]:
    rows: dict[str, tuple[str, str, str]] = {}
    section = text.split("\n## Values\n", 1)[1]
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        m = ROW.match(line)
        assert m, f"README row not in the form | `key` | type | `default` | description |: {line}"
        assert m["key"] not in rows, f"README lists {m['key']} twice"
        rows[m["key"]] = (m["type"], m["default"], m["text"])
    return rows


def _leaves(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{path}.")
        else:
            yield path


def _at(values: Any, path: str) -> Any:
    for part in path.split("."):
        assert isinstance(values, dict), f"{path} is not in values.yaml"
        assert part in values, f"{path} is not in values.yaml"
        values = values[part]
    return values


def _readme_problems(text: str) -> list[str]:
    rows = _readme_rows(text)
    problems = []
    for leaf in _leaves(VALUES):
        parts = leaf.split(".")
        if not any(".".join(parts[:i]) in rows for i in range(1, len(parts) + 1)):
            problems.append(f"{leaf}: no README row")
    for key, (kind, default, description) in rows.items():
        try:
            value = _at(VALUES, key)
        except AssertionError as exc:
            problems.append(str(exc))
            continue
        if yaml.safe_load(default) != value:
            problems.append(f"{key}: README default {default} is not values.yaml's {value!r}")
        if not isinstance(value, TYPES[kind]) or (kind == "integer" and isinstance(value, bool)):
            problems.append(f"{key}: README type {kind} but the default is {value!r}")
        if not description.strip():
            problems.append(f"{key}: no description")
        for other in rows:
            if other.startswith(key + "."):
                problems.append(f"{key} and {other} both have rows")
    return problems


def test_the_readme_lists_every_value_with_its_type_and_default() -> None:
    rows = _readme_rows(README)
    assert len(rows) >= 50
    assert _readme_problems(README) == []


def test_the_readme_check_finds_a_missing_value_and_a_wrong_default() -> None:
    """The check above can fail: drop a row and change a default in a copy of the README."""
    lines = README.splitlines()
    broken = "\n".join(
        line.replace("`INFO`", "`DEBUG`")
        for line in lines
        if not line.startswith("| `webhook.timeoutSeconds`")
    )
    assert _readme_problems(broken) == [
        "webhook.timeoutSeconds: no README row",
        "logLevel: README default DEBUG is not values.yaml's 'INFO'",
    ]


def test_every_readme_value_has_a_schema_of_its_type() -> None:
    json_types = {
        "string": "string",
        "boolean": "boolean",
        "integer": "integer",
        "object": "object",
        "list": "array",
    }
    for key, (kind, _, _) in _readme_rows(README).items():
        node = SCHEMA
        for part in key.split("."):
            node = _resolve(node)["properties"][part]
        node = _resolve(node)
        if "enum" in node:
            assert {type(v) for v in node["enum"]} == {str}, key
            assert kind == "string", key
        else:
            declared = node["type"] if isinstance(node["type"], list) else [node["type"]]
            assert json_types[kind] in declared, f"{key}: README {kind}, schema {declared}"


# ---- ServiceMonitor / PodMonitor select exactly the services ----------------------------------


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In", expr
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


async def test_the_monitors_are_off_by_default() -> None:
    docs = _docs((await helm("template", "nw", str(CHART))).ok())
    assert [d["kind"] for d in docs if d["kind"] in ("ServiceMonitor", "PodMonitor")] == []


async def test_the_service_monitor_selects_the_five_metrics_services_and_their_http_port() -> None:
    docs = _docs(
        (
            await helm(
                "template",
                "nw",
                str(CHART),
                "-n",
                "nodewright-system",
                "--set",
                "metrics.serviceMonitor.enabled=true",
                "--set",
                "metrics.serviceMonitor.labels.release=prometheus",
                "--set",
                "metrics.serviceMonitor.interval=15s",
            )
        ).ok()
    )
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert monitor["metadata"]["namespace"] == "nodewright-system"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"] == [
        {"port": "http", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}
    ]
    services = [d for d in docs if d["kind"] == "Service"]
    assert len(services) >= 6  # the five metrics Services and the webhook's
    selected = [
        s for s in services if _selects(monitor["spec"]["selector"], s["metadata"]["labels"])
    ]
    assert sorted(s["metadata"]["name"] for s in selected) == [
        f"nodewright-{s}-metrics" for s in SERVICES
    ]
    for s in selected:
        assert {"name": "http", "port": 8080, "targetPort": "http"} in s["spec"]["ports"]


async def test_the_pod_monitor_selects_the_services_pods_and_not_the_hooks() -> None:
    docs = _docs(
        (
            await helm(
                "template",
                "nw",
                str(CHART),
                "--set",
                "metrics.podMonitor.enabled=true",
                "--set",
                "uninstallHook.enabled=true",
            )
        ).ok()
    )
    (monitor,) = [d for d in docs if d["kind"] == "PodMonitor"]
    assert monitor["spec"]["podMetricsEndpoints"] == [
        {"port": "http", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"}
    ]
    templates = [d for d in docs if d["kind"] in ("Deployment", "Job")]
    selected = [
        d
        for d in templates
        if _selects(monitor["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])
    ]
    assert sorted(d["metadata"]["name"] for d in selected) == [f"nodewright-{s}" for s in SERVICES]
    assert "nodewright-uninstall-all" in [d["metadata"]["name"] for d in templates]
    for d in selected:
        ports = d["spec"]["template"]["spec"]["containers"][0]["ports"]
        assert {"name": "http", "containerPort": 8080} in ports
