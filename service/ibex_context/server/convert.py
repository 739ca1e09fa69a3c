"""Assembly results to wire messages."""

from __future__ import annotations

from ibex_context._proto.ibex.context.v1 import context_pb2 as pb
from ibex_context.pipeline.assembler import Assembly


def assemble_response(assembly: Assembly) -> pb.AssembleContextResponse:
    report = assembly.report
    budget = assembly.budget
    metadata = pb.InjectionMetadata(
        directive_injected=assembly.directive_injected,
        memories_injected=len(assembly.memories),
        memories_available=assembly.memories_available,
        total_tokens_injected=assembly.tokens_injected,
        context_window_used=assembly.context_window_used,
        was_truncated=assembly.was_truncated,
        fallback_reason=assembly.reasons[0] if assembly.reasons else "",
        memory_ids=[m.memory.id for m in assembly.memories],
        degradation_level=int(assembly.degradation),  # type: ignore[arg-type]
        timings=pb.StageTimings(
            budget_us=report.stage_us("budget"),
            directive_us=report.stage_us("directive"),
            hot_us=report.stage_us("hot"),
            embed_us=report.stage_us("embed"),
            cold_us=report.stage_us("cold"),
            score_us=report.stage_us("score"),
            pack_us=report.stage_us("pack"),
            format_us=report.stage_us("format"),
            retrieval_us=_retrieval_us(assembly),
            total_us=max(0, report.finished_ns - report.started_ns) // 1000,
        ),
        memories=[
            pb.InjectedMemory(
                id=m.memory.id,
                category=m.memory.category,
                tokens=m.tokens,
                score=m.score,
                relevance=m.relevance,
                recency=m.recency,
                usefulness=m.usefulness,
                confidence=m.confidence,
                frequency=m.frequency,
                source=int(m.memory.source),  # type: ignore[arg-type]
            )
            for m in assembly.memories
        ],
        sources=[
            pb.SourceOutcome(
                source=s.source,
                status=int(s.status),  # type: ignore[arg-type]
                duration_us=s.duration_us,
                count=s.count,
                detail=s.detail,
            )
            for s in report.sources
        ],
        degradation_reasons=list(assembly.reasons),
        profile=report.profile,
        request_id=report.request_id,
    )
    if budget is not None:
        metadata.tokens.CopyFrom(
            pb.TokenAccounting(
                encoding=budget.encoding,
                exact=budget.exact,
                context_window=budget.context_window,
                messages_tokens=budget.messages_tokens,
                directive_tokens=budget.directive_tokens,
                response_reserve=budget.response_reserve,
                safety_buffer=budget.safety_buffer,
                memory_budget=budget.memory_budget,
                memory_tokens_used=assembly.memory_tokens_used,
                constrained=budget.is_constrained,
                approximation_reason=budget.approximation_reason,
            )
        )
    return pb.AssembleContextResponse(
        messages=[pb.Message(role=m.role, content=m.content) for m in assembly.messages],
        metadata=metadata,
    )


def _retrieval_us(assembly: Assembly) -> int:
    spans = [s for s in assembly.report.stages if s.stage in ("directive", "hot", "embed", "cold")]
    if not spans:
        return 0
    return (max(s.end_ns for s in spans) - min(s.start_ns for s in spans)) // 1000
