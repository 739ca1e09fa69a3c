"""DnsRoundRobin: calls spread over every address of a name, re-resolved, bad addresses set aside."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import pytest
from ibex_context.client import ContextClient, DnsRoundRobin
from ibex_context.devtools import scripted_service as scripted
from ibex_context.devtools.scripted_service import RunningServer, scripted_server
from ibex_context.models import ChatMessage

MESSAGES = (ChatMessage("user", "What do I drink?"),)


async def assemble(client: ContextClient) -> bool:
    result = await client.assemble(org_id="o", agent_id="a", model=scripted.FULL, messages=MESSAGES)
    return result.from_service


class FakeDns:
    """A resolver whose answer the test changes; the addresses are real loopback sockets."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = list(addresses)
        self.fail = False
        self.lookups = 0

    async def __call__(self, host: str, port: int) -> list[str]:
        self.lookups += 1
        if self.fail:
            raise socket.gaierror("temporary failure in name resolution")
        return list(self.addresses)


@pytest.fixture
async def two_servers() -> AsyncIterator[tuple[RunningServer, RunningServer]]:
    async with (
        scripted_server(host="127.0.0.1") as first,
        scripted_server(host="127.0.0.2", port=first.port) as second,
    ):
        yield first, second


def rr_client(port: int, dns: FakeDns) -> ContextClient:
    endpoints = DnsRoundRobin("ibex-context-headless", port, resolver=dns, refresh_seconds=3600)
    return ContextClient(f"dns:///ibex-context-headless:{port}", endpoints=endpoints, timeout=5)


async def test_calls_are_spread_round_robin_over_every_address(
    two_servers: tuple[RunningServer, RunningServer],
) -> None:
    first, second = two_servers
    async with rr_client(first.port, FakeDns("127.0.0.1", "127.0.0.2")) as client:
        results = [await assemble(client) for _ in range(6)]
    assert all(results)
    assert (first.service.calls, second.service.calls) == (3, 3)


async def test_an_address_that_refuses_is_skipped_and_the_call_retried_elsewhere(
    server: RunningServer,
) -> None:
    dns = FakeDns("127.0.0.3", "127.0.0.1")  # nothing listens on 127.0.0.3
    endpoints = DnsRoundRobin("name", server.port, resolver=dns, refresh_seconds=3600)
    async with ContextClient("dns:///name", endpoints=endpoints, timeout=5) as client:
        results = [await assemble(client) for _ in range(4)]
        down = [e.address for e in endpoints._endpoints if e.down]
        await endpoints.refresh()  # a new resolution gives it another chance
        back = [e.address for e in endpoints._endpoints if e.down]

    assert all(results)
    assert server.service.calls == 4
    assert down == ["127.0.0.3"]
    assert back == []


async def test_re_resolution_adds_new_pods_and_retires_gone_ones(
    two_servers: tuple[RunningServer, RunningServer],
) -> None:
    first, second = two_servers
    dns = FakeDns("127.0.0.1")
    endpoints = DnsRoundRobin("name", first.port, resolver=dns, refresh_seconds=3600)
    async with ContextClient("dns:///name", endpoints=endpoints, timeout=5) as client:
        for _ in range(2):
            await assemble(client)
        dns.addresses = ["127.0.0.2"]
        await endpoints.refresh()
        for _ in range(2):
            await assemble(client)
        assert endpoints.addresses == ["127.0.0.2"]

    assert (first.service.calls, second.service.calls) == (2, 2)


async def test_a_failed_resolution_keeps_the_last_good_addresses(server: RunningServer) -> None:
    dns = FakeDns("127.0.0.1")
    endpoints = DnsRoundRobin("name", server.port, resolver=dns, refresh_seconds=3600)
    async with ContextClient("dns:///name", endpoints=endpoints, timeout=5) as client:
        dns.fail = True
        await endpoints.refresh()
        served = await assemble(client)
        kept = endpoints.addresses
    assert dns.lookups == 2
    assert kept == ["127.0.0.1"]
    assert served


async def test_when_every_address_is_set_aside_they_are_still_tried(server: RunningServer) -> None:
    endpoints = DnsRoundRobin("name", server.port, resolver=FakeDns("127.0.0.1"), refresh_seconds=3600)
    async with ContextClient("dns:///name", endpoints=endpoints, timeout=5) as client:
        for endpoint in endpoints._endpoints:
            endpoint.down = True
        served = await assemble(client)
    assert served


async def test_a_dns_target_resolves_a_real_name(server: RunningServer) -> None:
    async with ContextClient(f"dns:///localhost:{server.port}", timeout=5) as client:
        served = await assemble(client)
    assert served
