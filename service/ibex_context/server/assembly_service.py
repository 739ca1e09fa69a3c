"""ContextAssemblyService at the edge: ``AssembleContext``'s request in (validated into an
``AssemblyRequest``), the call (profile, deadlines, admission, the assembler) and the
``Assembly`` out (``AssembleContextResponse``, built in place).

The handler is ``(request, context) -> response``; ``server/rpc.py`` parses, serializes
and observes around it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import grpc
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb

from ibex_context.errors import InvalidRequest
from ibex_context.models import ROLES, AssemblyRequest, ChatMessage
from ibex_context.pipeline.assembler import Assembler
from ibex_context.pipeline.assembly import Assembly, AssemblyObserver, Rejection
from ibex_context.pipeline.deadlines import DeadlinePolicy
from ibex_context.pipeline.outcome import Stage, StageSpan
from ibex_context.pipeline.post_response import InjectionQueue
from ibex_context.profiles.model import DEFAULT_PROFILE, Admission, Profile
from ibex_context.server import validation
from ibex_context.server.admission import FairAdmission
from ibex_context.server.lifecycle import InflightCalls
from ibex_context.server.rpc import CallError, Context, Method, service_methods
from ibex_context.server.validation import Limits, preview, uuid_field

_MAX_MODEL_CHARS = 200
_MAX_REQUEST_ID_CHARS = 128

ProfileResolver = Callable[[str, str], Profile]
# An org's admission share and rate limit, by org id (ProfileStore.resolve_org's).
AdmissionResolver = Callable[[str], Admission]


def _default_admission(_org_id: str) -> Admission:
    return DEFAULT_PROFILE.admission


class ContextAssemblyHandler:
    def __init__(
        self,
        *,
        assembler: Assembler,
        resolve_profile: ProfileResolver,
        limits: Limits,
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
                request = assemble_request(message, self._limits)
            except InvalidRequest as exc:
                self._observer.rejected(
                    Rejection(
                        validation.loggable(message.request_id, _MAX_REQUEST_ID_CHARS),
                        validation.loggable(message.model.strip(), _MAX_MODEL_CHARS),
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
            response = assemble_response(assembly)
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


# --- the request in -----------------------------------------------------------------


def assemble_request(message: pb.AssembleContextRequest, limits: Limits) -> AssemblyRequest:
    org_id = uuid_field(message.org_id, "org_id")
    agent_id = uuid_field(message.agent_id, "agent_id")
    session_id = uuid_field(message.session_id, "session_id", required=False)
    model = message.model.strip()
    if not model:
        raise InvalidRequest("model", "is required (e.g. gpt-4o)")
    if len(model) > _MAX_MODEL_CHARS or not model.isprintable():
        raise InvalidRequest("model", f"must be at most {_MAX_MODEL_CHARS} printable characters")
    request_id = message.request_id or uuid.uuid4().hex
    if len(request_id) > _MAX_REQUEST_ID_CHARS or not request_id.isprintable():
        raise InvalidRequest("request_id", f"must be at most {_MAX_REQUEST_ID_CHARS} printable characters")
    count = len(message.messages)
    if count > limits.max_messages:
        raise InvalidRequest("messages", f"has {count} messages; at most {limits.max_messages} are accepted")
    messages = []
    for i, m in enumerate(message.messages):
        if m.role not in ROLES:
            raise InvalidRequest(
                f"messages[{i}].role", f"unknown role {preview(m.role)}; expected one of {sorted(ROLES)}"
            )
        if len(m.content) > limits.max_message_chars:
            raise InvalidRequest(
                f"messages[{i}].content",
                f"has {len(m.content)} characters; at most {limits.max_message_chars} are accepted",
            )
        messages.append(ChatMessage(m.role, m.content))
    return AssemblyRequest(
        org_id=org_id,
        agent_id=agent_id,
        session_id=session_id,
        model=model,
        request_id=request_id,
        messages=tuple(messages),
    )


# --- the response out ---------------------------------------------------------------

# Each stage's field in the wire's StageTimings: every ``Stage`` but the send, which is
# timed after the response is built (observability reads it, the wire does not).
WIRE_STAGE_FIELDS: tuple[tuple[Stage, str], ...] = tuple(
    (stage, f"{stage.value}_us") for stage in Stage if stage is not Stage.SERIALIZE
)


def assemble_response(assembly: Assembly) -> pb.AssembleContextResponse:
    """``assembly`` on the wire."""
    # Built in place (add(), CopyFrom-free): constructing upb messages from Python
    # lists costs more per call (benchmarks/results/serialization.md).
    budget, timings = assembly.budget, assembly.timings
    response = pb.AssembleContextResponse()
    for message in assembly.messages:
        response.messages.add(role=message.role, content=message.content)
    md = response.metadata
    md.directive_injected = assembly.composed.directive_injected
    md.memories_injected = assembly.memories_injected
    md.memories_available = assembly.composed.memories_available
    md.total_tokens_injected = assembly.composed.tokens_injected
    md.context_window_used = assembly.context_window_used
    md.was_truncated = assembly.composed.was_truncated
    md.fallback_reason = assembly.reasons[0] if assembly.reasons else ""
    md.degradation_level = int(assembly.degradation)  # type: ignore[assignment]
    md.degradation_reasons.extend(assembly.reasons)
    md.profile = assembly.profile
    md.request_id = assembly.request_id
    t = md.timings
    stages_us = timings.stages_us()
    for stage, field in WIRE_STAGE_FIELDS:
        setattr(t, field, stages_us.get(stage, 0))
    t.retrieval_us = timings.retrieval_us
    t.total_us = timings.total_us
    for m, handle in zip(assembly.memories, assembly.handles, strict=True):
        md.memory_ids.append(m.memory.id)
        md.memories.add(
            id=m.memory.id,
            category=m.memory.category,
            tokens=m.tokens,
            score=m.score,
            relevance=m.relevance,
            recency=m.recency,
            usefulness=m.usefulness,
            confidence=m.confidence,
            frequency=m.frequency,
            source=int(m.memory.source),
            semantic=m.semantic,
            lexical=m.lexical,
            handle=handle,
        )
    for s in assembly.sources:
        md.sources.add(
            source=s.source,
            status=int(s.status),
            duration_us=s.duration_us,
            count=s.found,
            detail=s.detail,
        )
    if budget is not None:
        tokens = md.tokens
        tokens.encoding = budget.encoding
        tokens.exact = budget.exact
        tokens.context_window = budget.context_window
        tokens.messages_tokens = budget.messages_tokens
        tokens.directive_tokens = budget.directive_tokens
        tokens.response_reserve = budget.response_reserve
        tokens.safety_buffer = budget.safety_buffer
        tokens.memory_budget = budget.memory_budget
        tokens.memory_tokens_used = assembly.composed.memory_tokens
        tokens.constrained = budget.is_constrained
        tokens.approximation_reason = budget.approximation_reason
    return response
