"""A small in-memory MemoryService on a real socket, for MemoryClient tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
from ibex_context.server.grpc_server import ServiceServer
from ibex_context.server.rpc import CallError, Method, unary
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb

SERVICE = "/ibex.context.v1.MemoryService/"


@dataclass
class InMemoryMemoryService:
    memories: dict[tuple[str, str], dict[str, pb.MemoryInput]] = field(default_factory=dict)
    directives: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)
    batches: list[int] = field(default_factory=list)

    def methods(self) -> list[Method]:
        return [
            unary(SERVICE + "UpsertMemories", pb.UpsertMemoriesRequest, self.upsert),
            unary(SERVICE + "DeleteMemories", pb.DeleteMemoriesRequest, self.delete),
            unary(SERVICE + "SetDirective", pb.SetDirectiveRequest, self.set_directive),
            unary(SERVICE + "ClearDirective", pb.ClearDirectiveRequest, self.clear_directive),
            unary(SERVICE + "RecordFeedback", pb.RecordFeedbackRequest, self.record_feedback),
        ]

    @staticmethod
    def _scope(request: Any) -> tuple[str, str]:
        if not request.org_id:
            raise CallError(grpc.StatusCode.INVALID_ARGUMENT, "org_id: required")
        if not request.agent_id:
            raise CallError(grpc.StatusCode.INVALID_ARGUMENT, "agent_id: required")
        return request.org_id, request.agent_id

    async def upsert(self, request: Any, _context: Any) -> Any:
        scope = self._scope(request)
        for i, memory in enumerate(request.memories):
            if not memory.content:
                raise CallError(grpc.StatusCode.INVALID_ARGUMENT, f"memories[{i}].content: required")
        self.batches.append(len(request.memories))
        stored = self.memories.setdefault(scope, {})
        results = []
        for memory in request.memories:
            memory_id = memory.id or f"m{len(stored) + 1}"
            outcome = pb.UPSERT_OUTCOME_UPDATED if memory_id in stored else pb.UPSERT_OUTCOME_CREATED
            stored[memory_id] = memory
            results.append(pb.UpsertResult(id=memory_id, outcome=outcome))
        return pb.UpsertMemoriesResponse(results=results)

    async def delete(self, request: Any, _context: Any) -> Any:
        stored = self.memories.get(self._scope(request), {})
        deleted = sum(1 for i in request.ids if stored.pop(i, None) is not None)
        return pb.DeleteMemoriesResponse(deleted=deleted)

    async def set_directive(self, request: Any, _context: Any) -> Any:
        scope = self._scope(request)
        version = self.directives.get(scope, (0, ""))[0] + 1
        self.directives[scope] = (version, request.content)
        return pb.SetDirectiveResponse(version=version)

    async def clear_directive(self, request: Any, _context: Any) -> Any:
        cleared = self.directives.pop(self._scope(request), None) is not None
        return pb.ClearDirectiveResponse(cleared=cleared)

    async def record_feedback(self, request: Any, _context: Any) -> Any:
        self._scope(request)
        step = {pb.FEEDBACK_POSITIVE: 0.1, pb.FEEDBACK_NEGATIVE: -0.1, pb.FEEDBACK_NEUTRAL: 0.0}
        updates = [
            pb.MemoryScoreUpdate(
                memory_id=f.memory_id, previous_usefulness=0.5, new_usefulness=0.5 + step[f.feedback]
            )
            for f in request.feedback
        ]
        return pb.RecordFeedbackResponse(updates=updates)


@asynccontextmanager
async def memory_server() -> AsyncIterator[tuple[str, InMemoryMemoryService]]:
    service = InMemoryMemoryService()
    server = ServiceServer(service.methods(), max_request_bytes=4 * 1024 * 1024)
    port = await server.start("127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{port}", service
    finally:
        await server.stop(0)
