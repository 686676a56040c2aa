"""What the five services really serve on /metrics after a rollout on the rig: Prometheus'
own linter (``promtool check metrics``, from Debian's prometheus package, unpacked by
scripts/build-rig.sh) finds nothing to say about it, the stage and drain duration histograms
counted the rollout's stages and drains, every process exports the standard process
metrics, and every query of the Grafana dashboard parses as PromQL (``promtool check
rules``: each query a recording rule) and selects only names a service really exported."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from nodewright import manifests
from nodewright.rig import Rig, nodes
from shared.kube import Kube
from tests.deploy.test_dashboard import DASHBOARD, _exprs, _series, metric_names
from tests.e2e.conftest import Services, cr_ready
from tests.helpers.waiting import eventually

pytestmark = pytest.mark.timeout(600)

OLD_GAUGE = """# HELP nodewright_node_status_count Target nodes per state
# TYPE nodewright_node_status_count gauge
nodewright_node_status_count{nodewright="gpu",status="Complete"} 3
"""
"""The name one of our gauges had before: what the linter must flag (it can fail)."""


async def promtool(rig: Rig, *args: str, stdin: str = "") -> tuple[int, str]:
    binary = rig.bin_dir / "promtool"
    assert binary.exists(), "scripts/build-rig.sh promtool builds it"
    proc = await asyncio.create_subprocess_exec(
        str(binary),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(stdin.encode()), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        body: bytes = resp.read()
    return body.decode()


def _grafana_free(expr: str) -> str:
    """A dashboard query with Grafana's variables filled in, as Grafana sends it."""
    expr = expr.replace("$__rate_interval", "5m")
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def _as_rules(queries: list[tuple[str, str]], where: Path) -> Path:
    """The queries as one recording rule each, for ``promtool check rules`` (which parses
    every expression, naming the one that fails)."""
    rules = [
        {"record": f"nodewright:dashboard:query{i}", "expr": _grafana_free(expr)}
        for i, (_, expr) in enumerate(queries)
    ]
    path = where / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    return path


async def test_what_the_services_serve_is_lint_clean_and_what_the_dashboard_queries(
    rig: Rig, cluster: Kube, services: Services, tmp_path: Path
) -> None:
    kapi = cluster
    names = await nodes.create_nodes(
        kapi, [f"gpu-node-{i:03d}" for i in range(3)], labels={"nodepool": "gpu"}
    )
    await nodes.wait_ready(kapi, names)
    await asyncio.to_thread(services.fleet.start_all)
    example = manifests.sample("nodewright-gpu-node-tuning.yaml")
    await manifests.apply(kapi, example)
    await eventually(
        lambda: cr_ready(kapi, example["metadata"]["name"]), timeout_s=240, what="Ready"
    )
    code, said = await promtool(rig, "check", "metrics", stdin=OLD_GAUGE)
    assert code != 0
    assert '"_count" suffix' in said, said
    exported: dict[str, set[str]] = {}
    samples: dict[str, float] = {}
    for service, replicas in services.fleet.replicas.items():
        text = await asyncio.to_thread(_scrape, replicas[0].health_port)
        code, said = await promtool(rig, "check", "metrics", stdin=text)
        assert (code, said.strip()) == (0, ""), f"{service}: {said}"
        names_here: set[str] = set()
        for family in text_string_to_metric_families(text):
            # A labelled counter no one counted yet is served as its HELP and TYPE only.
            names_here |= _series(family.name, family.type)
            for sample in family.samples:
                names_here.add(sample.name)
                if sample.name.endswith(
                    ("_duration_seconds_count", "_phase_seconds_count", "_releases_total")
                ):
                    label = sample.labels.get("phase") or sample.labels.get("via")
                    key = f"{service}:{sample.name}" + (f":{label}" if label else "")
                    samples[key] = samples.get(key, 0.0) + sample.value
        assert {"process_cpu_seconds_total", "process_resident_memory_bytes"} <= names_here, service
        exported[service] = names_here
    # Three nodes, each drained once and through two stages (apply, config): counted once.
    assert samples.get("drainer:nodewright_drain_duration_seconds_count") == 3, samples
    assert samples.get("executor:nodewright_stage_duration_seconds_count") == 6, samples
    # The scheduler's passes decided, wrote batch books and admitted. Each node was released
    # once, as soon as it was due (the fast path) unless a pass saw it first.
    for phase in ("decide", "book", "admissions"):
        key = f"scheduler:nodewright_scheduler_pass_phase_seconds_count:{phase}"
        assert samples.get(key, 0) >= 1, samples
    released = "scheduler:nodewright_scheduler_releases_total"
    fast, by_pass = samples.get(f"{released}:fast", 0), samples.get(f"{released}:pass", 0)
    assert (fast + by_pass, fast >= 1) == (3, True), samples
    every = set().union(*exported.values())
    dashboard = json.loads(DASHBOARD.read_text())
    queries = list(_exprs(dashboard))
    for title, expr in queries:
        unknown = metric_names(expr) - every
        assert not unknown, f"{title}: {sorted(unknown)} not served by any service"
    code, said = await promtool(rig, "check", "rules", str(_as_rules(queries, tmp_path)))
    assert code == 0, said
    assert f"SUCCESS: {len(queries)} rules found" in said, said
    # ... and the check can fail: a query that does not parse is named.
    broken = [("Broken", "sum(rate(nodewright_events_handled_total[5m]) by (kind)")]
    code, said = await promtool(rig, "check", "rules", str(_as_rules(broken, tmp_path)))
    assert code != 0
    assert "could not parse expression" in said, said
