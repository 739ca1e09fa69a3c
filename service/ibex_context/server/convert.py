"""Assembly results to wire messages."""

from __future__ import annotations

from ibex_context._proto.ibex.context.v1 import context_pb2 as pb
from ibex_context.pipeline.assembler import Assembly
from ibex_context.pipeline.formatting import handles
from ibex_context.pipeline.report import SOURCES


def assemble_response(assembly: Assembly) -> pb.AssembleContextResponse:
    # Built in place (add(), CopyFrom-free): constructing upb messages from Python
    # lists costs ~0.14 ms more per call (benchmarks/results/serialization.md).
    report = assembly.report
    budget = assembly.budget
    response = pb.AssembleContextResponse()
    for message in assembly.messages:
        response.messages.add(role=message.role, content=message.content)
    md = response.metadata
    md.directive_injected = assembly.directive_injected
    md.memories_injected = len(assembly.memories)
    md.memories_available = assembly.memories_available
    md.total_tokens_injected = assembly.tokens_injected
    md.context_window_used = assembly.context_window_used
    md.was_truncated = assembly.was_truncated
    md.fallback_reason = assembly.reasons[0] if assembly.reasons else ""
    md.degradation_level = int(assembly.degradation)  # type: ignore[assignment]
    md.degradation_reasons.extend(assembly.reasons)
    md.profile = report.profile
    md.request_id = report.request_id
    t = md.timings
    t.budget_us = report.stage_us("budget")
    t.directive_us = report.stage_us("directive")
    t.hot_us = report.stage_us("hot")
    t.embed_us = report.stage_us("embed")
    t.cold_us = report.stage_us("cold")
    t.lexical_us = report.stage_us("lexical")
    t.score_us = report.stage_us("score")
    t.pack_us = report.stage_us("pack")
    t.format_us = report.stage_us("format")
    t.retrieval_us = _retrieval_us(assembly)
    t.total_us = max(0, report.finished_ns - report.started_ns) // 1000
    handle_of = handles(assembly.memories)
    for m in assembly.memories:
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
            handle=handle_of[m.memory.id],
        )
    for s in report.sources:
        md.sources.add(
            source=s.source,
            status=int(s.status),
            duration_us=s.duration_us,
            count=s.count,
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
        tokens.memory_tokens_used = assembly.memory_tokens_used
        tokens.constrained = budget.is_constrained
        tokens.approximation_reason = budget.approximation_reason
    return response


def _retrieval_us(assembly: Assembly) -> int:
    spans = [s for s in assembly.report.stages if s.stage in SOURCES]
    if not spans:
        return 0
    return (max(s.end_ns for s in spans) - min(s.start_ns for s in spans)) // 1000
