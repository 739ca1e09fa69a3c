"""What one method injected for one question, and the figures over many questions.

* evidence recall, micro: evidence turns injected / evidence turns (all questions'
  turns pooled); macro: the mean over questions of each one's share;
* full-hit rate: share of questions whose every evidence turn was injected;
* concentration: per conversation, the share of injected slots taken by its
  ``TOP_INJECTED`` most-injected memories; averaged over conversations.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

TOP_INJECTED = 10


@dataclass(frozen=True, slots=True)
class Outcome:
    """One question answered by one method at one budget (no text of the data set)."""

    conversation: str
    question: int  # position in the conversation's qa list
    category: int
    evidence: int  # evidence turns
    hits: int  # evidence turns injected
    injected: int  # memories injected
    tokens: int  # tokens the injected memories cost (see the report for what is counted)
    latency_ms: float | None = None  # round trip, for the service only
    degraded: bool = False
    # Which memories were injected (turn indices); kept in memory for concentration only.
    memories: tuple[int, ...] = ()

    @property
    def recall(self) -> float:
        return self.hits / self.evidence


def outcome(
    *,
    conversation: str,
    question: int,
    category: int,
    evidence: Iterable[int],
    injected: Sequence[int],
    tokens: int,
    latency_ms: float | None = None,
    degraded: bool = False,
) -> Outcome:
    wanted = set(evidence)
    chosen = set(injected)
    return Outcome(
        conversation=conversation,
        question=question,
        category=category,
        evidence=len(wanted),
        hits=len(wanted & chosen),
        injected=len(chosen),
        tokens=tokens,
        latency_ms=latency_ms,
        degraded=degraded,
        memories=tuple(injected),
    )


@dataclass(frozen=True, slots=True)
class Summary:
    questions: int
    evidence_turns: int
    recall_micro: float
    recall_macro: float
    full_hit: float
    mean_injected: float
    mean_tokens: float
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    degraded: int


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summarise(outcomes: Sequence[Outcome]) -> Summary:
    if not outcomes:
        return Summary(0, 0, math.nan, math.nan, math.nan, math.nan, math.nan, None, None, 0)
    evidence = sum(o.evidence for o in outcomes)
    latencies = [o.latency_ms for o in outcomes if o.latency_ms is not None]
    n = len(outcomes)
    return Summary(
        questions=n,
        evidence_turns=evidence,
        recall_micro=sum(o.hits for o in outcomes) / evidence,
        recall_macro=sum(o.recall for o in outcomes) / n,
        full_hit=sum(o.hits == o.evidence for o in outcomes) / n,
        mean_injected=sum(o.injected for o in outcomes) / n,
        mean_tokens=sum(o.tokens for o in outcomes) / n,
        latency_p50_ms=percentile(latencies, 50) if latencies else None,
        latency_p99_ms=percentile(latencies, 99) if latencies else None,
        degraded=sum(o.degraded for o in outcomes),
    )


def concentration(outcomes: Sequence[Outcome], top: int = TOP_INJECTED) -> float:
    """Mean over conversations of the share of injected slots its ``top`` most-injected
    memories took (NaN when nothing was injected)."""
    by_conversation: dict[str, Counter[int]] = {}
    for o in outcomes:
        by_conversation.setdefault(o.conversation, Counter()).update(o.memories)
    shares = [
        sum(count for _, count in counts.most_common(top)) / total
        for counts in by_conversation.values()
        if (total := sum(counts.values()))
    ]
    return sum(shares) / len(shares) if shares else math.nan
