"""The Helm chart, checked offline: helm lint, helm template, kubernetes-validate against the validated
Kubernetes version, and the chart's design rules asserted over the rendered manifests.

Custom resources have no schema in kubernetes-validate: the ContextProfile is validated against our CRD's
openAPIV3Schema with jsonschema and planned by the real operator code; the ServiceMonitor (prometheus-
operator's CRD is not available offline) is checked structurally against the metrics Service.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from ibex_context.cli import main as cli_main
from ibex_context.observability.tracing import SDK_READ_VARIABLES
from ibex_context.profiles.loader import parse_profiles
from ibex_context.settings import Settings
from ibex_context.stores.redis.topology import RedisTopology
from ibex_operator.config import OperatorConfig
from ibex_operator.reconcile import ProfileView, configmap_name, plan_namespace

from tests.chart.conftest import (
    CHART,
    CI_VALUES,
    FULLNAME,
    IMAGE_REPOSITORY_SET,
    INSTALL_VALUES,
    MINIMUM_KUBERNETES_VERSION,
    NAMESPACE,
    VALIDATED_KUBERNETES_VERSION,
    VALUES_SETS,
    Rendered,
    parse_manifests,
    run_helm,
    template_args,
)

CHART_CRD = CHART / "crds" / "contextprofiles.context.ibex.dev.yaml"
CUSTOM_KINDS = {"ContextProfile", "ServiceMonitor", "PrometheusRule", "PodMonitor", "KopfPeering"}
SERVER_LABELS = {
    "app.kubernetes.io/name": "ibex-context",
    "app.kubernetes.io/instance": "rel",
    "app.kubernetes.io/component": "server",
}
LOCAL_STORES = CHART / "ci" / "local-stores-values.yaml"
OBSERVABILITY = CHART / "ci" / "observability-values.yaml"
FIXED_REPLICAS = CHART / "ci" / "fixed-replicas-values.yaml"
EXTENSIONS = CHART / "ci" / "extensions-values.yaml"


def values_of(path: Path) -> Mapping[str, Any]:
    loaded: Mapping[str, Any] = yaml.safe_load(path.read_text())
    return loaded


def rendered_values(r: Rendered) -> Mapping[str, Any]:
    """The values file a parametrized render used ({} for the defaults)."""
    if r.values_name == "default":
        return {}
    return values_of(CHART / "ci" / r.values_name)


def containers(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def server_container(r: Rendered) -> Mapping[str, Any]:
    spec = r.one("Deployment", FULLNAME)["spec"]["template"]["spec"]
    return next(c for c in spec["containers"] if c["name"] == "server")


def env_of(container: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# --- lint, render, validate -----------------------------------------------------------------------


def test_ci_values_files_cover_at_least_two_other_configurations() -> None:
    assert len(CI_VALUES) >= 2, [p.name for p in CI_VALUES]


@pytest.mark.parametrize(("name", "files"), VALUES_SETS, ids=[n for n, _ in VALUES_SETS])
def test_helm_lint_strict_passes(helm: str, name: str, files: tuple[Path, ...]) -> None:
    args = [
        "lint",
        "--strict",
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--kube-version",
        VALIDATED_KUBERNETES_VERSION,
        "--set",
        IMAGE_REPOSITORY_SET,
        "--values",
        str(INSTALL_VALUES),
    ]
    for path in files:
        args += ["--values", str(path)]
    result = run_helm(helm, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[ERROR]" not in result.stdout and "[WARNING]" not in result.stdout, result.stdout


def test_every_builtin_manifest_validates_strictly_against_the_validated_kubernetes_version(
    rendered: Rendered,
) -> None:
    checked = 0
    for manifest in rendered.manifests:
        if manifest["kind"] in CUSTOM_KINDS:
            continue
        for version in (VALIDATED_KUBERNETES_VERSION, MINIMUM_KUBERNETES_VERSION):
            try:
                kubernetes_validate.validate(manifest, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{manifest['kind']}/{manifest['metadata']['name']} invalid for {version}: {exc}")
        checked += 1
    assert checked >= 5  # CRD, ServiceAccount, Services, Deployment, PDB at the least


def test_chart_declares_the_validated_and_minimum_kubernetes_versions() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == "0.1.0"
    assert chart["kubeVersion"].startswith(">=1.28")
    assert chart["annotations"]["ibex.dev/validated-kubernetes-version"] == VALIDATED_KUBERNETES_VERSION


def test_unknown_value_keys_are_rejected_by_the_schema(helm: str) -> None:
    result = run_helm(helm, *template_args(sets=["server.replicas=3"]))
    assert result.returncode != 0
    assert "replicas" in result.stderr


def test_invalid_setting_values_are_rejected_naming_the_field(helm: str) -> None:
    result = run_helm(helm, *template_args(sets=["config.embedder=word2vec"]))
    assert result.returncode != 0
    assert "embedder" in result.stderr


def test_the_default_embedder_is_the_semantic_one(render: Callable[..., Rendered]) -> None:
    spec = render().one("Deployment", FULLNAME)["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for c in containers(spec) for e in c.get("env", [])}
    assert env["IBEX_EMBEDDER"] == "minilm"
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["config"]["properties"]["embedder"]["enum"] == ["minilm", "openai", "hashing"]


def test_the_stores_secret_and_the_default_profile_are_scoped_to_the_release(helm: str) -> None:
    # Two releases in one namespace: no object of one has the name of an object of the other.
    names = {}
    for release in ("blue", "green"):
        args = template_args(sets=[f"secrets.existingSecret={release}-ibex-context-stores"])
        args[1] = release
        result = run_helm(helm, *args)
        assert result.returncode == 0, result.stderr
        manifests = parse_manifests(result.stdout)
        names[release] = {
            (m["kind"], m["metadata"]["name"]) for m in manifests if m["kind"] != "CustomResourceDefinition"
        }
        server = next(
            m
            for m in manifests
            if m["kind"] == "Deployment" and m["metadata"]["name"] == f"{release}-ibex-context"
        )
        env = env_of(server["spec"]["template"]["spec"]["containers"][0])
        assert env["IBEX_REDIS_URL"]["valueFrom"]["secretKeyRef"]["name"] == f"{release}-ibex-context-stores"
        profile = next(m for m in manifests if m["kind"] == "ContextProfile")
        assert profile["metadata"]["name"] == f"{release}-ibex-context-default"
        assert profile["metadata"]["labels"]["context.ibex.dev/release"] == release
    assert not names["blue"] & names["green"]


def test_each_releases_operator_selects_only_its_releases_profiles(render: Callable[..., Rendered]) -> None:
    r = render()
    c = r.one("Deployment", f"{FULLNAME}-operator")["spec"]["template"]["spec"]["containers"][0]
    plain = {name: e["value"] for name, e in env_of(c).items() if "value" in e}
    config = OperatorConfig.from_env({**plain, "WATCH_NAMESPACE": NAMESPACE})
    profile = r.one("ContextProfile", f"{FULLNAME}-default")
    assert config.selector_labels == {"context.ibex.dev/release": "rel"}
    assert selects(config.selector_labels, profile["metadata"]["labels"])


# --- pod security ---------------------------------------------------------------------------------


def test_every_pod_runs_restricted(rendered: Rendered) -> None:
    assert rendered.pod_specs
    for workload, _, spec in rendered.pod_specs:
        pod_sc = spec["securityContext"]
        assert pod_sc["runAsNonRoot"] is True, workload
        assert pod_sc["seccompProfile"]["type"] == "RuntimeDefault", workload
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC"), workload
        assert not any("hostPath" in v for v in spec.get("volumes", [])), workload
        for c in containers(spec):
            sc = c["securityContext"]
            where = f"{workload} container {c['name']}"
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["runAsNonRoot"] is True, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            assert "add" not in sc["capabilities"], where
            assert sc["seccompProfile"]["type"] == "RuntimeDefault", where
            assert sc.get("privileged") is not True, where
            assert "resources" in c and c["resources"].get("requests"), where


def test_our_image_runs_as_uid_and_gid_10001_with_a_writable_tmp(rendered: Rendered) -> None:
    for workload, _, spec in rendered.pod_specs:
        ours = [
            c for c in containers(spec) if c["image"].split("@")[0].split(":")[0].endswith("ibex-context")
        ]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in ours:
            assert c["securityContext"]["runAsUser"] == 10001, workload
            assert c["securityContext"]["runAsGroup"] == 10001, workload
            tmp = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
            assert tmp and "emptyDir" in volumes[tmp[0]["name"]], (
                f"{workload}/{c['name']} needs an emptyDir /tmp"
            )


def test_only_the_operator_mounts_a_service_account_token(rendered: Rendered) -> None:
    for workload, _, spec in rendered.pod_specs:
        expected = workload == f"Deployment/{FULLNAME}-operator"
        assert spec["automountServiceAccountToken"] is expected, workload
    for sa in rendered.of_kind("ServiceAccount"):
        assert sa["automountServiceAccountToken"] is sa["metadata"]["name"].endswith("-operator")


# --- the service Deployment ---------------------------------------------------------------------


def test_server_probes_are_native_grpc_and_liveness_never_depends_on_the_stores(rendered: Rendered) -> None:
    c = server_container(rendered)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    env = {e["name"]: e.get("value") for e in c["env"]}
    # The kubelet's gRPC probe speaks no TLS: with TLS on the gRPC port it asks the plaintext
    # health-only port (IBEX_HEALTH_PORT).
    probed = ports["grpc-health"] if "IBEX_TLS_CERT_FILE" in env else ports["grpc"]
    if "IBEX_TLS_CERT_FILE" in env:
        assert env["IBEX_HEALTH_PORT"] == str(probed) != str(ports["grpc"])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert set(c[probe]) & {"grpc", "httpGet", "exec", "tcpSocket"} == {"grpc"}, probe
        assert c[probe]["grpc"]["port"] == probed
    # Readiness = overall health (the process accepts calls, stores or not); liveness = it answers.
    assert c["readinessProbe"]["grpc"]["service"] == ""
    assert c["livenessProbe"]["grpc"]["service"] == "liveness"
    assert c["startupProbe"]["grpc"]["service"] == "liveness"
    assert c["livenessProbe"]["failureThreshold"] * c["livenessProbe"]["periodSeconds"] >= 30


def test_termination_grace_outlasts_prestop_sleep_drain_and_in_flight_grace(rendered: Rendered) -> None:
    spec = rendered.one("Deployment", FULLNAME)["spec"]["template"]["spec"]
    c = server_container(rendered)
    env = env_of(c)
    sleep_command = c["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep_command[0] == "sleep"
    pre_stop = float(sleep_command[1])
    grace = float(env["IBEX_SHUTDOWN_GRACE_SECONDS"]["value"])
    drain = float(env["IBEX_SHUTDOWN_DRAIN_DELAY_SECONDS"]["value"])
    assert spec["terminationGracePeriodSeconds"] > pre_stop + drain + grace
    assert pre_stop > 0


def test_observability_values_shift_termination_grace_with_the_shutdown_timing(
    render: Callable[..., Rendered],
) -> None:
    spec = render([OBSERVABILITY]).one("Deployment", FULLNAME)["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] == 10 + 2 + 15 + 5


def test_profiles_are_mounted_as_an_optional_directory_never_subpath(rendered: Rendered) -> None:
    spec = rendered.one("Deployment", FULLNAME)["spec"]["template"]["spec"]
    volume = next(v for v in spec["volumes"] if v["name"] == "profiles")
    assert volume["configMap"] == {"name": f"{FULLNAME}-profiles", "optional": True}
    assert volume["configMap"]["name"] == configmap_name(FULLNAME)  # the operator's naming
    c = server_container(rendered)
    mount = next(m for m in c["volumeMounts"] if m["name"] == "profiles")
    assert mount["mountPath"] == "/etc/ibex-context/profiles"
    assert env_of(c)["IBEX_PROFILES_PATH"]["value"] == "/etc/ibex-context/profiles/profiles.json"
    for workload, _, pod in rendered.pod_specs:
        for ctr in containers(pod):
            assert all("subPath" not in m and "subPathExpr" not in m for m in ctr.get("volumeMounts", [])), (
                workload
            )


def test_only_the_charts_own_secret_triggers_restarts_never_the_profiles(rendered: Rendered) -> None:
    annotations = (
        rendered.one("Deployment", FULLNAME)["spec"]["template"]["metadata"].get("annotations") or {}
    )
    checksums = {k for k in annotations if k.startswith("checksum/")}
    assert checksums <= {"checksum/secret"}
    assert not any("profile" in k for k in annotations)
    secret = rendered.maybe("Secret", f"{FULLNAME}-generated")
    assert ("checksum/secret" in checksums) == (secret is not None)


def test_chart_never_renders_the_operator_owned_profiles_configmap(rendered: Rendered) -> None:
    operator_on = rendered.maybe("Deployment", f"{FULLNAME}-operator") is not None
    if operator_on:
        assert rendered.maybe("ConfigMap", f"{FULLNAME}-profiles") is None


def test_static_profiles_without_the_operator_load_with_the_service_loader(
    render: Callable[..., Rendered],
) -> None:
    cm = render([LOCAL_STORES]).one("ConfigMap", f"{FULLNAME}-profiles")
    profile_set = parse_profiles(cm["data"]["profiles.json"])
    assert len(profile_set.bindings) == 2


def test_every_ibex_environment_variable_is_a_real_setting(rendered: Rendered) -> None:
    fields = set(Settings.model_fields)
    # The standard OpenTelemetry names some settings are read from (AliasChoices).
    aliases = {
        str(choice)
        for field in Settings.model_fields.values()
        for choice in getattr(field.validation_alias, "choices", ())
    }
    spec = rendered.one("Deployment", FULLNAME)["spec"]["template"]["spec"]
    extra_env = set(rendered_values(rendered).get("config", {}).get("extraEnv", {})) | aliases
    extra_env |= SDK_READ_VARIABLES
    for c in containers(spec):
        if not c["image"].split("@")[0].split(":")[0].endswith("ibex-context"):
            continue  # a sidecar's environment is its own
        for name in env_of(c):
            if name.startswith("IBEX_"):
                assert name.removeprefix("IBEX_").lower() in fields, (
                    f"{c['name']}: {name} is not a Settings field"
                )
            else:
                assert name in extra_env, f"{c['name']}: {name} is neither a setting nor the user's extraEnv"


def test_store_urls_and_secrets_come_from_secrets_never_plain_values(rendered: Rendered) -> None:
    env = env_of(server_container(rendered))
    for name in ("IBEX_REDIS_URL", "IBEX_POSTGRES_DSN", "IBEX_NONCE_SECRET"):
        assert "secretKeyRef" in env[name]["valueFrom"], name
    if "IBEX_OPENAI_API_KEY" in env:
        assert env["IBEX_OPENAI_API_KEY"]["valueFrom"]["secretKeyRef"]["optional"] is True


def test_default_install_reads_external_store_urls_from_the_existing_secret(
    render: Callable[..., Rendered],
) -> None:
    env = env_of(server_container(render()))
    assert env["IBEX_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": f"{FULLNAME}-stores",
        "key": "redis-url",
    }
    assert env["IBEX_POSTGRES_DSN"]["valueFrom"]["secretKeyRef"] == {
        "name": f"{FULLNAME}-stores",
        "key": "postgres-dsn",
    }


def test_read_replicas_come_from_an_optional_secret_key_and_their_bounds_from_values(
    render: Callable[..., Rendered], tmp_path: Path
) -> None:
    env = env_of(server_container(render()))
    assert env["IBEX_POSTGRES_READ_DSNS"]["valueFrom"]["secretKeyRef"] == {
        "name": f"{FULLNAME}-stores",
        "key": "postgres-read-dsns",
        "optional": True,
    }
    assert env["IBEX_POSTGRES_REPLICA_MAX_LAG_SECONDS"]["value"] == "5"
    values = tmp_path / "replicas.yaml"
    values.write_text("config:\n  readReplicas:\n    maxLagSeconds: 1.5\n    pollSeconds: 0.1\n")
    env = env_of(server_container(render([values])))
    assert env["IBEX_POSTGRES_REPLICA_MAX_LAG_SECONDS"]["value"] == "1.5"
    assert env["IBEX_POSTGRES_REPLICA_POLL_SECONDS"]["value"] == "0.1"
    settings = Settings(
        postgres_replica_max_lag_seconds=env["IBEX_POSTGRES_REPLICA_MAX_LAG_SECONDS"]["value"],
        postgres_replica_poll_seconds=env["IBEX_POSTGRES_REPLICA_POLL_SECONDS"]["value"],
    )
    assert (settings.postgres_replica_max_lag_seconds, settings.postgres_replica_poll_seconds) == (1.5, 0.1)


SENTINEL = CHART / "ci" / "redis-sentinel-values.yaml"


def test_redis_is_one_server_unless_values_say_sentinel_or_cluster(render: Callable[..., Rendered]) -> None:
    env = env_of(server_container(render()))
    assert not {"IBEX_REDIS_SENTINELS", "IBEX_REDIS_SENTINEL_MASTER", "IBEX_REDIS_CLUSTER"} & set(env)


def test_sentinel_values_become_settings_the_service_reads_as_a_sentinel_topology(
    render: Callable[..., Rendered], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = env_of(server_container(render([SENTINEL])))
    assert env["IBEX_REDIS_SENTINEL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "ibex-stores",  # the values file's secrets.existingSecret
        "key": "redis-sentinel-password",
        "optional": True,
    }
    for name in ("IBEX_REDIS_SENTINELS", "IBEX_REDIS_SENTINEL_MASTER"):
        monkeypatch.setenv(name, env[name]["value"])
    topology = RedisTopology.from_settings(Settings(redis_url="redis://:pw@unused/0"))
    assert topology.mode == "sentinel"
    assert topology.sentinels[0] == ("redis-node-0.redis-headless.data", 26379)
    assert topology.sentinel_master == "mymaster"


def test_cluster_mode_becomes_the_cluster_setting(
    render: Callable[..., Rendered], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = env_of(server_container(render(sets=["config.redis.mode=cluster"])))
    monkeypatch.setenv("IBEX_REDIS_CLUSTER", env["IBEX_REDIS_CLUSTER"]["value"])
    assert RedisTopology.from_settings(Settings(redis_url="rediss://cache.example:6379")).mode == "cluster"
    assert "IBEX_REDIS_SENTINELS" not in env


@pytest.mark.parametrize(
    ("sets", "named"),
    [
        (["config.redis.mode=sentinel"], "sentinel"),
        (["config.redis.mode=sentinel", "config.redis.sentinel.addresses={s:26379}"], "masterName"),
        (
            [
                "config.redis.mode=sentinel",
                "config.redis.sentinel.masterName=m",
                "config.redis.sentinel.addresses={s}",
            ],
            "addresses",
        ),
        (["config.redis.mode=replicated"], "mode"),
        (["config.redis.mode=cluster", "redis.enabled=true"], "config.redis.mode"),
    ],
)
def test_redis_values_that_cannot_work_are_refused(helm: str, sets: list[str], named: str) -> None:
    result = run_helm(helm, *template_args(sets=sets))
    assert result.returncode != 0 and named in result.stderr, result.stderr


def test_in_chart_stores_are_wired_to_their_services_automatically(render: Callable[..., Rendered]) -> None:
    import base64

    r = render([LOCAL_STORES])
    secret = r.one("Secret", f"{FULLNAME}-generated")
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    redis_svc = r.one("Service", f"{FULLNAME}-redis")
    pg_svc = r.one("Service", f"{FULLNAME}-postgresql")
    assert data["redis-url"] == f"redis://{redis_svc['metadata']['name']}:6379/0"
    assert data["postgres-dsn"] == (
        f"postgresql://ibex:{data['postgres-password']}@{pg_svc['metadata']['name']}:5432/ibex"
    )
    assert len(data["postgres-password"]) >= 32
    env = env_of(server_container(r))
    assert env["IBEX_POSTGRES_DSN"]["valueFrom"]["secretKeyRef"] == {
        "name": f"{FULLNAME}-generated",
        "key": "postgres-dsn",
    }
    pg = r.one("StatefulSet", f"{FULLNAME}-postgresql")["spec"]["template"]["spec"]["containers"][0]
    assert pg["image"] == "docker.io/pgvector/pgvector:pg17"
    assert env_of(pg)["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == "postgres-password"


def test_in_chart_stores_are_opt_in(render: Callable[..., Rendered]) -> None:
    for files in ((), (OBSERVABILITY,), (FIXED_REPLICAS,)):
        assert not render(files).of_kind("StatefulSet")


def test_migrations_run_once_per_install_and_upgrade_as_a_hook_job_with_the_servers_store_settings(
    render: Callable[..., Rendered],
) -> None:
    r = render([EXTENSIONS])
    job = r.one("Job", f"{FULLNAME}-migrate")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    # Kept after it ran (its logs), replaced by the next upgrade's run.
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation"
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["activeDeadlineSeconds"] == 3600
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    # The chart's ServiceAccount does not exist before install: the namespace default, without a token.
    assert "serviceAccountName" not in pod and pod["automountServiceAccountToken"] is False
    (migrate,) = pod["containers"]
    assert migrate["args"] == ["migrate"]
    assert "migrate" in cli_main.commands
    server_env = env_of(server_container(r))
    for name in ("IBEX_POSTGRES_DSN", "IBEX_EMBEDDING_DIM", "IBEX_OPENAI_BASE_URL"):
        assert env_of(migrate)[name] == server_env[name]
    # Not in every pod start any more: the server has no migrations init container.
    deployment = r.one("Deployment", FULLNAME)["spec"]["template"]["spec"]
    assert "initContainers" not in deployment
    fixed = render([FIXED_REPLICAS])
    assert (
        not fixed.of_kind("Job")
        and "initContainers" not in fixed.one("Deployment", FULLNAME)["spec"]["template"]["spec"]
    )


def test_with_the_in_chart_postgresql_each_server_pod_migrates_in_an_init_container(
    render: Callable[..., Rendered],
) -> None:
    # The in-chart database does not exist before install, so a pre-install hook could not reach it.
    r = render([LOCAL_STORES])
    assert not r.of_kind("Job")
    spec = r.one("Deployment", FULLNAME)["spec"]["template"]["spec"]
    migrate = spec["initContainers"][0]
    assert migrate["args"] == ["migrate"]
    assert env_of(migrate)["IBEX_POSTGRES_DSN"] == env_of(spec["containers"][0])["IBEX_POSTGRES_DSN"]


# --- replicas, HPA, PDB ---------------------------------------------------------------------------


def test_an_hpa_owned_deployment_starts_at_min_replicas_and_the_hpa_is_the_operators_or_the_charts(
    render: Callable[..., Rendered],
) -> None:
    # Operator on: the operator renders HPA <fullname>; the Deployment starts at minReplicas instead
    # of Kubernetes' default of 1 until that HPA exists (upgrades keep the live count: lookup).
    default = render()
    assert default.one("Deployment", FULLNAME)["spec"]["replicas"] == 2
    assert not default.of_kind("HorizontalPodAutoscaler")
    # Operator off, autoscaling on: the chart renders the HPA itself.
    local = render([LOCAL_STORES])
    assert local.one("Deployment", FULLNAME)["spec"]["replicas"] == 1
    hpa = local.one("HorizontalPodAutoscaler", FULLNAME)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": FULLNAME}
    assert hpa["spec"]["minReplicas"] == 1 and hpa["spec"]["maxReplicas"] == 4
    metric_kinds = [m["type"] for m in hpa["spec"]["metrics"]]
    assert metric_kinds == ["Pods", "Resource"]
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "ibex_context_inflight_calls"


def test_fixed_replicas_without_any_hpa(render: Callable[..., Rendered]) -> None:
    r = render([FIXED_REPLICAS])
    assert r.one("Deployment", FULLNAME)["spec"]["replicas"] == 3
    assert not r.of_kind("HorizontalPodAutoscaler")


def test_chart_hpa_matches_the_operators_scaling_policy(render: Callable[..., Rendered]) -> None:
    from ibex_operator.reconcile import HPA_BEHAVIOR

    hpa = render([LOCAL_STORES]).one("HorizontalPodAutoscaler", FULLNAME)
    assert hpa["spec"]["behavior"] == HPA_BEHAVIOR


def test_pdb_allows_one_disruption_of_server_pods_only(rendered: Rendered) -> None:
    pdb = rendered.one("PodDisruptionBudget", FULLNAME)
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == SERVER_LABELS


# --- labels, selectors, Services --------------------------------------------------------------------


def test_every_workload_selector_matches_its_own_pod_labels_and_no_other_workload(rendered: Rendered) -> None:
    workloads = [m for m in rendered.manifests if m["kind"] in ("Deployment", "StatefulSet")]
    for w in workloads:
        selector = w["spec"]["selector"]["matchLabels"]
        assert selects(selector, w["spec"]["template"]["metadata"]["labels"]), w["metadata"]["name"]
        for other in workloads:
            if other is not w:
                assert not selects(selector, other["spec"]["template"]["metadata"]["labels"]), (
                    f"{w['metadata']['name']} also selects {other['metadata']['name']}"
                )


def test_every_service_selects_exactly_one_workloads_pods_on_a_declared_port(rendered: Rendered) -> None:
    workloads = [m for m in rendered.manifests if m["kind"] in ("Deployment", "StatefulSet")]
    for svc in rendered.of_kind("Service"):
        matched = [
            w
            for w in workloads
            if selects(svc["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])
        ]
        assert len(matched) == 1, f"Service {svc['metadata']['name']} selects {len(matched)} workloads"
        port_names = {
            p["name"]
            for c in matched[0]["spec"]["template"]["spec"]["containers"]
            for p in c.get("ports", [])
        }
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in port_names, f"{svc['metadata']['name']}: {port['targetPort']}"


def test_grpc_services_declare_app_protocol_grpc_and_headless_is_clusterip_none(rendered: Rendered) -> None:
    main = rendered.one("Service", FULLNAME)
    assert main["spec"]["ports"] == [
        {"name": "grpc", "port": 50051, "targetPort": "grpc", "protocol": "TCP", "appProtocol": "grpc"}
    ]
    assert main["spec"]["selector"] == SERVER_LABELS
    headless = rendered.maybe("Service", f"{FULLNAME}-headless")
    if headless is not None:
        assert headless["spec"]["clusterIP"] == "None"
        assert headless["spec"]["ports"][0]["appProtocol"] == "grpc"
        assert headless["spec"]["selector"] == SERVER_LABELS
    metrics = rendered.one("Service", f"{FULLNAME}-metrics")
    assert metrics["spec"]["ports"][0]["port"] == 9464


def test_headless_service_can_be_turned_off(render: Callable[..., Rendered]) -> None:
    assert render().maybe("Service", f"{FULLNAME}-headless") is not None
    assert render([FIXED_REPLICAS]).maybe("Service", f"{FULLNAME}-headless") is None


def test_topology_spread_selects_the_server_pods(render: Callable[..., Rendered]) -> None:
    spec = render().one("Deployment", FULLNAME)["spec"]["template"]["spec"]
    keys = {c["topologyKey"] for c in spec["topologySpreadConstraints"]}
    assert keys == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    for constraint in spec["topologySpreadConstraints"]:
        assert constraint["labelSelector"]["matchLabels"] == SERVER_LABELS
        assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"


def test_service_monitor_scrapes_the_metrics_service_port(render: Callable[..., Rendered]) -> None:
    r = render([OBSERVABILITY])
    sm = r.one("ServiceMonitor", FULLNAME)
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    metrics_svc = r.one("Service", f"{FULLNAME}-metrics")
    assert selects(sm["spec"]["selector"]["matchLabels"], metrics_svc["metadata"]["labels"])
    others = [s for s in r.of_kind("Service") if s is not metrics_svc]
    assert not any(selects(sm["spec"]["selector"]["matchLabels"], s["metadata"]["labels"]) for s in others)
    endpoint = sm["spec"]["endpoints"][0]
    assert endpoint["port"] in {p["name"] for p in metrics_svc["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert not render().of_kind("ServiceMonitor")


@pytest.mark.parametrize(
    ("sets", "workers"),
    [
        ((), 1),
        (("server.resources.requests.cpu=1500m",), 2),
        (("server.resources.requests.cpu=3",), 3),
        (("server.resources.requests.cpu=250m",), 1),
        (("server.resources.requests.cpu=3", "server.workers=2"), 2),
    ],
)
def test_one_worker_per_cpu_requested_each_metrics_port_declared_and_scraped(
    render: Callable[..., Rendered], sets: tuple[str, ...], workers: int
) -> None:
    r = render([OBSERVABILITY], sets)
    container = server_container(r)
    assert env_of(container)["IBEX_WORKERS"]["value"] == str(workers)
    # Prometheus scrapes the pod's address: the service's loopback default is opened.
    assert env_of(container)["IBEX_METRICS_HOST"]["value"] == "0.0.0.0"
    # serve --workers: worker i serves metrics on IBEX_METRICS_PORT + i (server/workers.py).
    base = int(env_of(container)["IBEX_METRICS_PORT"]["value"])
    expected = {("http-metrics" if i == 0 else f"http-metrics-{i}", base + i) for i in range(workers)}
    declared = {
        (p["name"], p["containerPort"]) for p in container["ports"] if p["name"].startswith("http-metrics")
    }
    assert declared == expected
    service_ports = {
        (p["targetPort"], p["port"]) for p in r.one("Service", f"{FULLNAME}-metrics")["spec"]["ports"]
    }
    assert service_ports == expected
    scraped = {e["port"] for e in r.one("ServiceMonitor", FULLNAME)["spec"]["endpoints"]}
    assert scraped == {name for name, _ in expected}
    admitted = {
        p["port"]
        for policy in r.of_kind("NetworkPolicy")
        if policy["metadata"]["name"] == FULLNAME
        for rule in policy["spec"]["ingress"]
        for p in rule["ports"]
    }
    assert {name for name, _ in expected} <= admitted


def test_network_policies_admit_grpc_from_configured_peers_and_isolate_the_operator(
    render: Callable[..., Rendered],
) -> None:
    r = render([OBSERVABILITY])
    server = r.one("NetworkPolicy", FULLNAME)
    assert server["spec"]["podSelector"]["matchLabels"] == SERVER_LABELS
    grpc_rule = next(rule for rule in server["spec"]["ingress"] if rule["ports"][0]["port"] == "grpc")
    assert grpc_rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "llm-proxy"}}}
    ]
    egress_ports = {p["port"] for rule in server["spec"]["egress"] for p in rule["ports"]}
    assert {53, 6379, 5432} <= egress_ports
    operator = r.one("NetworkPolicy", f"{FULLNAME}-operator")
    # The operator admits its metrics scrape only.
    assert operator["spec"]["ingress"] == [{"ports": [{"port": "http-metrics", "protocol": "TCP"}]}]
    assert set(operator["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    # On by default (issue 27); off only when asked.
    assert render().maybe("NetworkPolicy", FULLNAME) is not None
    assert not render(sets=("networkPolicy.enabled=false",)).of_kind("NetworkPolicy")


def test_dashboard_configmap_carries_the_grafana_label_and_the_dashboard_json(
    render: Callable[..., Rendered],
) -> None:
    cm = render([OBSERVABILITY]).one("ConfigMap", f"{FULLNAME}-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    source = (CHART / "dashboards" / "ibex-context.json").read_text()
    assert json.loads(cm["data"]["ibex-context.json"]) == json.loads(source)
    assert render().maybe("ConfigMap", f"{FULLNAME}-dashboard") is None


# --- the operator -----------------------------------------------------------------------------------

EXPECTED_OPERATOR_RULES = [
    {
        "apiGroups": ["context.ibex.dev"],
        "resources": ["contextprofiles"],
        "verbs": ["get", "list", "watch", "patch"],
    },
    {"apiGroups": ["context.ibex.dev"], "resources": ["contextprofiles/status"], "verbs": ["patch"]},
    {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "resourceNames": [f"{FULLNAME}-profiles"],
        "verbs": ["get", "patch", "delete"],
    },
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "list"]},
    {
        "apiGroups": ["autoscaling"],
        "resources": ["horizontalpodautoscalers"],
        "resourceNames": [FULLNAME],
        "verbs": ["get", "patch", "delete"],
    },
    {"apiGroups": ["autoscaling"], "resources": ["horizontalpodautoscalers"], "verbs": ["create", "list"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
]


def test_operator_rbac_is_namespaced_with_exactly_the_designed_rules(render: Callable[..., Rendered]) -> None:
    r = render()
    role = r.one("Role", f"{FULLNAME}-operator")
    assert role["rules"] == EXPECTED_OPERATOR_RULES
    assert not r.of_kind("ClusterRole") and not r.of_kind("ClusterRoleBinding")
    binding = r.one("RoleBinding", f"{FULLNAME}-operator")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": f"{FULLNAME}-operator",
    }
    operator_sa = r.one("Deployment", f"{FULLNAME}-operator")["spec"]["template"]["spec"][
        "serviceAccountName"
    ]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": operator_sa, "namespace": NAMESPACE}]


def test_no_rbac_rule_anywhere_uses_a_wildcard(rendered: Rendered) -> None:
    for kind in ("Role", "ClusterRole"):
        for role in rendered.of_kind(kind):
            for rule in role["rules"]:
                for field in ("apiGroups", "resources", "verbs"):
                    assert "*" not in rule.get(field, []), f"{role['metadata']['name']}: {rule}"


def test_operator_runs_one_replica_with_recreate_and_a_liveness_probe(
    render: Callable[..., Rendered],
) -> None:
    deployment = render().one("Deployment", f"{FULLNAME}-operator")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    c = deployment["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["ibex-context-operator"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http-health"}
    assert "readinessProbe" not in c


def test_operator_environment_points_it_at_the_service_deployment_and_its_namespace(
    render: Callable[..., Rendered],
) -> None:
    r = render()
    c = r.one("Deployment", f"{FULLNAME}-operator")["spec"]["template"]["spec"]["containers"][0]
    env = env_of(c)
    assert env["WATCH_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    plain = {name: e["value"] for name, e in env.items() if "value" in e}
    config = OperatorConfig.from_env({**plain, "WATCH_NAMESPACE": NAMESPACE})
    assert config.namespaces == (NAMESPACE,)
    assert config.default_service == r.one("Deployment", FULLNAME)["metadata"]["name"]
    health_port = next(p["containerPort"] for p in c["ports"] if p["name"] == "http-health")
    assert config.liveness_endpoint == f"http://0.0.0.0:{health_port}/healthz"


def test_operator_is_absent_when_disabled(render: Callable[..., Rendered]) -> None:
    r = render([LOCAL_STORES])
    assert r.maybe("Deployment", f"{FULLNAME}-operator") is None
    assert not r.of_kind("Role") and not r.of_kind("ContextProfile")


# --- the CRD (generated from the profile schema: tests/operator/test_crd.py) and the default profile -


def test_crd_is_shipped_in_crds_and_validates(render: Callable[..., Rendered]) -> None:
    crd = render().one("CustomResourceDefinition", "contextprofiles.context.ibex.dev")
    kubernetes_validate.validate(crd, VALIDATED_KUBERNETES_VERSION, strict=True)
    assert not list((CHART / "templates").rglob("*crd*")), "CRDs belong in crds/, not templates/"


def _crd_schema() -> Mapping[str, Any]:
    crd = yaml.safe_load(CHART_CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["storage"])
    schema: Mapping[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


@pytest.mark.parametrize("files", [(), (OBSERVABILITY,)], ids=["default", "observability"])
def test_default_contextprofile_is_valid_and_the_operator_renders_the_expected_children(
    render: Callable[..., Rendered],
    files: tuple[Path, ...],
) -> None:
    profile = render(files).one("ContextProfile", f"{FULLNAME}-default")
    # CRD schemas are OpenAPI 3.0 (boolean exclusiveMinimum): JSON Schema draft 4 semantics.
    jsonschema.Draft4Validator(_crd_schema()).validate(profile)
    assert profile["spec"]["selector"] == {"default": True}
    view = ProfileView.from_body(
        {**profile, "metadata": {**profile["metadata"], "generation": 1, "uid": "u1"}}
    )
    plan = plan_namespace(NAMESPACE, [view], FULLNAME, "2026-11-22T00:00:00Z")
    ready = next(c for c in plan.statuses[f"{FULLNAME}-default"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", ready
    (objects,) = plan.services
    assert objects.hpa["metadata"]["name"] == FULLNAME
    assert objects.hpa["spec"]["scaleTargetRef"]["name"] == FULLNAME
    assert objects.configmap["metadata"]["name"] == f"{FULLNAME}-profiles"
    assert objects.hpa["spec"]["minReplicas"] == 2 and objects.hpa["spec"]["maxReplicas"] == 10


def test_default_contextprofile_spec_overrides_are_merged(render: Callable[..., Rendered]) -> None:
    profile = render([OBSERVABILITY]).one("ContextProfile", f"{FULLNAME}-default")
    assert profile["spec"]["budget"] == {"maxMemoryTokens": 3000}
    assert profile["spec"]["service"] == FULLNAME


# --- helm test ------------------------------------------------------------------------------------


def test_helm_test_pod_checks_health_then_makes_one_assemble_call(render: Callable[..., Rendered]) -> None:
    r = render()
    pod = r.one("Pod", f"{FULLNAME}-test-grpc")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["restartPolicy"] == "Never"
    target = f"{FULLNAME}:50051"
    health = pod["spec"]["initContainers"][0]["args"]
    assemble = pod["spec"]["containers"][0]["args"]
    assert health[:3] == ["health", "--target", target]
    assert assemble[:3] == ["assemble", "--target", target]
    # The assemble step fails on a fallback or a degraded answer (a plain call exits 0 on those).
    assert "--require-full" in assemble
    assert r.one("Service", FULLNAME)["spec"]["ports"][0]["port"] == 50051


def test_helm_test_arguments_parse_with_the_real_cli(render: Callable[..., Rendered]) -> None:
    pod = render().one("Pod", f"{FULLNAME}-test-grpc")
    for container in (pod["spec"]["initContainers"][0], pod["spec"]["containers"][0]):
        command_name, *rest = container["args"]
        command = cli_main.commands[command_name]
        context = command.make_context(command_name, list(rest), resilient_parsing=False)
        assert context.params["target"] == f"{FULLNAME}:50051"


def test_the_assembly_cap_is_a_value_the_service_reads(render: Callable[..., Rendered]) -> None:
    assert env_of(server_container(render()))["IBEX_MAX_CONCURRENT_ASSEMBLIES"]["value"] == "4"
    tuned = render(sets=["config.maxConcurrentAssemblies=8"])
    assert env_of(server_container(tuned))["IBEX_MAX_CONCURRENT_ASSEMBLIES"]["value"] == "8"


def test_the_inference_threads_run_below_the_event_loop_by_a_value(
    render: Callable[..., Rendered], helm: str
) -> None:
    assert env_of(server_container(render()))["IBEX_EMBEDDING_WORKER_NICE"]["value"] == "10"
    same = render(sets=["config.embeddingWorkerNice=0"])
    assert env_of(server_container(same))["IBEX_EMBEDDING_WORKER_NICE"]["value"] == "0"
    result = run_helm(helm, *template_args((), ["config.embeddingWorkerNice=20"]))
    assert result.returncode != 0 and "embeddingWorkerNice" in result.stderr


def test_a_negative_assembly_cap_is_refused_by_the_schema(helm: str) -> None:
    result = run_helm(helm, *template_args((), ["config.maxConcurrentAssemblies=-1"]))
    assert result.returncode != 0 and "maxConcurrentAssemblies" in result.stderr


# --- extension points: environment, volumes, sidecars, registries -----------------------------------


def test_extra_env_takes_any_name_with_a_value_or_a_value_from(render: Callable[..., Rendered]) -> None:
    env = env_of(server_container(render([EXTENSIONS])))
    assert env["HTTPS_PROXY"]["value"] == "http://proxy.example.com:3128"
    assert env["PROMETHEUS_DISABLE_CREATED_SERIES"]["value"] == "true"
    assert env["IBEX_HOT_LIMIT"]["value"] == "30"
    assert env["IBEX_OPENAI_BASE_URL"] == {
        "name": "IBEX_OPENAI_BASE_URL",
        "valueFrom": {"configMapKeyRef": {"name": "embeddings-endpoint", "key": "base-url"}},
    }
    operator = render([EXTENSIONS]).one("Deployment", f"{FULLNAME}-operator")
    operator_env = env_of(operator["spec"]["template"]["spec"]["containers"][0])
    assert operator_env["HTTPS_PROXY"]["value"] == "http://proxy.example.com:3128"


def test_extra_env_refuses_a_value_from_without_a_source(helm: str) -> None:
    result = run_helm(
        helm, *template_args(sets=["config.extraEnv.FOO.valueFrom=null", "config.extraEnv.FOO.x=1"])
    )
    assert result.returncode != 0 and "extraEnv" in result.stderr


def test_extra_volumes_mounts_env_from_and_sidecars_reach_the_server_and_the_operator(
    render: Callable[..., Rendered],
) -> None:
    r = render([EXTENSIONS])
    for name, volume, mount_path, env_from, sidecar in (
        (
            FULLNAME,
            "stores-ca",
            "/etc/ibex-context/ca",
            {"configMapRef": {"name": "ibex-tuning"}},
            "log-shipper",
        ),
        (
            f"{FULLNAME}-operator",
            "api-ca",
            "/etc/ibex-operator/ca",
            {"secretRef": {"name": "operator-extra"}},
            "proxy",
        ),
    ):
        spec = r.one("Deployment", name)["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volume in volumes and "tmp" in volumes, name
        ours = spec["containers"][0]
        assert {"name": volume, "mountPath": mount_path, "readOnly": True} in ours["volumeMounts"], name
        assert ours["envFrom"] == [env_from], name
        assert [c["name"] for c in spec["containers"]][1:] == [sidecar], name


def test_the_private_ca_is_mounted_where_the_migrations_run_too(render: Callable[..., Rendered]) -> None:
    r = render([EXTENSIONS])
    for _, _, spec in r.pod_specs:
        for c in containers(spec):
            if c.get("args", [None])[0] == "migrate":
                assert any(m["name"] == "stores-ca" for m in c["volumeMounts"])
                return
    pytest.fail("no migrations container rendered")


@pytest.mark.parametrize("name", ["tmp", "profiles"])
def test_extra_volumes_cannot_shadow_the_charts_own(helm: str, name: str) -> None:
    result = run_helm(
        helm,
        *template_args(sets=[f"server.extraVolumes[0].name={name}", "server.extraVolumes[0].emptyDir=null"]),
    )
    assert result.returncode != 0 and "extraVolumes" in result.stderr


def test_every_pod_pulls_with_the_global_and_the_charts_pull_secrets(render: Callable[..., Rendered]) -> None:
    for files in ((EXTENSIONS,), (EXTENSIONS, LOCAL_STORES)):
        r = render(files)
        assert r.pod_specs
        for workload, _, spec in r.pod_specs:
            assert spec["imagePullSecrets"] == [{"name": "mirror-pull"}, {"name": "platform-pull"}], workload


def test_global_image_registry_replaces_the_registry_of_every_image_but_the_users_sidecars(
    render: Callable[..., Rendered],
) -> None:
    r = render([EXTENSIONS, LOCAL_STORES])
    sidecars = {"log-shipper", "proxy"}
    images = {c["name"]: c["image"] for _, _, spec in r.pod_specs for c in containers(spec)}
    assert images.pop("redis") == "mirror.example.com/library/redis:7.4-alpine"
    assert images.pop("postgresql") == "mirror.example.com/pgvector/pgvector:pg17"
    for name, image in images.items():
        if name not in sidecars:
            assert image.startswith("mirror.example.com/") and image.endswith(":0.1.0"), (name, image)
    # Without a mirror the stores come from Docker Hub, named in full.
    plain = render([LOCAL_STORES])
    stores = {c["name"]: c["image"] for _, _, spec in plain.pod_specs for c in containers(spec)}
    assert stores["redis"] == "docker.io/library/redis:7.4-alpine"


# --- the operator's replicas and metrics -------------------------------------------------------------


def test_operator_replicas_elect_a_leader_through_a_kopf_peering_object(
    render: Callable[..., Rendered],
) -> None:
    r = render([OBSERVABILITY])
    deployment = r.one("Deployment", f"{FULLNAME}-operator")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    c = deployment["spec"]["template"]["spec"]["containers"][0]
    plain = {name: e["value"] for name, e in env_of(c).items() if "value" in e}
    config = OperatorConfig.from_env({**plain, "WATCH_NAMESPACE": NAMESPACE})
    peering = r.one("KopfPeering", f"{FULLNAME}-operator")
    assert config.peering == peering["metadata"]["name"]
    assert peering["apiVersion"] == "kopf.dev/v1" and peering["metadata"]["namespace"] == NAMESPACE
    crd = r.one("CustomResourceDefinition", "kopfpeerings.kopf.dev")
    assert crd["spec"]["names"]["kind"] == "KopfPeering" and crd["spec"]["scope"] == "Namespaced"
    rules = r.one("Role", f"{FULLNAME}-operator")["rules"]
    assert {
        "apiGroups": ["kopf.dev"],
        "resources": ["kopfpeerings"],
        "verbs": ["get", "list", "watch", "patch"],
    } in rules
    # One replica: standalone, no peering object, no peering rights.
    single = render()
    assert not single.of_kind("KopfPeering")
    c = single.one("Deployment", f"{FULLNAME}-operator")["spec"]["template"]["spec"]["containers"][0]
    assert "IBEX_OPERATOR_PEERING" not in env_of(c)


def test_operator_metrics_are_served_and_scraped_by_a_pod_monitor(render: Callable[..., Rendered]) -> None:
    r = render([OBSERVABILITY])
    deployment = r.one("Deployment", f"{FULLNAME}-operator")
    c = deployment["spec"]["template"]["spec"]["containers"][0]
    plain = {name: e["value"] for name, e in env_of(c).items() if "value" in e}
    config = OperatorConfig.from_env({**plain, "WATCH_NAMESPACE": NAMESPACE})
    port = next(p["containerPort"] for p in c["ports"] if p["name"] == "http-metrics")
    assert config.metrics_port == port
    monitor = r.one("PodMonitor", f"{FULLNAME}-operator")
    assert selects(
        monitor["spec"]["selector"]["matchLabels"], deployment["spec"]["template"]["metadata"]["labels"]
    )
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "http-metrics"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert not render().of_kind("PodMonitor")
