"""An oversized request is refused from its gRPC length prefix, before its body is
read: three concurrent 300 MB AssembleContext calls cost the real server process
less than 50 MB of peak memory, and each caller gets RESOURCE_EXHAUSTED (gRPC's
core refuses it: ``grpc.max_receive_message_length``, server/grpc_server.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb
from ibex_context_client.proto.ibex.context.v1 import context_pb2_grpc

from tests.conftest import Tenant

from .conftest import request, user
from .test_shutdown import _serve, _wait_serving

MB = 1024 * 1024
ASSEMBLE = "/ibex.context.v1.ContextAssemblyService/AssembleContext"


def _oversized_request(tenant: Tenant, size: int) -> bytes:
    """A well-formed AssembleContextRequest whose one user message is ``size`` bytes."""
    head = request(tenant.org_id, tenant.agent_id).SerializeToString()
    content = b"x" * size
    message = b"\x0a\x04user" + b"\x12" + _varint(len(content)) + content
    del content
    return head + b"\x32" + _varint(len(message)) + message  # field 6: messages


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _memory_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/{pid}/status")


def _reset_peak(pid: int) -> None:
    # "5" resets VmHWM (the peak resident set) to the current RSS (proc(5)).
    Path(f"/proc/{pid}/clear_refs").write_text("5")


async def _send_raw(port: int, payload: bytes) -> grpc.aio.AioRpcError | None:
    """One call, as a client that serialized the whole request would make it: the
    payload's bytes as they are (no serializer), one 300 MB payload shared by the calls."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            await channel.unary_unary(ASSEMBLE)(payload, timeout=120)
        except grpc.aio.AioRpcError as error:
            return error
    return None


async def test_three_concurrent_300_mb_requests_are_refused_before_their_bodies_are_read(
    redis_url: str, postgres_dsn: str, tenant: Tenant
) -> None:
    proc, port = _serve(redis_url, postgres_dsn)
    try:
        await _wait_serving(port)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = context_pb2_grpc.ContextAssemblyServiceStub(channel)
            for i in range(20):  # warm: pools open, encodings and caches in use
                await stub.AssembleContext(request(tenant.org_id, tenant.agent_id, user(f"hello {i}")))
        idle_kb = _memory_kb(proc.pid, "VmRSS")
        _reset_peak(proc.pid)

        payload = _oversized_request(tenant, 300 * MB)
        errors = await asyncio.wait_for(
            asyncio.gather(*(_send_raw(port, payload) for _ in range(3))), timeout=180
        )
        size = len(payload)
        del payload
        peak_kb = _memory_kb(proc.pid, "VmHWM")
        after_kb = _memory_kb(proc.pid, "VmRSS")
        print(f"server RSS: idle {idle_kb} kB, peak {peak_kb} kB, after {after_kb} kB")

        for error in errors:
            assert error is not None, "an oversized request was answered"
            assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert f"larger than max ({size} vs. {4 * MB})" in (error.details() or "")
        assert peak_kb - idle_kb < 50 * 1024, f"peak {peak_kb - idle_kb} kB above idle"
        assert after_kb - idle_kb < 50 * 1024, f"{after_kb - idle_kb} kB kept after the calls"

        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = await context_pb2_grpc.ContextAssemblyServiceStub(channel).AssembleContext(
                request(tenant.org_id, tenant.agent_id, user("still serving?")), timeout=10
            )
        assert isinstance(reply, pb.AssembleContextResponse)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def test_a_refused_request_leaves_its_connection_usable(
    redis_url: str, postgres_dsn: str, tenant: Tenant
) -> None:
    proc, port = _serve(redis_url, postgres_dsn)
    try:
        await _wait_serving(port)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = context_pb2_grpc.ContextAssemblyServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.AssembleContext(
                    request(tenant.org_id, tenant.agent_id, user("x" * 5 * MB)), timeout=30
                )
            assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            reply = await stub.AssembleContext(
                request(tenant.org_id, tenant.agent_id, user("and now a normal one")), timeout=10
            )
        assert reply.messages[-1].content == "and now a normal one"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
