from __future__ import annotations

import uuid
from collections.abc import Sequence

import numpy as np
from ibex_context.models import MemoryRecord, ScoredMemory
from ibex_context.pipeline.layout import format_context
from ibex_context.tokens.counting import MessageTokenCounter
from ibex_context.tokens.encodings import EncodingRegistry

from benchmarks.quality.baselines import (
    ContentCost,
    InjectionCost,
    cosine_ranking,
    memory_records,
    pack,
    rrf_ranking,
    score_ranking,
)


class _Costs:
    def __init__(self, blocks: Sequence[int], framing: int = 0) -> None:
        self._blocks, self._framing = list(blocks), framing

    def framing(self) -> int:
        return self._framing

    def block(self, index: int) -> int:
        return self._blocks[index]

    def smallest_block(self) -> int:
        return min(self._blocks)

    def exact(self, indices: Sequence[int]) -> int:
        return self._framing + sum(self._blocks[i] for i in indices)


def test_rrf_rewards_agreement_between_rankings() -> None:
    cosine = np.array([0, 1, 2, 3])
    lexical = np.array([2, 0])

    fused = rrf_ranking([cosine, lexical], 5)

    # 0: 1/61 + 1/62; 2: 1/63 + 1/61; 1: 1/62; 3: 1/64; 4 in neither: left out.
    assert fused.tolist() == [0, 2, 1, 3]


def test_rankings_order_by_score_and_leave_out_zero_scores() -> None:
    memories = np.eye(3, dtype=np.float32)
    query = np.array([0.1, 0.9, 0.4], dtype=np.float32)
    assert cosine_ranking(query, memories).tolist() == [1, 2, 0]
    assert score_ranking(np.array([0.0, 2.0, 0.5, 0.0], dtype=np.float32)).tolist() == [1, 2]


def test_packing_skips_what_does_not_fit_and_stops_at_the_cap() -> None:
    costs = _Costs([50, 500, 30, 40, 10], framing=20)

    assert pack([0, 1, 2, 3, 4], costs, budget=145, max_items=10).indices == (0, 2, 3)
    assert pack([0, 1, 2, 3, 4], costs, budget=150, max_items=10).indices == (0, 2, 3, 4)
    assert pack([0, 1, 2, 3, 4], costs, budget=150, max_items=2).indices == (0, 2)
    assert pack([1], costs, budget=100, max_items=10).indices == ()
    assert pack([0, 2], costs, budget=150, max_items=10).tokens == 100


def test_injection_cost_is_what_the_service_formatter_adds(encodings: EncodingRegistry) -> None:
    counter = MessageTokenCounter(encodings)
    encoding = encodings.get("o200k_base")
    contents = ["Ada: I adopted a cat.", "Ben: I run <fast> & far.", "Ada: Pixel opens doors now, every one."]
    records = memory_records([str(uuid.uuid4()) for _ in contents], contents, "episodic")
    costs = InjectionCost(records, encoding, counter, nonce="0123456789abcdef")

    chosen = [2, 0]
    formatted = format_context(
        [],
        directive=None,
        memories=[_scored(records[i]) for i in chosen],
        fmt="xml",
        mode="system_first",
        nonce="0123456789abcdef",
    )
    rendered = counter.count_messages(formatted.messages, encoding) - counter.count_messages([], encoding)
    assert costs.exact(chosen) == rendered
    # Framing is paid once: the additive estimate matches the exact count.
    assert costs.framing() + costs.block(2) + costs.block(0) == rendered
    assert costs.framing() > 0
    assert ContentCost(contents, encoding).exact(chosen) < rendered


def _scored(record: MemoryRecord) -> ScoredMemory:
    return ScoredMemory(record, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
