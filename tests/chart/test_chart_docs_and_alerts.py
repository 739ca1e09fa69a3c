"""The chart's generated documentation is current, complete and from one source each; the alerts
ship as a PrometheusRule built from the same rules the docs list, over metrics the service exposes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.chart.conftest import CHART, FULLNAME, REPO, Rendered
from tests.observability.test_dashboard import exposed_sample_names

SCRIPT = REPO / "scripts" / "chart_docs.py"
RULES = CHART / "alerts" / "ibex-context.rules.yaml"
# The service's and the operator's own metrics, and the gRPC server metrics the service exports.
METRIC = re.compile(r"\b((?:ibex_context|ibex_operator|grpc_server)_[a-z0-9_]+)")
RUNBOOKS = REPO / "docs" / "runbooks.md"


def run_chart_docs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO, timeout=60
    )


def rules() -> list[Mapping[str, Any]]:
    loaded: list[Mapping[str, Any]] = yaml.safe_load(RULES.read_text())
    return loaded


# --- the chart README and the docs' alert list -------------------------------------------------------


def test_the_generated_chart_readme_and_alert_list_are_current() -> None:
    result = run_chart_docs("--check")
    assert result.returncode == 0, result.stderr


def test_a_schema_change_without_regenerating_is_reported_stale(tmp_path: Path) -> None:
    shutil.copytree(CHART, tmp_path / "charts" / "ibex-context")
    (tmp_path / "docs").mkdir()
    shutil.copy(REPO / "docs" / "observability.md", tmp_path / "docs" / "observability.md")
    assert run_chart_docs("--check", "--root", str(tmp_path)).returncode == 0
    schema_path = tmp_path / "charts" / "ibex-context" / "values.schema.json"
    schema = json.loads(schema_path.read_text())
    schema["properties"]["server"]["properties"]["replicaCount"]["description"] = "changed"
    schema_path.write_text(json.dumps(schema, indent=2) + "\n")
    stale = run_chart_docs("--check", "--root", str(tmp_path))
    assert stale.returncode == 1
    assert "charts/ibex-context/README.md is stale" in stale.stderr
    assert run_chart_docs("--root", str(tmp_path)).returncode == 0
    assert "| changed |" in (tmp_path / "charts" / "ibex-context" / "README.md").read_text()


def _leaves(schema: Mapping[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[str, Mapping[str, Any]]]:
    properties = schema.get("properties")
    if isinstance(properties, Mapping) and properties:
        for key, child in properties.items():
            yield from _leaves(child, (*path, key))
    else:
        yield ".".join(path), schema


def test_every_value_is_described_in_the_schema_and_listed_in_the_readme() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    readme = (CHART / "README.md").read_text()
    for key, leaf in _leaves(schema):
        described = "description" in leaf or (
            "$ref" in leaf and "description" in schema["definitions"].get(leaf["$ref"].rsplit("/", 1)[-1], {})
        )
        assert described, f"{key} has no description in values.schema.json"
        assert f"| `{key}` |" in readme, key


def test_the_chart_names_its_home_sources_and_an_icon_it_ships() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["home"].startswith("https://")
    assert chart["sources"] and all(s.startswith("https://") for s in chart["sources"])
    assert chart["icon"].endswith("/charts/ibex-context/icon.svg")
    assert (CHART / "icon.svg").read_text().startswith("<svg")


# --- the PrometheusRule ---------------------------------------------------------------------------


def operator_sample_names() -> set[str]:
    from ibex_operator.metrics import OperatorMetrics

    metrics = OperatorMetrics()
    return {s.name for family in metrics.registry.collect() for s in family.samples}


def test_every_alert_is_complete_and_queries_only_metrics_the_service_exposes() -> None:
    exposed = exposed_sample_names() | operator_sample_names()
    names = [rule["alert"] for rule in rules()]
    assert len(names) == len(set(names)) >= 11
    for rule in rules():
        assert re.fullmatch(r"IbexContext[A-Za-z]+", rule["alert"])
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        queried = set(METRIC.findall(rule["expr"]))
        assert queried and queried <= exposed, (rule["alert"], queried - exposed)
        # Per release: every aggregation keeps namespace and job.
        for grouping in re.findall(r"\bby \(([^)]*)\)", rule["expr"]):
            assert {"namespace", "job"} <= {g.strip() for g in grouping.split(",")}, rule["alert"]
        expr = re.sub(r'"[^"]*"', '""', rule["expr"])
        for opening, closing in ("()", "[]", "{}"):
            assert expr.count(opening) == expr.count(closing), rule["alert"]


def test_the_alerts_a_platform_team_needs_next_are_there() -> None:
    by_name = {rule["alert"]: rule for rule in rules()}
    assert "up == 0" in by_name["IbexContextTargetDown"]["expr"]
    assert "grpc_server_handled_total" in by_name["IbexContextGrpcErrorRate"]["expr"]
    assert (
        'ibex_operator_reconciles_total{result="error"}'
        in by_name["IbexContextOperatorReconcileFailing"]["expr"]
    )
    hpa = by_name["IbexContextHpaAtMaximum"]["expr"]
    assert "kube_horizontalpodautoscaler_status_current_replicas" in hpa
    assert "kube_horizontalpodautoscaler_spec_max_replicas" in hpa


def test_every_alert_links_its_runbook_section() -> None:
    home = yaml.safe_load((CHART / "Chart.yaml").read_text())["home"]
    headings = set(re.findall(r"^## (\S+)$", RUNBOOKS.read_text(), re.MULTILINE))
    for rule in rules():
        alert = rule["alert"]
        assert rule["annotations"]["runbook_url"] == f"{home}/blob/main/docs/runbooks.md#{alert.lower()}"
        assert alert in headings, f"docs/runbooks.md has no section {alert}"
    assert headings == {rule["alert"] for rule in rules()}


def test_the_prometheus_rule_is_opt_in_and_carries_every_documented_alert(
    render: Callable[..., Rendered],
) -> None:
    assert not render().of_kind("PrometheusRule")
    rule = render(sets=["prometheusRule.enabled=true"]).one("PrometheusRule", FULLNAME)
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (group,) = rule["spec"]["groups"]
    assert group["rules"] == rules()
    documented = (REPO / "docs" / "observability.md").read_text()
    for alert in rules():
        assert f"`{alert['alert']}`" in documented


def test_alerts_can_be_labelled_left_out_and_extended(render: Callable[..., Rendered]) -> None:
    r = render(
        sets=[
            "prometheusRule.enabled=true",
            "prometheusRule.ruleLabels.team=platform",
            "prometheusRule.ruleLabels.severity=page",
            "prometheusRule.disabledAlerts={IbexContextUsageUpdatesDropped}",
            "prometheusRule.extraRules[0].alert=MyOwn",
            "prometheusRule.extraRules[0].expr=vector(1)",
        ]
    )
    shipped = r.one("PrometheusRule", FULLNAME)["spec"]["groups"][0]["rules"]
    by_name = {rule["alert"]: rule for rule in shipped}
    assert "IbexContextUsageUpdatesDropped" not in by_name
    assert by_name["MyOwn"]["expr"] == "vector(1)"
    store_down = by_name["IbexContextStoreDown"]
    # An alert's own severity wins over the common labels.
    assert store_down["labels"] == {"severity": "critical", "team": "platform"}


def test_service_monitor_endpoints_carry_the_relabelings(render: Callable[..., Rendered]) -> None:
    r = render(
        sets=[
            "metrics.serviceMonitor.enabled=true",
            "server.workers=2",
            "metrics.serviceMonitor.relabelings[0].sourceLabels={__meta_kubernetes_pod_node_name}",
            "metrics.serviceMonitor.relabelings[0].targetLabel=node",
            "metrics.serviceMonitor.metricRelabelings[0].action=drop",
            "metrics.serviceMonitor.metricRelabelings[0].sourceLabels={__name__}",
            "metrics.serviceMonitor.metricRelabelings[0].regex=ibex_context_stage_duration_seconds_bucket",
        ]
    )
    endpoints = r.one("ServiceMonitor", FULLNAME)["spec"]["endpoints"]
    assert len(endpoints) == 2
    for endpoint in endpoints:
        assert endpoint["relabelings"] == [
            {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}
        ]
        assert endpoint["metricRelabelings"][0]["action"] == "drop"
    assert (
        "relabelings"
        not in render(sets=["metrics.serviceMonitor.enabled=true"]).one("ServiceMonitor", FULLNAME)["spec"][
            "endpoints"
        ][0]
    )


def test_a_relabeling_with_an_unknown_action_is_refused(helm: str) -> None:
    from tests.chart.conftest import run_helm, template_args

    result = run_helm(helm, *template_args(sets=["metrics.serviceMonitor.relabelings[0].action=rename"]))
    assert result.returncode != 0 and "relabelings/0/action" in result.stderr
