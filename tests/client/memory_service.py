"""A small in-memory MemoryService on a real socket, for MemoryClient tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import grpclib.const
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream
from ibex_context._proto.ibex.context.v1 import context_pb2 as pb
from ibex_context.devtools.scripted_service import free_socket

SERVICE = "/ibex.context.v1.MemoryService/"


@dataclass
class InMemoryMemoryService:
    memories: dict[tuple[str, str], dict[str, pb.MemoryInput]] = field(default_factory=dict)
    directives: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)
    batches: list[int] = field(default_factory=list)

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        def unary(func: Any, request: type[Any], reply: type[Any]) -> grpclib.const.Handler:
            return grpclib.const.Handler(func, grpclib.const.Cardinality.UNARY_UNARY, request, reply)

        return {
            SERVICE + "UpsertMemories": unary(
                self.upsert, pb.UpsertMemoriesRequest, pb.UpsertMemoriesResponse
            ),
            SERVICE + "DeleteMemories": unary(
                self.delete, pb.DeleteMemoriesRequest, pb.DeleteMemoriesResponse
            ),
            SERVICE + "SetDirective": unary(
                self.set_directive, pb.SetDirectiveRequest, pb.SetDirectiveResponse
            ),
            SERVICE + "ClearDirective": unary(
                self.clear_directive, pb.ClearDirectiveRequest, pb.ClearDirectiveResponse
            ),
            SERVICE + "RecordFeedback": unary(
                self.record_feedback, pb.RecordFeedbackRequest, pb.RecordFeedbackResponse
            ),
        }

    @staticmethod
    def _scope(request: Any) -> tuple[str, str]:
        if not request.org_id:
            raise GRPCError(Status.INVALID_ARGUMENT, "org_id: required")
        if not request.agent_id:
            raise GRPCError(Status.INVALID_ARGUMENT, "agent_id: required")
        return request.org_id, request.agent_id

    async def upsert(self, stream: Stream[Any, Any]) -> None:
        request = await stream.recv_message()
        scope = self._scope(request)
        for i, memory in enumerate(request.memories):
            if not memory.content:
                raise GRPCError(Status.INVALID_ARGUMENT, f"memories[{i}].content: required")
        self.batches.append(len(request.memories))
        stored = self.memories.setdefault(scope, {})
        results = []
        for memory in request.memories:
            memory_id = memory.id or f"m{len(stored) + 1}"
            outcome = pb.UPSERT_OUTCOME_UPDATED if memory_id in stored else pb.UPSERT_OUTCOME_CREATED
            stored[memory_id] = memory
            results.append(pb.UpsertResult(id=memory_id, outcome=outcome))
        await stream.send_message(pb.UpsertMemoriesResponse(results=results))

    async def delete(self, stream: Stream[Any, Any]) -> None:
        request = await stream.recv_message()
        stored = self.memories.get(self._scope(request), {})
        deleted = sum(1 for i in request.ids if stored.pop(i, None) is not None)
        await stream.send_message(pb.DeleteMemoriesResponse(deleted=deleted))

    async def set_directive(self, stream: Stream[Any, Any]) -> None:
        request = await stream.recv_message()
        scope = self._scope(request)
        version = self.directives.get(scope, (0, ""))[0] + 1
        self.directives[scope] = (version, request.content)
        await stream.send_message(pb.SetDirectiveResponse(version=version))

    async def clear_directive(self, stream: Stream[Any, Any]) -> None:
        request = await stream.recv_message()
        cleared = self.directives.pop(self._scope(request), None) is not None
        await stream.send_message(pb.ClearDirectiveResponse(cleared=cleared))

    async def record_feedback(self, stream: Stream[Any, Any]) -> None:
        request = await stream.recv_message()
        self._scope(request)
        step = {pb.FEEDBACK_POSITIVE: 0.1, pb.FEEDBACK_NEGATIVE: -0.1, pb.FEEDBACK_NEUTRAL: 0.0}
        updates = [
            pb.MemoryScoreUpdate(
                memory_id=f.memory_id, previous_usefulness=0.5, new_usefulness=0.5 + step[f.feedback]
            )
            for f in request.feedback
        ]
        await stream.send_message(pb.RecordFeedbackResponse(updates=updates))


@asynccontextmanager
async def memory_server() -> AsyncIterator[tuple[str, InMemoryMemoryService]]:
    service = InMemoryMemoryService()
    server = Server([service])
    sock = free_socket()
    await server.start(sock=sock)
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}", service
    finally:
        server.close()
        with suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 1.0)
