"""The compose step: the stores' answers in, the injected messages out, nothing else.

``compose`` is pure: the same input gives the same result, it does no I/O and reads
no clock, so these tests call it directly with plain values.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from ibex_context.candidates import Candidates
from ibex_context.models import ChatMessage, MemoryRecord, Source
from ibex_context.pipeline.budget import compute_budget
from ibex_context.pipeline.compose import ComposeInput, Composition, compose, directive_only
from ibex_context.pipeline.layout import stored_token_counts
from ibex_context.profiles.model import BudgetLimits, Profile
from ibex_context.tokens.catalogue import resolve_model
from ibex_context.tokens.counting import MessageTokenCounter
from ibex_context.tokens.encodings import EncodingRegistry

NOW = 1_790_000_000.0
NONCE = "3f9a1c0b7d2e4a68"
MESSAGES = (ChatMessage("system", "You are helpful."), ChatMessage("user", "When does the warehouse open?"))


def _memory(registry: EncodingRegistry, n: int, content: str, similarity: float) -> MemoryRecord:
    return MemoryRecord(
        id=f"00000000-0000-4000-8000-{n:012d}",
        content=content,
        category="factual",
        occurred_at=NOW - 86_400,
        token_counts=stored_token_counts(content, [registry.get("o200k_base")]),
        similarity=similarity,
        source=Source.COLD,
    )


def _run(
    registry: EncodingRegistry,
    candidates: list[MemoryRecord],
    *,
    profile: Profile | None = None,
    directive: str | None = "Be exact.",
) -> Composition:
    profile = profile or Profile()
    counter = MessageTokenCounter(registry)
    model = resolve_model("gpt-4o", profile.models)
    encoding = registry.get(model.encoding)
    messages_tokens = counter.count_messages(MESSAGES, encoding)
    budget = compute_budget(
        model, messages_tokens=messages_tokens, directive_tokens=0, limits=profile.budget, exact=True
    )
    return compose(
        ComposeInput(
            messages=MESSAGES,
            directive=directive,
            candidates=Candidates.from_records(candidates),
            query_embedding=np.ones(4, dtype=np.float32),
            lexical_searched=False,
            profile=profile,
            encoding=encoding,
            budget=budget,
            nonce=NONCE,
            now=NOW,
        ),
        counter,
    )


def test_injects_the_best_memories_in_rank_order_with_their_costs(registry: EncodingRegistry) -> None:
    candidates = [
        _memory(registry, 1, "The warehouse opens at six.", 0.9),
        _memory(registry, 2, "The office cat is called Miso.", 0.1),  # below the relevance floor
        _memory(registry, 3, "Deliveries arrive at the back door.", 0.5),
    ]
    result = _run(registry, candidates)
    assert [m.memory.id for m in result.memories] == [candidates[0].id, candidates[2].id]
    assert result.memories_available == 2
    assert all(m.tokens > 0 for m in result.memories)
    system = result.messages[0].content
    assert system.index("Be exact.") < system.index("The warehouse opens at six.")
    assert "Miso" not in system
    assert result.messages[1:] == MESSAGES


def test_each_memory_carries_the_handle_its_block_has_in_the_text(registry: EncodingRegistry) -> None:
    candidates = [
        _memory(registry, 1, "The warehouse opens at six.", 0.9),
        replace(_memory(registry, 2, "Always lock the dock.", 0.7), category="procedural"),
        _memory(registry, 3, "Deliveries arrive at the back door.", 0.5),
    ]
    result = _run(registry, candidates)
    # Rank order (factual 0.9, procedural 0.7, factual 0.5); the text groups by category,
    # procedural first, so the handles follow the text, not the rank.
    assert [m.memory.id for m in result.memories] == [c.id for c in candidates]
    assert result.handles == (2, 1, 3)
    text = result.messages[0].content
    for memory, handle in zip(result.memories, result.handles, strict=True):
        assert f'<memory id="{handle}">\n{memory.memory.content}\n</memory>' in text


def test_the_injected_count_is_exact(registry: EncodingRegistry) -> None:
    candidates = [
        _memory(registry, n, f"Fact number {n} about the warehouse & <dock>.", 0.9 - n / 100)
        for n in range(8)
    ]
    result = _run(registry, candidates)
    encoding = registry.get("o200k_base")
    recount = MessageTokenCounter(registry, cache_size=0)
    added = recount.count_messages(result.messages, encoding) - recount.count_messages(MESSAGES, encoding)
    assert result.tokens_injected == added
    assert result.memory_tokens <= result.budget.memory_budget


def test_a_tight_budget_keeps_the_best_memory_that_fits_not_several_weaker_ones(
    registry: EncodingRegistry,
) -> None:
    # ~100 tokens: it fits the budget only if nothing weaker is taken before it.
    long_best = _memory(registry, 1, "The warehouse opens at six " + "and stays open late " * 24 + ".", 0.95)
    short_weak = [_memory(registry, 10 + n, f"Note {n}.", 0.3) for n in range(30)]
    profile = Profile(budget=BudgetLimits(max_memory_tokens=250))
    result = _run(registry, [*short_weak, long_best], profile=profile)
    assert result.memories[0].memory.id == long_best.id
    assert result.memories[0].tokens > 100
    assert result.was_truncated  # some weak notes did not fit after it


def test_a_directive_that_leaves_no_room_for_the_answer_injects_nothing(registry: EncodingRegistry) -> None:
    huge = "Follow the rules. " * 40_000
    result = _run(registry, [_memory(registry, 1, "The warehouse opens at six.", 0.9)], directive=huge)
    assert result.directive_exceeds_window
    assert result.memories == ()
    assert result.messages == MESSAGES


def test_the_same_input_composes_the_same_result(registry: EncodingRegistry) -> None:
    candidates = [_memory(registry, n, f"Fact {n} about the dock.", 0.8 - n / 50) for n in range(5)]
    first, second = _run(registry, candidates), _run(registry, candidates)
    assert first.messages == second.messages
    assert [m.memory.id for m in first.memories] == [m.memory.id for m in second.memories]


def test_the_directive_alone_is_laid_out_counted_and_reserved_in_the_budget(
    registry: EncodingRegistry,
) -> None:
    profile, counter = Profile(), MessageTokenCounter(registry)
    model = resolve_model("gpt-4o", profile.models)
    encoding = registry.get(model.encoding)
    before = compute_budget(
        model,
        messages_tokens=counter.count_messages(MESSAGES, encoding),
        directive_tokens=0,
        limits=profile.budget,
        exact=True,
    )
    alone = directive_only(
        MESSAGES, "Be exact.", profile=profile, nonce=NONCE, encoding=encoding, budget=before, counter=counter
    )
    messages = alone.injection.messages(MESSAGES)
    assert "Be exact." in messages[0].content and alone.injection.handles == {}
    recount = MessageTokenCounter(registry, cache_size=0)
    assert alone.tokens == recount.count_messages(messages, encoding) - recount.count_messages(
        MESSAGES, encoding
    )
    assert alone.budget.directive_tokens == alone.tokens
    assert alone.budget.window_remaining == before.window_remaining - alone.tokens


def test_no_directive_lays_out_nothing_and_reserves_nothing(registry: EncodingRegistry) -> None:
    profile, counter = Profile(), MessageTokenCounter(registry)
    model = resolve_model("gpt-4o", profile.models)
    before = compute_budget(model, messages_tokens=50, directive_tokens=0, limits=profile.budget, exact=True)
    alone = directive_only(
        MESSAGES,
        None,
        profile=profile,
        nonce=NONCE,
        encoding=registry.get(model.encoding),
        budget=before,
        counter=counter,
    )
    assert alone.injection.messages(MESSAGES) == MESSAGES
    assert alone.tokens == 0 and alone.budget == before
