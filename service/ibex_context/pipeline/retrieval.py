"""Parallel retrieval: directive, hot set, lexical search and query embedding at
once; the vector (cold) search as soon as the embedding is ready. The embedding,
the longest of them, is started first (``Retriever.begin_embedding``), before the
call's budget is even counted. Each source has
its own timeout and a failure of one never blocks the others.

This is the only stage of the pipeline that does I/O. It fills a
``RetrievalState`` as results arrive, so that when the call's deadline runs out
the assembler can answer at once with whatever arrived (e.g. the directive) and
cancel the rest: cancelling the tasks cancels the Redis and PostgreSQL work
(asyncpg sends a cancel request for an interrupted query).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

import numpy as np

from ibex_context.candidates import Candidates, merge
from ibex_context.embedding.base import Embedder
from ibex_context.embedding.cache import CachedEmbedder, embed_for_org
from ibex_context.errors import EmbeddingError, StoreError
from ibex_context.models import Directive, FloatVector
from ibex_context.pipeline.deadlines import RetrievalDeadlines
from ibex_context.pipeline.outcome import (
    STAND_IN_DETAIL,
    SourceName,
    SourceResult,
    SourceStatus,
    plan_detail,
)
from ibex_context.stores.base import ColdMemorySearch, DirectiveReader, HotMemoryReader
from ibex_context.stores.cold_plan import ColdMatches, walk_missed

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetrievalPlan:
    """What to fetch for one call, and until when (``pipeline.deadlines``)."""

    org_id: str
    agent_id: str
    query: str
    hot_limit: int
    cold_limit: int
    # The call's deadline caps each source's own, so sources stop themselves (one
    # cancellation each) exactly when the assembler stops waiting for them.
    deadlines: RetrievalDeadlines
    # Set when the budget is too small for cold memories to matter.
    skip_cold_reason: str = ""
    # BM25 matches asked of the store, under the cold deadline; 0: no lexical search.
    lexical_limit: int = 0

    def until_call_ends(self) -> float:
        """Seconds left until the call stops waiting for retrieval."""
        return self.deadlines.ends_at - time.perf_counter()


@dataclass(slots=True)
class RetrievalState:
    """What has arrived so far. Mutated only by the retrieval tasks."""

    directive: Directive | None = None
    directive_done: bool = False
    hot: Candidates = field(default_factory=Candidates.empty)
    cold: Candidates = field(default_factory=Candidates.empty)
    lexical: Candidates = field(default_factory=Candidates.empty)
    query_embedding: FloatVector | None = None
    # Set when the lexical search ended, however (the vector search may wait for it).
    lexical_ended: asyncio.Event = field(default_factory=asyncio.Event)
    # The query's embedding when it was started before the sources (shared: shield it).
    pending_embedding: asyncio.Future[FloatVector] | None = None
    sources: dict[SourceName, SourceResult] = field(default_factory=dict)
    # perf_counter_ns intervals per source, for the stage spans.
    intervals: dict[SourceName, tuple[int, int]] = field(default_factory=dict)

    def candidates(self) -> Candidates:
        """Hot, vector and lexical matches merged and de-duplicated by id
        (``candidates.merge``): a memory found by the vector search keeps its
        similarity and gets the BM25 score of the lexical search when that found it
        too; one found in the hot set as well is marked as coming from both. Vectors
        of the query's dimension are kept."""
        query = self.query_embedding
        dim = None if query is None else int(query.shape[-1])
        return merge(self.cold, self.lexical, self.hot, dim=dim)


@dataclass(frozen=True, slots=True)
class StandIn:
    """A cheaper query embedder (MiniLM's static table) beside the call's embedder.

    ``first``: the vector search runs at once with its vector, beside the embedder's
    inference, and asks for the winners' vectors; the embedder's vector, when it comes
    within ``after`` seconds of retrieval's start, scores them (and the other sources'
    memories), else the stand-in's does. Otherwise the call waits up to ``after`` for the
    embedder's vector and searches with the stand-in's only when it is late or failed."""

    embed: Callable[[Sequence[str]], list[FloatVector]]
    after: float
    first: bool = False


# The first stage asks the table's search for this many times the call's cold limit, for
# MiniLM to rank: the table's own top 100 held 65.6 % of the dev conversations' evidence
# where MiniLM's held 70.3 %; its top 200 ranked by MiniLM, 68.7 % in the first 100.
FIRST_STAGE_POOL = 2
# pgvector's hnsw.ef_search tops out at 1,000 (the assembler's MAX_SEARCH_LIMIT).
_MOST_ROWS = 1000
# A repeated graph walk must end this long before the cold source's own timer, so that the
# first walk's answer stands when the second is late (the timers fire in order only while
# the event loop runs less late than this).
_REWALK_MARGIN = 0.003
# A repeated walk (ef_search 600) takes up to this many times the first (200) on a 100k
# agent's graph (large-agents §24: 14.7-21 ms against 9-10.6): one that cannot end before
# the cold deadline is not started, its work would be thrown away on stores already slow.
_REWALK_COST = 2.0


class _QueryVector(NamedTuple):
    vector: FloatVector
    detail: str = ""


class Retriever:
    """Runs the retrieval of one call against the injected stores and embedder."""

    def __init__(
        self,
        *,
        directives: DirectiveReader,
        hot_memories: HotMemoryReader,
        cold_memories: ColdMemorySearch,
        embedder: Embedder,
        stand_in: StandIn | None = None,
        rewalk: bool = False,
    ) -> None:
        """``rewalk``: a graph walk that missed (``stores.cold_plan.walk_missed``) is
        repeated wider (the store's ``GraphSearchWidth.rewalk_ef_search``)."""
        self._directives = directives
        self._hot = hot_memories
        self._cold = cold_memories
        self._embedder = embedder
        self._stand_in = stand_in
        self._rewalk = rewalk
        self._begin = embedder.begin if isinstance(embedder, CachedEmbedder) else None
        # What the cache embeds of a query (normalised, its tail when long): the stand-in
        # embeds the same text.
        self._begin_text = embedder.query_text if isinstance(embedder, CachedEmbedder) else None

    def begin_embedding(self, org_id: str, query: str, state: RetrievalState) -> None:
        """Starts embedding ``query`` now, ahead of everything else of the call: with the
        query cache in front of a threaded embedder, a worker thread takes it at once and
        computes while the event loop counts the budget and starts the other reads."""
        if query and self._begin is not None:
            state.pending_embedding = self._begin(query, org_id=org_id)

    def start(self, plan: RetrievalPlan, state: RetrievalState) -> list[SourceTask]:
        """Start every source; the caller waits for them (see ``wait_for_sources``)."""
        deadlines = plan.deadlines
        # One deadline for the cold task and for the wait on it: the task's own timer
        # must fire first, so it records how it ended before the caller cancels it.
        return [
            SourceTask(
                asyncio.create_task(self._directive(plan, state), name="retrieve-directive"),
                deadlines.directive,
            ),
            SourceTask(
                asyncio.create_task(self._hot_set(plan, state), name="retrieve-hot"),
                deadlines.hot,
            ),
            SourceTask(
                asyncio.create_task(
                    self._embed_and_search(plan, state, deadlines.cold), name="retrieve-cold"
                ),
                deadlines.cold,
            ),
            SourceTask(
                asyncio.create_task(self._lexical(plan, state, deadlines.cold), name="retrieve-lexical"),
                deadlines.cold,
            ),
        ]

    async def _directive(self, plan: RetrievalPlan, state: RetrievalState) -> None:
        # Redis sources run until the call's deadline; their own timeouts are applied
        # by wait_for_sources, which stops waiting for a source only when nothing
        # else keeps the call waiting (an answer that arrives while the cold search
        # is still running is used, not thrown away).
        directive = await _run_source(
            state,
            SourceName.DIRECTIVE,
            plan.until_call_ends(),
            lambda: self._directives.get_directive(plan.org_id, plan.agent_id),
            count=lambda d: 1 if d is not None else 0,
        )
        if not isinstance(directive, _Failed):
            state.directive = directive
            state.directive_done = True

    async def _hot_set(self, plan: RetrievalPlan, state: RetrievalState) -> None:
        if plan.hot_limit <= 0:
            _skip(state, SourceName.HOT, "hot_limit is 0")
            return
        hot = await _run_source(
            state,
            SourceName.HOT,
            plan.until_call_ends(),
            # Not shielded: the read's client (stores.redis.wire) is cancellation-safe;
            # a cancelled read leaves its reply to be read and dropped on its connection.
            lambda: self._hot.get_hot_memories(plan.org_id, plan.agent_id, plan.hot_limit),
            count=len,
        )
        if not isinstance(hot, _Failed):
            state.hot = hot

    async def _lexical(self, plan: RetrievalPlan, state: RetrievalState, deadline: float) -> None:
        """BM25 over the agent's memories; needs no embedding, so it runs from the start."""
        try:
            limit = plan.lexical_limit
            why_not = _NO_QUERY if not plan.query else _why_not_search(plan, limit, "lexical_limit")
            if why_not:
                _skip(state, SourceName.LEXICAL, why_not)
                return
            found = await _run_source(
                state,
                SourceName.LEXICAL,
                deadline - time.perf_counter(),
                lambda: self._cold.search_lexical(plan.org_id, plan.agent_id, plan.query, limit),
                count=len,
            )
            if not isinstance(found, _Failed):
                state.lexical = found
        finally:
            state.lexical_ended.set()

    async def _embed_and_search(self, plan: RetrievalPlan, state: RetrievalState, deadline: float) -> None:
        """Embeds the query, then searches; ``deadline`` covers both together."""
        if not plan.query:
            _skip(state, SourceName.EMBED, _NO_QUERY)
            _skip(state, SourceName.COLD, _NO_QUERY)
            return
        if self._stand_in is not None and self._stand_in.first:
            await self._search_first(plan, state, deadline, self._stand_in)
            return
        try:
            found = await _run_source(
                state,
                SourceName.EMBED,
                deadline - time.perf_counter(),
                lambda: self._query_vector(plan, state),
                count=_one,
                describe=_vector_detail,
            )
        except asyncio.CancelledError:
            # Stopped while embedding (a late event loop can reach the caller's
            # cancel before this task's own timer): the search never started.
            _skip(state, SourceName.COLD, "query embedding did not finish")
            raise
        if isinstance(found, _Failed):
            _skip(state, SourceName.COLD, "query embedding failed")
            return
        state.query_embedding = embedding = found.vector
        if why_not := _why_not_search(plan, plan.cold_limit, "cold_limit"):
            _skip(state, SourceName.COLD, why_not)
            return
        remaining = deadline - time.perf_counter()
        cold = await _run_source(
            state,
            SourceName.COLD,
            remaining,
            lambda: self._search(plan, state, embedding, deadline),
            count=len,
            describe=_chosen_plan,
        )
        if not isinstance(cold, _Failed):
            state.cold = cold

    async def _search(
        self, plan: RetrievalPlan, state: RetrievalState, embedding: FloatVector, deadline: float
    ) -> Candidates:
        """The vector search; a graph walk that missed (``walk_missed``: the lexical search,
        awaited here, found a memory the walk did not return, nearer to the question than one
        it did) is repeated wider when there is time, else its first answer stands."""
        started = time.perf_counter()
        found = await self._cold.search(plan.org_id, plan.agent_id, embedding, plan.cold_limit)
        walked = time.perf_counter() - started
        if not (self._rewalk and isinstance(found, ColdMatches) and found.plan.walks_graph):
            return found
        ends_at = deadline - _REWALK_MARGIN
        # The last moment a second walk could start and end in time: the lexical search is
        # waited for until then, no longer (waiting to the deadline itself would race the
        # source's own timer, and lose the first answer when the loop runs late).
        latest_start = ends_at - _REWALK_COST * walked
        try:
            async with asyncio.timeout(latest_start - time.perf_counter()):
                await state.lexical_ended.wait()
        except TimeoutError:
            return found
        if not walk_missed(found, state.lexical, embedding) or time.perf_counter() > latest_start:
            return found
        try:
            async with asyncio.timeout(ends_at - time.perf_counter()):
                wider = await self._cold.search(
                    plan.org_id, plan.agent_id, embedding, plan.cold_limit, wider=True
                )
        except (TimeoutError, StoreError):
            return found
        return ColdMatches.of(wider, wider.plan, rewalked=True) if isinstance(wider, ColdMatches) else wider

    async def _search_first(
        self, plan: RetrievalPlan, state: RetrievalState, deadline: float, stand_in: StandIn
    ) -> None:
        """The vector search with the stand-in's vector at once, the embedder's inference
        beside it; the embedder's vector, when in time, is the one the memories are scored
        with (the search's similarities are dropped: scoring computes them from the
        winners' vectors), else the stand-in's."""
        [first] = stand_in.embed([self._embedded_text(plan.query)])
        search: asyncio.Task[Candidates | _Failed] | None = None
        if not (why_not := _why_not_search(plan, plan.cold_limit, "cold_limit")):
            search = asyncio.create_task(
                self._search_with_vectors(plan, state, deadline, first), name="retrieve-cold-first"
            )
        else:
            _skip(state, SourceName.COLD, why_not)
        try:
            started = time.perf_counter()
            vectors = await _run_source(
                state,
                SourceName.EMBED,
                min(stand_in.after, deadline - started),
                lambda: self._query_embedding(plan.org_id, plan.query, state),
                count=len,
            )
            cold = await search if search is not None else _FAILED
        except asyncio.CancelledError:
            if search is not None:
                search.cancel()
            raise
        if isinstance(vectors, _Failed) or not vectors:
            # Late or failed: the call goes on with the stand-in's vector, and says so.
            state.sources[SourceName.EMBED] = state.sources[SourceName.EMBED]._replace(
                status=SourceStatus.OK, found=1, detail=STAND_IN_DETAIL
            )
            state.query_embedding = first
        else:
            state.query_embedding = vectors[0]
            if not isinstance(cold, _Failed):
                cold.similarity = np.full(len(cold), np.nan)  # scored from their vectors
        if not isinstance(cold, _Failed):
            state.cold = cold

    async def _search_with_vectors(
        self, plan: RetrievalPlan, state: RetrievalState, deadline: float, vector: FloatVector
    ) -> Candidates | _Failed:
        limit = min(plan.cold_limit * FIRST_STAGE_POOL, max(plan.cold_limit, _MOST_ROWS))

        def search() -> Awaitable[Candidates]:
            return self._cold.search(plan.org_id, plan.agent_id, vector, limit, with_vectors=True)

        return await _run_source(
            state,
            SourceName.COLD,
            deadline - time.perf_counter(),
            search,
            count=len,
            describe=_chosen_plan,
        )

    def _embedded_text(self, query: str) -> str:
        return self._begin_text(query) if self._begin_text is not None else query

    async def _query_vector(self, plan: RetrievalPlan, state: RetrievalState) -> _QueryVector:
        """The query's vector: the embedder's, or the stand-in's when the embedder's is not
        there after ``StandIn.after`` or failed (its computation goes on for the cache,
        unless still queued: ``embedding.batching``'s expiry)."""
        stand_in = self._stand_in
        if stand_in is None:
            [vector] = await self._query_embedding(plan.org_id, plan.query, state)
            return _QueryVector(vector)
        try:
            async with asyncio.timeout(stand_in.after):
                [vector] = await self._query_embedding(plan.org_id, plan.query, state)
            return _QueryVector(vector)
        except (TimeoutError, EmbeddingError):
            [vector] = stand_in.embed([self._embedded_text(plan.query)])
            return _QueryVector(vector, STAND_IN_DETAIL)

    async def _query_embedding(self, org_id: str, query: str, state: RetrievalState) -> list[FloatVector]:
        pending = state.pending_embedding
        if pending is None:
            return await embed_for_org(self._embedder, org_id, [query])
        if pending.done():  # a cache hit: no shield, no turn of the loop
            return [pending.result()]
        # Shielded: other calls of the same query may share it.
        return [await asyncio.shield(pending)]


@dataclass(frozen=True, slots=True)
class SourceTask:
    """A running source and the perf_counter() time after which the call need not wait for it."""

    task: asyncio.Task[None]
    wait_until: float


async def wait_for_sources(sources: Sequence[SourceTask], ends_at: float) -> None:
    """Waits until every source finished, or every one still running is past its own
    ``wait_until`` (or ``ends_at`` has come).

    A source's timeout bounds how long the call waits *for it*: a hot-set read that
    answers at 12 ms while the cold search runs until 20 ms is used, where a timer
    cancelling it at 10 ms would have thrown the answer away and saved no time. The
    caller cancels what is left.
    """
    pending = {s.task: s.wait_until for s in sources if not s.task.done()}
    while pending:
        stop_at = min(max(pending.values()), ends_at)
        wait = stop_at - time.perf_counter()
        if wait <= 0:
            return
        # The extra millisecond lets a source that stops itself at ends_at record it.
        done, _ = await asyncio.wait(pending, timeout=wait + 0.001, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            del pending[task]


class _Failed:
    pass


_FAILED = _Failed()


async def _run_source(
    state: RetrievalState,
    source: SourceName,
    timeout: float,
    call: Callable[[], Awaitable[T]],
    *,
    count: Callable[[T], int],
    describe: Callable[[T], str] | None = None,
) -> T | _Failed:
    """Run one source under its timeout and record its outcome; never raises
    (except CancelledError, which must propagate so the work is cancelled)."""
    start = time.perf_counter_ns()
    status, detail, n = SourceStatus.OK, "", 0
    result: T | _Failed = _FAILED
    try:
        if timeout <= 0:
            raise TimeoutError
        async with asyncio.timeout(timeout):
            value = await call()
        result, n = value, count(value)
        if describe is not None:
            detail = describe(value)
    except TimeoutError:
        status, detail = SourceStatus.TIMEOUT, f"no answer within {timeout * 1000:.1f} ms"
    except asyncio.CancelledError:
        end = time.perf_counter_ns()
        state.intervals[source] = (start, end)
        state.sources[source] = SourceResult(
            source, SourceStatus.TIMEOUT, (end - start) // 1000, 0, "no answer when the call stopped waiting"
        )
        raise
    except Exception as exc:  # any store or embedder failure degrades, never fails the call
        status, detail = SourceStatus.ERROR, type(exc).__name__
    end = time.perf_counter_ns()
    state.intervals[source] = (start, end)
    state.sources[source] = SourceResult(source, status, (end - start) // 1000, n, detail)
    return result


def _one(_: object) -> int:
    return 1


def _vector_detail(found: _QueryVector) -> str:
    return found.detail


def _chosen_plan(found: Candidates) -> str:
    """The cold source's detail: the plan the store chose, into the metadata and metrics."""
    return plan_detail(found.plan.value, rewalked=found.rewalked) if isinstance(found, ColdMatches) else ""


_NO_QUERY = "no user message to search with"


def _why_not_search(plan: RetrievalPlan, limit: int, limit_name: str) -> str:
    """Why a search of the stored memories (vector or lexical) is not run; '' when it is."""
    if plan.skip_cold_reason:
        return plan.skip_cold_reason
    return f"{limit_name} is 0" if limit <= 0 else ""


def _skip(state: RetrievalState, source: SourceName, why: str) -> None:
    state.sources[source] = SourceResult(source, SourceStatus.SKIPPED, 0, 0, why)
