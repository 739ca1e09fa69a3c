"""Assembly results to wire messages."""

from __future__ import annotations

from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb

from ibex_context.pipeline.assembly import Assembly
from ibex_context.pipeline.outcome import Stage

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
