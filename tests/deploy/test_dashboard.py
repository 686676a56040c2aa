"""The Grafana dashboard (deploy/chart/nodewright/dashboards/nodewright.json) queries only
metrics the services export, shows every NodeWright gauge filtered by ``$nodewright``, and
the chart ships it as a ConfigMap for the Grafana sidecar when asked to.

The exported names come from the services themselves: each service's shell is built, offline
(an unconnected NATS client, an API client that sends nothing), on a fresh Prometheus
registry, and the registry lists what that service would serve on /metrics.
"""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import Callable, Iterator
from typing import Any, get_args

import pytest
from nats.aio.client import Client as NATS

from services.drainer import config as drainer_config, service as drainer
from services.executor import config as executor_config, service as executor
from services.scheduler import config as scheduler_config, service as scheduler
from services.status import config as status_config, metrics, service as status
from services.validator import config as validator_config, service as validator
from shared import api, config, kubeaccess, runtime
from shared.bus import Bus
from shared.kube import Kube, request_counter
from tests.deploy.helm import CHART, render

DASHBOARD = CHART / "dashboards" / "nodewright.json"
NODEWRIGHT_FILTER = 'nodewright=~"$nodewright"'

Build = Callable[[runtime.ServiceContext, Any], object]
SERVICES: tuple[tuple[str, type[config.ServiceSettings], Build], ...] = (
    (scheduler.NAME, scheduler_config.Settings, lambda ctx, _: scheduler.Scheduler(ctx)),
    (drainer.NAME, drainer_config.Settings, drainer.Drainer),
    (executor.NAME, executor_config.Settings, executor.Executor),
    (validator.NAME, validator_config.Settings, validator.Validator),
    (status.NAME, status_config.Settings, status.Status),
)
"""Each service: its name, settings and the shell its ``build`` creates (which registers its
metrics)."""


@pytest.fixture
async def exported() -> dict[str, set[str]]:
    """Service name -> the metric names its /metrics exposes (counters with ``_total``)."""
    found: dict[str, set[str]] = {}
    # Never connected: the shells are only built, for their metrics.
    nowhere = kubeaccess.Access(server="https://127.0.0.1:1", ssl=ssl.create_default_context())
    offline = kubeaccess.Session(nowhere, max_in_flight=1)
    try:
        for name, settings_type, build in SERVICES:
            settings = config.load(settings_type, {})
            nc = NATS()
            registry = runtime.process_registry()
            ctx = runtime.ServiceContext(
                name=name,
                identity="dashboard-test",
                settings=settings,
                bus=Bus(nc=nc, js=nc.jetstream(), settings=settings.nats),
                kube=Kube(offline, observe=request_counter(registry)),
                registry=registry,
                supervisor=runtime.Supervisor(name=name, graceful_timeout_s=1),
                health_port=0,
            )
            build(ctx, settings)
            found[name] = set().union(*(_series(m.name, m.type) for m in registry.collect()))
    finally:
        await offline.close()
    return found


def _series(name: str, kind: str) -> set[str]:
    """The names a metric family is exposed under (counters end in _total; a histogram is
    its buckets, count and sum)."""
    if kind == "counter":
        return {f"{name}_total"}
    if kind == "histogram":
        return {f"{name}_bucket", f"{name}_count", f"{name}_sum"}
    return {name}


def _dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", ())


def _exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of every panel."""
    return [(p["title"], t["expr"]) for p in _panels(dashboard) for t in p.get("targets", ())]


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "group_left", "group_right"})


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers left once string literals,
    label matchers, ranges and grouping clauses are cut, that are not a keyword and not
    called (functions and aggregations are followed by "(")."""
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        if match.start() > 0 and text[match.start() - 1] in "$.0123456789":
            continue  # a variable or part of a number (1e3)
        called = text[match.end() :].lstrip().startswith("(")
        if not called and match.group() not in _KEYWORDS:
            names.add(match.group())
    return names


def test_metric_names_are_found_in_promql() -> None:
    expr = (
        'sum by (consumer, outcome) (rate(a_total{kind="b_c", x=~"$v"}[$__rate_interval]))'
        " / on (consumer) group_left max(d) by (consumer) or e_gauge * 2 > bool 1e3"
    )
    assert metric_names(expr) == {"a_total", "d", "e_gauge"}


def test_every_query_selects_only_metrics_the_services_export(
    exported: dict[str, set[str]],
) -> None:
    every = set().union(*exported.values())
    used = {name: title for title, expr in _exprs(_dashboard()) for name in metric_names(expr)}
    assert used, "the dashboard has no queries"
    unknown = {name: title for name, title in used.items() if name not in every}
    assert unknown == {}, f"queried but exported by no service: {unknown}"
    # The counters are the ones docs/metrics.md names, and the status service exports every
    # gauge family.
    assert exported[status.NAME] >= {f.name for f in metrics.FAMILIES}
    own = {n for n in every if n.startswith("nodewright_")}
    assert own - {f.name for f in metrics.FAMILIES} == {
        "nodewright_events_published_total",
        "nodewright_events_handled_total",
        "nodewright_events_dead_lettered_total",
        "nodewright_status_writes_total",
        "nodewright_status_kube_events_total",
        "nodewright_kube_requests_total",
        "nodewright_scheduler_releases_total",
        *_series("nodewright_stage_duration_seconds", "histogram"),
        *_series("nodewright_drain_duration_seconds", "histogram"),
        *_series("nodewright_scheduler_pass_phase_seconds", "histogram"),
        "nodewright_workqueue_depth",
        "nodewright_workqueue_adds_total",
        "nodewright_workqueue_retries_total",
        *_series("nodewright_workqueue_queue_duration_seconds", "histogram"),
        *_series("nodewright_workqueue_work_duration_seconds", "histogram"),
    }
    # Every service's work queue is seen.
    for name, names in exported.items():
        assert "nodewright_workqueue_depth" in names, name
    # Every service exports the standard process metrics.
    for name, names in exported.items():
        assert {"process_cpu_seconds_total", "process_resident_memory_bytes"} <= names, name


def test_every_nodewright_gauge_has_a_panel_filtered_by_the_nodewright_variable() -> None:
    dashboard = _dashboard()
    gauges = {f.name for f in metrics.FAMILIES}
    shown: set[str] = set()
    for title, expr in _exprs(dashboard):
        selected = metric_names(expr) & gauges
        shown |= selected
        for name in selected:
            selectors = re.findall(rf"\b{name}\{{([^}}]*)\}}", expr)
            assert selectors, f"{title}: {name} without a label filter"
            assert all(NODEWRIGHT_FILTER in s for s in selectors), (title, expr)
    assert sorted(gauges - shown) == []
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["nodewright"]["definition"] == "label_values(nodewright_status, nodewright)"
    assert variables["nodewright"]["multi"] is True
    assert variables["datasource"]["query"] == "prometheus"
    for panel in _panels(dashboard):
        for t in panel.get("targets", ()):
            assert t["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel


def test_the_state_panels_name_every_state() -> None:
    panels = {p["title"]: p for p in _panels(_dashboard())}
    states = set(get_args(api.RolloutState))
    timeline = panels["State over time"]
    (query,) = timeline["targets"]
    numbered = dict(re.findall(r'status="(\w+)"\}\) \* (\d+)', query["expr"]))
    (mapping,) = timeline["fieldConfig"]["defaults"]["mappings"]
    assert {n: m["text"] for n, m in mapping["options"].items()} == {
        n: s for s, n in numbered.items()
    }
    assert set(numbered) == states
    (table_state,) = [
        o
        for o in panels["NodeWrights"]["fieldConfig"]["overrides"]
        if o["matcher"]["options"] == "State"
    ]
    (mappings,) = [p["value"] for p in table_state["properties"] if p["id"] == "mappings"]
    assert set(mappings[0]["options"]) == states


def test_panels_fit_the_grid_without_overlapping() -> None:
    taken: dict[tuple[int, int], str] = {}
    for panel in _panels(_dashboard()):
        pos = panel["gridPos"]
        assert pos["x"] >= 0, panel["title"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in taken, f"{panel['title']} overlaps {taken[(x, y)]}"
                taken[(x, y)] = panel["title"]
    ids = [p["id"] for p in _panels(_dashboard())]
    assert len(ids) == len(set(ids))


async def test_the_chart_ships_the_dashboard_only_when_enabled() -> None:
    assert not [d for d in await render() if d["kind"] == "ConfigMap"]
    (configmap,) = await render(
        "--set",
        "dashboards.enabled=true",
        "--set",
        "dashboards.annotations.grafana_folder=Platform",
        "-s",
        "templates/dashboards.yaml",
    )
    assert configmap["kind"] == "ConfigMap"
    assert configmap["metadata"]["namespace"] == "nodewright-system"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "Platform"}
    assert configmap["data"] == {"nodewright.json": DASHBOARD.read_text()}
    assert json.loads(configmap["data"]["nodewright.json"])["uid"] == "nodewright"
