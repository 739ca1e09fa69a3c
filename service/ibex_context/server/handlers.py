"""gRPC handlers of ContextAssemblyService and MemoryService (grpc.aio, upb messages).

Handlers translate between the wire and the pipeline; they hold no logic of
their own beyond validation and error mapping. Each is ``(request, context) ->
response``; ``server/rpc.py`` parses, serializes and observes around it, and
``server/handling.py`` does what every memory method does around its work.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import grpc
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb

from ibex_context.errors import InvalidRequest
from ibex_context.memory_api.writes import MemoryWrites
from ibex_context.pipeline.assembler import Assembler
from ibex_context.pipeline.assembly import AssemblyObserver, Rejection
from ibex_context.pipeline.deadlines import DeadlinePolicy
from ibex_context.pipeline.outcome import Stage, StageSpan
from ibex_context.pipeline.post_response import InjectionQueue
from ibex_context.profiles.model import DEFAULT_PROFILE, Admission, Profile
from ibex_context.server import convert, validation
from ibex_context.server.admission import FairAdmission
from ibex_context.server.handling import agent_scoped
from ibex_context.server.lifecycle import InflightCalls
from ibex_context.server.rpc import CallError, Context, Method, service_methods

log = logging.getLogger(__name__)

ProfileResolver = Callable[[str, str], Profile]
# An org's admission share and rate limit, by org id (ProfileStore.resolve_org's).
AdmissionResolver = Callable[[str], Admission]


def _default_admission(_org_id: str) -> Admission:
    return DEFAULT_PROFILE.admission


_OUTCOMES = {"created": pb.UPSERT_OUTCOME_CREATED, "updated": pb.UPSERT_OUTCOME_UPDATED}


class ContextAssemblyHandler:
    def __init__(
        self,
        *,
        assembler: Assembler,
        resolve_profile: ProfileResolver,
        limits: validation.Limits,
        deadlines: DeadlinePolicy,
        injections: InjectionQueue,
        inflight: InflightCalls,
        observer: AssemblyObserver,
        admission: FairAdmission | None = None,
        resolve_admission: AdmissionResolver = _default_admission,
    ) -> None:
        self._assembler = assembler
        self._admission = admission or FairAdmission(0)
        self._resolve_admission = resolve_admission
        self._resolve_profile = resolve_profile
        self._limits = limits
        self._deadlines = deadlines
        self._injections = injections
        self._inflight = inflight
        self._observer = observer

    def methods(self) -> list[Method]:
        return service_methods(pb.DESCRIPTOR.services_by_name["ContextAssemblyService"], pb, self)

    async def AssembleContext(self, message: pb.AssembleContextRequest, context: Context) -> bytes:
        """Returns the response serialized: its serialization is a stage the observer is told of."""
        with self._inflight.track():
            try:
                request = validation.assemble_request(message, self._limits)
            except InvalidRequest as exc:
                self._observer.rejected(
                    Rejection(
                        validation.loggable(message.request_id, 128),
                        validation.loggable(message.model.strip(), 200),
                        exc.field,
                    )
                )
                raise CallError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
            profile = self._resolve_profile(request.org_id, request.agent_id)
            caller = context.time_remaining()
            deadlines = self._deadlines.for_call(profile.deadlines, caller)
            org_id = request.org_id
            shed = self._admission.admit(org_id, self._resolve_admission(org_id))
            if shed is None:
                try:
                    assembly = await self._assembler.assemble(request, profile, deadlines)
                finally:
                    self._admission.release(org_id)
            else:
                assembly = self._assembler.shed(request, profile, shed)
            response = convert.assemble_response(assembly)
            start = time.perf_counter_ns()
            payload = response.SerializeToString()
            serialize = StageSpan(Stage.SERIALIZE, start, time.perf_counter_ns())
            # After the last thing it times; what runs after the response (metrics,
            # spans, the access log) only reads the assembly.
            self._observer.answered(assembly, serialize)
            if assembly.memories:
                self._injections.submit(
                    request.org_id, request.agent_id, [m.memory.id for m in assembly.memories]
                )
            return payload


class MemoryHandler:
    def __init__(
        self,
        *,
        writes: MemoryWrites,
        limits: validation.Limits,
        inflight: InflightCalls,
        limit_refused: Callable[[str], None] = lambda _limit: None,
    ) -> None:
        self._writes = writes
        self._limits = limits
        self._inflight = inflight
        self._limit_refused = limit_refused

    def methods(self) -> list[Method]:
        """Every method of MemoryService in the proto (``MemoryServiceHandler`` has them all)."""
        return service_methods(pb.DESCRIPTOR.services_by_name["MemoryService"], pb, self)

    @agent_scoped
    async def UpsertMemories(
        self, message: pb.UpsertMemoriesRequest, org_id: str, agent_id: str
    ) -> pb.UpsertMemoriesResponse:
        memories = validation.new_memories(message.memories, self._limits)
        results = await self._writes.upsert(org_id, agent_id, memories)
        return pb.UpsertMemoriesResponse(
            results=[
                pb.UpsertResult(id=r.id, outcome=_OUTCOMES.get(r.outcome, pb.UPSERT_OUTCOME_UNCHANGED))
                for r in results
            ]
        )

    @agent_scoped
    async def DeleteMemories(
        self, message: pb.DeleteMemoriesRequest, org_id: str, agent_id: str
    ) -> pb.DeleteMemoriesResponse:
        ids = validation.delete_ids(message.ids, self._limits)
        deleted = await self._writes.delete(org_id, agent_id, ids)
        return pb.DeleteMemoriesResponse(deleted=deleted)

    @agent_scoped
    async def SetDirective(
        self, message: pb.SetDirectiveRequest, org_id: str, agent_id: str
    ) -> pb.SetDirectiveResponse:
        content = validation.directive_content(message.content, self._limits)
        version = await self._writes.set_directive(org_id, agent_id, content)
        return pb.SetDirectiveResponse(version=version)

    @agent_scoped
    async def ClearDirective(
        self, message: pb.ClearDirectiveRequest, org_id: str, agent_id: str
    ) -> pb.ClearDirectiveResponse:
        cleared = await self._writes.clear_directive(org_id, agent_id)
        return pb.ClearDirectiveResponse(cleared=cleared)

    @agent_scoped
    async def RecordFeedback(
        self, message: pb.RecordFeedbackRequest, org_id: str, agent_id: str
    ) -> pb.RecordFeedbackResponse:
        session_id = validation.uuid_field(message.session_id, "session_id", required=False) or None
        items = validation.feedback(message.feedback, self._limits)
        updates = await self._writes.record_feedback(org_id, agent_id, session_id, items)
        return pb.RecordFeedbackResponse(
            updates=[
                pb.MemoryScoreUpdate(
                    memory_id=u.memory_id,
                    previous_usefulness=u.previous_usefulness,
                    new_usefulness=u.new_usefulness,
                )
                for u in updates
            ]
        )
