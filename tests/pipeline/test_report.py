"""The report's vocabulary (sources, reasons, outcomes) and the report built once from an assembly."""

from __future__ import annotations

from typing import Any

import pytest
from ibex_context.models import AssemblyRequest, ChatMessage, Degradation, MemoryRecord, ScoredMemory
from ibex_context.pipeline.assembler import Assembly
from ibex_context.pipeline.budget import compute_budget
from ibex_context.pipeline.outcome import (
    Outcome,
    Reason,
    SourceName,
    SourceResult,
    SourceStatus,
    StageSpan,
    Timings,
    outcome_of,
)
from ibex_context.pipeline.report import AssemblyReport, build_report
from ibex_context.profiles.model import BudgetLimits
from ibex_context.tokens.catalogue import resolve_model


def test_a_failed_source_gives_its_own_reason_and_an_answered_or_skipped_one_none() -> None:
    from ibex_context.pipeline.outcome import Reason, SourceName, SourceStatus

    assert Reason.of_source(SourceName.COLD, SourceStatus.TIMEOUT) is Reason.COLD_TIMEOUT
    assert Reason.of_source(SourceName.LEXICAL, SourceStatus.ERROR) is Reason.LEXICAL_ERROR
    assert Reason.of_source(SourceName.HOT, SourceStatus.OK) is None
    assert Reason.of_source(SourceName.HOT, SourceStatus.SKIPPED) is None
    assert Reason.COLD_TIMEOUT.source is SourceName.COLD
    assert Reason.DEADLINE_EXCEEDED.source is None
    # Every source can fail both ways, each with a reason of its own.
    assert (
        len({Reason.of_source(s, k) for s in SourceName for k in (SourceStatus.TIMEOUT, SourceStatus.ERROR)})
        == 10
    )


def test_reasons_order_most_severe_first() -> None:
    from ibex_context.pipeline.outcome import Reason

    given = [Reason.LEXICAL_TIMEOUT, Reason.HOT_ERROR, Reason.DEADLINE_EXCEEDED, Reason.COLD_ERROR]
    assert Reason.ordered(given) == [
        Reason.DEADLINE_EXCEEDED,
        Reason.HOT_ERROR,
        Reason.COLD_ERROR,
        Reason.LEXICAL_TIMEOUT,
    ]
    # The values are what the wire and the metrics carry.
    assert Reason.DIRECTIVE_EXCEEDS_WINDOW == "directive_exceeds_window"


# --- the report, built once from what the call produced -------------------------------

REQUEST = AssemblyRequest(
    org_id="0b6f7a4e-8f1c-4b53-9a51-5b1a3c7c2d01",
    agent_id="5d2e9c1a-3b4f-4e6a-8c7d-9f0a1b2c3d11",
    session_id="",
    model="gpt-4o",
    request_id="req-9",
    messages=(ChatMessage("user", "when does the warehouse open?"),),
)
SOURCES_ANSWERED = (
    SourceResult(SourceName.DIRECTIVE, SourceStatus.OK, 300, 1),
    SourceResult(SourceName.HOT, SourceStatus.OK, 900, 12),
    SourceResult(SourceName.EMBED, SourceStatus.OK, 400, 1),
    SourceResult(SourceName.COLD, SourceStatus.TIMEOUT, 20_000, 0, "no answer within 20.0 ms"),
    SourceResult(SourceName.LEXICAL, SourceStatus.OK, 2_000, 7),
)
TIMINGS = Timings(
    started_ns=1_000_000,
    finished_ns=31_000_000,
    stages=(
        StageSpan("budget", 1_000_000, 1_100_000),
        StageSpan("hot", 1_200_000, 2_100_000),
        StageSpan("cold", 1_300_000, 21_300_000),
        StageSpan("directive", 1_150_000, 1_450_000),
        StageSpan("score", 21_400_000, 21_700_000),
    ),
)


def _assembly(**changes: Any) -> Assembly:
    model = resolve_model("gpt-4o", ())
    budget = compute_budget(model, messages_tokens=20, directive_tokens=40, limits=BudgetLimits(), exact=True)
    memory = MemoryRecord(id="m1", content="The warehouse opens at six.", category="factual")
    given = Assembly(
        messages=REQUEST.messages,
        directive_injected=True,
        memories=(ScoredMemory(memory, 0.9, 0.9, 0.5, 0.5, 0.8, 0.0, tokens=12),),
        handles=(1,),
        memories_available=9,
        tokens_injected=95,
        context_window_used=1,
        was_truncated=False,
        degradation=Degradation.HOT_ONLY,
        reasons=(Reason.COLD_TIMEOUT,),
        budget=budget,
        memory_tokens_used=55,
        sources=SOURCES_ANSWERED,
        candidates_evaluated=31,
        timings=TIMINGS,
    )
    return given._replace(**changes)


def test_the_report_is_built_from_the_assembly_and_the_send() -> None:
    assembly = _assembly()
    serialize = StageSpan("serialize", 31_500_000, 31_700_000)
    report = build_report(REQUEST, "support", assembly, serialize)
    assert report == AssemblyReport(
        request_id="req-9",
        model="gpt-4o",
        profile="support",
        started_ns=1_000_000,
        finished_ns=31_000_000,
        outcome=Outcome.DEGRADED,
        degradation=Degradation.HOT_ONLY,
        reasons=(Reason.COLD_TIMEOUT,),
        stages=(*TIMINGS.stages, serialize),
        sources=SOURCES_ANSWERED,
        candidates_evaluated=31,
        memories_available=9,
        memories_injected=1,
        directive_injected=True,
        tokens_injected=95,
        memory_budget=4000,  # the profile's cap: the window leaves more
        memory_tokens_used=55,
        encoding="o200k_base",
        exact_tokens=True,
    )
    assert report.duration_seconds == 0.030
    # A send that did not finish has no serialize stage; the rest is the same.
    assert build_report(REQUEST, "support", assembly, None).stages == TIMINGS.stages


def test_a_call_answered_before_its_model_was_resolved_reports_no_encoding() -> None:
    # Shed, or out of time before the budget: no budget, nothing counted.
    report = build_report(REQUEST, "default", _assembly(budget=None, degradation=Degradation.PASS_THROUGH))
    assert (report.encoding, report.exact_tokens, report.memory_budget) == ("", True, 0)
    assert report.outcome is Outcome.FALLBACK


def test_the_report_cannot_be_changed_once_built() -> None:
    report = build_report(REQUEST, "default", _assembly())
    with pytest.raises(AttributeError):
        report.outcome = Outcome.FULL  # type: ignore[misc]
    with pytest.raises(AttributeError):
        report.sources[0].status = SourceStatus.ERROR  # type: ignore[misc]
    with pytest.raises(AttributeError):
        report.stages[0].end_ns = 0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("degradation", "reasons", "outcome"),
    [
        (Degradation.FULL, (), Outcome.FULL),
        # FULL with a reason (a skipped-but-failed part): not everything went right.
        (Degradation.FULL, (Reason.LEXICAL_ERROR,), Outcome.DEGRADED),
        (Degradation.PARTIAL, (Reason.LEXICAL_TIMEOUT,), Outcome.DEGRADED),
        (Degradation.HOT_ONLY, (Reason.COLD_ERROR,), Outcome.DEGRADED),
        (Degradation.COLD_ONLY, (Reason.HOT_TIMEOUT,), Outcome.DEGRADED),
        (Degradation.DIRECTIVE_ONLY, (Reason.DEADLINE_EXCEEDED,), Outcome.FALLBACK),
        (Degradation.PASS_THROUGH, (Reason.OVERLOADED,), Outcome.FALLBACK),
    ],
)
def test_the_outcome_label_of_each_level(
    degradation: Degradation, reasons: tuple[Reason, ...], outcome: Outcome
) -> None:
    assert outcome_of(degradation, reasons) is outcome


def test_timings_sum_a_stage_per_name_and_span_retrieval_over_the_sources_only() -> None:
    twice = Timings(0, 5_000_000, (*TIMINGS.stages, StageSpan("score", 22_000_000, 22_100_000)))
    assert twice.stages_us() == {"budget": 100, "hot": 900, "cold": 20_000, "directive": 300, "score": 400}
    # From the first source's start (directive, 1.15 ms) to the last one's end (cold,
    # 21.3 ms); budget and score are not retrieval.
    assert TIMINGS.retrieval_us == 20_150
    assert TIMINGS.total_us == 30_000
    assert Timings(0, 0).retrieval_us == 0
