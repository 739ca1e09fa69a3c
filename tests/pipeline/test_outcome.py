"""The vocabulary of a call's outcome (``pipeline/outcome.py``): which reason a source's
ending gives, how reasons are ordered, which outcome label a degradation gets, and the
timings' arithmetic."""

from __future__ import annotations

import pytest
from ibex_context.models import Degradation
from ibex_context.pipeline.outcome import (
    SOURCES,
    STAGES,
    Outcome,
    Reason,
    SourceName,
    SourceStatus,
    StageSpan,
    Timings,
    outcome_of,
    plan_detail,
    plan_of,
    rewalked,
)


@pytest.mark.parametrize("source", list(SourceName))
def test_a_source_that_timed_out_or_failed_names_itself_and_one_that_answered_gives_no_reason(
    source: SourceName,
) -> None:
    timeout = Reason.of_source(source, SourceStatus.TIMEOUT)
    error = Reason.of_source(source, SourceStatus.ERROR)
    assert timeout is not None and timeout.value == f"{source.value}_timeout"
    assert error is not None and error.value == f"{source.value}_error"
    assert timeout.source is source and error.source is source
    assert Reason.of_source(source, SourceStatus.OK) is None
    assert Reason.of_source(source, SourceStatus.SKIPPED) is None


def test_reasons_of_the_whole_call_name_no_source_and_come_first() -> None:
    assert Reason.DEADLINE_EXCEEDED.source is None and Reason.OVERLOADED.source is None
    ordered = Reason.ordered([Reason.LEXICAL_TIMEOUT, Reason.HOT_ERROR, Reason.DEADLINE_EXCEEDED])
    assert ordered == [Reason.DEADLINE_EXCEEDED, Reason.HOT_ERROR, Reason.LEXICAL_TIMEOUT]


@pytest.mark.parametrize(
    ("degradation", "reasons", "outcome"),
    [
        (Degradation.FULL, (), Outcome.FULL),
        (Degradation.FULL, (Reason.LEXICAL_TIMEOUT,), Outcome.DEGRADED),
        (Degradation.PARTIAL, (Reason.COLD_TIMEOUT,), Outcome.DEGRADED),
        (Degradation.HOT_ONLY, (Reason.COLD_ERROR,), Outcome.DEGRADED),
        (Degradation.COLD_ONLY, (Reason.HOT_TIMEOUT,), Outcome.DEGRADED),
        (Degradation.DIRECTIVE_ONLY, (Reason.ASSEMBLY_ERROR,), Outcome.FALLBACK),
        (Degradation.PASS_THROUGH, (Reason.OVERLOADED,), Outcome.FALLBACK),
    ],
)
def test_the_outcome_label_of_each_degradation(
    degradation: Degradation, reasons: tuple[Reason, ...], outcome: Outcome
) -> None:
    assert outcome_of(degradation, reasons) is outcome


def test_the_plan_travels_in_the_cold_source_detail_and_back() -> None:
    assert plan_of(plan_detail("agent_halfvec")) == "agent_halfvec"
    assert plan_of("") is None and plan_of("timed out after 35 ms") is None


def test_a_repeated_walk_is_said_in_the_detail_and_keeps_its_plan() -> None:
    detail = plan_detail("agent_halfvec", rewalked=True)
    assert detail == "plan: agent_halfvec, walked again wider"
    assert plan_of(detail) == "agent_halfvec" and rewalked(detail)
    assert not rewalked(plan_detail("agent_halfvec")) and not rewalked("walked again wider")


def test_timings_sum_a_repeated_stage_and_span_the_sources() -> None:
    timings = Timings(
        started_ns=1_000_000,
        finished_ns=9_000_000,
        stages=(
            StageSpan("budget", 1_000_000, 1_500_000),
            StageSpan("hot", 2_000_000, 4_000_000),
            StageSpan("cold", 3_000_000, 7_000_000),
            StageSpan("format", 7_000_000, 7_200_000),
            StageSpan("format", 8_000_000, 8_300_000),  # laid out again after an exact count
        ),
    )
    assert timings.total_us == 8_000
    assert timings.stages_us() == {"budget": 500, "hot": 2_000, "cold": 4_000, "format": 500}
    assert timings.retrieval_us == 5_000  # the first source's start to the last one's end
    assert Timings(5, 3).total_us == 0 and Timings(0, 10).retrieval_us == 0


def test_every_source_is_a_stage() -> None:
    assert set(SOURCES) <= set(STAGES)
