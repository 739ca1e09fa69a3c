"""CachedEmbedder: an LRU by (model, sha256(org, normalised text)) that coalesces concurrent misses."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pytest
from ibex_context.embedding.cache import CachedEmbedder, normalise_query
from ibex_context.embedding.hashing import HashingEmbedder
from ibex_context.errors import EmbeddingError
from ibex_context.models import FloatVector


class CountingEmbedder:
    """A real (hashing) embedder that counts and can slow down its calls."""

    def __init__(self, delay: float = 0.0, name: str = "counting") -> None:
        self._inner = HashingEmbedder(16)
        self._delay = delay
        self._name = name
        self.calls: list[list[str]] = []

    @property
    def name(self) -> str:
        return self._name

    @property
    def dim(self) -> int:
        return 16

    async def embed(self, texts: Sequence[str]) -> list[FloatVector]:
        self.calls.append(list(texts))
        await asyncio.sleep(self._delay)
        return await self._inner.embed(texts)

    async def aclose(self) -> None:
        return None


async def test_a_repeated_text_is_embedded_once() -> None:
    inner = CountingEmbedder()
    cache = CachedEmbedder(inner, max_entries=10)
    first = await cache.embed(["hello"])
    second = await cache.embed(["hello", "world"])
    assert inner.calls == [["hello"], ["world"]]
    np.testing.assert_array_equal(first[0], second[0])
    assert (cache.hits, cache.misses) == (1, 2)


async def test_the_least_recently_used_entry_is_evicted() -> None:
    inner = CountingEmbedder()
    cache = CachedEmbedder(inner, max_entries=2)
    await cache.embed(["a"])
    await cache.embed(["b"])
    await cache.embed(["a"])  # a is now the most recent
    await cache.embed(["c"])  # evicts b
    inner.calls.clear()
    await cache.embed(["a", "b"])
    assert inner.calls == [["b"]] and len(cache) == 2


async def test_a_full_cache_evicts_from_the_org_holding_most_so_a_flood_evicts_its_own() -> None:
    inner = CountingEmbedder()
    cache = CachedEmbedder(inner, max_entries=4)
    await cache.embed(["quiet one", "quiet two"], org_id="org-b")
    for i in range(20):  # org A's flood of new questions
        await cache.embed([f"flood {i}"], org_id="org-a")
    assert len(cache) == 4
    inner.calls.clear()
    await cache.embed(["quiet one", "quiet two"], org_id="org-b")
    await cache.embed(["flood 19", "flood 18"], org_id="org-a")
    assert inner.calls == []  # org B's two entries kept; org A kept its two newest


async def test_concurrent_misses_for_the_same_text_share_one_call() -> None:
    inner = CountingEmbedder(delay=0.05)
    cache = CachedEmbedder(inner, max_entries=10)
    results = await asyncio.gather(*(cache.embed(["same query"]) for _ in range(5)))
    assert inner.calls == [["same query"]]
    assert all(np.array_equal(r[0], results[0][0]) for r in results)


async def test_a_cancelled_caller_does_not_cancel_the_others_nor_lose_the_result() -> None:
    inner = CountingEmbedder(delay=0.05)
    cache = CachedEmbedder(inner, max_entries=10)
    impatient = asyncio.create_task(cache.embed(["q"]))
    await asyncio.sleep(0.01)
    patient = asyncio.create_task(cache.embed(["q"]))
    await asyncio.sleep(0.01)
    impatient.cancel()
    [vector] = await patient
    assert vector.shape == (16,)
    with pytest.raises(asyncio.CancelledError):
        await impatient
    await cache.embed(["q"])
    assert inner.calls == [["q"]]


async def test_entries_are_per_model_and_read_only() -> None:
    a, b = CountingEmbedder(name="model-a"), CountingEmbedder(name="model-b")
    [from_a] = await CachedEmbedder(a, 10).embed(["x"])
    await CachedEmbedder(b, 10).embed(["x"])
    assert len(a.calls) == len(b.calls) == 1
    with pytest.raises(ValueError):
        from_a[0] = 1.0


class ThreadedCountingEmbedder(CountingEmbedder):
    """A real (hashing) embedder run in a worker thread, like minilm: ``submit_queries`` hands it over."""

    def __init__(self) -> None:
        super().__init__()
        self.submitted: list[list[str]] = []
        self.tenants: list[str] = []
        self._executor = ThreadPoolExecutor(max_workers=1)

    def submit_queries(self, texts: Sequence[str], *, tenant: str = "") -> Future[list[FloatVector]]:
        self.submitted.append(list(texts))
        self.tenants.append(tenant)
        return self._executor.submit(lambda: [self._inner.embed_one(t) for t in texts])

    async def aclose(self) -> None:
        self._executor.shutdown(wait=True)


async def test_texts_differing_only_in_whitespace_share_one_embedding() -> None:
    inner = CountingEmbedder()
    cache = CachedEmbedder(inner, max_entries=10)
    [a] = await cache.embed(["  what did I say\nabout   my dog? "])
    [b] = await cache.embed(["what did I say about my dog?"])
    assert inner.calls == [["what did I say about my dog?"]]  # the normalised text is embedded
    np.testing.assert_array_equal(a, b)
    assert normalise_query(" a\t b \n") == "a b"


async def test_an_agent_loop_embeds_its_turns_query_once() -> None:
    """A user turn, then tool calls re-sending the same last user message: one embedding."""
    inner = CountingEmbedder()
    cache = CachedEmbedder(inner, max_entries=100)
    tool_calls = [0, 3, 8, 1]
    for turn, calls in enumerate(tool_calls):
        for _ in range(1 + calls):
            await cache.begin(f"turn {turn}: find the invoice and file it")
    assert len(inner.calls) == len(tool_calls)
    assert cache.counts() == (sum(tool_calls), 0, len(tool_calls))


async def test_begin_hands_a_threaded_embedder_its_work_before_the_loop_turns() -> None:
    inner = ThreadedCountingEmbedder()
    cache = CachedEmbedder(inner, max_entries=10)
    try:
        pending = cache.begin("the query")
        assert inner.submitted == [["the query"]]  # no await in between
        joined = cache.begin("the query")
        assert joined is pending and cache.counts() == (0, 1, 1)
        vector = await asyncio.shield(pending)
        [again] = await cache.embed(["the query"])
        assert again is vector and cache.counts() == (1, 1, 1)
    finally:
        await cache.aclose()


async def test_a_threaded_embedder_is_told_whose_queries_it_gets() -> None:
    # The embedding queue takes orgs in turns (embedding.batching).
    inner = ThreadedCountingEmbedder()
    cache = CachedEmbedder(inner, max_entries=10)
    try:
        await asyncio.shield(cache.begin("a question", org_id="org-a"))
        await cache.embed(["another question"], org_id="org-b")
        assert inner.tenants == ["org-a", "org-b"]
    finally:
        await cache.aclose()


async def test_a_failed_embedding_reaches_its_waiters_and_is_not_cached() -> None:
    class Failing(CountingEmbedder):
        async def embed(self, texts: Sequence[str]) -> list[FloatVector]:
            self.calls.append(list(texts))
            raise EmbeddingError("down")

    inner = Failing()
    cache = CachedEmbedder(inner, max_entries=10)
    with pytest.raises(EmbeddingError):
        await cache.embed(["q"])
    with pytest.raises(EmbeddingError):
        await asyncio.shield(cache.begin("q"))
    assert len(inner.calls) == 2 and len(cache) == 0


async def test_entries_are_per_org_neither_cached_nor_shared_in_flight_across_orgs() -> None:
    """Org B's call of org A's exact text is embedded for B (a miss, taking an embedding's
    time), whether A's is cached or still in flight: the time tells B nothing of A."""
    inner = CountingEmbedder(delay=0.02)
    cache = CachedEmbedder(inner, max_entries=10)
    await cache.embed(["the merger closes friday"], org_id="org-a")
    await cache.embed(["the merger closes friday"], org_id="org-b")
    assert inner.calls == [["the merger closes friday"]] * 2
    assert (cache.hits, cache.shared, cache.misses) == (0, 0, 2)
    pending_a = cache.begin("in flight", org_id="org-a")
    pending_b = cache.begin("in flight", org_id="org-b")
    assert pending_a is not pending_b
    await asyncio.gather(pending_a, pending_b)
    assert cache.shared == 0
    await cache.embed(["the merger closes friday"], org_id="org-b")
    assert cache.hits == 1
