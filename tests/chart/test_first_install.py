"""What a platform engineer hits on the first `helm install` / `helm test` / `helm uninstall` (issue 15),
checked on the rendered manifests, the values schema, and the real code they feed (the service's id
validator, the operator's configuration and planner). What needs a real cluster is listed in
docs/kubernetes.md; the image itself is run by tests/image (scripts/image-check).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
import yaml
from ibex_context.server.validation import uuid_field
from ibex_operator.config import OperatorConfig
from ibex_operator.reconcile import INFLIGHT_METRIC, ProfileView, plan_namespace

from tests.chart.conftest import (
    CHART,
    FULLNAME,
    IMAGE_REPOSITORY_SET,
    INSTALL_VALUES,
    NAMESPACE,
    REPO,
    VALUES_SETS,
    Rendered,
    run_helm,
    template_args,
)

OBSERVABILITY = CHART / "ci" / "observability-values.yaml"
ADAPTER_RULE = REPO / "docs" / "prometheus-adapter-values.yaml"


def env_of(container: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def operator_container(r: Rendered) -> Mapping[str, Any]:
    spec = r.one("Deployment", f"{FULLNAME}-operator")["spec"]["template"]["spec"]
    container: Mapping[str, Any] = spec["containers"][0]
    return container


def server_container(r: Rendered) -> Mapping[str, Any]:
    spec = r.one("Deployment", FULLNAME)["spec"]["template"]["spec"]
    return next(c for c in spec["containers"] if c["name"] == "server")


def operator_config(r: Rendered) -> OperatorConfig:
    plain = {name: e["value"] for name, e in env_of(operator_container(r)).items() if "value" in e}
    return OperatorConfig.from_env({**plain, "WATCH_NAMESPACE": NAMESPACE})


def planned_hpa(r: Rendered) -> Mapping[str, Any] | None:
    """The HPA the real operator planner renders from the chart's default ContextProfile, configured by
    the operator environment the chart renders."""
    profile = r.one("ContextProfile", f"{FULLNAME}-default")
    view = ProfileView.from_body(
        {**profile, "metadata": {**profile["metadata"], "generation": 1, "uid": "u1"}}
    )
    config = operator_config(r)
    plan = plan_namespace(
        NAMESPACE,
        [view],
        config.default_service,
        "2026-11-25T00:00:00Z",
        render_hpa_objects=config.render_hpa,
        inflight_metric=config.inflight_metric,
    )
    (objects,) = plan.services
    return objects.hpa


def refused(helm: str, *sets: str) -> str:
    result = run_helm(helm, *template_args(sets=list(sets)))
    assert result.returncode != 0, f"{sets} rendered"
    return result.stderr


def rendered_ok(helm: str, *sets: str) -> None:
    result = run_helm(helm, *template_args(sets=list(sets)))
    assert result.returncode == 0, f"{sets}: {result.stderr}"


def notes(helm: str, *sets: str) -> str:
    args = ["install", "rel", str(CHART), "--namespace", NAMESPACE, "--dry-run=client"]
    args += ["--set", IMAGE_REPOSITORY_SET, "--values", str(INSTALL_VALUES)]
    for item in sets:
        args += ["--set", item]
    result = run_helm(helm, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.split("NOTES:", 1)[1]


# --- 1. helm test with the default values -------------------------------------------------------------


def test_the_helm_test_ids_by_default_are_uuids_the_service_accepts(render: Callable[..., Rendered]) -> None:
    pod = render().one("Pod", f"{FULLNAME}-test-grpc")
    args = pod["spec"]["containers"][0]["args"]
    org, agent = args[args.index("--org") + 1], args[args.index("--agent") + 1]
    # The server's own validator (INVALID_ARGUMENT "org_id: is not a valid UUID" otherwise).
    assert uuid_field(org, "org_id") == org
    assert uuid_field(agent, "agent_id") == agent


def test_the_schema_refuses_helm_test_ids_that_are_not_uuids(helm: str) -> None:
    assert "/tests/orgId" in refused(helm, "tests.orgId=helm-test")
    assert "/tests/agentId" in refused(helm, "tests.agentId=helm-test")
    rendered_ok(helm, "tests.orgId=0b6f7a4e-8f1c-4b53-9a51-5b1a3c7c2d01")


# --- 2. helm uninstall ---------------------------------------------------------------------------------


def test_uninstall_needs_no_hook_and_nothing_rendered_carries_a_finalizer(rendered: Rendered) -> None:
    # helm uninstall deletes the operator (Deployment, Role, RoleBinding) before custom resources. The
    # operator adds no finalizer to ContextProfiles (tests/operator: test_profiles_carry_no_finalizer...),
    # and nothing the chart renders carries one, so the default ContextProfile is simply deleted and the
    # garbage collector removes the operator-made ConfigMap and HPA through their ownerReferences.
    for m in rendered.manifests:
        assert not m["metadata"].get("finalizers"), f"{m['kind']}/{m['metadata']['name']}"
        hooks = (m["metadata"].get("annotations") or {}).get("helm.sh/hook", "")
        assert "delete" not in hooks, f"{m['kind']}/{m['metadata']['name']}: {hooks}"


# --- 3. the operator's HPA ----------------------------------------------------------------------------


def test_by_default_the_operator_hpa_scales_on_cpu_alone(render: Callable[..., Rendered]) -> None:
    r = render()
    assert operator_config(r).inflight_metric is False
    hpa = planned_hpa(r)
    assert hpa is not None
    assert [m["type"] for m in hpa["spec"]["metrics"]] == ["Resource"]


def test_a_target_in_flight_value_turns_the_adapter_metric_on(render: Callable[..., Rendered]) -> None:
    r = render(sets=["autoscaling.targetInflightPerPod=12"])
    assert operator_config(r).inflight_metric is True
    hpa = planned_hpa(r)
    assert hpa is not None
    pods = next(m for m in hpa["spec"]["metrics"] if m["type"] == "Pods")
    assert pods["pods"] == {
        "metric": {"name": INFLIGHT_METRIC},
        "target": {"type": "AverageValue", "averageValue": "12"},
    }


def test_autoscaling_off_means_no_operator_hpa_and_fixed_replicas(
    helm: str, render: Callable[..., Rendered]
) -> None:
    r = render(sets=["autoscaling.enabled=false", "server.replicaCount=3"])
    assert operator_config(r).render_hpa is False
    assert planned_hpa(r) is None
    assert not r.of_kind("HorizontalPodAutoscaler")
    assert r.one("Deployment", FULLNAME)["spec"]["replicas"] == 3
    text = notes(helm, "autoscaling.enabled=false", "server.replicaCount=3")
    assert "no HPA (autoscaling off: 3 replicas)" in " ".join(text.split())
    assert f"HPA {FULLNAME}" in " ".join(notes(helm).split())


def test_the_shipped_prometheus_adapter_rule_serves_the_metric_the_hpa_asks_for() -> None:
    values = yaml.safe_load(ADAPTER_RULE.read_text())
    (rule,) = values["rules"]["custom"]
    assert rule["seriesQuery"].startswith(f"{INFLIGHT_METRIC}{{")
    assert rule["name"]["as"] == INFLIGHT_METRIC
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
    assert rule["resources"]["overrides"]["namespace"] == {"resource": "namespace"}
    # The service exports exactly that gauge.
    from ibex_context.observability.metrics import Metrics
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    Metrics(registry)
    assert INFLIGHT_METRIC in {m.name for m in registry.collect()}


# --- 4. NetworkPolicy ---------------------------------------------------------------------------------


def _selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_the_network_policy_admits_the_helm_test_pod_when_grpc_peers_are_restricted(
    render: Callable[..., Rendered],
) -> None:
    r = render([OBSERVABILITY])
    test_pod_labels = r.one("Pod", f"{FULLNAME}-test-grpc")["metadata"]["labels"]
    policy = r.one("NetworkPolicy", FULLNAME)
    admitted = [
        peer
        for rule in policy["spec"]["ingress"]
        if any(p["port"] == "grpc" for p in rule["ports"])
        for peer in rule.get("from", [])
        if "podSelector" in peer and "namespaceSelector" not in peer
        and _selects(peer["podSelector"].get("matchLabels", {}), test_pod_labels)
    ]  # fmt: skip
    assert admitted, policy["spec"]["ingress"]


def test_metrics_may_be_scraped_from_any_namespace_unless_restricted(render: Callable[..., Rendered]) -> None:
    r = render(sets=["networkPolicy.enabled=true"])
    rules = r.one("NetworkPolicy", FULLNAME)["spec"]["ingress"]
    metrics = [rule for rule in rules if any(p["port"] == "http-metrics" for p in rule["ports"])]
    assert len(metrics) == 1 and "from" not in metrics[0], metrics
    restricted = render(
        sets=[
            "networkPolicy.enabled=true",
            "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=observability",
        ]
    )
    rules = restricted.one("NetworkPolicy", FULLNAME)["spec"]["ingress"]
    (metrics_rule,) = [rule for rule in rules if any(p["port"] == "http-metrics" for p in rule["ports"])]
    assert metrics_rule["from"] == [{"namespaceSelector": {"matchLabels": {"team": "observability"}}}]


# --- 5. ServiceMonitor --------------------------------------------------------------------------------


def test_the_service_monitor_carries_the_release_label_kube_prometheus_stack_selects(
    render: Callable[..., Rendered],
) -> None:
    sm = render(sets=["metrics.serviceMonitor.enabled=true"]).one("ServiceMonitor", FULLNAME)
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    renamed = render(
        sets=["metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.release=prom"]
    )
    assert renamed.one("ServiceMonitor", FULLNAME)["metadata"]["labels"]["release"] == "prom"


# --- 6. the values schema (and the checks JSON Schema cannot express) -----------------------------------


def test_min_replicas_above_max_replicas_is_refused(helm: str) -> None:
    message = refused(helm, "autoscaling.minReplicas=5", "autoscaling.maxReplicas=3")
    assert "autoscaling.minReplicas (5) must not exceed autoscaling.maxReplicas (3)" in message
    rendered_ok(helm, "autoscaling.minReplicas=3", "autoscaling.maxReplicas=3")


@pytest.mark.parametrize("value", ["0", "0%", "-1", "150%"])
def test_a_pdb_that_blocks_node_drains_is_refused(helm: str, value: str) -> None:
    assert "/server/pdb/maxUnavailable" in refused(helm, f"server.pdb.maxUnavailable={value}")


@pytest.mark.parametrize("value", ["1", "2", "25%", "100%"])
def test_a_pdb_that_allows_disruptions_renders(helm: str, value: str) -> None:
    rendered_ok(helm, f"server.pdb.maxUnavailable={value}")


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("server.resources.requests.cpu", "lots"),
        ("server.resources.requests.cpu", "500mm"),
        ("server.resources.requests.memory", "1 Gi"),
        ("server.resources.limits.memory", "1GB"),
        ("operator.resources.requests.memory", "big"),
        ("server.migrations.resources.limits.memory", "256MiB"),
    ],
)
def test_resource_quantities_kubernetes_would_reject_are_refused(helm: str, path: str, value: str) -> None:
    assert "/" + path.replace(".", "/") in refused(helm, f"{path}={value}")


@pytest.mark.parametrize(
    ("path", "value"),
    [("server.resources.requests.cpu", "500m"), ("server.resources.requests.cpu", "1.5"),
     ("server.resources.limits.memory", "1Gi"), ("server.resources.limits.memory", "800M")],
)  # fmt: skip
def test_valid_resource_quantities_render(helm: str, path: str, value: str) -> None:
    rendered_ok(helm, f"{path}={value}")


def _chart_set_env(render: Callable[..., Rendered], deployment: str, block: str) -> set[str]:
    """Every variable the chart itself sets on that Deployment's containers, over every values set
    (minus what those values files put in extraEnv)."""
    names: set[str] = set()
    for _, files in VALUES_SETS:
        r = render(files)
        workload = r.maybe("Deployment", deployment)
        if workload is None:
            continue
        extra: set[str] = set()
        for path in files:
            values = yaml.safe_load(path.read_text()) or {}
            extra |= set(((values.get(block) or {}).get("extraEnv")) or {})
        for c in workload["spec"]["template"]["spec"]["containers"]:
            names |= set(env_of(c)) - extra
    return names


def _schema_forbidden(block: str) -> set[str]:
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    names: list[str] = schema["properties"][block]["properties"]["extraEnv"]["propertyNames"]["not"]["enum"]
    return set(names)


def test_extra_env_may_not_repeat_a_variable_the_chart_sets(
    helm: str, render: Callable[..., Rendered]
) -> None:
    chart_set = _chart_set_env(render, FULLNAME, "config")
    assert {"IBEX_GRPC_PORT", "IBEX_REDIS_URL", "IBEX_NONCE_SECRET"} <= chart_set
    # The schema's list is exactly what the chart sets, so a new chart variable cannot be forgotten.
    assert _schema_forbidden("config") == chart_set
    for name in sorted(chart_set):
        assert name in refused(helm, f"config.extraEnv.{name}=1")
    rendered_ok(helm, "config.extraEnv.IBEX_HOT_LIMIT=30")


def test_operator_extra_env_may_not_repeat_a_variable_the_chart_sets(
    helm: str, render: Callable[..., Rendered]
) -> None:
    chart_set = _chart_set_env(render, f"{FULLNAME}-operator", "operator")
    assert _schema_forbidden("operator") == chart_set
    for name in sorted(chart_set):
        assert name in refused(helm, f"operator.extraEnv.{name}=x")
    rendered_ok(helm, "operator.extraEnv.IBEX_OPERATOR_LOG_LEVEL=DEBUG")


# --- 7. smaller ---------------------------------------------------------------------------------------


def test_without_an_image_repository_nothing_renders_and_the_message_says_why(helm: str) -> None:
    result = run_helm(helm, *template_args(image=False))
    assert result.returncode != 0
    assert "image.repository is required" in result.stderr


def test_every_image_of_ours_names_a_registry(rendered: Rendered) -> None:
    for workload, _, spec in rendered.pod_specs:
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            image = c["image"]
            if "ibex-context" not in image:
                continue
            host = image.split("/", 1)[0]
            assert "/" in image and ("." in host or ":" in host or host == "localhost"), (
                f"{workload}: {image}"
            )


def test_every_empty_dir_has_a_size_limit(rendered: Rendered) -> None:
    for workload, _, spec in rendered.pod_specs:
        for volume in spec.get("volumes", []):
            if "emptyDir" in volume:
                assert volume["emptyDir"].get("sizeLimit"), f"{workload}: volume {volume['name']}"


def test_with_the_operator_the_deployment_starts_at_min_replicas_not_one(
    render: Callable[..., Rendered],
) -> None:
    r = render(sets=["autoscaling.minReplicas=3", "autoscaling.maxReplicas=9"])
    assert r.one("Deployment", FULLNAME)["spec"]["replicas"] == 3
    assert r.one("ContextProfile", f"{FULLNAME}-default")["spec"]["autoscaling"]["minReplicas"] == 3


def test_the_notes_say_where_the_minilm_weights_are_and_what_hashing_is(helm: str) -> None:
    assert "--build-arg WITH_MINILM=false has none" in notes(helm)  # minilm is the default
    assert "lexical toy" in notes(helm, "config.embedder=hashing")
    assert "WITH_MINILM" not in notes(helm, "config.embedder=openai")
