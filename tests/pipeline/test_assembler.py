"""The assembler's contract with its caller: whatever breaks inside, it answers.

The stores here are small in-memory implementations of the narrow interfaces in
``stores.base``; the real ones are exercised end to end in ``tests/server``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

import numpy as np
from ibex_context.candidates import Candidates
from ibex_context.embedding.cache import CachedEmbedder
from ibex_context.embedding.hashing import HashingEmbedder
from ibex_context.models import (
    AssemblyRequest,
    ChatMessage,
    Degradation,
    Directive,
    FloatVector,
    MemoryRecord,
    Source,
)
from ibex_context.pipeline.assembler import Assembler, AssemblerConfig
from ibex_context.pipeline.deadlines import CallDeadlines, DeadlinePolicy
from ibex_context.pipeline.outcome import Reason, SourceName, SourceStatus
from ibex_context.pipeline.retrieval import Retriever
from ibex_context.profiles.model import BudgetLimits, Deadlines, Profile, Scoring, ScoringWeights
from ibex_context.tokens.counting import MessageTokenCounter
from ibex_context.tokens.encodings import EncodingRegistry

ORG = "0b6f7a4e-8f1c-4b53-9a51-5b1a3c7c2d01"
AGENT = "5d2e9c1a-3b4f-4e6a-8c7d-9f0a1b2c3d11"


class _Directives:
    async def get_directive(self, org_id: str, agent_id: str) -> Directive | None:
        return Directive("Be exact.")


class _Hot:
    def __init__(self, embedding: FloatVector, delay: float = 0.0) -> None:
        self._embedding = embedding
        self._delay = delay

    async def get_hot_memories(self, org_id: str, agent_id: str, limit: int) -> Candidates:
        await asyncio.sleep(self._delay)
        return Candidates.from_records(
            [
                MemoryRecord(
                    id="7c1d2e3f-4a5b-4c6d-8e9f-0a1b2c3d4e02",
                    content="The warehouse opens at six.",
                    category="factual",
                    embedding=self._embedding,
                )
            ],
            Source.HOT,
        )


class _Cold:
    def __init__(self, delay: float = 0.0) -> None:
        self._delay = delay
        self.limits: dict[str, int] = {}

    async def search(self, org_id: str, agent_id: str, embedding: FloatVector, limit: int) -> Candidates:
        self.limits["vector"] = limit
        await asyncio.sleep(self._delay)
        return Candidates.empty()

    async def search_lexical(self, org_id: str, agent_id: str, query: str, limit: int) -> Candidates:
        self.limits["lexical"] = limit
        await asyncio.sleep(self._delay)
        return Candidates.empty()


async def _assembler(
    *,
    hot_delay: float = 0.0,
    cold_delay: float = 0.0,
    cold: _Cold | None = None,
    counting_executor: Executor | None = None,
) -> Assembler:
    embedder = HashingEmbedder(384)
    (vector,) = await embedder.embed(["The warehouse opens at six."])
    encodings = EncodingRegistry()
    # As the service does at start-up: loading a BPE file takes up to a second.
    encodings.preload(["o200k_base", "cl100k_base"])
    return Assembler(
        retriever=Retriever(
            directives=_Directives(),
            hot_memories=_Hot(np.asarray(vector), hot_delay),
            cold_memories=cold or _Cold(cold_delay),
            embedder=embedder,
        ),
        encodings=encodings,
        message_counter=MessageTokenCounter(encodings),
        config=AssemblerConfig(hot_limit=20, cold_limit=50, query_max_chars=2000, nonce_secret=b"s"),
        counting_executor=counting_executor,
    )


def within(budget: float, profile: Profile) -> CallDeadlines:
    """A call given ``budget`` seconds outright, the profile's source timeouts inside it."""
    return DeadlinePolicy().within(budget, profile.deadlines)


REQUEST = AssemblyRequest(
    org_id=ORG,
    agent_id=AGENT,
    session_id="",
    model="gpt-4o",
    request_id="r",
    messages=(ChatMessage("user", "when does the warehouse open?"),),
)


async def test_a_healthy_assembly_injects_directive_and_memory() -> None:
    assembly = await (await _assembler()).assemble(REQUEST, Profile(), within(1.0, Profile()))
    assert assembly.degradation is Degradation.FULL
    assert assembly.composed.directive_injected and len(assembly.memories) == 1
    assert assembly.messages[-1] == REQUEST.messages[-1]


async def test_searches_ask_for_at_least_as_many_memories_as_the_profile_may_inject() -> None:
    cold = _Cold()
    assembler = await _assembler(cold=cold)
    await assembler.assemble(REQUEST, Profile(), within(1.0, Profile()))
    assert cold.limits == {"vector": 50, "lexical": 50}  # the configured limits
    wide = Profile(budget=BudgetLimits(max_memories=100))
    await assembler.assemble(REQUEST, wide, within(1.0, wide))
    assert cold.limits == {"vector": 100, "lexical": 100}


async def test_an_exception_inside_assembly_degrades_to_the_fetched_directive() -> None:
    # All-zero weights cannot be scored: the kind of bug that must not fail the LLM call.
    # (Validation makes them impossible to build; model_construct skips it, as a bug would.)
    zero = ScoringWeights.model_construct(relevance=0, recency=0, usefulness=0, confidence=0, frequency=0)
    broken = Profile(scoring=Scoring.model_construct(weights=zero))
    assembly = await (await _assembler()).assemble(REQUEST, broken, within(1.0, broken))
    assert assembly.reasons[0] == "assembly_error"
    assert assembly.degradation is Degradation.DIRECTIVE_ONLY
    assert assembly.composed.directive_injected and not assembly.memories
    assert "Be exact." in assembly.messages[0].content
    assert assembly.messages[-1] == REQUEST.messages[-1]


async def test_no_time_at_all_passes_the_messages_through() -> None:
    assembly = await (await _assembler()).assemble(REQUEST, Profile(), within(0.0, Profile()))
    assert assembly.degradation is Degradation.PASS_THROUGH
    assert assembly.reasons[0] == "deadline_exceeded"
    assert assembly.messages == REQUEST.messages


# Deadlines of 50 ms for the hot set, 400 ms for the cold search: wide enough apart
# that a loaded test machine cannot blur which one came first.
# Beyond the bounds a profile may set (45 ms): built without validation, for the test only.
SPREAD = Profile(
    deadlines=Deadlines.model_construct(assembly_ms=900, directive_ms=50, hot_ms=50, cold_ms=400)
)


async def test_a_hot_set_answering_after_its_timeout_is_used_while_the_cold_search_runs() -> None:
    assembler = await _assembler(hot_delay=0.15, cold_delay=0.3)
    assembly = await assembler.assemble(REQUEST, SPREAD, within(1.0, SPREAD))
    # Waiting for the cold search kept the call open past the hot set's 50 ms: its
    # answer is used, not thrown away.
    assert assembly.degradation is Degradation.FULL and assembly.reasons == ()
    assert len(assembly.memories) == 1


async def test_the_call_stops_waiting_for_a_late_source_once_nothing_else_keeps_it() -> None:
    # The hot set would answer at 600 ms, inside the call's 900: the call still stops
    # at the hot set's own 50 ms once the other sources are done.
    assembler = await _assembler(hot_delay=0.6)
    assembly = await assembler.assemble(REQUEST, SPREAD, within(1.0, SPREAD))
    assert assembly.reasons == ("hot_timeout",)
    # The cold search answered: COLD_ONLY names what was used.
    assert assembly.degradation is Degradation.COLD_ONLY and assembly.composed.directive_injected


async def test_an_assembly_carries_every_sources_outcome_and_its_stages_timings() -> None:
    assembly = await (await _assembler()).assemble(REQUEST, Profile(), within(1.0, Profile()))
    assert [s.source for s in assembly.sources] == list(SourceName)
    assert {s.status for s in assembly.sources} == {SourceStatus.OK}
    assert assembly.candidates_evaluated == 1
    timings = assembly.timings
    assert {s.stage for s in timings.stages} == {"budget", *SourceName, "score", "pack", "format"}
    assert all(timings.started_ns <= s.start_ns <= s.end_ns <= timings.finished_ns for s in timings.stages)


async def test_a_shed_call_fetches_nothing_and_reports_only_why() -> None:
    assembly = (await _assembler()).shed(REQUEST, Profile(), Reason.OVERLOADED)
    assert assembly.degradation is Degradation.PASS_THROUGH and assembly.reasons == (Reason.OVERLOADED,)
    assert assembly.messages == REQUEST.messages
    assert assembly.sources == () and assembly.timings.stages == () and assembly.budget is None


class _Recording:
    """Stores and a threaded embedder that note, in one list, when each was asked."""

    def __init__(self, embedding: FloatVector) -> None:
        self.events: list[str] = []
        self._embedder = HashingEmbedder(384)
        self._hot = _Hot(embedding)
        self._executor = ThreadPoolExecutor(max_workers=1)

    name = "recording"
    dim = 384

    def submit_queries(self, texts: Sequence[str], *, tenant: str = "") -> Future[list[FloatVector]]:
        self.events.append("embed")
        return self._executor.submit(lambda: [self._embedder.embed_one(t) for t in texts])

    async def embed(self, texts: Sequence[str]) -> list[FloatVector]:
        return await asyncio.wrap_future(self.submit_queries(texts))

    async def aclose(self) -> None:
        self._executor.shutdown(wait=True)

    async def get_directive(self, org_id: str, agent_id: str) -> Directive | None:
        self.events.append("directive")
        return Directive("Be exact.")

    async def get_hot_memories(self, org_id: str, agent_id: str, limit: int) -> Candidates:
        self.events.append("hot")
        return await self._hot.get_hot_memories(org_id, agent_id, limit)

    async def search(self, org_id: str, agent_id: str, embedding: FloatVector, limit: int) -> Candidates:
        self.events.append("vector")
        return Candidates.empty()

    async def search_lexical(self, org_id: str, agent_id: str, query: str, limit: int) -> Candidates:
        self.events.append("lexical")
        return Candidates.empty()


async def test_the_query_embedding_starts_before_any_store_is_asked_and_is_reused_by_the_next_call() -> None:
    (vector,) = await HashingEmbedder(384).embed(["The warehouse opens at six."])
    recording = _Recording(np.asarray(vector))
    query_cache = CachedEmbedder(recording, max_entries=10)
    encodings = EncodingRegistry()
    encodings.preload(["o200k_base", "cl100k_base"])
    assembler = Assembler(
        retriever=Retriever(
            directives=recording, hot_memories=recording, cold_memories=recording, embedder=query_cache
        ),
        encodings=encodings,
        message_counter=MessageTokenCounter(encodings),
        config=AssemblerConfig(hot_limit=20, cold_limit=50, query_max_chars=2000, nonce_secret=b"s"),
    )
    try:
        first = await assembler.assemble(REQUEST, Profile(), within(1.0, Profile()))
        assert recording.events[0] == "embed"
        assert set(recording.events) == {"embed", "directive", "hot", "vector", "lexical"}
        assert first.degradation is Degradation.FULL and first.memories[0].semantic > 0
        # The agent loop's next LLM call of the same turn: a tool result, the same user message.
        recording.events.clear()
        tool_call = dataclasses.replace(REQUEST, messages=(*REQUEST.messages, ChatMessage("tool", "{}")))
        second = await assembler.assemble(tool_call, Profile(), within(1.0, Profile()))
        assert "embed" not in recording.events and query_cache.counts() == (1, 0, 1)
        assert second.degradation is Degradation.FULL
    finally:
        await query_cache.aclose()


class _RecordingExecutor(ThreadPoolExecutor):
    """One worker thread that records what was handed to it."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.submitted = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


async def test_a_large_requests_messages_are_counted_off_the_loop_while_other_calls_go_on() -> None:
    """A fresh 400,000-character conversation used to be counted on the event loop, every
    other call waiting; it is counted on the counting thread, to the same exact count."""
    executor = _RecordingExecutor()
    assembler = await _assembler(counting_executor=executor)
    large = dataclasses.replace(
        REQUEST,
        messages=tuple(
            ChatMessage("user" if i % 2 == 0 else "assistant", f"turn {i} " + "warehouse shift rota " * 240)
            for i in range(80)
        )
        + REQUEST.messages,
    )
    assert sum(len(m.content) for m in large.messages) > 400_000
    # The counting thread is held busy: the large call must wait for it, off the loop.
    release = threading.Event()
    blocker = executor.submit(release.wait, 10)
    try:
        pending = asyncio.create_task(assembler.assemble(large, Profile(), within(10.0, Profile())))
        small = await assembler.assemble(REQUEST, Profile(), within(5.0, Profile()))
        assert small.degradation is Degradation.FULL and not pending.done()
        assert executor.submitted == 2  # the blocker and the large call; the small one counted inline
    finally:
        release.set()
    blocker.result(timeout=10)
    assembly = await pending
    assert assembly.composed.budget is not None
    exact = MessageTokenCounter(EncodingRegistry()).count_messages(
        large.messages, EncodingRegistry().get("o200k_base")
    )
    assert assembly.composed.budget.messages_tokens == exact
    executor.shutdown()
