"""Round robin over every address of a name, with grpcio's own resolver and policy: a real
DNS server on a real UDP socket names real loopback servers (127.0.0.1, 127.0.0.2)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ibex_context.devtools import scripted_service as scripted
from ibex_context.devtools.certs import Authority
from ibex_context.devtools.scripted_service import RunningServer, ScriptedAssembly, scripted_server
from ibex_context.models import ChatMessage
from ibex_context.server.grpc_server import ServiceServer
from ibex_context.server.tls import ServerTls, TlsFiles
from ibex_context_client import ClientCredentials, ContextClient

from tests.client.dns_server import DnsServer, dns_server

MESSAGES = (ChatMessage("user", "What do I drink?"),)
NAME = "ibex-context-headless.test"


async def assemble(client: ContextClient) -> bool:
    result = await client.assemble(org_id="o", agent_id="a", model=scripted.FULL, messages=MESSAGES)
    return result.from_service


async def until(condition: object, client: ContextClient, seconds: float = 10.0) -> None:
    """Calls until ``condition()`` holds (bounded)."""
    give_up = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < give_up, "condition not reached"
        await assemble(client)
        await asyncio.sleep(0.02)


@pytest.fixture
async def dns() -> AsyncIterator[tuple[DnsServer, str]]:
    async with dns_server() as running:
        yield running


@pytest.fixture
async def two_servers() -> AsyncIterator[tuple[RunningServer, RunningServer]]:
    async with (
        scripted_server(host="127.0.0.1") as first,
        scripted_server(host="127.0.0.2", port=first.port) as second,
    ):
        yield first, second


async def test_calls_are_spread_round_robin_over_every_address(
    two_servers: tuple[RunningServer, RunningServer], dns: tuple[DnsServer, str]
) -> None:
    first, second = two_servers
    server, where = dns
    server.addresses[NAME] = ["127.0.0.1", "127.0.0.2"]
    async with ContextClient(f"dns://{where}/{NAME}:{first.port}", timeout=5) as client:
        assert await client.warm_up(5.0)
        # Both connections up (the channel is ready with the first), then count.
        await until(lambda: first.service.calls and second.service.calls, client)
        first.service.calls = second.service.calls = 0
        results = [await assemble(client) for _ in range(6)]
    assert all(results)
    assert (first.service.calls, second.service.calls) == (3, 3)


async def test_an_address_that_refuses_is_skipped(server: RunningServer, dns: tuple[DnsServer, str]) -> None:
    resolver, where = dns
    resolver.addresses[NAME] = ["127.0.0.3", "127.0.0.1"]  # nothing listens on 127.0.0.3
    async with ContextClient(f"dns://{where}/{NAME}:{server.port}", timeout=5) as client:
        results = [await assemble(client) for _ in range(4)]
    assert all(results)
    assert server.service.calls == 4


async def test_re_resolution_adds_new_pods_and_retires_gone_ones(
    two_servers: tuple[RunningServer, RunningServer], dns: tuple[DnsServer, str]
) -> None:
    first, second = two_servers
    resolver, where = dns
    resolver.addresses[NAME] = ["127.0.0.1"]
    target = f"dns://{where}/{NAME}:{first.port}"
    async with ContextClient(target, timeout=5, refresh_seconds=0.2) as client:
        for _ in range(2):
            assert await assemble(client)
        assert (first.service.calls, second.service.calls) == (2, 0)
        resolver.addresses[NAME] = ["127.0.0.2"]
        await until(lambda: second.service.calls, client)  # re-resolved on its own
        served_by_first = first.service.calls
        results = [await assemble(client) for _ in range(4)]
    assert all(results)
    assert first.service.calls == served_by_first, "the address that left gets no new calls"
    assert second.service.calls >= 4
    assert resolver.queries >= 2


async def test_a_failed_resolution_keeps_the_last_good_channel(
    server: RunningServer, dns: tuple[DnsServer, str]
) -> None:
    resolver, where = dns
    resolver.addresses[NAME] = ["127.0.0.1"]
    async with ContextClient(f"dns://{where}/{NAME}:{server.port}", timeout=5) as client:
        assert await assemble(client)
        resolver.failing = True
        queries = resolver.queries
        kept = not await client._channel.refresh()
        served = await assemble(client)
    assert resolver.queries > queries
    assert kept
    assert served


async def test_tls_over_round_robin_verifies_the_services_name_not_each_address(
    dns: tuple[DnsServer, str], tmp_path: Path
) -> None:
    # The certificate names the Service; the pods' addresses are not in it.
    authority = Authority.create("ibex-test-ca")
    cert, key = authority.issue(NAME, dns=(NAME,), server=True).write(tmp_path, "server")
    ca = tmp_path / "ca.crt"
    ca.write_bytes(authority.cert_pem)
    service = ScriptedAssembly()
    tls = ServerTls(TlsFiles(cert, key))
    secured = ServiceServer(service.methods(), max_request_bytes=1 << 20, credentials=tls.credentials())
    port = await secured.start("127.0.0.2", 0)
    resolver, where = dns
    resolver.addresses[NAME] = ["127.0.0.2"]
    try:
        credentials = ClientCredentials(ca_file=ca)
        async with ContextClient(
            f"dns://{where}/{NAME}:{port}", credentials=credentials, timeout=5
        ) as client:
            verified = await assemble(client)
        other = Authority.create("another-ca")
        (tmp_path / "other.crt").write_bytes(other.cert_pem)
        untrusted = ClientCredentials(ca_file=tmp_path / "other.crt")
        async with ContextClient(f"dns://{where}/{NAME}:{port}", credentials=untrusted, timeout=5) as client:
            refused = await client.assemble(org_id="o", agent_id="a", model=scripted.FULL, messages=MESSAGES)
    finally:
        await secured.stop(0)
    assert verified
    assert not refused.from_service and refused.fallback_reason == "client_unavailable"
    assert service.calls == 1


async def test_a_dns_target_resolves_a_real_name(server: RunningServer) -> None:
    async with ContextClient(f"dns:///localhost:{server.port}", timeout=5) as client:
        served = await assemble(client)
    assert served


def test_a_bearer_token_is_never_sent_in_plaintext_to_another_host(tmp_path: Path) -> None:
    """As the Go client: a token over plaintext is anyone's on the path. Refused at
    construction, naming the host and never the token; loopback (development) and TLS pass."""
    from ibex_context_client import MemoryClient

    token = "s3cret-token-" + "x" * 32
    for target in ("ibex-context.prod.svc:50051", "dns:///ibex-context-headless:50051", "10.0.0.7:50051"):
        for make in (ContextClient, MemoryClient):
            with pytest.raises(ValueError, match="plaintext") as refused:
                make(target, token=token)
            assert token not in str(refused.value)
        with pytest.raises(ValueError, match="plaintext"):
            ContextClient(target, credentials=ClientCredentials(token=token))
    for loopback in ("127.0.0.1:50051", "localhost:50051", "[::1]:50051", "127.0.0.2:50051"):
        ContextClient(loopback, token=token)
    ca = tmp_path / "ca.crt"
    ca.write_bytes(Authority.create("client test CA").cert_pem)
    ContextClient("ibex-context.prod.svc:50051", credentials=ClientCredentials(ca_file=ca, token=token))
    ContextClient("ibex-context.prod.svc:50051", credentials=ClientCredentials(tls=True), token=token)
    ContextClient("ibex-context.prod.svc:50051")  # no token: plaintext is the caller's choice
