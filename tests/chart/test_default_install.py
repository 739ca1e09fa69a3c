"""A default install comes up (issue 38, deliverable 3): with image.repository and nothing else the
install is refused naming the value to set; with the stores named (or in the chart) every Secret a pod
mounts or reads is created by the release, before the pods that need it, and the generated
certificate and credentials are what the server parses and what `helm test` presents.

`helm template` does no lookup: that the generated Secrets are kept across upgrades is proven against
a real API server (tests/cluster)."""

from __future__ import annotations

import base64
import datetime
import ssl
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from ibex_context.server.app import ContextService
from ibex_context.server.auth import Role, parse_credentials, token_digest
from ibex_context.settings import Settings
from ibex_context.tokens.encodings import EncodingRegistry
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb

from tests.chart.conftest import (
    CI_VALUES,
    FULLNAME,
    NAMESPACE,
    Rendered,
    parse_manifests,
    run_helm,
    template_args,
)
from tests.chart.test_security_defaults import rendered_settings

# What a real default-install test sets, besides image.repository: the stores, in the chart or named.
IN_CHART_STORES = ("redis.enabled=true", "postgresql.enabled=true")
NAMED_STORES = ("secrets.existingSecret=ibex-stores",)
PRE_INSTALL = "pre-install"


def render_with(helm: str, *sets: str) -> Rendered:
    result = run_helm(helm, *template_args(sets=list(sets), stores=False))
    assert result.returncode == 0, result.stderr
    return Rendered("+".join(sets), parse_manifests(result.stdout))


def secret_data(r: Rendered, name: str) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in r.one("Secret", name)["data"].items()}


def hook_phases(metadata: Mapping[str, Any]) -> set[str]:
    return set(((metadata.get("annotations") or {}).get("helm.sh/hook") or "").split(",")) - {""}


def required_secrets(pod_spec: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(secret name, where) of every Secret the pod cannot start without (optional ones left out)."""
    for volume in pod_spec.get("volumes", []):
        secret = volume.get("secret")
        if secret and not secret.get("optional"):
            yield secret["secretName"], f"volume {volume['name']}"
        for source in (volume.get("projected") or {}).get("sources", []):
            if "secret" in source and not source["secret"].get("optional"):
                yield source["secret"]["name"], f"projected volume {volume['name']}"
    for container in (*pod_spec.get("initContainers", []), *pod_spec["containers"]):
        for entry in container.get("env", []):
            ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
            if ref and not ref.get("optional"):
                yield ref["name"], f"{container['name']} env {entry['name']}"
        for source in container.get("envFrom", []):
            ref = source.get("secretRef")
            if ref and not ref.get("optional"):
                yield ref["name"], f"{container['name']} envFrom"


def created_secrets(r: Rendered) -> set[str]:
    """Secrets the release creates: its Secret objects and cert-manager Certificates' targets."""
    names = {m["metadata"]["name"] for m in r.of_kind("Secret")}
    return names | {c["spec"]["secretName"] for c in r.of_kind("Certificate")}


# --- refused, naming the value ------------------------------------------------------------------------


def test_with_only_the_image_the_install_is_refused_naming_the_stores_secret(helm: str) -> None:
    result = run_helm(helm, *template_args(stores=False))
    assert result.returncode != 0
    assert "secrets.existingSecret is required" in result.stderr
    # ... and the other way out, with the keys the Secret must hold.
    assert "redis.enabled=true, postgresql.enabled=true" in result.stderr
    assert "redis-url" in result.stderr and "postgres-dsn" in result.stderr


def test_one_in_chart_store_still_needs_the_secret_of_the_other(helm: str) -> None:
    result = run_helm(helm, *template_args(sets=["redis.enabled=true"], stores=False))
    assert result.returncode != 0
    assert "secrets.existingSecret is required" in result.stderr
    assert "postgres-dsn" in result.stderr and "redis-url" not in result.stderr


@pytest.mark.parametrize(
    ("sets", "named"),
    [
        (["security.auth.credentialsSecret=mine"], "security.auth.testTokenSecret is required"),
        (
            ["security.auth.testTokenSecret=mine"],
            "security.auth.testTokenSecret needs security.auth.credentialsSecret",
        ),
    ],
)
def test_credentials_and_the_test_token_are_both_generated_or_both_yours(
    helm: str, sets: list[str], named: str
) -> None:
    result = run_helm(helm, *template_args(sets=sets))
    assert result.returncode != 0 and named in result.stderr, result.stderr


# --- every Secret a pod needs exists --------------------------------------------------------------


@pytest.mark.parametrize("stores", [IN_CHART_STORES, NAMED_STORES], ids=["in-chart-stores", "named-stores"])
def test_every_secret_a_pod_needs_is_created_by_the_release_or_named_in_the_values(
    helm: str, stores: tuple[str, ...]
) -> None:
    r = render_with(helm, *stores)
    named = {s.split("=", 1)[1] for s in stores if s.startswith("secrets.existingSecret=")}
    created = created_secrets(r)
    missing = [
        f"{workload}: {name} ({where})"
        for workload, _, spec in r.pod_specs
        for name, where in required_secrets(spec)
        if name not in created | named
    ]
    assert not missing, missing
    # The defaults generate the certificate and the credentials (no cert-manager, nothing of yours).
    assert {f"{FULLNAME}-tls", f"{FULLNAME}-credentials", f"{FULLNAME}-test-token"} <= created


@pytest.mark.parametrize("values", CI_VALUES, ids=[p.stem for p in CI_VALUES])
def test_every_ci_values_file_is_a_complete_install_whose_secrets_exist_or_are_named_in_it(
    helm: str, values: Path
) -> None:
    result = run_helm(helm, *template_args([values], stores=False))
    assert result.returncode == 0, result.stderr
    r = Rendered(values.stem, parse_manifests(result.stdout))
    named_in_values = values.read_text()
    missing = [
        f"{workload}: {name} ({where})"
        for workload, _, spec in r.pod_specs
        for name, where in required_secrets(spec)
        if name not in created_secrets(r) and name not in named_in_values
    ]
    assert not missing, missing


def test_cert_manager_certificate_and_credentials_of_your_own_replace_the_generated_ones(helm: str) -> None:
    r = render_with(
        helm,
        *NAMED_STORES,
        "security.tls.certManager.enabled=true",
        "security.tls.certManager.issuerRef.name=ca",
        "security.auth.credentialsSecret=my-credentials",
        "security.auth.testTokenSecret=my-test-token",
    )
    generated = {m["metadata"]["name"] for m in r.of_kind("Secret")}
    assert (
        not {f"{FULLNAME}-tls", f"{FULLNAME}-ca", f"{FULLNAME}-credentials", f"{FULLNAME}-test-token"}
        & generated
    )
    assert r.one("Certificate", FULLNAME)["spec"]["secretName"] == f"{FULLNAME}-tls"


@pytest.mark.parametrize("stores", [IN_CHART_STORES, NAMED_STORES], ids=["in-chart-stores", "named-stores"])
def test_no_hook_that_runs_before_install_waits_for_a_secret_the_release_creates_after_it(
    helm: str, stores: tuple[str, ...]
) -> None:
    # Hooks run before the release's ordinary objects exist: a pre-install Job reading a Secret the
    # release creates would sit in CreateContainerConfigError until its deadline.
    r = render_with(helm, *stores, "redis.enabled=true")
    ordinary = {m["metadata"]["name"] for m in r.of_kind("Secret") if not hook_phases(m["metadata"])}
    for workload, _, spec in r.pod_specs:
        manifest_kind, name = workload.split("/", 1)
        manifest = r.one(manifest_kind, name)
        if PRE_INSTALL in hook_phases(manifest["metadata"]):
            assert not {s for s, _ in required_secrets(spec)} & ordinary, workload


def test_the_helm_test_pod_mounts_the_ca_and_the_token_the_release_generates(helm: str) -> None:
    r = render_with(helm, *NAMED_STORES)
    pod = r.one("Pod", f"{FULLNAME}-test-grpc")
    volumes = {v["name"]: v["secret"] for v in pod["spec"]["volumes"] if "secret" in v}
    assert volumes["tls"]["secretName"] == f"{FULLNAME}-tls"
    assert "ca.crt" in secret_data(r, f"{FULLNAME}-tls")
    assert volumes["test-token"] == {"secretName": f"{FULLNAME}-test-token"}  # not optional: it exists
    assert "token" in secret_data(r, f"{FULLNAME}-test-token")


# --- what was generated is what the server parses ------------------------------------------------------


def test_the_generated_credentials_grant_the_bootstrap_token_every_role_and_the_test_token_assemble_only(
    helm: str,
) -> None:
    r = render_with(helm, *NAMED_STORES)
    credentials = parse_credentials(secret_data(r, f"{FULLNAME}-credentials")["credentials.yaml"].decode())
    bootstrap = secret_data(r, f"{FULLNAME}-bootstrap-token")["token"].decode()
    test = secret_data(r, f"{FULLNAME}-test-token")["token"].decode()
    assert len(bootstrap) >= 48 and len(test) >= 48 and bootstrap != test
    admin = credentials.by_token_digest[token_digest(bootstrap)]
    assert admin.roles == frozenset(Role) and admin.org_id is None
    tester = credentials.by_token_digest[token_digest(test)]
    assert tester.roles == {Role.ASSEMBLE}
    test_pod = r.one("Pod", f"{FULLNAME}-test-grpc")
    assemble_args = test_pod["spec"]["containers"][0]["args"]
    assert tester.org_id == assemble_args[assemble_args.index("--org") + 1]
    # The server mounts the digests only, never a token.
    server = r.one("Deployment", FULLNAME)["spec"]["template"]["spec"]
    mounted = {v["secret"]["secretName"] for v in server["volumes"] if "secret" in v}
    assert not {f"{FULLNAME}-bootstrap-token", f"{FULLNAME}-test-token"} & mounted


def test_the_generated_certificate_is_signed_by_the_ca_for_every_service_name(
    helm: str, tmp_path: Path
) -> None:
    r = render_with(helm, *NAMED_STORES)
    tls = secret_data(r, f"{FULLNAME}-tls")
    assert r.one("Secret", f"{FULLNAME}-tls")["type"] == "kubernetes.io/tls"
    ca = x509.load_pem_x509_certificate(tls["ca.crt"])
    leaf = x509.load_pem_x509_certificate(tls["tls.crt"])
    leaf.verify_directly_issued_by(ca)
    assert secret_data(r, f"{FULLNAME}-ca")["ca.crt"] == tls["ca.crt"]
    names = set(
        leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName
        )
    )
    for service in (FULLNAME, f"{FULLNAME}-headless"):
        assert {service, f"{service}.{NAMESPACE}.svc", f"{service}.{NAMESPACE}.svc.cluster.local"} <= names
    assert isinstance(leaf.public_key(), ec.EllipticCurvePublicKey)
    # The server's own check: the key belongs to the certificate.
    for key, value in tls.items():
        (tmp_path / key).write_bytes(value)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with pytest.raises(ssl.SSLError):
        context.load_cert_chain(certfile=tmp_path / "ca.crt", keyfile=tmp_path / "tls.key")
    context.load_cert_chain(certfile=tmp_path / "tls.crt", keyfile=tmp_path / "tls.key")
    # An upgrade renews it this long before it ends (the annotation it compares).
    not_after = r.one("Secret", f"{FULLNAME}-tls")["metadata"]["annotations"]["ibex.dev/not-after"]
    recorded = datetime.datetime.fromisoformat(not_after)
    assert abs((recorded - leaf.not_valid_after_utc).total_seconds()) < 120


@pytest.mark.integration
async def test_a_server_with_the_generated_secrets_answers_the_helm_test_call_and_the_bootstrap_token(
    helm: str, tmp_path: Path, redis_url: str, postgres_dsn: str, encodings: EncodingRegistry
) -> None:
    # The rendered Deployment's settings, its Secret mounts filled with the rendered Secrets' data.
    r = render_with(helm, *NAMED_STORES)
    for directory, secret in (("tls", f"{FULLNAME}-tls"), ("auth", f"{FULLNAME}-credentials")):
        (tmp_path / directory).mkdir()
        for key, value in secret_data(r, secret).items():
            (tmp_path / directory / key).write_bytes(value)
    settings: Settings = rendered_settings(
        r,
        tmp_path,
        redis_url=redis_url,
        postgres_dsn=postgres_dsn,
        grpc_host="127.0.0.1",
        grpc_port=0,
        metrics_port=0,
        health_port=0,
        workers=1,
        embedder="hashing",
    )
    service = ContextService(settings, encodings=encodings)
    await service.start()
    try:
        ca = secret_data(r, f"{FULLNAME}-tls")["ca.crt"]
        test_pod = r.one("Pod", f"{FULLNAME}-test-grpc")["spec"]["containers"][0]["args"]
        target_host = test_pod[test_pod.index("--target") + 1].rsplit(":", 1)[0]
        org = test_pod[test_pod.index("--org") + 1]
        options = [("grpc.ssl_target_name_override", target_host)]
        credentials = grpc.ssl_channel_credentials(ca)
        async with grpc.aio.secure_channel(f"127.0.0.1:{service.port}", credentials, options=options) as ch:
            assemble = ch.unary_unary(
                "/ibex.context.v1.ContextAssemblyService/AssembleContext",
                request_serializer=pb.AssembleContextRequest.SerializeToString,
                response_deserializer=pb.AssembleContextResponse.FromString,
            )
            request = pb.AssembleContextRequest(
                org_id=org,
                agent_id=str(uuid.uuid4()),
                model="gpt-4o",
                messages=[pb.Message(role="user", content="hi")],
            )
            test_token = secret_data(r, f"{FULLNAME}-test-token")["token"].decode()
            answer = await assemble(
                request, metadata=(("authorization", f"Bearer {test_token}"),), timeout=10
            )
            assert answer.messages
            # The test token is bound to the test org; the bootstrap token may purge any org.
            other = pb.AssembleContextRequest(
                org_id=str(uuid.uuid4()),
                agent_id=str(uuid.uuid4()),
                model="gpt-4o",
                messages=[pb.Message(role="user", content="hi")],
            )
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await assemble(other, metadata=(("authorization", f"Bearer {test_token}"),), timeout=10)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            bootstrap = secret_data(r, f"{FULLNAME}-bootstrap-token")["token"].decode()
            purge = ch.unary_unary(
                "/ibex.context.v1.MemoryService/PurgeOrg",
                request_serializer=pb.PurgeOrgRequest.SerializeToString,
                response_deserializer=pb.PurgeOrgResponse.FromString,
            )
            purged = await purge(
                pb.PurgeOrgRequest(org_id=other.org_id),
                metadata=(("authorization", f"Bearer {bootstrap}"),),
                timeout=10,
            )
            assert purged.complete
    finally:
        await service.stop(grace=1.0)
