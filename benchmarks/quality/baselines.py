"""The baselines the service is compared with: three rankings of the same memories,
each packed into the same budget the same way.

* cosine top-k: MiniLM similarity of the question and each memory;
* BM25 (``bm25.py``): documents that share no word with the question are left out;
* hybrid: reciprocal rank fusion (k = 60) of the two rankings.

Packing takes memories in ranking order, skips one that does not fit and stops at
the count cap. A memory's cost is what it adds to the service's injected text
(``InjectionCost``) or, for reference, its content tokens alone (``ContentCost``).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt
from ibex_context.models import MemoryRecord, ScoredMemory
from ibex_context.pipeline.layout import format_context
from ibex_context.tokens.counting import MessageTokenCounter
from ibex_context.tokens.encodings import Encoding

RRF_K = 60
Ranking = npt.NDArray[np.int64]


def cosine_ranking(query: npt.NDArray[np.float32], memories: npt.NDArray[np.float32]) -> Ranking:
    """Memory indices by decreasing cosine similarity (vectors are unit length);
    ties keep dialog order."""
    similarity = memories @ query
    ranking: Ranking = np.argsort(-similarity, kind="stable").astype(np.int64)
    return ranking


def score_ranking(scores: npt.NDArray[np.float32]) -> Ranking:
    """Indices with a positive score, best first; ties keep dialog order."""
    order = np.argsort(-scores, kind="stable")
    ranking: Ranking = order[scores[order] > 0].astype(np.int64)
    return ranking


def rrf_ranking(rankings: Sequence[Ranking], size: int, k: int = RRF_K) -> Ranking:
    """Reciprocal rank fusion: sum of 1 / (k + rank) over the rankings a memory is in
    (rank from 1); memories in none are left out."""
    fused = np.zeros(size, dtype=np.float64)
    for ranking in rankings:
        fused[ranking] += 1.0 / (k + np.arange(1, len(ranking) + 1))
    order = np.argsort(-fused, kind="stable")
    result: Ranking = order[fused[order] > 0].astype(np.int64)
    return result


class CostModel(Protocol):
    """Additive cost estimates, and the exact cost of a set (the final word)."""

    def framing(self) -> int: ...

    def block(self, index: int) -> int: ...

    def smallest_block(self) -> int: ...

    def exact(self, indices: Sequence[int]) -> int: ...


@dataclass(frozen=True, slots=True)
class Packed:
    indices: tuple[int, ...]
    tokens: int
    # Memories dropped because the exact cost of the set exceeded the estimate's.
    repairs: int


def pack(ranking: Sequence[int] | Ranking, costs: CostModel, budget: int, max_items: int) -> Packed:
    """Greedy in ranking order: a memory that does not fit is skipped, the count cap
    stops. Estimated with additive costs, then checked exactly (dropping the last
    added until the exact cost fits, which has not happened with the xml format)."""
    selected: list[int] = []
    total = costs.framing()
    smallest = costs.smallest_block()
    for index in ranking:
        if len(selected) >= max_items or total + smallest > budget:
            break
        cost = costs.block(int(index))
        if total + cost <= budget:
            selected.append(int(index))
            total += cost
    exact = costs.exact(selected) if selected else 0
    repairs = 0
    while selected and exact > budget:
        selected.pop()
        repairs += 1
        exact = costs.exact(selected) if selected else 0
    return Packed(tuple(selected), exact, repairs)


class ContentCost:
    """Content tokens only: no tags, no notice, no message framing."""

    def __init__(self, contents: Sequence[str], encoding: Encoding) -> None:
        self._tokens = [encoding.count(c) for c in contents]

    def framing(self) -> int:
        return 0

    def block(self, index: int) -> int:
        return self._tokens[index]

    def smallest_block(self) -> int:
        return min(self._tokens, default=0)

    def exact(self, indices: Sequence[int]) -> int:
        return sum(self._tokens[i] for i in indices)


class InjectionCost:
    """What a set of memories adds to the prompt when the service's own formatter
    renders it (default xml format, ``system_first``), counted with the service's
    tokenizer exactly as the service counts its budget: the tokens of the formatted
    messages minus those of the client's (here: none; the injected system message
    does not depend on the question).

    The formatter is called as a black box, so a change of the framing changes
    these costs too. ``nonce``: the session's, as the service's answers show it
    (it is in every memory's tag, so its tokens matter); random until known.
    Per-memory estimates: ``framing`` is what two singletons share (notice,
    section tags, message overhead), ``block`` the rest of a singleton's cost.
    """

    def __init__(
        self,
        records: Sequence[MemoryRecord],
        encoding: Encoding,
        counter: MessageTokenCounter,
        *,
        nonce: str | None = None,
    ) -> None:
        self._records = list(records)
        self._encoding = encoding
        self._counter = counter
        # The service derives a 16-hex-character nonce per (tenant, session, model).
        self._nonce = nonce or secrets.token_hex(8)
        singles = [self.exact([i]) for i in range(len(self._records))]
        shared = singles[0] + singles[1] - self.exact([0, 1]) if len(self._records) >= 2 else 0
        self._framing = shared
        self._blocks = [s - shared for s in singles]

    def framing(self) -> int:
        return self._framing

    def block(self, index: int) -> int:
        return self._blocks[index]

    def smallest_block(self) -> int:
        return min(self._blocks, default=0)

    def exact(self, indices: Sequence[int]) -> int:
        memories = [_unscored(self._records[i]) for i in indices]
        formatted = format_context(
            [], directive=None, memories=memories, fmt="xml", mode="system_first", nonce=self._nonce
        )
        if not formatted.injected:
            return 0
        return self._counter.count_messages(
            formatted.messages, self._encoding
        ) - self._counter.count_messages([], self._encoding)


def _unscored(record: MemoryRecord) -> ScoredMemory:
    # format_context takes scored memories; the formatter reads only ``.memory``.
    return ScoredMemory(
        memory=record, score=0.0, relevance=0.0, recency=0.0, usefulness=0.0, confidence=0.0, frequency=0.0
    )


def memory_records(ids: Sequence[str], contents: Sequence[str], category: str) -> list[MemoryRecord]:
    """The stored memories as the formatter sees them (ids the service assigned)."""
    return [MemoryRecord(id=i, content=c, category=category) for i, c in zip(ids, contents, strict=True)]


BASELINES: tuple[str, ...] = ("cosine", "bm25", "hybrid")


def rankings_for(
    query_vector: npt.NDArray[np.float32],
    memory_vectors: npt.NDArray[np.float32],
    bm25_scores: npt.NDArray[np.float32],
) -> Mapping[str, Ranking]:
    cosine = cosine_ranking(query_vector, memory_vectors)
    lexical = score_ranking(bm25_scores)
    return {
        "cosine": cosine,
        "bm25": lexical,
        "hybrid": rrf_ranking([cosine, lexical], len(memory_vectors)),
    }
