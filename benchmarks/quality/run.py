"""One benchmark run: per budget, fresh agents are ingested, every question is asked
of the service in conversation order (post-response bookkeeping on, as in
production), and the baselines pack the same memories into the same budget."""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from ibex_context.embedding.minilm import MiniLMEmbedder
from ibex_context.tokens.catalogue import resolve_model
from ibex_context.tokens.counting import MessageTokenCounter
from ibex_context.tokens.encodings import Encoding, EncodingRegistry
from ibex_context_client.context import ContextClient
from ibex_context_client.memory import MemoryClient

from benchmarks.quality.ask import (
    CALL_TIMEOUT_SECONDS,
    MODEL,
    SERVED_DEADLINE_SECONDS,
    ask,
    open_connection,
    warm_query_embedding,
)
from benchmarks.quality.baselines import (
    BASELINES,
    ContentCost,
    InjectionCost,
    Ranking,
    memory_records,
    pack,
    rankings_for,
)
from benchmarks.quality.bm25 import BM25Index
from benchmarks.quality.budgets import Budget
from benchmarks.quality.ingest import (
    CATEGORY,
    IngestedConversation,
    Tenant,
    duplicate_turns,
    evidence_indices,
    ingest,
)
from benchmarks.quality.locomo import Conversation
from benchmarks.quality.metrics import Outcome, outcome
from benchmarks.quality.served import Served, level_name, served

log = logging.getLogger(__name__)
SERVICE = "service"
CONTENT_ONLY = " (content tokens)"


def methods() -> list[str]:
    return [SERVICE, *BASELINES, *(b + CONTENT_ONLY for b in BASELINES)]


@dataclass(frozen=True, slots=True)
class Prepared:
    """What a run computes once for every budget: embeddings, BM25, rankings."""

    conversation: Conversation
    turn_vectors: npt.NDArray[np.float32]
    rankings: list[Mapping[str, Ranking]]  # per question
    evidence: list[list[int]]  # per question: turn indices
    content_cost: ContentCost


@dataclass(slots=True)
class BudgetRun:
    budget: Budget
    outcomes: dict[str, list[Outcome]] = field(default_factory=lambda: {m: [] for m in methods()})
    profiles_seen: Counter[str] = field(default_factory=Counter)
    memory_budgets_seen: Counter[int] = field(default_factory=Counter)
    degradations: Counter[str] = field(default_factory=Counter)
    # Every answer's degradation level (FULL included) and each reason it gave, as served.
    levels: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    # Whether the questions' embeddings were computed before they were asked (--warm).
    warm: bool = False
    warm_up_failures: int = 0
    packing_repairs: int = 0
    duplicate_turns: int = 0
    # Per answer: the service's memory_tokens_used minus what the benchmark's costing
    # charges for the same memories (a few tokens of nonce apart, it should be 0).
    costing_differences: list[int] = field(default_factory=list)
    # Questions whose baselines were costed before any answer showed the service's nonce.
    costed_without_service_nonce: int = 0
    seconds: float = 0.0

    def served(self) -> Served:
        return served(self.levels, self.reasons, _round_trips(self))


def served_over(runs: Sequence[BudgetRun]) -> Served:
    """Every budget's answers pooled."""
    levels: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for run in runs:
        levels.update(run.levels)
        reasons.update(run.reasons)
    return served(levels, reasons, [ms for run in runs for ms in _round_trips(run)])


def _round_trips(run: BudgetRun) -> list[float]:
    return [o.latency_ms for o in run.outcomes[SERVICE] if o.latency_ms is not None]


def prepare(
    conversations: Sequence[Conversation], embedder: MiniLMEmbedder, encoding: Encoding
) -> list[Prepared]:
    prepared = []
    for conversation in conversations:
        contents = [t.content for t in conversation.turns]
        turn_vectors = np.asarray(embedder.embed_sync(contents), dtype=np.float32)
        questions = [q.text for q in conversation.questions]
        query_vectors = np.asarray(embedder.embed_sync(questions), dtype=np.float32) if questions else None
        index = BM25Index(contents)
        rankings = [
            rankings_for(query_vectors[i], turn_vectors, index.scores(q))
            for i, q in enumerate(questions)
            if query_vectors is not None
        ]
        prepared.append(
            Prepared(
                conversation,
                turn_vectors,
                rankings,
                evidence_indices(conversation),
                ContentCost(contents, encoding),
            )
        )
    return prepared


def model_encoding(registry: EncodingRegistry) -> Encoding:
    return registry.get(resolve_model(MODEL, {}).encoding)


async def run_budget(
    budget: Budget,
    tenants: Sequence[Tenant],
    prepared: Sequence[Prepared],
    *,
    target: str,
    warm_up: Tenant,
    warmed: set[str],
    encoding: Encoding,
    counter: MessageTokenCounter,
    warm: bool = False,
) -> BudgetRun:
    run = BudgetRun(budget, warm=warm)
    started = time.perf_counter()
    async with MemoryClient(target, timeout=120.0) as writer, ContextClient(target) as reader:
        # A proxy's connection to the service is long-lived: open this one with a call that
        # is not counted (a fixed text of the memoryless agent, no question's embedding).
        await open_connection(reader, warm_up)
        for tenant, item in zip(tenants, prepared, strict=True):
            ingested = await ingest(writer, item.conversation, tenant, item.turn_vectors)
            run.duplicate_turns += duplicate_turns([ingested])
            log.info(
                "%s: %s ingested (%d turns)",
                budget.name,
                item.conversation.sample_id,
                len(ingested.memory_ids),
            )
            await _ask_conversation(run, ingested, item, reader, warm_up, warmed, encoding, counter)
    run.seconds = time.perf_counter() - started
    return run


async def _ask_conversation(
    run: BudgetRun,
    ingested: IngestedConversation,
    item: Prepared,
    reader: ContextClient,
    warm_up: Tenant,
    warmed: set[str],
    encoding: Encoding,
    counter: MessageTokenCounter,
) -> None:
    conversation = item.conversation
    budget = run.budget
    turns_of = ingested.turns_by_memory_id()
    records = memory_records(ingested.memory_ids, [t.content for t in conversation.turns], CATEGORY)
    # Re-costed with the service's own nonce once an answer shows it (a random one of
    # the same form until then).
    framed_cost = InjectionCost(records, encoding, counter)
    costed_nonce: str | None = None
    # One session per conversation and budget (the service wants a UUID).
    session_id = str(uuid.uuid4())
    for position, question in enumerate(conversation.questions):
        # The query cache is per org: warmed by a memoryless agent of the tenant's own org.
        warmed_key = f"{ingested.tenant.org_id}\x1f{question.text}"
        if run.warm and warmed_key not in warmed:
            warm_in_org = Tenant(ingested.tenant.org_id, warm_up.agent_id)
            if await warm_query_embedding(reader, warm_in_org, question.text):
                warmed.add(warmed_key)
            else:
                run.warm_up_failures += 1
        timeout = CALL_TIMEOUT_SECONDS if run.warm else SERVED_DEADLINE_SECONDS
        answer = await ask(reader, ingested.tenant, question.text, session_id, timeout=timeout)
        injected = [turn for memory_id in answer.memory_ids for turn in turns_of.get(memory_id, [])]
        run.profiles_seen[answer.profile] += 1
        run.memory_budgets_seen[answer.memory_budget] += 1
        run.levels[level_name(answer.degradation)] += 1
        run.reasons.update(answer.reasons)
        if answer.degraded:
            run.degradations[",".join(answer.reasons) or answer.degradation] += 1
        evidence = item.evidence[position]

        scored = functools.partial(
            outcome,
            conversation=conversation.sample_id,
            question=question.number,
            category=question.category,
            evidence=evidence,
        )
        if answer.nonce is not None and answer.nonce != costed_nonce:
            framed_cost = InjectionCost(records, encoding, counter, nonce=answer.nonce)
            costed_nonce = answer.nonce
        if costed_nonce is None:
            run.costed_without_service_nonce += 1
        if answer.memory_ids and not answer.degraded:
            memory_index = {memory_id: i for i, memory_id in enumerate(ingested.memory_ids)}
            same_set = [memory_index[m] for m in answer.memory_ids if m in memory_index]
            run.costing_differences.append(answer.memory_tokens - framed_cost.exact(same_set))
        run.outcomes[SERVICE].append(
            scored(
                injected=injected,
                tokens=answer.memory_tokens,
                latency_ms=answer.latency_ms,
                degraded=answer.degraded,
            )
        )
        for name, ranking in item.rankings[position].items():
            framed = pack(ranking, framed_cost, budget.max_memory_tokens, budget.max_memories)
            run.packing_repairs += framed.repairs
            run.outcomes[name].append(scored(injected=framed.indices, tokens=framed.tokens))
            plain = pack(ranking, item.content_cost, budget.max_memory_tokens, budget.max_memories)
            run.outcomes[name + CONTENT_ONLY].append(scored(injected=plain.indices, tokens=plain.tokens))
