"""How the retrieval tasks record each source's outcome, whoever stops them."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence

import numpy as np
from ibex_context.candidates import Candidates
from ibex_context.embedding.cache import CachedEmbedder
from ibex_context.embedding.hashing import HashingEmbedder
from ibex_context.errors import EmbeddingError, QueryExpired, StoreError, StoreUnavailable
from ibex_context.models import Directive, FloatVector, MemoryRecord
from ibex_context.pipeline.deadlines import RetrievalDeadlines
from ibex_context.pipeline.outcome import STAND_IN_DETAIL, SourceStatus, plan_detail
from ibex_context.pipeline.retrieval import (
    RetrievalPlan,
    RetrievalState,
    Retriever,
    StandIn,
    wait_for_sources,
)
from ibex_context.stores.cold_plan import ColdMatches, ColdPlan

ORG = "0b6f7a4e-8f1c-4b53-9a51-5b1a3c7c2d01"
AGENT = "5d2e9c1a-3b4f-4e6a-8c7d-9f0a1b2c3d11"


class _Directives:
    async def get_directive(self, org_id: str, agent_id: str) -> Directive | None:
        return None


class _Hot:
    async def get_hot_memories(self, org_id: str, agent_id: str, limit: int) -> Candidates:
        return Candidates.empty()


class _Cold:
    def __init__(self) -> None:
        self.searches = 0

        self.embeddings: list[FloatVector] = []
        self.with_vectors: list[bool] = []
        self.limits: list[int] = []
        self.found = Candidates.empty()

    async def search(
        self, org_id: str, agent_id: str, embedding: FloatVector, limit: int, *, with_vectors: bool = False
    ) -> Candidates:
        self.searches += 1
        self.embeddings.append(embedding)
        self.with_vectors.append(with_vectors)
        self.limits.append(limit)
        return self.found

    async def search_lexical(self, org_id: str, agent_id: str, query: str, limit: int) -> Candidates:
        return Candidates.empty()


class _StuckEmbedder:
    """An embedding service that never answers."""

    name = "stuck"
    dim = 3

    async def embed(self, texts: Sequence[str]) -> list[FloatVector]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        pass


def _plan(cold_timeout: float) -> RetrievalPlan:
    now = time.perf_counter()
    return RetrievalPlan(
        org_id=ORG,
        agent_id=AGENT,
        query="when does the warehouse open?",
        hot_limit=5,
        cold_limit=5,
        deadlines=RetrievalDeadlines(
            ends_at=now + 5.0, directive=now + 1.0, hot=now + 1.0, cold=now + cold_timeout
        ),
    )


def _retriever(cold: _Cold) -> Retriever:
    return Retriever(
        directives=_Directives(), hot_memories=_Hot(), cold_memories=cold, embedder=_StuckEmbedder()
    )


async def test_an_embedding_past_the_cold_timeout_skips_the_search() -> None:
    cold, state = _Cold(), RetrievalState()
    tasks = _retriever(cold).start(_plan(cold_timeout=0.02), state)
    await wait_for_sources(tasks, ends_at=time.perf_counter() + 5.0)
    assert all(t.task.done() for t in tasks), "the cold task stops itself at its own deadline"
    assert state.sources["embed"].status is SourceStatus.TIMEOUT
    assert state.sources["cold"].status is SourceStatus.SKIPPED
    assert cold.searches == 0


async def test_a_cold_task_cancelled_while_embedding_records_the_search_as_skipped() -> None:
    # What a late event loop produces: the caller's cancel reaches the task before
    # the task's own timer fires. The search never ran, so it was skipped, not "still
    # running at the call deadline".
    cold, state = _Cold(), RetrievalState()
    tasks = _retriever(cold).start(_plan(cold_timeout=5.0), state)
    await asyncio.sleep(0.01)
    for source in tasks:
        source.task.cancel()
    await asyncio.gather(*(t.task for t in tasks), return_exceptions=True)
    assert state.sources["embed"].status is SourceStatus.TIMEOUT
    assert state.sources["cold"].status is SourceStatus.SKIPPED
    assert state.sources["cold"].detail == "query embedding did not finish"
    assert cold.searches == 0


class _FailingEmbedder(_StuckEmbedder):
    name = "failing"

    async def embed(self, texts: Sequence[str]) -> list[FloatVector]:
        raise QueryExpired("queued over 15 ms")


class _StandInRecorder:
    """The stand-in's embedding function: a fixed vector, and the texts it was given."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.vector = np.array([0.0, 1.0, 0.0], dtype=np.float32)

    def __call__(self, texts: Sequence[str]) -> list[FloatVector]:
        self.texts.extend(texts)
        return [self.vector for _ in texts]


async def _run_with_stand_in(
    embedder: object,
    stand_in: _StandInRecorder,
    *,
    after: float,
    first: bool = False,
    cold: _Cold | None = None,
) -> tuple[_Cold, RetrievalState]:
    cold, state = cold or _Cold(), RetrievalState()
    retriever = Retriever(
        directives=_Directives(),
        hot_memories=_Hot(),
        cold_memories=cold,
        embedder=embedder,  # type: ignore[arg-type]
        stand_in=StandIn(stand_in, after, first=first),
    )
    plan = _plan(cold_timeout=5.0)
    retriever.begin_embedding(ORG, plan.query, state)
    tasks = retriever.start(plan, state)
    await asyncio.wait_for(asyncio.gather(*(t.task for t in tasks)), timeout=10)
    return cold, state


async def test_a_late_embedding_is_stood_in_for_and_the_search_runs_with_the_stand_ins_vector() -> None:
    stand_in = _StandInRecorder()
    cold, state = await _run_with_stand_in(_StuckEmbedder(), stand_in, after=0.02)
    assert state.sources["embed"].status is SourceStatus.OK
    assert state.sources["embed"].detail == STAND_IN_DETAIL
    assert state.sources["cold"].status is SourceStatus.OK
    assert cold.searches == 1 and cold.embeddings[0] is stand_in.vector
    assert state.query_embedding is stand_in.vector


async def test_a_failed_embedding_is_stood_in_for_at_once() -> None:
    stand_in = _StandInRecorder()
    started = time.perf_counter()
    cold, state = await _run_with_stand_in(_FailingEmbedder(), stand_in, after=5.0)
    assert time.perf_counter() - started < 4.0, "it did not wait for the stand-in's time"
    assert state.sources["embed"].detail == STAND_IN_DETAIL
    assert cold.embeddings == [stand_in.vector]
    assert issubclass(QueryExpired, EmbeddingError)


async def test_an_embedding_in_time_is_searched_with_and_the_stand_in_is_not_asked() -> None:
    stand_in = _StandInRecorder()
    cold, state = await _run_with_stand_in(CachedEmbedder(HashingEmbedder(8), 10), stand_in, after=5.0)
    assert state.sources["embed"].status is SourceStatus.OK and state.sources["embed"].detail == ""
    assert stand_in.texts == []
    assert cold.searches == 1 and cold.embeddings[0] is not stand_in.vector


async def test_the_stand_in_embeds_the_text_the_query_cache_would_have() -> None:
    stand_in = _StandInRecorder()
    cold, state = _Cold(), RetrievalState()
    retriever = Retriever(
        directives=_Directives(),
        hot_memories=_Hot(),
        cold_memories=cold,
        embedder=CachedEmbedder(_StuckEmbedder(), 10),
        stand_in=StandIn(stand_in, 0.02),
    )
    plan = dataclasses.replace(_plan(cold_timeout=5.0), query="  when   does the\nwarehouse open?  ")
    retriever.begin_embedding(ORG, plan.query, state)
    tasks = retriever.start(plan, state)
    await asyncio.wait_for(asyncio.gather(*(t.task for t in tasks)), timeout=10)
    assert stand_in.texts == ["when does the warehouse open?"]


def _cold_matches(similarity: float) -> Candidates:
    """Two memories with their vectors, as the vector search returns them ``with_vectors``."""
    n = 2
    return Candidates(
        ids=["m1", "m2"],
        contents=["one", "two"],
        categories=["fact", "fact"],
        confidence=np.full(n, 0.8),
        usefulness=np.full(n, 0.5),
        retrieval_counts=np.zeros(n),
        occurred_at=np.full(n, 1_700_000_000.0),
        last_injected_at=np.full(n, np.nan),
        token_counts=[{}, {}],
        similarity=np.full(n, similarity),
        lexical_score=np.full(n, np.nan),
        sources=np.zeros(n, dtype=np.int8),
        vectors=np.eye(n, 8, dtype=np.float32),
        vector_rows=np.arange(n, dtype=np.intp),
    )


async def test_first_the_search_runs_at_once_with_the_stand_ins_vector_and_asks_for_the_winners_vectors() -> (
    None
):
    stand_in, cold = _StandInRecorder(), _Cold()
    cold.found = _cold_matches(similarity=0.3)
    cold, state = await _run_with_stand_in(
        CachedEmbedder(HashingEmbedder(8), 10), stand_in, after=5.0, first=True, cold=cold
    )
    assert cold.embeddings == [stand_in.vector] and cold.with_vectors == [True]
    # Twice the call's limit (5): MiniLM ranks a wider pool than the table would keep.
    assert cold.limits == [10]
    # The embedder's vector came in time: it scores the memories, from their vectors.
    assert state.sources["embed"].status is SourceStatus.OK and state.sources["embed"].detail == ""
    assert state.query_embedding is not None and state.query_embedding is not stand_in.vector
    assert np.isnan(state.cold.similarity).all() and (state.cold.vector_rows >= 0).all()


async def test_first_a_late_embedding_leaves_the_stand_ins_vector_and_similarities_and_says_so() -> None:
    stand_in, cold = _StandInRecorder(), _Cold()
    cold.found = _cold_matches(similarity=0.3)
    started = time.perf_counter()
    cold, state = await _run_with_stand_in(_StuckEmbedder(), stand_in, after=0.02, first=True, cold=cold)
    assert time.perf_counter() - started < 4.0
    assert state.sources["embed"].status is SourceStatus.OK
    assert state.sources["embed"].detail == STAND_IN_DETAIL
    assert state.sources["cold"].status is SourceStatus.OK
    assert state.query_embedding is stand_in.vector
    assert (state.cold.similarity == 0.3).all()


class _PlannedCold(_Cold):
    """A store that names the plan of its vector search, as the PostgreSQL store does."""

    async def search(self, org_id: str, agent_id: str, embedding: FloatVector, limit: int) -> Candidates:
        self.searches += 1
        return ColdMatches.of(Candidates.empty(), ColdPlan.AGENT_HALFVEC)


async def test_the_cold_sources_detail_names_the_plan_the_store_chose() -> None:
    cold, state = _PlannedCold(), RetrievalState()
    retriever = Retriever(
        directives=_Directives(), hot_memories=_Hot(), cold_memories=cold, embedder=HashingEmbedder(8)
    )
    tasks = retriever.start(_plan(cold_timeout=5.0), state)
    await asyncio.wait_for(asyncio.gather(*(t.task for t in tasks)), timeout=10)
    assert cold.searches == 1
    assert state.sources["cold"].status is SourceStatus.OK
    assert state.sources["cold"].detail == "plan: agent_halfvec"


async def _skips(plan: RetrievalPlan) -> dict[str, str]:
    state = RetrievalState()
    retriever = Retriever(
        directives=_Directives(), hot_memories=_Hot(), cold_memories=_Cold(), embedder=HashingEmbedder(8)
    )
    tasks = retriever.start(plan, state)
    await asyncio.wait_for(asyncio.gather(*(t.task for t in tasks)), timeout=10)
    return {name: r.detail for name, r in state.sources.items() if r.status is SourceStatus.SKIPPED}


async def test_each_skipped_source_says_why_first_the_query_then_the_budget_then_its_limit() -> None:
    plan = _plan(cold_timeout=5.0)
    assert await _skips(dataclasses.replace(plan, query="", lexical_limit=5)) == {
        "embed": "no user message to search with",
        "cold": "no user message to search with",
        "lexical": "no user message to search with",
    }
    constrained = dataclasses.replace(plan, skip_cold_reason="budget too small", cold_limit=0)
    assert await _skips(constrained) == {"cold": "budget too small", "lexical": "budget too small"}
    assert await _skips(dataclasses.replace(plan, cold_limit=0, hot_limit=0)) == {
        "hot": "hot_limit is 0",
        "cold": "cold_limit is 0",
        "lexical": "lexical_limit is 0",
    }


# ---------------------------------------------------------------- a graph walk that missed

QUESTION = np.array([1.0, 0.0, 0.0], dtype=np.float32)


class _FixedEmbedder(_StuckEmbedder):
    """Embeds every text as ``QUESTION``."""

    name = "fixed"

    async def embed(self, texts: Sequence[str]) -> list[FloatVector]:
        return [QUESTION for _ in texts]


def _matches(similarities: dict[str, float], plan: ColdPlan = ColdPlan.AGENT_HALFVEC) -> ColdMatches:
    records = [MemoryRecord(i, i, "factual", similarity=s) for i, s in similarities.items()]
    return ColdMatches.of(Candidates.from_records(records), plan)


def _with_vectors(vectors: dict[str, Sequence[float]]) -> Candidates:
    records = [
        MemoryRecord(i, i, "factual", embedding=np.array(v, dtype=np.float32)) for i, v in vectors.items()
    ]
    return Candidates.from_records(records)


class _Graph:
    """An agent's own graph: the first walk finds ``walked``, a wider one ``wider`` (None:
    it never answers; an exception: it raises it); the lexical search finds ``lexical``
    after ``lexical_delay``."""

    def __init__(
        self,
        walked: ColdMatches,
        wider: ColdMatches | StoreError | None,
        lexical: Candidates,
        *,
        lexical_delay: float = 0.0,
        walk_seconds: float = 0.0,
    ) -> None:
        self.walked, self.wider, self.lexical = walked, wider, lexical
        self.lexical_delay, self.walk_seconds = lexical_delay, walk_seconds
        self.walks: list[bool] = []  # each search's ``wider``

    async def search(
        self,
        org_id: str,
        agent_id: str,
        embedding: FloatVector,
        limit: int,
        *,
        with_vectors: bool = False,
        wider: bool = False,
    ) -> Candidates:
        self.walks.append(wider)
        if not wider:
            await asyncio.sleep(self.walk_seconds)
            return self.walked
        if self.wider is None:
            await asyncio.Event().wait()
        if isinstance(self.wider, StoreError):
            raise self.wider
        assert self.wider is not None
        return self.wider

    async def search_lexical(self, org_id: str, agent_id: str, query: str, limit: int) -> Candidates:
        await asyncio.sleep(self.lexical_delay)
        return self.lexical


async def _retrieve(graph: _Graph, *, rewalk: bool = True, cold_timeout: float = 5.0) -> RetrievalState:
    state = RetrievalState()
    retriever = Retriever(
        directives=_Directives(),
        hot_memories=_Hot(),
        cold_memories=graph,
        embedder=_FixedEmbedder(),
        rewalk=rewalk,
    )
    plan = dataclasses.replace(_plan(cold_timeout=cold_timeout), lexical_limit=5)
    tasks = retriever.start(plan, state)
    await asyncio.wait_for(asyncio.gather(*(t.task for t in tasks)), timeout=10)
    return state


# The walk returned memories at 0.55 and 0.52; the question's words found "x", at cosine 0.70.
WALKED = {"a": 0.55, "b": 0.52}
NEARER_BY_WORDS = {"far": [0.0, 1.0, 0.0], "x": [0.7, 0.714, 0.0]}


async def test_a_walk_that_missed_what_the_words_found_is_repeated_wider_and_says_so() -> None:
    wider = _matches({"x": 0.70, "y": 0.66, "a": 0.55})
    graph = _Graph(_matches(WALKED), wider, _with_vectors(NEARER_BY_WORDS))
    state = await _retrieve(graph)
    assert graph.walks == [False, True]
    assert list(state.cold.ids) == ["x", "y", "a"]
    assert state.sources["cold"].status is SourceStatus.OK
    assert state.sources["cold"].found == 3
    assert state.sources["cold"].detail == plan_detail("agent_halfvec", rewalked=True)


async def test_the_walk_waits_for_the_lexical_search_to_judge_it() -> None:
    wider = _matches({"x": 0.70})
    graph = _Graph(_matches(WALKED), wider, _with_vectors(NEARER_BY_WORDS), lexical_delay=0.05)
    state = await _retrieve(graph)
    assert graph.walks == [False, True] and list(state.cold.ids) == ["x"]


async def test_a_walk_whose_farthest_is_nearer_than_all_the_words_found_is_not_repeated() -> None:
    graph = _Graph(_matches({"a": 0.75}), _matches({"x": 0.70}), _with_vectors(NEARER_BY_WORDS))
    state = await _retrieve(graph)
    assert graph.walks == [False]
    assert list(state.cold.ids) == ["a"] and state.sources["cold"].detail == plan_detail("agent_halfvec")


async def test_the_exact_scan_and_a_service_without_rewalks_never_walk_again() -> None:
    exact = _Graph(_matches(WALKED, ColdPlan.EXACT), _matches({"x": 0.7}), _with_vectors(NEARER_BY_WORDS))
    await _retrieve(exact)
    assert exact.walks == [False]
    off = _Graph(_matches(WALKED), _matches({"x": 0.7}), _with_vectors(NEARER_BY_WORDS))
    state = await _retrieve(off, rewalk=False)
    assert off.walks == [False] and list(state.cold.ids) == ["a", "b"]


async def test_a_repeated_walk_that_is_late_leaves_the_first_answer_before_the_cold_deadline() -> None:
    graph = _Graph(_matches(WALKED), None, _with_vectors(NEARER_BY_WORDS))
    started = time.perf_counter()
    state = await _retrieve(graph, cold_timeout=0.1)
    assert graph.walks == [False, True]
    assert state.sources["cold"].status is SourceStatus.OK, "the first walk's answer stands"
    assert list(state.cold.ids) == ["a", "b"]
    assert state.sources["cold"].detail == plan_detail("agent_halfvec")
    assert time.perf_counter() - started < 5.0


async def test_a_repeated_walk_that_fails_leaves_the_first_answer() -> None:
    graph = _Graph(_matches(WALKED), StoreUnavailable("replica gone"), _with_vectors(NEARER_BY_WORDS))
    state = await _retrieve(graph)
    assert graph.walks == [False, True]
    assert state.sources["cold"].status is SourceStatus.OK and list(state.cold.ids) == ["a", "b"]


async def test_a_walk_that_missed_is_not_repeated_when_a_second_could_not_end_in_time() -> None:
    # The first walk took 0.2 s; 0.3 s are left of the cold deadline, a second walk may
    # take twice the first.
    graph = _Graph(_matches(WALKED), _matches({"x": 0.7}), _with_vectors(NEARER_BY_WORDS), walk_seconds=0.2)
    state = await _retrieve(graph, cold_timeout=0.5)
    assert graph.walks == [False]
    assert state.sources["cold"].status is SourceStatus.OK and list(state.cold.ids) == ["a", "b"]
