"""An assembly on the wire (``server.assembly_service``): every ``Stage`` but the send has
its field in the wire's StageTimings, and the response carries what the assembly holds.
AssembleContext's calls end to end are test_assemble.py's and test_validation.py's."""

from __future__ import annotations

from ibex_context.models import ChatMessage, Degradation, MemoryRecord, ScoredMemory
from ibex_context.pipeline.assembly import Assembly, Composition
from ibex_context.pipeline.outcome import (
    STAGES,
    Outcome,
    Reason,
    SourceName,
    SourceResult,
    SourceStatus,
    Stage,
    StageSpan,
    Timings,
)
from ibex_context.server.assembly_service import WIRE_STAGE_FIELDS, assemble_response
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb


def test_the_wire_timings_have_one_field_per_stage_and_nothing_else_of_the_stages() -> None:
    fields = {f.name for f in pb.StageTimings.DESCRIPTOR.fields} - {"retrieval_us", "total_us"}
    assert {field for _, field in WIRE_STAGE_FIELDS} == fields
    assert [stage for stage, _ in WIRE_STAGE_FIELDS] == [s for s in STAGES if s is not Stage.SERIALIZE]


def test_the_response_carries_the_assembly_its_stages_and_its_handles() -> None:
    memory = MemoryRecord(id="m1", content="The dock opens at six.", category="factual")
    stages = tuple(
        StageSpan(stage, 1_000_000 * n, 1_000_000 * n + 1000 * (n + 1)) for n, stage in enumerate(STAGES)
    )
    assembly = Assembly(
        request_id="r1",
        model="gpt-4o",
        profile="p",
        composed=Composition(
            (ChatMessage("system", '<memory id="4">\nThe dock opens at six.\n</memory>'),),
            memories=(ScoredMemory(memory, 0.9, 0.9, 0.5, 0.5, 0.8, 0.0, tokens=12),),
            handles=(4,),
            memories_available=3,
            tokens_injected=20,
            memory_tokens=12,
            was_truncated=True,
        ),
        degradation=Degradation.HOT_ONLY,
        reasons=(Reason.COLD_TIMEOUT, Reason.LEXICAL_ERROR),
        outcome=Outcome.DEGRADED,
        sources=(SourceResult(SourceName.COLD, SourceStatus.TIMEOUT, 35_000, 0, "timed out"),),
        candidates_evaluated=7,
        context_window_used=1,
        timings=Timings(0, 50_000_000, stages),
    )
    response = assemble_response(assembly)
    md = response.metadata
    assert (md.request_id, md.profile) == ("r1", "p")
    assert [m.content for m in response.messages] == [assembly.messages[0].content]
    assert (md.memories_injected, md.memories_available, md.total_tokens_injected) == (1, 3, 20)
    assert [(m.id, m.handle, m.tokens) for m in md.memories] == [("m1", 4, 12)]
    assert md.fallback_reason == "cold_timeout" and list(md.degradation_reasons) == [
        "cold_timeout",
        "lexical_error",
    ]
    assert md.degradation_level == pb.DEGRADATION_LEVEL_HOT_ONLY and md.was_truncated
    # Stage n lasted n + 1 µs; the send is not on the wire.
    for n, stage in enumerate(STAGES):
        if stage is not Stage.SERIALIZE:
            assert getattr(md.timings, f"{stage}_us") == n + 1, stage
    assert md.timings.total_us == 50_000
    assert [(s.source, s.status, s.count) for s in md.sources] == [("cold", pb.SOURCE_STATUS_TIMEOUT, 0)]
    assert not md.HasField("tokens")  # no budget: the model was never resolved
