"""Who may call what, over real TLS sockets with certificates made here: every RPC by
every role by own org / another org, no credential, unknown credentials, mutual TLS
identities, refusals that read and write nothing, and no secret in logs or metrics."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml
from grpc_health.v1 import health_pb2
from ibex_context.devtools.certs import SERVER_NAME, Authority, Issued
from ibex_context.observability.logging import JsonFormatter
from ibex_context.server.app import ContextService
from ibex_context.server.auth import METHOD_ROLES, Role, method_roles, token_digest
from ibex_context.tokens.encodings import EncodingRegistry
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb

from tests.server.conftest import StartService

pytestmark = pytest.mark.integration

ORG = str(uuid.uuid4())
OTHER_ORG = str(uuid.uuid4())
AGENT = str(uuid.uuid4())
ASSEMBLY = "/ibex.context.v1.ContextAssemblyService/"
MEMORY = "/ibex.context.v1.MemoryService/"


def token_of(name: str) -> str:
    return f"tok-{name}-{uuid.uuid4().hex}{uuid.uuid4().hex}"


@dataclass
class Pki:
    ca: Authority
    server: Issued
    directory: Path

    @property
    def ca_file(self) -> Path:
        path = self.directory / "ca.crt"
        path.write_bytes(self.ca.cert_pem)
        return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    ca = Authority.create("ibex test CA")
    return Pki(ca, ca.server(), tmp_path_factory.mktemp("pki"))


# One bound principal per role (bound to ORG), and one unbound principal with every role.
TOKENS = {role.value: token_of(role.value) for role in Role}
TOKENS["everything"] = token_of("everything")


def credentials_yaml(tokens: dict[str, str], *, identities: dict[str, list[str]] | None = None) -> str:
    principals: list[dict[str, Any]] = [
        {
            "name": f"bound-{role.value}",
            "roles": [role.value],
            "org_id": ORG,
            "token_sha256": [token_digest(tokens[role.value]).hex()],
        }
        for role in Role
    ]
    principals.append(
        {
            "name": "everything",
            "roles": [r.value for r in Role],
            "token_sha256": [token_digest(tokens["everything"]).hex()],
        }
    )
    for name, names in (identities or {}).items():
        principals.append({"name": name, "roles": ["read"], "org_id": ORG, "tls_identities": names})
    return yaml.safe_dump({"principals": principals})


@pytest.fixture
async def secured(start_service: StartService, pki: Pki, tmp_path: Path) -> ContextService:
    cert, key = pki.server.write(tmp_path, "server")
    credentials = tmp_path / "credentials.yaml"
    credentials.write_text(credentials_yaml(TOKENS))
    return await start_service(
        auth_enabled=True,
        auth_credentials_file=credentials,
        auth_reload_seconds=0.05,
        tls_cert_file=cert,
        tls_key_file=key,
        health_port=0,
    )


def channel(port: int, pki: Pki, client: Issued | None = None) -> grpc.aio.Channel:
    credentials = grpc.ssl_channel_credentials(
        pki.ca.cert_pem,
        client.key_pem if client else None,
        client.cert_pem if client else None,
    )
    return grpc.aio.secure_channel(
        f"127.0.0.1:{port}", credentials, options=[("grpc.ssl_target_name_override", SERVER_NAME)]
    )


@pytest.fixture
async def tls_channel(secured: ContextService, pki: Pki) -> AsyncIterator[grpc.aio.Channel]:
    async with channel(secured.port, pki) as ch:
        yield ch


def requests_for(org: str) -> dict[str, Any]:
    """A valid request of every method for ``org`` (each one succeeds when allowed)."""
    memory_id = str(uuid.uuid4())
    return {
        ASSEMBLY + "AssembleContext": pb.AssembleContextRequest(
            org_id=org, agent_id=AGENT, model="gpt-4o", messages=[pb.Message(role="user", content="hi")]
        ),
        MEMORY + "UpsertMemories": pb.UpsertMemoriesRequest(
            org_id=org,
            agent_id=AGENT,
            memories=[pb.MemoryInput(content="prefers window seats", category="preference")],
        ),
        MEMORY + "DeleteMemories": pb.DeleteMemoriesRequest(org_id=org, agent_id=AGENT, ids=[memory_id]),
        MEMORY + "SetDirective": pb.SetDirectiveRequest(org_id=org, agent_id=AGENT, content="be brief"),
        MEMORY + "ClearDirective": pb.ClearDirectiveRequest(org_id=org, agent_id=AGENT),
        MEMORY + "RecordFeedback": pb.RecordFeedbackRequest(
            org_id=org,
            agent_id=AGENT,
            feedback=[pb.MemoryFeedback(memory_id=memory_id, feedback=pb.FEEDBACK_POSITIVE)],
        ),
        MEMORY + "GetMemories": pb.GetMemoriesRequest(org_id=org, agent_id=AGENT, ids=[memory_id]),
        MEMORY + "ListMemories": pb.ListMemoriesRequest(org_id=org, agent_id=AGENT),
        MEMORY + "SearchMemories": pb.SearchMemoriesRequest(org_id=org, agent_id=AGENT, query="seats"),
        MEMORY + "GetDirective": pb.GetDirectiveRequest(org_id=org, agent_id=AGENT),
        MEMORY + "ExportMemories": pb.ExportMemoriesRequest(org_id=org),
        MEMORY + "PurgeAgent": pb.PurgeAgentRequest(org_id=org, agent_id=AGENT),
        MEMORY + "PurgeOrg": pb.PurgeOrgRequest(org_id=org),
    }


async def call(ch: grpc.aio.Channel, path: str, request: Any, token: str | None) -> grpc.StatusCode:
    method = ch.unary_unary(
        path, request_serializer=lambda m: m.SerializeToString(), response_deserializer=bytes
    )
    metadata = (("authorization", f"Bearer {token}"),) if token is not None else None
    try:
        await method(request, metadata=metadata, timeout=10)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_every_method_of_the_proto_needs_exactly_one_role() -> None:
    served = {
        f"/{service.full_name}/{method.name}"
        for service in pb.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    assert set(METHOD_ROLES) == served


def test_each_method_requires_the_role_its_proto_option_names() -> None:
    by_role: dict[Role, set[str]] = {}
    for path, role in METHOD_ROLES.items():
        by_role.setdefault(role, set()).add(path.rsplit("/", 1)[1])
    assert by_role == {
        Role.ASSEMBLE: {"AssembleContext"},
        Role.WRITE: {"UpsertMemories", "DeleteMemories", "SetDirective", "ClearDirective", "RecordFeedback"},
        Role.READ: {"GetMemories", "ListMemories", "SearchMemories", "GetDirective", "ExportMemories"},
        Role.ADMIN: {"PurgeAgent", "PurgeOrg"},
    }


def test_every_role_of_the_proto_is_a_role_of_the_credentials_file() -> None:
    names = [value.name for value in pb.Role.DESCRIPTOR.values if value.number != pb.ROLE_UNSPECIFIED]
    named = {name.removeprefix("ROLE_").lower() for name in names}
    assert named == {role.value for role in Role}


def test_a_method_without_the_option_has_no_role_and_so_is_refused() -> None:
    health = health_pb2.DESCRIPTOR.services_by_name["Health"]
    assert method_roles([health]) == {}


async def test_the_matrix_every_method_every_role_own_and_other_org(tls_channel: grpc.aio.Channel) -> None:
    outcomes: dict[tuple[str, str, str], grpc.StatusCode] = {}
    for role in Role:
        for org_label, org in (("own", ORG), ("other", OTHER_ORG)):
            for path, request in requests_for(org).items():
                outcomes[(path, role.value, org_label)] = await call(
                    tls_channel, path, request, TOKENS[role.value]
                )
    expected = {
        (path, role.value, org_label): (
            grpc.StatusCode.OK
            if METHOD_ROLES[path] is role and org_label == "own"
            else grpc.StatusCode.PERMISSION_DENIED
        )
        for path in METHOD_ROLES
        for role in Role
        for org_label in ("own", "other")
    }
    wrong = {key: code for key, code in outcomes.items() if code != expected[key]}
    assert not wrong, wrong


async def test_an_unbound_principal_with_every_role_may_call_everything_for_any_org(
    tls_channel: grpc.aio.Channel,
) -> None:
    for org in (ORG, OTHER_ORG):
        for path, request in requests_for(org).items():
            assert await call(tls_channel, path, request, TOKENS["everything"]) == grpc.StatusCode.OK, path


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        ("authorization", "Bearer not-a-token-anyone-issued"),
        ("authorization", "Basic dXNlcjpwYXNz"),
        ("authorization", ""),
        ("authorization-bin", b"\x00\x01"),
    ],
    ids=["none", "unknown-token", "other-scheme", "empty", "binary"],
)
async def test_no_or_an_unknown_credential_is_unauthenticated_on_every_method(
    tls_channel: grpc.aio.Channel, metadata: tuple[str, Any] | None
) -> None:
    for path, request in requests_for(ORG).items():
        method = tls_channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString())
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await method(request, metadata=(metadata,) if metadata else None, timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, path


async def test_refused_calls_read_and_write_nothing(tls_channel: grpc.aio.Channel) -> None:
    everything = TOKENS["everything"]
    org, agent = str(uuid.uuid4()), str(uuid.uuid4())
    set_directive = pb.SetDirectiveRequest(org_id=org, agent_id=agent, content="keep me")
    assert await call(tls_channel, MEMORY + "SetDirective", set_directive, everything) == grpc.StatusCode.OK
    refused = [
        (
            MEMORY + "SetDirective",
            pb.SetDirectiveRequest(org_id=org, agent_id=agent, content="overwritten"),
            TOKENS["write"],
        ),
        (MEMORY + "ClearDirective", pb.ClearDirectiveRequest(org_id=org, agent_id=agent), None),
        (MEMORY + "PurgeOrg", pb.PurgeOrgRequest(org_id=org), TOKENS["admin"]),
        (MEMORY + "PurgeAgent", pb.PurgeAgentRequest(org_id=org, agent_id=agent), TOKENS["write"]),
    ]
    for path, request, token in refused:
        assert await call(tls_channel, path, request, token) in (
            grpc.StatusCode.PERMISSION_DENIED,
            grpc.StatusCode.UNAUTHENTICATED,
        ), path
    get = tls_channel.unary_unary(
        MEMORY + "GetDirective",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=pb.GetDirectiveResponse.FromString,
    )
    reply = await get(
        pb.GetDirectiveRequest(org_id=org, agent_id=agent),
        metadata=(("authorization", f"Bearer {everything}"),),
        timeout=10,
    )
    assert reply.exists and reply.content == "keep me"


async def test_health_and_reflection_stay_open_without_credentials(tls_channel: grpc.aio.Channel) -> None:
    from grpc_health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

    check = tls_channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=HealthCheckRequest.SerializeToString,
        response_deserializer=HealthCheckResponse.FromString,
    )
    reply = await check(HealthCheckRequest(service=""), timeout=10)
    assert reply.status == HealthCheckResponse.SERVING


async def test_the_plaintext_health_port_answers_probes_and_serves_nothing_else(
    secured: ContextService,
) -> None:
    from grpc_health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

    assert secured.health_port is not None and secured.health_port != secured.port
    async with grpc.aio.insecure_channel(f"127.0.0.1:{secured.health_port}") as ch:
        check = ch.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=HealthCheckRequest.SerializeToString,
            response_deserializer=HealthCheckResponse.FromString,
        )
        for service in ("", "liveness", "ibex.context.v1.MemoryService"):
            reply = await check(HealthCheckRequest(service=service), timeout=10)
            assert reply.status == HealthCheckResponse.SERVING, service
        get = requests_for(ORG)[MEMORY + "GetDirective"]
        assert await call(ch, MEMORY + "GetDirective", get, TOKENS["read"]) == grpc.StatusCode.UNIMPLEMENTED


async def test_a_plaintext_client_cannot_talk_to_the_tls_port(secured: ContextService) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{secured.port}") as ch:
        code = await call(
            ch, MEMORY + "GetDirective", requests_for(ORG)[MEMORY + "GetDirective"], TOKENS["read"]
        )
    assert code == grpc.StatusCode.UNAVAILABLE


async def test_a_client_that_trusts_another_ca_refuses_the_server(secured: ContextService, pki: Pki) -> None:
    impostor = Pki(Authority.create("other CA"), pki.server, pki.directory)
    async with channel(secured.port, impostor) as ch:
        code = await call(
            ch, MEMORY + "GetDirective", requests_for(ORG)[MEMORY + "GetDirective"], TOKENS["read"]
        )
    assert code == grpc.StatusCode.UNAVAILABLE


async def test_tokens_are_reloaded_when_the_file_changes(
    secured: ContextService, tls_channel: grpc.aio.Channel
) -> None:
    assert secured.settings.auth_credentials_file is not None
    request = requests_for(ORG)[MEMORY + "GetDirective"]
    rotated = dict(TOKENS, read=token_of("read-rotated"))
    # Both the old and the new token during the rotation, then the new one only.
    both = yaml.safe_load(credentials_yaml(rotated))
    for principal in both["principals"]:
        if principal["name"] == "bound-read":
            principal["token_sha256"].append(token_digest(TOKENS["read"]).hex())
    secured.settings.auth_credentials_file.write_text(yaml.safe_dump(both))
    await wait_for(lambda: secured.credentials is not None and secured.credentials.reloads >= 1)
    assert await call(tls_channel, MEMORY + "GetDirective", request, TOKENS["read"]) == grpc.StatusCode.OK
    assert await call(tls_channel, MEMORY + "GetDirective", request, rotated["read"]) == grpc.StatusCode.OK
    secured.settings.auth_credentials_file.write_text(credentials_yaml(rotated))
    await wait_for(lambda: secured.credentials is not None and secured.credentials.reloads >= 2)
    assert (
        await call(tls_channel, MEMORY + "GetDirective", request, TOKENS["read"])
        == grpc.StatusCode.UNAUTHENTICATED
    )
    assert await call(tls_channel, MEMORY + "GetDirective", request, rotated["read"]) == grpc.StatusCode.OK


async def test_a_credentials_file_that_stops_parsing_fails_closed_until_a_good_one_loads(
    secured: ContextService, tls_channel: grpc.aio.Channel, caplog: pytest.LogCaptureFixture
) -> None:
    """A revocation with a typo must not keep the revoked token valid: nothing is valid
    until the file parses again, and the operator is told (an error, a gauge at 0)."""
    assert secured.settings.auth_credentials_file is not None and secured.credentials is not None
    request = requests_for(ORG)[MEMORY + "GetDirective"]
    loaded = "ibex_context_credentials_loaded"
    assert secured.metrics_registry.get_sample_value(loaded) == 1
    assert await call(tls_channel, MEMORY + "GetDirective", request, TOKENS["read"]) == grpc.StatusCode.OK
    with caplog.at_level(logging.ERROR, logger="ibex_context.server.guard"):
        secured.settings.auth_credentials_file.write_text("principals: [broken")
        await wait_for(lambda: secured.credentials is not None and not secured.credentials.loaded)
    for token in (TOKENS["read"], TOKENS["everything"]):
        assert (
            await call(tls_channel, MEMORY + "GetDirective", request, token)
            == grpc.StatusCode.UNAUTHENTICATED
        )
    assert secured.metrics_registry.get_sample_value(loaded) == 0
    assert any("every credential is refused" in r.getMessage() for r in caplog.records)
    assert all(TOKENS["read"] not in r.getMessage() for r in caplog.records)
    secured.settings.auth_credentials_file.write_text(credentials_yaml(TOKENS))
    await wait_for(lambda: secured.credentials is not None and secured.credentials.loaded)
    assert await call(tls_channel, MEMORY + "GetDirective", request, TOKENS["read"]) == grpc.StatusCode.OK
    assert secured.metrics_registry.get_sample_value(loaded) == 1


async def test_an_unauthenticated_body_is_refused_before_it_is_parsed(tls_channel: grpc.aio.Channel) -> None:
    """Without a credential, a body that is not protobuf at all is UNAUTHENTICATED (not
    INVALID_ARGUMENT: it was never parsed); with a valid one, the same body is parsed and
    refused as invalid."""
    garbage = b"\xff" * 1_000_000
    for path in (ASSEMBLY + "AssembleContext", MEMORY + "UpsertMemories"):
        method = tls_channel.unary_unary(path, request_serializer=bytes, response_deserializer=bytes)
        for metadata in (None, (("authorization", f"Bearer {token_of('nobody')}"),)):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await method(garbage, metadata=metadata, timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as parsed:
            await method(garbage, metadata=(("authorization", f"Bearer {TOKENS['everything']}"),), timeout=10)
        assert parsed.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_token_shorter_than_the_minimum_is_refused_even_when_the_file_names_it(
    secured: ContextService, tls_channel: grpc.aio.Channel, caplog: pytest.LogCaptureFixture
) -> None:
    assert secured.settings.auth_credentials_file is not None
    weak = "password1234"
    document = yaml.safe_load(credentials_yaml(TOKENS))
    document["principals"].append(
        {"name": "weakling", "roles": ["read"], "token_sha256": [token_digest(weak).hex()]}
    )
    secured.settings.auth_credentials_file.write_text(yaml.safe_dump(document))
    await wait_for(lambda: secured.credentials is not None and secured.credentials.reloads >= 1)
    request = requests_for(ORG)[MEMORY + "GetDirective"]
    with caplog.at_level(logging.WARNING, logger="ibex_context.server.guard"):
        assert (
            await call(tls_channel, MEMORY + "GetDirective", request, weak) == grpc.StatusCode.UNAUTHENTICATED
        )
    messages = [r.getMessage() for r in caplog.records]
    assert any("weakling" in m and "shorter than 32" in m for m in messages)
    assert all(weak not in m for m in messages)
    refused = secured.metrics_registry.get_sample_value(
        "ibex_context_auth_refusals_total", {"method": "GetDirective", "reason": "weak_token"}
    )
    assert refused == 1


async def wait_for(condition: Callable[[], bool], *, settle: float = 0.0, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    ends = loop.time() + timeout
    while not condition():
        assert loop.time() < ends, "condition not reached"
        await asyncio.sleep(0.02)
    if settle:
        await asyncio.sleep(settle)


# --- mutual TLS ---------------------------------------------------------------------------


@pytest.fixture
async def mutual(start_service: StartService, pki: Pki, tmp_path: Path) -> ContextService:
    cert, key = pki.server.write(tmp_path, "server")
    credentials = tmp_path / "credentials.yaml"
    credentials.write_text(
        credentials_yaml(
            TOKENS,
            identities={
                "reader-by-dns": ["reader.clients.test"],
                "reader-by-uri": ["spiffe://test/reader"],
                "reader-by-cn": ["cn-only-reader"],
            },
        )
    )
    return await start_service(
        auth_enabled=True,
        auth_credentials_file=credentials,
        tls_cert_file=cert,
        tls_key_file=key,
        tls_client_ca_file=pki.ca_file,
    )


@pytest.mark.parametrize(
    "issue",
    [
        lambda ca: ca.issue("ignored-cn", dns=("reader.clients.test",)),
        lambda ca: ca.issue("ignored-cn", uris=("spiffe://test/reader",)),
        lambda ca: ca.issue("cn-only-reader"),
    ],
    ids=["dns-san", "uri-san", "common-name"],
)
async def test_a_client_certificate_identity_is_a_principal(
    mutual: ContextService, pki: Pki, issue: Callable[[Authority], Issued]
) -> None:
    async with channel(mutual.port, pki, issue(pki.ca)) as ch:
        own = requests_for(ORG)
        assert (
            await call(ch, MEMORY + "GetDirective", own[MEMORY + "GetDirective"], None) == grpc.StatusCode.OK
        )
        # Its roles and org, nothing more.
        assert (
            await call(ch, MEMORY + "SetDirective", own[MEMORY + "SetDirective"], None)
            == grpc.StatusCode.PERMISSION_DENIED
        )
        other = requests_for(OTHER_ORG)[MEMORY + "GetDirective"]
        assert await call(ch, MEMORY + "GetDirective", other, None) == grpc.StatusCode.PERMISSION_DENIED
        # A token sent on the same connection decides alone.
        assert (
            await call(ch, MEMORY + "PurgeOrg", own[MEMORY + "PurgeOrg"], TOKENS["admin"])
            == grpc.StatusCode.OK
        )
        assert (
            await call(ch, MEMORY + "GetDirective", own[MEMORY + "GetDirective"], "wrong")
            == grpc.StatusCode.UNAUTHENTICATED
        )


async def test_a_verified_certificate_nobody_named_is_unauthenticated(
    mutual: ContextService, pki: Pki
) -> None:
    async with channel(mutual.port, pki, pki.ca.issue("stranger", dns=("stranger.test",))) as ch:
        request = requests_for(ORG)[MEMORY + "GetDirective"]
        assert await call(ch, MEMORY + "GetDirective", request, None) == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize(
    "client",
    [
        None,
        lambda ca: ca.issue("reader", dns=("reader.clients.test",), expired=True),
        lambda ca: Authority.create("another CA").issue("reader", dns=("reader.clients.test",)),
    ],
    ids=["no-certificate", "expired", "another-ca"],
)
async def test_mutual_tls_refuses_the_handshake_without_a_valid_client_certificate(
    mutual: ContextService, pki: Pki, client: Callable[[Authority], Issued] | None
) -> None:
    async with channel(mutual.port, pki, client(pki.ca) if client else None) as ch:
        request = requests_for(ORG)[MEMORY + "GetDirective"]
        assert (
            await call(ch, MEMORY + "GetDirective", request, TOKENS["everything"])
            == grpc.StatusCode.UNAVAILABLE
        )


# --- no secret in logs, metrics or spans ------------------------------------------------------


async def test_refusals_are_counted_without_ids_and_no_token_reaches_logs_or_metrics(
    secured: ContextService, tls_channel: grpc.aio.Channel, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    sent = [TOKENS["read"], TOKENS["admin"], "never-issued-secret-token-0123456789"]
    own = requests_for(ORG)
    await call(tls_channel, MEMORY + "PurgeOrg", own[MEMORY + "PurgeOrg"], sent[0])  # role
    await call(tls_channel, MEMORY + "PurgeOrg", requests_for(OTHER_ORG)[MEMORY + "PurgeOrg"], sent[1])  # org
    await call(tls_channel, MEMORY + "GetMemories", own[MEMORY + "GetMemories"], sent[2])  # unknown
    await call(tls_channel, MEMORY + "GetDirective", own[MEMORY + "GetDirective"], sent[0])  # allowed
    async with httpx.AsyncClient() as http:
        metrics = (await http.get(f"http://127.0.0.1:{secured.metrics_port}/metrics")).text
    assert 'ibex_context_auth_refusals_total{method="PurgeOrg",reason="role"} 1.0' in metrics
    assert 'ibex_context_auth_refusals_total{method="PurgeOrg",reason="org"} 1.0' in metrics
    assert 'ibex_context_auth_refusals_total{method="GetMemories",reason="unauthenticated"} 1.0' in metrics
    # Every record as the service writes it (JSON: message and every extra field).
    await asyncio.sleep(0.05)  # the access log is written after the status is sent
    formatter = JsonFormatter()
    logs = "\n".join(formatter.format(record) for record in caplog.records)
    assert "refused PurgeOrg for principal bound-read: role" in logs
    secrets = [*sent, *(token_digest(t).hex() for t in sent)]
    for text, where in ((logs, "logs"), (metrics, "metrics")):
        for secret in secrets:
            assert secret not in text, where
        for tenant in (ORG, OTHER_ORG):
            assert tenant not in text, where


# --- the Python clients and the CLI --------------------------------------------------------


async def test_the_clients_present_tls_and_a_token(secured: ContextService, pki: Pki) -> None:
    from ibex_context.models import ChatMessage
    from ibex_context_client import ContextClient, MemoryClient
    from ibex_context_client.credentials import ClientCredentials
    from ibex_context_client.memory import MemoryClientError

    target = f"127.0.0.1:{secured.port}"
    agent = str(uuid.uuid4())  # this test's own agent: the others purge and clear ORG's
    tls = ClientCredentials(ca_file=pki.ca_file)
    async with MemoryClient(target, credentials=tls, token=TOKENS["write"]) as writer:
        assert await writer.set_directive(ORG, agent, "be brief") >= 1
        with pytest.raises(MemoryClientError) as refused:
            await writer.get_directive(ORG, agent)
        assert "PERMISSION_DENIED" in str(refused.value)
    messages = [ChatMessage("user", "hello")]
    async with ContextClient(target, credentials=tls, token=TOKENS["assemble"], timeout=5.0) as proxy:
        result = await proxy.assemble(org_id=ORG, agent_id=agent, model="gpt-4o", messages=messages)
        assert result.from_service and "be brief" in result.messages[0].content
    # Refused: the proxy contract holds, the caller's messages go on unassembled.
    async with ContextClient(target, credentials=tls, timeout=5.0) as anonymous:
        result = await anonymous.assemble(org_id=ORG, agent_id=agent, model="gpt-4o", messages=messages)
        assert not result.from_service and result.fallback_reason == "client_error:UNAUTHENTICATED"


async def test_the_cli_takes_tls_and_a_token_from_flags_and_env(
    secured: ContextService, pki: Pki, tmp_path: Path
) -> None:
    from click.testing import CliRunner
    from ibex_context.cli import main

    token_file = tmp_path / "token"
    token_file.write_text(TOKENS["read"] + "\n")
    target = ["--target", f"127.0.0.1:{secured.port}", "--org", ORG, "--agent", AGENT]
    runner = CliRunner()
    # In a thread: the CLI runs its own event loop while the server's keeps serving.
    flags = await asyncio.to_thread(
        runner.invoke,
        main,
        ["--tls-ca", str(pki.ca_file), "--token-file", str(token_file), "directive", "get", *target],
    )
    assert flags.exit_code == 0, flags.output
    env = await asyncio.to_thread(
        runner.invoke,
        main,
        ["directive", "get", *target],
        env={"IBEX_TLS_CA": str(pki.ca_file), "IBEX_TOKEN": TOKENS["read"]},
    )
    assert env.exit_code == 0, env.output
    anonymous = await asyncio.to_thread(
        runner.invoke, main, ["directive", "get", *target], env={"IBEX_TLS_CA": str(pki.ca_file)}
    )
    assert anonymous.exit_code != 0 and "UNAUTHENTICATED" in anonymous.output


async def test_the_clients_and_the_cli_present_a_client_certificate(
    mutual: ContextService, pki: Pki, tmp_path: Path
) -> None:
    from click.testing import CliRunner
    from ibex_context.cli import main
    from ibex_context.models import ChatMessage
    from ibex_context_client import ContextClient, MemoryClient
    from ibex_context_client.credentials import ClientCredentials
    from ibex_context_client.memory import MemoryClientError

    cert, key = pki.ca.issue("ignored-cn", dns=("reader.clients.test",)).write(tmp_path, "reader")
    target = f"127.0.0.1:{mutual.port}"
    reader = ClientCredentials(ca_file=pki.ca_file, cert_file=cert, key_file=key)
    async with MemoryClient(target, credentials=reader) as client:
        await client.get_directive(ORG, AGENT)  # a reader: answered, not refused
        with pytest.raises(MemoryClientError) as refused:
            await client.set_directive(ORG, AGENT, "not mine to set")
        assert refused.value.status is grpc.StatusCode.PERMISSION_DENIED
    messages = [ChatMessage("user", "hello")]
    async with ContextClient(target, credentials=reader, timeout=5.0) as proxy:
        result = await proxy.assemble(org_id=ORG, agent_id=AGENT, model="gpt-4o", messages=messages)
    assert not result.from_service and result.fallback_reason == "client_error:PERMISSION_DENIED"
    # Without the certificate the handshake itself fails: the proxy contract still holds.
    async with ContextClient(target, credentials=ClientCredentials(ca_file=pki.ca_file), timeout=5.0) as none:
        result = await none.assemble(org_id=ORG, agent_id=AGENT, model="gpt-4o", messages=messages)
    assert not result.from_service and result.fallback_reason == "client_unavailable"

    flags = ["--tls-ca", str(pki.ca_file), "--tls-cert", str(cert), "--tls-key", str(key)]
    ids = ["--target", target, "--org", ORG, "--agent", AGENT]
    runner = CliRunner()
    by_flags = await asyncio.to_thread(runner.invoke, main, [*flags, "directive", "get", *ids])
    assert by_flags.exit_code == 0, by_flags.output
    env = {"IBEX_TLS_CA": str(pki.ca_file), "IBEX_TLS_CERT": str(cert), "IBEX_TLS_KEY": str(key)}
    by_env = await asyncio.to_thread(runner.invoke, main, ["directive", "get", *ids], env=env)
    assert by_env.exit_code == 0, by_env.output


async def test_no_token_or_tenant_id_reaches_a_span(
    redis_url: str, postgres_dsn: str, pki: Pki, tmp_path: Path, encodings: EncodingRegistry
) -> None:
    from ibex_context.observability.tracing import Tracing
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from prometheus_client import CollectorRegistry

    from tests.server.conftest import generous_profiles_file, make_settings

    cert, key = pki.server.write(tmp_path, "server")
    credentials = tmp_path / "credentials.yaml"
    credentials.write_text(credentials_yaml(TOKENS))
    exporter = InMemorySpanExporter()
    service = ContextService(
        make_settings(
            redis_url,
            postgres_dsn,
            profiles_path=generous_profiles_file(tmp_path),
            auth_enabled=True,
            auth_credentials_file=credentials,
            tls_cert_file=cert,
            tls_key_file=key,
        ),
        encodings=encodings,
        metrics_registry=CollectorRegistry(),
        tracing=Tracing(exporter, sample_ratio=1.0, batch=False),
    )
    await service.start()
    try:
        async with channel(service.port, pki) as ch:
            for token in (TOKENS["assemble"], TOKENS["read"], None, "never-issued-secret-token-0123456789"):
                for path, request in requests_for(ORG).items():
                    if path.endswith(("AssembleContext", "GetDirective", "PurgeOrg")):
                        await call(ch, path, request, token)
        await asyncio.sleep(0.1)
    finally:
        await service.stop(grace=1.0)
    spans = exporter.get_finished_spans()
    assert spans
    text = "\n".join(span.to_json() for span in spans)
    codes = {span.attributes.get("rpc.grpc.status_code") for span in spans if span.attributes}
    # The refusals were traced (UNAUTHENTICATED 16, PERMISSION_DENIED 7) next to the calls allowed.
    assert {0, 7, 16} <= codes, codes
    for secret in (*TOKENS.values(), "never-issued-secret-token-0123456789"):
        assert secret not in text
        assert token_digest(secret).hex() not in text
    assert ORG not in text
