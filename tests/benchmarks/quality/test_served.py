"""What the service served, as a user's request gets it: levels, reasons, round trips."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.quality.__main__ import parse_args
from benchmarks.quality.ask import SERVED_DEADLINE_SECONDS
from benchmarks.quality.budgets import parse_budgets
from benchmarks.quality.metrics import outcome
from benchmarks.quality.report import Setup, _served_section, markdown
from benchmarks.quality.run import SERVICE, BudgetRun, served_over
from benchmarks.quality.served import FULL, level_name, served


def test_levels_are_named_shortly_and_a_call_without_an_answer_says_why() -> None:
    assert level_name("DEGRADATION_LEVEL_FULL") == FULL == "FULL"
    assert level_name("DEGRADATION_LEVEL_PARTIAL") == "PARTIAL"
    assert level_name("deadline_exceeded") == "no answer (deadline_exceeded)"
    assert level_name("") == "no answer (unknown)"


def test_the_full_share_counts_only_full_answers_and_round_trips_are_nearest_rank() -> None:
    levels = Counter({"FULL": 97, "PARTIAL": 2, "no answer (deadline_exceeded)": 1})
    figures = served(levels, Counter({"embed_timeout": 2, "deadline_exceeded": 1}), [*range(1, 101)])
    assert figures.answers == 100
    assert figures.full_share == pytest.approx(0.97)
    assert (figures.p50_ms, figures.p99_ms, figures.max_ms) == (50, 99, 100)
    assert list(figures.reasons) == ["embed_timeout", "deadline_exceeded"]  # most common first


def test_no_answers_give_no_round_trips_and_no_full_share() -> None:
    figures = served(Counter(), Counter(), [])
    assert (figures.answers, figures.full_share, figures.p99_ms) == (0, 0.0, None)


def run_with(label: str, answers: list[tuple[str, tuple[str, ...], float]]) -> BudgetRun:
    [budget] = parse_budgets(label)
    run = BudgetRun(budget)
    for i, (level, reasons, ms) in enumerate(answers):
        run.levels[level] += 1
        run.reasons.update(reasons)
        run.outcomes[SERVICE].append(
            outcome(
                conversation="c", question=i, category=4, evidence=[1], injected=[1], tokens=10, latency_ms=ms
            )
        )
    return run


def test_budgets_are_pooled_answer_by_answer() -> None:
    a = run_with("1000", [("FULL", (), 10.0), ("PARTIAL", ("embed_timeout",), 44.0)])
    b = run_with("default", [("FULL", (), 12.0), ("FULL", (), 11.0)])
    pooled = served_over([a, b])
    assert pooled.answers == 4
    assert pooled.levels == {"FULL": 3, "PARTIAL": 1}
    assert pooled.reasons == {"embed_timeout": 1}
    assert pooled.max_ms == 44.0


def setup(*, warm: bool) -> Setup:
    return Setup(
        data_path="d.json", data_sha256="0" * 64, conversations=[], duplicate_turns=0, embedder="e",
        memory_embeddings="m", machine="2 CPUs", started_utc="2026-11-28 12:00 UTC", seconds=1.0,
        service="s", command="python -m benchmarks.quality", warm=warm, fresh_service_per_budget=not warm,
    )  # fmt: skip


def test_the_report_leads_with_what_was_served_and_says_how_it_was_asked() -> None:
    runs = [run_with("1000", [("FULL", (), 10.0), ("PARTIAL", ("embed_timeout",), 44.0)])]
    cold = markdown(setup(warm=False), runs)
    assert cold.index("## As served (cold, under 45 ms)") < cold.index("## Summary")
    assert "| 1,000 tokens, at most 20 memories | 2 | 50.0 % | FULL 1, PARTIAL 1 | embed_timeout 1 |" in cold
    assert "asked once, cold" in cold and "a new service process per budget" in cold
    warm = markdown(setup(warm=True), runs)
    assert "## As served (warm" in warm and "WARM mode" in warm and "not what users are served" in warm
    assert _served_section(setup(warm=False), runs)[-2].startswith("| all budgets | 2 |")


def test_questions_are_asked_cold_under_the_proxys_deadline_unless_warm_is_asked_for() -> None:
    assert parse_args([]).warm is False
    assert parse_args(["--warm"]).warm is True
    assert SERVED_DEADLINE_SECONDS == 0.045
