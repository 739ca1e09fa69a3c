"""The assembly of one call: budget -> retrieval -> scoring -> packing -> formatting,
under one deadline, degrading instead of failing.

The degradation ladder (ADR-0002):

* FULL            every source asked answered in time;
* HOT_ONLY        the cold search (or its embedding) failed: the hot set's memories
                  are used;
* COLD_ONLY       the hot set failed (Redis): the cold search's memories are used;
* PARTIAL         memories of both kinds arrived, but a part failed (one half of
                  the cold search, vector or lexical, or the directive): the
                  reasons say which;
* DIRECTIVE_ONLY  no memory source answered, or the call's deadline ran out: the
                  directive is injected if it was fetched;
* PASS_THROUGH    nothing could be injected: the client's messages unchanged.

Counting the client's messages is the one step whose cost grows with the request (a
fresh 400,000-character conversation: ~15 ms of tokenizer work, up to 4 MiB a call):
a request of more than ``AssemblerConfig.inline_count_chars`` characters is counted on
the counting executor's thread (tiktoken and hashlib release the GIL while they work),
so it does not hold the event loop every other call needs. The counts are the same
exact counts either way.

The model's window, less the response reserve and the safety buffer, is a hard
limit: when the client's messages leave no room (``messages_exceed_window``) or
the directive would not fit (``directive_exceeds_window``), nothing is injected.

Every reason is recorded, most severe first. An exception inside assembly
degrades like a deadline; only invalid input (checked before this module) is
an error for the caller.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

from ibex_context.models import AssemblyRequest, ChatMessage, Degradation
from ibex_context.pipeline.assembly import Assembly, Composition
from ibex_context.pipeline.budget import TokenBudget, compute_budget
from ibex_context.pipeline.compose import ComposeInput, compose, directive_only
from ibex_context.pipeline.deadlines import CallDeadlines
from ibex_context.pipeline.outcome import (
    SOURCE_STAGES,
    SOURCES,
    Reason,
    SourceName,
    SourceResult,
    SourceStatus,
    Stage,
    StageSpan,
    Timings,
    outcome_of,
)
from ibex_context.pipeline.retrieval import RetrievalPlan, RetrievalState, Retriever, wait_for_sources
from ibex_context.profiles.model import Profile
from ibex_context.tokens.catalogue import resolve_model
from ibex_context.tokens.counting import MessageTokenCounter
from ibex_context.tokens.encodings import Encoding, EncodingRegistry

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AssemblerConfig:
    hot_limit: int
    cold_limit: int
    query_max_chars: int
    nonce_secret: bytes
    lexical_limit: int = 50
    # Messages of more characters than this are counted on the counting executor.
    inline_count_chars: int = 65_536


class Assembler:
    def __init__(
        self,
        *,
        retriever: Retriever,
        encodings: EncodingRegistry,
        message_counter: MessageTokenCounter,
        config: AssemblerConfig,
        clock: Callable[[], float] = time.time,
        counting_executor: Executor | None = None,
    ) -> None:
        """``counting_executor``: where large requests' messages are counted (one thread
        is enough: it bounds that work to one core); None counts every request inline."""
        self._retriever = retriever
        self._counting = counting_executor
        self._encodings = encodings
        self._counter = message_counter
        self._config = config
        self._clock = clock
        # Cancelled retrieval tasks finish in the background; keep references so
        # they are not garbage-collected mid-cancellation.
        self._background: set[asyncio.Task[None]] = set()

    async def assemble(
        self, request: AssemblyRequest, profile: Profile, deadlines: CallDeadlines
    ) -> Assembly:
        """Assemble within ``deadlines`` (``DeadlinePolicy.for_call``): the budget bounds
        the whole call, retrieval and each source end where they say."""
        call = _Call(request, profile, time.perf_counter_ns())
        tasks: list[asyncio.Task[None]] = []
        try:
            if deadlines.budget <= 0:
                raise TimeoutError
            async with asyncio.timeout(deadlines.budget):
                return await self._assemble(call, tasks, deadlines)
        except TimeoutError:
            failure = Reason.DEADLINE_EXCEEDED
        except Exception:
            log.exception("assembly failed; degrading", extra={"request_id": request.request_id})
            failure = Reason.ASSEMBLY_ERROR
        finally:
            self._cancel(tasks)
        return self._fallback(call, failure)

    def shed(self, request: AssemblyRequest, profile: Profile, reason: Reason) -> Assembly:
        """The client's messages unchanged, at once, with ``reason`` (the server is over
        capacity): nothing is fetched, counted or formatted."""
        return self._pass_through(_Call(request, profile, time.perf_counter_ns()), (), [reason])

    # -- the full path --------------------------------------------------------------------

    async def _assemble(
        self, call: _Call, tasks: list[asyncio.Task[None]], deadlines: CallDeadlines
    ) -> Assembly:
        request, profile, state = call.request, call.profile, call.state
        query = _query_text(request.messages, self._config.query_max_chars)
        # First: the embedding is the call's longest step and needs nothing else.
        self._retriever.begin_embedding(request.org_id, query, state)
        t0 = time.perf_counter_ns()
        model = resolve_model(request.model, profile.models)
        encoding = self._encodings.get(model.encoding)
        exact = model.exact and encoding.exact
        approximation = encoding.approximation_reason or (
            "" if model.exact else f"{model.name} is counted with {encoding.name} (approximate)"
        )
        messages_tokens = await self._count_messages(request.messages, encoding)
        preliminary = compute_budget(
            model,
            messages_tokens=messages_tokens,
            directive_tokens=0,
            limits=profile.budget,
            exact=exact,
            approximation_reason=approximation,
        )
        call.encoding, call.messages_tokens, call.budget = encoding, messages_tokens, preliminary
        call.stages.append(StageSpan(Stage.BUDGET, t0, time.perf_counter_ns()))
        if preliminary.window_remaining < 0:
            # Not even the response reserve fits beside the client's messages: anything
            # injected would eat the model's answer. No store is asked.
            return self._pass_through(call, (), [Reason.MESSAGES_EXCEED_WINDOW])

        plan = RetrievalPlan(
            org_id=request.org_id,
            agent_id=request.agent_id,
            query=query,
            hot_limit=self._config.hot_limit,
            cold_limit=_search_limit(self._config.cold_limit, profile),
            lexical_limit=_search_limit(self._config.lexical_limit, profile),
            skip_cold_reason="memory budget below 1000 tokens" if preliminary.is_constrained else "",
            deadlines=deadlines.retrieval(started_at=call.started_ns / 1e9, now=time.perf_counter()),
        )
        sources = self._retriever.start(plan, state)
        tasks.extend(s.task for s in sources)
        await wait_for_sources(sources, plan.deadlines.ends_at)
        self._cancel(tasks)
        for source, (start, end) in state.intervals.items():
            call.stages.append(StageSpan(SOURCE_STAGES[source], start, end))
        outcomes = _closed(state.sources)
        return self._compose(call, outcomes, _reasons(outcomes))

    def _compose(self, call: _Call, sources: tuple[SourceResult, ...], reasons: list[Reason]) -> Assembly:
        request, state = call.request, call.state
        assert call.encoding is not None and call.budget is not None
        candidates = state.candidates()
        lexical = state.sources.get(SourceName.LEXICAL)
        composition = compose(
            ComposeInput(
                messages=request.messages,
                directive=state.directive.content if state.directive else None,
                candidates=candidates,
                query_embedding=state.query_embedding,
                lexical_searched=lexical is not None and lexical.status is SourceStatus.OK,
                profile=call.profile,
                encoding=call.encoding,
                budget=call.budget,
                nonce=self._nonce(request),
                now=self._clock(),
            ),
            self._counter,
        )
        t0, t1, t2, t3 = composition.marks
        call.stages.extend(
            (StageSpan(Stage.SCORE, t0, t1), StageSpan(Stage.PACK, t1, t2), StageSpan(Stage.FORMAT, t2, t3))
        )
        call.budget = composition.budget
        if composition.directive_exceeds_window:
            return self._pass_through(
                call,
                sources,
                [Reason.DIRECTIVE_EXCEEDS_WINDOW, *reasons],
                candidates_evaluated=len(candidates),
                memories_available=composition.memories_available,
            )
        return self._finish(
            call,
            sources,
            composition,
            degradation=_degradation(state, reasons),
            reasons=reasons,
            candidates_evaluated=len(candidates),
        )

    # -- degraded paths -------------------------------------------------------------------

    def _fallback(self, call: _Call, reason: Reason) -> Assembly:
        """Answer at once: the directive if it was fetched, else the messages unchanged."""
        state = call.state
        sources = _closed(state.sources)
        reasons = [reason, *(r for r in _reasons(sources) if r != reason)]
        directive = state.directive.content if state.directive else None
        if directive is not None and call.encoding is not None and call.budget is not None:
            try:
                # The directive alone, laid out, counted and budgeted by the compose step's code.
                alone = directive_only(
                    call.request.messages,
                    directive,
                    profile=call.profile,
                    nonce=self._nonce(call.request),
                    encoding=call.encoding,
                    budget=call.budget,
                    counter=self._counter,
                )
                if alone.budget.window_remaining < 0:
                    return self._pass_through(call, sources, [*reasons, Reason.DIRECTIVE_EXCEEDS_WINDOW])
                injected = Composition(
                    alone.injection.messages(call.request.messages),
                    directive_injected=bool(alone.injection.chunks),
                    tokens_injected=alone.tokens,
                    budget=call.budget,
                )
                return self._finish(
                    call, sources, injected, degradation=Degradation.DIRECTIVE_ONLY, reasons=reasons
                )
            except Exception:
                log.exception("directive-only fallback failed", extra={"request_id": call.request.request_id})
                reasons.append(Reason.ASSEMBLY_ERROR)
        level = Degradation.DIRECTIVE_ONLY if state.directive_done else Degradation.PASS_THROUGH
        return self._pass_through(call, sources, reasons, level)

    def _pass_through(
        self,
        call: _Call,
        sources: tuple[SourceResult, ...],
        reasons: list[Reason],
        level: Degradation = Degradation.PASS_THROUGH,
        *,
        candidates_evaluated: int = 0,
        memories_available: int = 0,
    ) -> Assembly:
        """The client's messages unchanged, with ``reasons`` and ``level`` (DIRECTIVE_ONLY
        when the directive was fetched but could not be injected)."""
        unchanged = Composition(
            call.request.messages, memories_available=memories_available, budget=call.budget
        )
        return self._finish(
            call,
            sources,
            unchanged,
            degradation=level,
            reasons=reasons,
            candidates_evaluated=candidates_evaluated,
        )

    def _finish(
        self,
        call: _Call,
        sources: tuple[SourceResult, ...],
        composed: Composition,
        *,
        degradation: Degradation,
        reasons: Sequence[Reason],
        candidates_evaluated: int = 0,
    ) -> Assembly:
        """The one place an ``Assembly`` is made: every path ends here, and the call's
        timings end with it."""
        budget = composed.budget
        window = budget.context_window if budget else 0
        used = call.messages_tokens + composed.tokens_injected
        ordered = tuple(reasons)
        return Assembly(
            request_id=call.request.request_id,
            model=call.request.model,
            profile=call.profile.name,
            composed=composed,
            degradation=degradation,
            reasons=ordered,
            outcome=outcome_of(degradation, ordered),
            sources=sources,
            candidates_evaluated=candidates_evaluated,
            # Rounded up: above 100 means past the window, never hidden by rounding down.
            context_window_used=math.ceil(100 * used / window) if window else 0,
            timings=Timings(call.started_ns, time.perf_counter_ns(), tuple(call.stages)),
        )

    # -- helpers --------------------------------------------------------------------------

    async def _count_messages(self, messages: Sequence[ChatMessage], encoding: Encoding) -> int:
        """``count_messages``, inline for a small request, else on the counting executor
        (a call cut by its deadline while queued there is dropped from the queue)."""
        if self._counting is None or sum(len(m.content) for m in messages) <= self._config.inline_count_chars:
            return self._counter.count_messages(messages, encoding)
        counted = self._counting.submit(self._counter.count_messages, messages, encoding)
        return await asyncio.wrap_future(counted)

    def _nonce(self, request: AssemblyRequest) -> str:
        # Unpredictable without the server secret, identical for identical inputs
        # (prompt caching), and different for every tenant, agent and session.
        material = "\x1f".join((request.org_id, request.agent_id, request.session_id, request.model))
        return hmac.new(self._config.nonce_secret, material.encode(), hashlib.sha256).hexdigest()[:16]

    def _cancel(self, tasks: list[asyncio.Task[None]]) -> None:
        for task in tasks:
            if task.done():
                continue
            # Never cancel twice: a task already being cancelled (its own timeout) is
            # cleaning up, and store clients do not survive a cancel during clean-up.
            if task.cancelling() == 0:
                task.cancel()
            self._background.add(task)
            task.add_done_callback(self._background.discard)


@dataclass(slots=True)
class _Call:
    """How far one call got: what a fallback may still use when the deadline cuts the
    call at any await, and the stages' timings so far. Private to one ``assemble``."""

    request: AssemblyRequest
    profile: Profile
    started_ns: int
    state: RetrievalState = field(default_factory=RetrievalState)
    encoding: Encoding | None = None
    messages_tokens: int = 0
    budget: TokenBudget | None = None
    stages: list[StageSpan] = field(default_factory=list)


# The most rows one search asks for (pgvector's hnsw.ef_search tops out at 1000).
MAX_SEARCH_LIMIT = 1000


def _search_limit(configured: int, profile: Profile) -> int:
    """A search returns at least as many memories as the profile may inject: with a
    count cap of 100, 50 candidates a search would cap recall (LoCoMo dev set, 4,000
    tokens x 100 memories: 81.7 % of the evidence with 50 a search, 83.8 % with 100;
    ADR-0008). A configured 0 still turns the search off."""
    if configured <= 0:
        return 0
    return min(max(configured, profile.budget.max_memories), MAX_SEARCH_LIMIT)


def _query_text(messages: Sequence[ChatMessage], max_chars: int) -> str:
    """The last user message is the semantic query (its tail, when long)."""
    for message in reversed(messages):
        if message.role == "user" and message.content.strip():
            return message.content[-max_chars:]
    return ""


# A source still running when the call stops waiting counts as timed out.
_STILL_RUNNING = {
    source: SourceResult(source, SourceStatus.TIMEOUT, 0, 0, "still running at the call deadline")
    for source in SOURCES
}


def _closed(recorded: Mapping[SourceName, SourceResult]) -> tuple[SourceResult, ...]:
    """Every source's outcome when the call stops waiting, in ``SOURCES`` order (a
    snapshot: a cancelled task records its own ending later, into the retrieval state
    only)."""
    return tuple(recorded.get(source) or _STILL_RUNNING[source] for source in SOURCES)


def _reasons(sources: tuple[SourceResult, ...]) -> list[Reason]:
    reasons = []
    for result in sources:
        reason = Reason.of_source(result.source, result.status)
        if reason is not None:
            reasons.append(reason)
    return Reason.ordered(reasons)


def _degradation(state: RetrievalState, reasons: Sequence[Reason]) -> Degradation:
    if not reasons:
        return Degradation.FULL
    failed = {r.source for r in reasons}
    hot_answered = SourceName.HOT not in failed
    vector_answered = not ({SourceName.EMBED, SourceName.COLD} & failed)
    lexical_answered = SourceName.LEXICAL not in failed
    cold_answered = vector_answered or lexical_answered
    if hot_answered and cold_answered:
        return Degradation.PARTIAL
    if hot_answered:
        return Degradation.HOT_ONLY
    if cold_answered:
        return Degradation.COLD_ONLY
    if state.directive_done:
        return Degradation.DIRECTIVE_ONLY
    return Degradation.PASS_THROUGH
