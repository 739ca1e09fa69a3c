"""The kind end-to-end flow (loadtest/kind/), checked without Docker: shellcheck on every script, and
every manifest the flow applies validated and cross-checked against the chart it installs (names,
ports, secrets, images) and the programs it runs (loadtest.seed arguments, locustfile options).
The flow itself needs Docker and is not run here (docs/kubernetes.md).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.chart.conftest import (
    CHART,
    MINIMUM_KUBERNETES_VERSION,
    REPO,
    VALIDATED_KUBERNETES_VERSION,
    Rendered,
    parse_manifests,
    run_helm,
)

KIND_DIR = REPO / "loadtest" / "kind"
UP = KIND_DIR / "up.sh"
UP_TEXT = UP.read_text()
SCRIPTS = [
    UP,
    KIND_DIR / "down.sh",
    REPO / "scripts" / "install-helm.sh",
    REPO / "scripts" / "lock-requirements.sh",
]
KIND_VALUES = KIND_DIR / "values-kind.yaml"
NOT_KUBERNETES_OBJECTS = {"kind-config.yaml", "values-kind.yaml"}
APPLIED = sorted(p for p in KIND_DIR.glob("*.yaml") if p.name not in NOT_KUBERNETES_OBJECTS)


def script_var(name: str) -> str:
    match = re.search(rf'^{name}="(?:\$\{{[A-Z_]+:-)?([^"}}]*)}}?"$', UP_TEXT, re.MULTILINE)
    assert match is not None, f"{name} not set in up.sh"
    return match.group(1)


RELEASE = script_var("RELEASE")
NAMESPACE = script_var("NAMESPACE")


def manifests_of(path: Path) -> list[dict[str, Any]]:
    return list(parse_manifests(path.read_text()))


def job(name: str) -> Mapping[str, Any]:
    for path in APPLIED:
        for m in manifests_of(path):
            if m["kind"] == "Job" and m["metadata"]["name"] == name:
                return m
    raise AssertionError(f"no Job {name} in {KIND_DIR}")


@pytest.fixture(scope="module")
def kind_release(helm: str) -> Rendered:
    result = run_helm(
        helm,
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--values",
        str(KIND_VALUES),
        "--kube-version",
        VALIDATED_KUBERNETES_VERSION,
    )
    assert result.returncode == 0, result.stderr
    return Rendered("kind", parse_manifests(result.stdout))


# --- scripts ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_shellcheck_finds_nothing(script: Path) -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck not found: apt-get install -y shellcheck (scripts/test installs it)")
    result = subprocess.run(
        [shellcheck, "--severity=style", str(script)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert script.stat().st_mode & 0o111, f"{script.name} is not executable"


def test_up_script_uses_only_files_that_exist() -> None:
    for ref in re.findall(r'"\$\{KIND_DIR\}/([^"]+)"', UP_TEXT):
        assert (KIND_DIR / ref).is_file(), ref
    for ref in re.findall(r'"\$\{ROOT\}/([^"$]+)"', UP_TEXT):
        assert (REPO / ref).exists(), ref


def test_load_never_goes_through_port_forward() -> None:
    assert "port-forward" not in UP_TEXT


def test_kind_config_is_a_multi_node_kind_cluster_named_as_the_script_expects() -> None:
    config = yaml.safe_load((KIND_DIR / "kind-config.yaml").read_text())
    assert config["kind"] == "Cluster" and config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    assert config["name"] == script_var("CLUSTER")
    roles = [n["role"] for n in config["nodes"]]
    assert roles.count("control-plane") == 1 and roles.count("worker") >= 2


def test_metrics_server_runs_with_kubelet_insecure_tls() -> None:
    assert "metrics-server" in UP_TEXT and "--kubelet-insecure-tls" in UP_TEXT


# --- manifests ----------------------------------------------------------------------------------------


def test_every_applied_manifest_validates_strictly() -> None:
    assert {p.name for p in APPLIED} >= {"seed-job.yaml", "locust-job.yaml"}
    for path in APPLIED:
        for manifest in manifests_of(path):
            for version in (VALIDATED_KUBERNETES_VERSION, MINIMUM_KUBERNETES_VERSION):
                try:
                    kubernetes_validate.validate(manifest, version, strict=True)
                except kubernetes_validate.ValidationError as exc:
                    pytest.fail(f"{path.name}: {manifest['kind']} invalid for {version}: {exc}")


def test_every_manifest_the_script_applies_is_in_the_directory() -> None:
    applied = set(re.findall(r'apply -f "\$\{KIND_DIR\}/([^"]+)"', UP_TEXT))
    applied |= set(re.findall(r'run_job "\$\{KIND_DIR\}/([^"]+)"', UP_TEXT))
    assert applied == {p.name for p in APPLIED}


def test_jobs_are_restricted_and_use_the_images_the_script_builds() -> None:
    loadtest_image = script_var("LOADTEST_IMAGE")
    for name in ("ibex-seed", "ibex-locust"):
        assert (
            f'run_job "${{KIND_DIR}}/{"seed" if name == "ibex-seed" else "locust"}-job.yaml" {name} '
            in UP_TEXT
        )
        spec = job(name)["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["automountServiceAccountToken"] is False
        for c in spec["containers"]:
            assert c["image"] == loadtest_image
            assert c["imagePullPolicy"] == "Never"
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
            assert sc["capabilities"]["drop"] == ["ALL"]
    locust_gate = job("ibex-locust")["spec"]
    assert locust_gate["backoffLimit"] == 0, "a failed p99 gate must fail the Job, not retry it"


def test_chart_values_for_kind_lint_and_use_the_loaded_image(helm: str, kind_release: Rendered) -> None:
    result = run_helm(
        helm,
        "lint",
        "--strict",
        str(CHART),
        "--values",
        str(KIND_VALUES),
        "--kube-version",
        VALIDATED_KUBERNETES_VERSION,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    repository, tag = script_var("IMAGE").split(":")
    server = kind_release.one("Deployment", RELEASE)["spec"]["template"]["spec"]["containers"][0]
    assert server["image"] == f"{repository}:{tag}"
    assert server["imagePullPolicy"] == "Never"
    assert kind_release.maybe("Deployment", f"{RELEASE}-operator") is not None
    assert kind_release.of_kind("StatefulSet"), "the kind flow uses the in-chart stores"


def test_jobs_reach_the_service_and_secret_the_chart_creates(kind_release: Rendered) -> None:
    locust = job("ibex-locust")["spec"]["template"]["spec"]["containers"][0]
    host = locust["args"][locust["args"].index("--host") + 1]
    service_name, port = host.split(":")
    service = kind_release.one("Service", service_name)
    assert int(port) in [p["port"] for p in service["spec"]["ports"]]

    seed = job("ibex-seed")["spec"]["template"]["spec"]["containers"][0]
    dsn = next(e for e in seed["env"] if e["name"] == "IBEX_POSTGRES_DSN")["valueFrom"]["secretKeyRef"]
    secret = kind_release.one("Secret", dsn["name"])
    assert dsn["key"] in secret["data"]
    redis = kind_release.one("StatefulSet", f"{RELEASE}-redis")
    assert "statefulset/${RELEASE}-redis" in UP_TEXT and redis


def test_seed_and_locust_share_the_agents_file_on_one_claim(monkeypatch: pytest.MonkeyPatch) -> None:
    from loadtest.seed import parse_args

    seed = job("ibex-seed")["spec"]["template"]["spec"]
    # The Job passes the DSN through the environment (from the chart's Secret).
    assert any(e["name"] == "IBEX_POSTGRES_DSN" for e in seed["containers"][0]["env"])
    monkeypatch.setenv("IBEX_POSTGRES_DSN", "postgresql://ibex@ibex-context-postgresql:5432/ibex")
    args = parse_args(seed["containers"][0]["args"])
    locust = job("ibex-locust")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in locust["containers"][0]["env"]}
    assert str(args.agents_file) == env["LOADTEST_AGENTS_FILE"]
    claims = {p.name: manifests_of(p)[0]["metadata"]["name"] for p in APPLIED if "pvc" in p.name}
    for spec in (seed, locust):
        data = next(v for v in spec["volumes"] if v["name"] == "data")
        assert data["persistentVolumeClaim"]["claimName"] in claims.values()


def test_locust_job_sets_only_options_the_locustfile_declares() -> None:
    declared = set(
        re.findall(r'env_var="(LOADTEST_[A-Z0-9_]+)"', (REPO / "loadtest" / "locustfile.py").read_text())
    )
    locust = job("ibex-locust")["spec"]["template"]["spec"]["containers"][0]
    used = {e["name"] for e in locust["env"]}
    assert used <= declared, used - declared
    locustfile = locust["args"][locust["args"].index("-f") + 1]
    # The Dockerfile's loadtest target copies loadtest/ to /opt/ibex/loadtest.
    assert locustfile == "/opt/ibex/loadtest/locustfile.py"
    assert "COPY loadtest /opt/ibex/loadtest" in (REPO / "Dockerfile").read_text()


def test_example_profiles_target_the_kind_release_and_never_collide_with_chart_objects(
    kind_release: Rendered,
) -> None:
    examples = [
        m
        for path in sorted((REPO / "examples").glob("*.yaml"))
        for m in manifests_of(path)
        if m.get("kind") == "ContextProfile"
    ]
    assert examples, "up.sh applies the ContextProfiles in examples/"
    chart_profiles = {m["metadata"]["name"] for m in kind_release.of_kind("ContextProfile")}
    for example in examples:
        assert example["metadata"]["name"] not in chart_profiles, "Helm and kubectl would share the object"
        service = example["spec"].get("service")
        if service is not None:
            assert kind_release.one("Deployment", service)
    assert any(m["spec"]["selector"].get("default") for m in examples), "some profile must be the default"
