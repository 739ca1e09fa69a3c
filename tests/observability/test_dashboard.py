"""The Grafana dashboard queries only metrics the service (and its client) really expose."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import grpc
import pytest
from ibex_context.observability.metrics import Metrics
from ibex_context_client.metrics import ClientMetrics
from ibex_context_client.results import AssembleResult
from ibex_operator.metrics import OperatorMetrics
from prometheus_client import CollectorRegistry

DASHBOARD = (
    Path(__file__).resolve().parents[2] / "charts" / "ibex-context" / "dashboards" / "ibex-context.json"
)
# Ours (service and operator), the conventional gRPC server metrics and the standard process metrics.
METRIC = re.compile(r"\b((?:ibex_context|ibex_operator|grpc_server|process)_[a-z0-9_]+)")


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def expressions(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in panels(dashboard) for t in p["targets"]]


def exposed_sample_names() -> set[str]:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.record_call("/ibex.context.v1.ContextAssemblyService/AssembleContext", grpc.StatusCode.OK, 0.01)
    metrics.record_store_up("redis", True)  # the store gauges appear with the first probe
    names = set(metrics.metric_names())
    ClientMetrics(registry).record(AssembleResult((), None, "", True, 0.01))
    names |= {s.name for family in registry.collect() for s in family.samples}
    operator = OperatorMetrics()
    operator.reconcile_seconds.observe(0.1)
    operator.changes.labels("ConfigMap", "created").inc()  # a labelled series appears with its first write
    names |= {s.name for family in operator.registry.collect() for s in family.samples}
    return names


def test_every_metric_the_dashboard_queries_is_exposed(dashboard: dict[str, Any]) -> None:
    queried = {name for expr in expressions(dashboard) for name in METRIC.findall(expr)}
    assert queried, "the dashboard queries no ibex_context metric"
    assert queried - exposed_sample_names() == set()


def test_the_panels_the_issue_asks_for_are_there(dashboard: dict[str, Any]) -> None:
    exprs = "\n".join(expressions(dashboard))
    for quantile in ("0.5", "0.9", "0.99"):
        assert (
            f"histogram_quantile({quantile}, sum by (le) (rate(ibex_context_assembly_duration_seconds_bucket"
            in exprs
        )
    assert "sum by (reason) (rate(ibex_context_fallbacks_total" in exprs
    assert "ibex_context_stage_duration_seconds" in exprs
    assert "ibex_context_inflight_calls" in exprs
    assert "ibex_context_profile_reload_last_success_timestamp_seconds" in exprs
    assert "ibex_context_retrieval_failures_total" in exprs
    # Store health, CPU, memory and replicas.
    assert "min by (store) (ibex_context_store_up" in exprs
    assert "sum by (pod) (rate(process_cpu_seconds_total" in exprs
    assert "sum by (pod) (process_resident_memory_bytes" in exprs
    assert "count(count by (pod) (up{" in exprs


def test_the_operator_has_its_panels_on_its_own_job(dashboard: dict[str, Any]) -> None:
    operator_exprs = [e for e in expressions(dashboard) if "ibex_operator_" in e]
    joined = "\n".join(operator_exprs)
    for metric in (
        "ibex_operator_reconciles_total",
        "ibex_operator_reconcile_duration_seconds_bucket",
        "ibex_operator_last_success_timestamp_seconds",
        "ibex_operator_changes_total",
        "ibex_operator_drift_repairs_total",
        "ibex_operator_leader",
    ):
        assert metric in joined, metric
    # The operator is scraped by its PodMonitor, under a job of its own.
    assert all('job=~"$operator_job"' in e for e in operator_exprs)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert "ibex_operator_leader" in variables["operator_job"]["definition"]


def test_the_datasource_is_a_template_variable_used_by_every_query(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in panels(dashboard):
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_queries_have_balanced_brackets_and_quotes(dashboard: dict[str, Any]) -> None:
    pairs = {")": "(", "]": "[", "}": "{"}
    for expr in expressions(dashboard):
        stack: list[str] = []
        for char in re.sub(r'"[^"]*"', '""', expr):
            if char in "([{":
                stack.append(char)
            elif char in pairs:
                assert stack and stack.pop() == pairs[char], expr
        assert not stack, expr
        assert expr.count('"') % 2 == 0, expr


def test_panel_ids_are_unique_and_panels_do_not_overlap(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24, panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps at {(x, y)}"
                cells.add((x, y))
