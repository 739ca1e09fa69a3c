"""Pods the HPA adds get calls from both clients, with their default settings: three servers
behind one DNS name (a real DNS server on UDP, real gRPC servers on 127.0.0.1-3, the service's
own connection policy), the Python ContextClient and the Go client (``clients/go``, built and
run as a process) calling them; a fourth address is added to the name and must receive calls
from both within 30 s, the clients' re-resolution period. And a client that re-resolves only
when a connection closes (grpcio's own channel) reaches it because the servers age connections."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from ibex_context.devtools import scripted_service as scripted
from ibex_context.devtools.scripted_service import RunningServer, ScriptedAssembly, scripted_server
from ibex_context.models import ChatMessage
from ibex_context.server.grpc_server import ConnectionPolicy
from ibex_context.server.rpc import Context
from ibex_context.settings import Settings
from ibex_context_client import ContextClient
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb
from ibex_context_client.proto.ibex.context.v1 import context_pb2_grpc

from tests.client.dns_server import DnsServer, dns_server

REPO = Path(__file__).resolve().parents[2]
GO = Path("/usr/local/go/bin/go")
NAME = "ibex-context-headless.test"
MESSAGES = (ChatMessage("user", "What do I drink?"),)
# What the issue asks: an added pod gets calls within 30 s (both clients re-resolve every 30 s).
ADDED_POD_DEADLINE = 30.0


@dataclass
class Pod(ScriptedAssembly):
    """Notes which client (by its user agent) called over which connection (peer address)."""

    connections: dict[str, set[str]] = field(default_factory=lambda: {"go": set(), "python": set()})

    async def assemble(self, request: pb.AssembleContextRequest, context: Context) -> bytes:
        agent = dict(context.invocation_metadata() or ()).get("user-agent", "")
        client = (
            "go" if str(agent).startswith("grpc-go/") else "python" if "grpc-python" in str(agent) else "?"
        )
        self.connections.setdefault(client, set()).add(
            cast("grpc.aio.ServicerContext[Any, Any]", context).peer()
        )
        return await super().assemble(request, context)


def callers(server: RunningServer) -> set[str]:
    """Which clients called this server: "go" (grpc-go) and/or "python" (grpcio)."""
    return {client for client, peers in pod(server).connections.items() if peers}


def pod(server: RunningServer) -> Pod:
    return cast("Pod", server.service)


@pytest.fixture(scope="module")
def callloop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Go client's call loop (clients/go/internal/callloop), built in module mode."""
    if not GO.exists():
        pytest.fail(f"{GO} not found: the Go toolchain (scripts/bootstrap.sh ensure_go)")
    binary = tmp_path_factory.mktemp("go") / "callloop"
    env = dict(os.environ, GOFLAGS="-mod=readonly", PATH=f"{GO.parent}{os.pathsep}{os.environ['PATH']}")
    subprocess.run(
        [str(GO), "build", "-o", str(binary), "./internal/callloop"],
        cwd=REPO / "clients" / "go",
        env=env,
        check=True,
        timeout=600,
    )
    return binary


@pytest.fixture
def go_calls(callloop: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """Started call loops; stopped (stdin closed) at the end."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.stdin is not None and not process.stdin.closed:
            process.stdin.close()
    for process in started:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture
async def four_servers() -> AsyncIterator[list[RunningServer]]:
    """Servers on 127.0.0.1-4, one port, with the service's default connection policy."""
    policy = ConnectionPolicy.from_settings(Settings())
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(
            scripted_server(host="127.0.0.1", connections=policy, service=Pod())
        )
        servers = [first]
        for host in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
            servers.append(
                await stack.enter_async_context(
                    scripted_server(host=host, port=first.port, connections=policy, service=Pod())
                )
            )
        yield servers


async def test_a_pod_added_behind_the_name_gets_calls_from_both_clients_within_30_s(
    four_servers: list[RunningServer], callloop: Path, go_calls: list[subprocess.Popen[str]]
) -> None:
    async with dns_server() as (dns, where):
        target = f"dns://{where}/{NAME}:{four_servers[0].port}"
        dns.addresses[NAME] = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
        started = time.monotonic()
        go = subprocess.Popen(
            [str(callloop), "-target", target], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        go_calls.append(go)
        async with ContextClient(target, timeout=5) as python:
            took = await _add_a_pod(python, dns, four_servers, started)
        # stdin closed: the loop ends. In a thread: the servers (on this event loop) answer its last call.
        go_output, _ = await asyncio.to_thread(go.communicate, None, 10)

    print(f"the added pod had calls from both clients {took:.1f} s after it was added")
    assert took < ADDED_POD_DEADLINE
    assert "fell back" not in go_output, go_output
    assert go.returncode == 0
    # The clients' own pings (grpc-go's BDP pings; neither sends keepalives) never cost them a
    # connection: a GOAWAY too_many_pings would have made them reconnect (the pods age
    # connections after 60 s, longer than this test).
    print({server.host: pod(server).connections for server in four_servers})
    for server in four_servers:
        assert len(pod(server).connections["go"]) == 1, server.host


async def _add_a_pod(
    python: ContextClient, dns: DnsServer, servers: list[RunningServer], started: float
) -> float:
    """Python calls throughout (none may fall back); how long the added pod took to get calls from both."""

    async def call_until(condition: Callable[[], bool], seconds: float) -> float:
        began = time.monotonic()
        while not condition():
            assert time.monotonic() - began < seconds, [callers(server) for server in servers]
            result = await python.assemble(org_id="o", agent_id="a", model=scripted.FULL, messages=MESSAGES)
            assert result.from_service, result.fallback_reason
            await asyncio.sleep(0.02)
        return time.monotonic() - began

    # Both clients reach the three pods (the Go process starts and connects meanwhile).
    await call_until(lambda: all(callers(server) == {"go", "python"} for server in servers[:3]), 60)
    # Added a few seconds after the clients started, as an HPA's pod is: their next
    # re-resolution is then less than 30 s away.
    await call_until(lambda: time.monotonic() - started > 3, 10)
    assert callers(servers[3]) == set()

    dns.addresses[NAME] = ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"]
    return await call_until(lambda: callers(servers[3]) == {"go", "python"}, ADDED_POD_DEADLINE)


@pytest.mark.parametrize(("age_seconds", "reached"), [(1.0, True), (None, False)], ids=["aged", "never aged"])
async def test_a_client_that_never_re_resolves_on_its_own_reaches_an_added_pod_once_connections_age(
    age_seconds: float | None, reached: bool
) -> None:
    """Any gRPC client (here grpcio's own channel: round robin, DNS resolved when a connection
    closes, at most every 0.5 s) finds the added pod once the servers age its connections."""
    policy = ConnectionPolicy.from_settings(Settings())
    if age_seconds is not None:
        policy = dataclasses.replace(policy, max_age_seconds=age_seconds, max_age_grace_seconds=1.0)
    options = [
        ("grpc.service_config", '{"loadBalancingConfig": [{"round_robin": {}}]}'),
        ("grpc.dns_min_time_between_resolutions_ms", 500),
    ]
    request = pb.AssembleContextRequest(org_id="o", agent_id="a", model=scripted.FULL)
    async with (
        scripted_server(host="127.0.0.1", connections=policy) as first,
        scripted_server(host="127.0.0.2", port=first.port, connections=policy) as added,
        dns_server() as (dns, where),
    ):
        dns.addresses[NAME] = ["127.0.0.1"]
        async with grpc.aio.insecure_channel(
            f"dns://{where}/{NAME}:{first.port}", options=options
        ) as channel:
            stub = context_pb2_grpc.ContextAssemblyServiceStub(channel)
            await stub.AssembleContext(request, timeout=10)
            dns.addresses[NAME] = ["127.0.0.1", "127.0.0.2"]
            give_up = time.monotonic() + 10
            while not added.service.calls and time.monotonic() < give_up:
                await stub.AssembleContext(request, timeout=10)  # none may fail
                await asyncio.sleep(0.02)

    assert bool(added.service.calls) is reached
