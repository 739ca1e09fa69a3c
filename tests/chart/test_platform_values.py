"""The chart gaps a platform team hits next (issue 38, deliverable 6): the migrations Job takes a
service mesh's annotations, its own ServiceAccount, scheduling and resources; the server takes init
containers; the NetworkPolicy's egress follows the ports the configuration names."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.chart.conftest import FULLNAME, Rendered

JOB_VALUES = {
    "server": {
        "tolerations": [{"key": "server-only", "operator": "Exists"}],
        "priorityClassName": "server-priority",
        "migrations": {
            "podAnnotations": {"sidecar.istio.io/inject": "false"},
            "podLabels": {"team": "data"},
            "serviceAccountName": "db-migrator",
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["batch"]}]}
                        ]
                    }
                }
            },
            "tolerations": [{"key": "batch", "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": "batch-low",
            "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
        },
    }
}


def values_file(tmp_path: Path, values: Mapping[str, Any]) -> Path:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(dict(values)))
    return path


def migrate_pod(r: Rendered) -> Mapping[str, Any]:
    template: Mapping[str, Any] = r.one("Job", f"{FULLNAME}-migrate")["spec"]["template"]
    return template


def test_the_migrations_job_takes_annotations_labels_service_account_scheduling_and_resources(
    render: Callable[..., Rendered], tmp_path: Path
) -> None:
    pod = migrate_pod(render([values_file(tmp_path, JOB_VALUES)]))
    migrations = JOB_VALUES["server"]["migrations"]
    assert pod["metadata"]["annotations"] == migrations["podAnnotations"]
    assert pod["metadata"]["labels"]["team"] == "data"
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "migrate"  # the chart's stay
    spec = pod["spec"]
    assert spec["serviceAccountName"] == "db-migrator"
    assert spec["automountServiceAccountToken"] is False
    assert spec["affinity"] == migrations["affinity"]
    assert spec["tolerations"] == migrations["tolerations"]
    assert spec["priorityClassName"] == "batch-low"
    assert spec["containers"][0]["resources"] == migrations["resources"]


def test_without_its_own_scheduling_the_job_runs_where_the_server_runs(
    render: Callable[..., Rendered], tmp_path: Path
) -> None:
    values = {"server": {k: v for k, v in JOB_VALUES["server"].items() if k != "migrations"}}
    spec = migrate_pod(render([values_file(tmp_path, values)]))["spec"]
    assert spec["tolerations"] == values["server"]["tolerations"]
    assert spec["priorityClassName"] == "server-priority"
    # ... and by default on the namespace's ServiceAccount: the chart's does not exist before install.
    assert "serviceAccountName" not in migrate_pod(render())["spec"]


def test_user_init_containers_run_before_the_charts_own(
    render: Callable[..., Rendered], tmp_path: Path
) -> None:
    wait = {"name": "wait-for-vault", "image": "registry.example.com/wait:1", "args": ["vault:8200"]}
    values = {
        "server": {"initContainers": [wait]},
        "redis": {"enabled": True},
        "postgresql": {"enabled": True},
    }
    spec = render([values_file(tmp_path, values)]).one("Deployment", FULLNAME)["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["wait-for-vault", "migrate"]
    assert spec["initContainers"][0] == wait
    assert "initContainers" not in render().one("Deployment", FULLNAME)["spec"]["template"]["spec"]


def egress_ports(r: Rendered) -> set[int]:
    policy = r.one("NetworkPolicy", FULLNAME)
    return {p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"] if p["protocol"] == "TCP"}


def test_the_egress_follows_the_sentinels_and_the_otlp_endpoint(render: Callable[..., Rendered]) -> None:
    assert egress_ports(render()) == {53, 6379, 5432, 4318, 443}
    sentinel = render(
        sets=(
            "config.redis.mode=sentinel",
            "config.redis.sentinel.masterName=mymaster",
            "config.redis.sentinel.addresses={s-0.data:26379,s-1.data:26380}",
        )
    )
    assert {26379, 26380} <= egress_ports(sentinel)
    grpc_otlp = render(
        sets=(
            "config.tracing.exporter=otlp",
            "config.tracing.protocol=grpc",
            "config.tracing.otlpEndpoint=http://otel-collector.observability:4317",
        )
    )
    assert 4317 in egress_ports(grpc_otlp)
    no_port = render(
        sets=(
            "config.tracing.exporter=otlp",
            "config.tracing.otlpEndpoint=https://otlp.example.com/v1/traces",
        )
    )
    assert 443 in egress_ports(no_port)
    # An endpoint configured but not exported to opens nothing.
    unused = render(sets=("config.tracing.otlpEndpoint=http://otel-collector.observability:4317",))
    assert 4317 not in egress_ports(unused)
