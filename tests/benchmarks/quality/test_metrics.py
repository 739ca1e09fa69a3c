from __future__ import annotations

import math

import pytest

from benchmarks.quality.metrics import concentration, outcome, percentile, summarise


def test_recall_is_micro_and_macro_averaged_and_full_hits_counted() -> None:
    outcomes = [
        outcome(conversation="c", question=0, category=1, evidence=[1, 2, 3, 4], injected=[1, 9], tokens=100),
        outcome(conversation="c", question=1, category=4, evidence=[5], injected=[5, 6, 7], tokens=300),
    ]

    s = summarise(outcomes)

    assert s.evidence_turns == 5
    assert s.recall_micro == pytest.approx(2 / 5)  # 1 of 4 and 1 of 1
    assert s.recall_macro == pytest.approx((1 / 4 + 1) / 2)
    assert s.full_hit == pytest.approx(1 / 2)
    assert s.mean_injected == pytest.approx(2.5)
    assert s.mean_tokens == pytest.approx(200)
    assert s.latency_p50_ms is None


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile([7.0], 99) == 7


def test_concentration_is_the_top_memories_share_averaged_over_conversations() -> None:
    # Conversation a: memory 1 in every answer; b: all different.
    a = [
        outcome(conversation="a", question=i, category=1, evidence=[0], injected=[1, 100 + i], tokens=0)
        for i in range(20)
    ]
    b = [
        outcome(conversation="b", question=i, category=1, evidence=[0], injected=[i], tokens=0)
        for i in range(20)
    ]

    share_a = (20 + 9) / 40  # memory 1 (20 slots) and nine others (1 each)
    share_b = 10 / 20
    assert concentration(a + b) == pytest.approx((share_a + share_b) / 2)
    assert concentration(a, top=1) == pytest.approx(0.5)
    assert math.isnan(concentration([]))
