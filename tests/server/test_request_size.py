"""An oversized request is refused from its gRPC length prefix, before its body is
read: three concurrent 300 MB AssembleContext calls cost the real server process
less than 50 MB of peak memory, and each caller gets RESOURCE_EXHAUSTED (gRPC's
core refuses it: ``grpc.max_receive_message_length``, server/grpc_server.py)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from grpclib.client import Channel
from grpclib.const import Cardinality, Status
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError, StreamTerminatedError
from ibex_context._proto.ibex.context.v1 import context_grpc
from ibex_context._proto.ibex.context.v1 import context_pb2 as pb

from tests.conftest import Tenant

from .conftest import request, user
from .test_shutdown import _serve, _wait_serving

MB = 1024 * 1024
ASSEMBLE = "/ibex.context.v1.ContextAssemblyService/AssembleContext"


class _BytesCodec(CodecBase):
    """Sends already-serialized protobuf bytes as they are: one 300 MB payload is
    built once and shared by the three calls."""

    __content_subtype__ = "proto"

    def encode(self, message: object, message_type: object) -> bytes:
        assert isinstance(message, bytes)
        return message

    def decode(self, data: bytes, message_type: object) -> bytes:
        return data


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


async def _send_raw(port: int, payload: bytes) -> GRPCError | None:
    """One call, as a client that serialized the whole request would make it."""
    async with Channel("127.0.0.1", port, codec=_BytesCodec()) as channel:
        try:
            async with channel.request(
                ASSEMBLE, Cardinality.UNARY_UNARY, bytes, bytes, timeout=120
            ) as stream:
                # The server refuses and resets the stream mid-body; the status follows.
                with contextlib.suppress(StreamTerminatedError):
                    await stream.send_message(payload, end=True)
                await stream.recv_message()
        except GRPCError as error:
            return error
    return None


async def test_three_concurrent_300_mb_requests_are_refused_before_their_bodies_are_read(
    redis_url: str, postgres_dsn: str, tenant: Tenant
) -> None:
    proc, port = _serve(redis_url, postgres_dsn)
    try:
        await _wait_serving(port)
        async with Channel("127.0.0.1", port) as channel:
            stub = context_grpc.ContextAssemblyServiceStub(channel)
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
            assert error.status is Status.RESOURCE_EXHAUSTED
            assert error.message is not None
            assert f"larger than max ({size} vs. {4 * MB})" in error.message
        assert peak_kb - idle_kb < 50 * 1024, f"peak {peak_kb - idle_kb} kB above idle"
        assert after_kb - idle_kb < 50 * 1024, f"{after_kb - idle_kb} kB kept after the calls"

        async with Channel("127.0.0.1", port) as channel:
            reply = await context_grpc.ContextAssemblyServiceStub(channel).AssembleContext(
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
        async with Channel("127.0.0.1", port) as channel:
            stub = context_grpc.ContextAssemblyServiceStub(channel)
            with pytest.raises(GRPCError) as refused:
                await stub.AssembleContext(
                    request(tenant.org_id, tenant.agent_id, user("x" * 5 * MB)), timeout=30
                )
            assert refused.value.status is Status.RESOURCE_EXHAUSTED
            reply = await stub.AssembleContext(
                request(tenant.org_id, tenant.agent_id, user("and now a normal one")), timeout=10
            )
        assert reply.messages[-1].content == "and now a normal one"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
