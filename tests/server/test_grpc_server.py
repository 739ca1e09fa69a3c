"""The server's connection policy, on real sockets with grpcio's own clients: connections aged
and replaced without failing a call, a cap on the calls in flight per connection, and the
settings that feed the core's channel arguments (keepalive enforcement included)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, cast

import grpc
import pytest
from ibex_context.devtools import scripted_service as scripted
from ibex_context.devtools.scripted_service import ScriptedAssembly, scripted_server
from ibex_context.server.grpc_server import ConnectionPolicy
from ibex_context.server.rpc import Context
from ibex_context.settings import Settings
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb
from ibex_context_client.proto.ibex.context.v1 import context_pb2_grpc

REQUEST = pb.AssembleContextRequest(
    org_id="o", agent_id="a", model=scripted.FULL, messages=[pb.Message(role="user", content="hi")]
)


def policy(**changes: Any) -> ConnectionPolicy:
    """The settings' defaults, with ``changes``."""
    return dataclasses.replace(ConnectionPolicy.from_settings(Settings()), **changes)


@dataclass
class WatchedAssembly(ScriptedAssembly):
    """Notes how many calls run at once, and from which client connections (peer addresses)."""

    in_flight: int = 0
    most_in_flight: int = 0
    peers: set[str] = field(default_factory=set)

    async def assemble(self, request: pb.AssembleContextRequest, context: Context) -> bytes:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.peers.add(cast("grpc.aio.ServicerContext[Any, Any]", context).peer())
        try:
            return await super().assemble(request, context)
        finally:
            self.in_flight -= 1


def test_the_settings_become_the_cores_channel_arguments() -> None:
    options = dict(policy(max_age_seconds=60, max_age_grace_seconds=30).options())

    assert options["grpc.max_connection_age_ms"] == 60_000
    assert options["grpc.max_connection_age_grace_ms"] == 30_000
    assert options["grpc.max_concurrent_streams"] == 100
    assert options["grpc.http2.min_ping_interval_without_data_ms"] == 10_000
    assert options["grpc.http2.max_ping_strikes"] == 2
    assert options["grpc.keepalive_permit_without_calls"] == 1
    assert options["grpc.http.overload_protection"] == 0


@pytest.mark.parametrize(("cap", "most"), [(2, 2), (None, 6)], ids=["capped at 2", "no cap"])
async def test_calls_past_max_concurrent_streams_wait_on_the_client_and_all_succeed(
    cap: int | None, most: int
) -> None:
    service = WatchedAssembly(delay=0.3)
    connections = policy(max_concurrent_streams=cap) if cap is not None else None
    async with (
        scripted_server(service=service, connections=connections) as running,
        grpc.aio.insecure_channel(running.target) as channel,  # one connection
    ):
        stub = context_pb2_grpc.ContextAssemblyServiceStub(channel)
        # One call first: the client learns the connection's limit from the server's HTTP/2
        # SETTINGS (a stream past it sent before then is refused, as HTTP/2 says).
        await stub.AssembleContext(REQUEST, timeout=30)
        service.most_in_flight = 0
        replies = await asyncio.gather(*(stub.AssembleContext(REQUEST, timeout=30) for _ in range(6)))

    assert all(reply.messages for reply in replies)
    assert service.calls == 7
    assert service.most_in_flight == most
    assert len(service.peers) == 1


async def test_an_aged_connection_is_replaced_and_no_call_fails() -> None:
    service = WatchedAssembly(delay=0.05)
    # Aged every 0.5 s; a call running then finishes on it (the grace).
    connections = policy(max_age_seconds=0.5, max_age_grace_seconds=5)
    failures: list[grpc.StatusCode] = []
    async with (
        scripted_server(service=service, connections=connections) as running,
        grpc.aio.insecure_channel(running.target) as channel,
    ):
        stub = context_pb2_grpc.ContextAssemblyServiceStub(channel)
        give_up = time.monotonic() + 20
        while len(service.peers) < 3 and time.monotonic() < give_up:
            try:
                await stub.AssembleContext(REQUEST, timeout=10)
            except grpc.aio.AioRpcError as exc:
                failures.append(exc.code())

    assert len(service.peers) >= 3, "the connection was never replaced"
    assert failures == []


@pytest.mark.parametrize(
    ("min_interval_seconds", "replaced"),
    [(5.0, True), (0.5, False)],
    ids=["pinging more often than allowed: too_many_pings", "within the minimum"],
)
async def test_keepalive_pings_more_often_than_the_minimum_close_the_connection(
    min_interval_seconds: float, replaced: bool
) -> None:
    service = WatchedAssembly()
    connections = policy(min_ping_interval_seconds=min_interval_seconds, max_ping_strikes=2)
    # Pings every second (grpcio's own floor) on an idle connection; its throttle of pings
    # without data, off.
    keepalive = [
        ("grpc.keepalive_time_ms", 1000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    async with (
        scripted_server(service=service, connections=connections) as running,
        grpc.aio.insecure_channel(running.target, options=keepalive) as channel,
    ):
        stub = context_pb2_grpc.ContextAssemblyServiceStub(channel)
        await stub.AssembleContext(REQUEST, timeout=30)
        # Three strikes (more than max_ping_strikes) take four pings: about four seconds.
        await asyncio.sleep(5)
        await stub.AssembleContext(REQUEST, timeout=30)

    # A connection closed with GOAWAY too_many_pings is replaced by a new one (a new peer).
    assert (len(service.peers) == 2) is replaced, service.peers
