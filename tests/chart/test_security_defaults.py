"""Secure by default (issue 27): a service installed with the chart's defaults refuses a caller
without credentials. Proven on the rendered manifests and by serving with exactly the settings the
rendered Deployment gives the server (its mounted files replaced by files made here)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from ibex_context.devtools.certs import SERVER_NAME, Authority
from ibex_context.server.app import ContextService
from ibex_context.server.auth import token_digest
from ibex_context.settings import Settings
from ibex_context.tokens.encodings import EncodingRegistry
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb

from tests.chart.conftest import FULLNAME, Rendered

ASSEMBLE = "/ibex.context.v1.ContextAssemblyService/AssembleContext"
EXPORT = "/ibex.context.v1.MemoryService/ExportMemories"
PURGE = "/ibex.context.v1.MemoryService/PurgeOrg"


@pytest.fixture
def defaults(render: Callable[..., Rendered]) -> Rendered:
    rendered: Rendered = render()
    return rendered


def server_pod(r: Rendered) -> Mapping[str, Any]:
    spec: Mapping[str, Any] = r.one("Deployment", FULLNAME)["spec"]["template"]["spec"]
    return spec


def server_container(r: Rendered) -> Mapping[str, Any]:
    return next(c for c in server_pod(r)["containers"] if c["name"] == "server")


def mounted_secret(r: Rendered, path: str) -> tuple[str, str]:
    """(secret name, mount path) of the Secret volume the server reads ``path`` from."""
    volumes = {v["name"]: v for v in server_pod(r)["volumes"]}
    for mount in server_container(r)["volumeMounts"]:
        if path.startswith(mount["mountPath"].rstrip("/") + "/"):
            assert "subPath" not in mount, "a subPath mount never sees a renewed Secret"
            return volumes[mount["name"]]["secret"]["secretName"], mount["mountPath"]
    raise AssertionError(f"{path} is on no mounted volume")


def test_the_defaults_turn_on_tls_authentication_and_the_network_policy(defaults: Rendered) -> None:
    env = {e["name"]: e.get("value") for e in server_container(defaults)["env"]}
    assert env["IBEX_AUTH_ENABLED"] == "true"
    assert mounted_secret(defaults, env["IBEX_AUTH_CREDENTIALS_FILE"])[0] == f"{FULLNAME}-credentials"
    assert mounted_secret(defaults, env["IBEX_TLS_CERT_FILE"])[0] == f"{FULLNAME}-tls"
    assert mounted_secret(defaults, env["IBEX_TLS_KEY_FILE"])[0] == f"{FULLNAME}-tls"
    assert defaults.maybe("NetworkPolicy", FULLNAME) is not None
    # helm test verifies the server with the Secret's CA and sends the test token.
    test_pod = defaults.one("Pod", f"{FULLNAME}-test-grpc")
    for container in (*test_pod["spec"]["initContainers"], *test_pod["spec"]["containers"]):
        names = {e["name"] for e in container.get("env", [])}
        assert {"IBEX_TLS_CA", "IBEX_TOKEN_FILE"} <= names, container["name"]


def test_plaintext_and_no_auth_need_saying_so(render: Callable[..., Rendered]) -> None:
    opened = render(sets=("security.tls.enabled=false", "security.auth.enabled=false"))
    env = {e["name"]: e.get("value") for e in server_container(opened)["env"]}
    assert env["IBEX_AUTH_ENABLED"] == "false"
    assert "IBEX_TLS_CERT_FILE" not in env and "IBEX_AUTH_CREDENTIALS_FILE" not in env


def rendered_settings(r: Rendered, files: Path, **stores: Any) -> Settings:
    """The server's settings as the rendered Deployment sets them: plain values as rendered, paths
    under the container's mounts moved to ``files``, the stores (Secret references) given here."""
    values: dict[str, Any] = {}
    for entry in server_container(r)["env"]:
        if "value" in entry and entry["name"].startswith("IBEX_"):
            value = entry["value"]
            if value.startswith("/etc/ibex-context/"):
                value = str(files / value.removeprefix("/etc/ibex-context/"))
            values[entry["name"].removeprefix("IBEX_").lower()] = value
    values.update(stores)
    return Settings(**values)


@pytest.mark.integration
async def test_a_server_with_the_default_settings_refuses_a_caller_without_credentials(
    defaults: Rendered, tmp_path: Path, redis_url: str, postgres_dsn: str, encodings: EncodingRegistry
) -> None:
    ca = Authority.create("cluster CA")
    (tmp_path / "tls").mkdir()
    (tmp_path / "auth").mkdir()
    ca.server().write(tmp_path / "tls", "tls")
    (tmp_path / "tls" / "ca.crt").write_bytes(ca.cert_pem)
    token = f"proxy-{uuid.uuid4().hex}"
    (tmp_path / "auth" / "credentials.yaml").write_text(
        yaml.safe_dump(
            {
                "principals": [
                    {"name": "proxy", "roles": ["assemble"], "token_sha256": [token_digest(token).hex()]}
                ]
            }
        )
    )
    settings = rendered_settings(
        defaults,
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
        credentials = grpc.ssl_channel_credentials(ca.cert_pem)
        options = [("grpc.ssl_target_name_override", SERVER_NAME)]
        async with grpc.aio.secure_channel(f"127.0.0.1:{service.port}", credentials, options=options) as ch:
            org = str(uuid.uuid4())
            requests = {
                ASSEMBLE: pb.AssembleContextRequest(
                    org_id=org, agent_id=org, model="gpt-4o", messages=[pb.Message(role="user", content="hi")]
                ),
                EXPORT: pb.ExportMemoriesRequest(org_id=org),
                PURGE: pb.PurgeOrgRequest(org_id=org),
            }
            for path, request in requests.items():
                method = ch.unary_unary(path, request_serializer=lambda m: m.SerializeToString())
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await method(request, timeout=10)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, path
            # The proxy's credential: assemble only.
            auth = (("authorization", f"Bearer {token}"),)
            await ch.unary_unary(ASSEMBLE, request_serializer=lambda m: m.SerializeToString())(
                requests[ASSEMBLE], metadata=auth, timeout=10
            )
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await ch.unary_unary(PURGE, request_serializer=lambda m: m.SerializeToString())(
                    requests[PURGE], metadata=auth, timeout=10
                )
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # The probes' plaintext port answers health only.
        assert service.health_port is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.health_port}") as probe:
            check = probe.unary_unary(
                "/grpc.health.v1.Health/Check",
                request_serializer=HealthCheckRequest.SerializeToString,
                response_deserializer=HealthCheckResponse.FromString,
            )
            assert (await check(HealthCheckRequest(service="liveness"), timeout=10)).status == (
                HealthCheckResponse.SERVING
            )
    finally:
        await service.stop(grace=1.0)


def test_cert_manager_mutual_tls_and_a_private_stores_ca_are_mounted_where_the_settings_point(
    render: Callable[..., Rendered],
) -> None:
    r = render(
        sets=(
            "security.tls.certManager.enabled=true",
            "security.tls.certManager.issuerRef.name=cluster-ca",
            "security.tls.certManager.issuerRef.kind=ClusterIssuer",
            "security.tls.clientCA.enabled=true",
            "security.tls.clientCA.secretName=client-ca",
            "security.storesCA.secretName=stores-ca",
        )
    )
    certificate = r.one("Certificate", FULLNAME)
    assert certificate["spec"]["secretName"] == f"{FULLNAME}-tls"
    assert certificate["spec"]["issuerRef"] == {
        "name": "cluster-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }
    assert (
        f"{FULLNAME}.{r.one('Deployment', FULLNAME)['metadata']['namespace']}.svc"
        in certificate["spec"]["dnsNames"]
    )
    env = {e["name"]: e.get("value") for e in server_container(r)["env"]}
    assert mounted_secret(r, env["IBEX_TLS_CLIENT_CA_FILE"])[0] == "client-ca"
    assert mounted_secret(r, env["IBEX_REDIS_CA_FILE"])[0] == "stores-ca"
    assert mounted_secret(r, env["IBEX_POSTGRES_CA_FILE"])[0] == "stores-ca"
    # The migrations run once, in the pre-install/pre-upgrade Job, against the same CA.
    migrate = r.one("Job", f"{FULLNAME}-migrate")["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e.get("value") for e in migrate["env"]}["IBEX_POSTGRES_CA_FILE"] == env[
        "IBEX_POSTGRES_CA_FILE"
    ]
    assert any(m["name"] == "stores-ca" for m in migrate["volumeMounts"])
