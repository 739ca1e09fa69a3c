"""The candidates one call gets from the stores, as the in-process benchmarks build them.

Contents look like what the stores return: English-like text of 50-400 tokens with
some punctuation, markup-ish characters, numbers and code, and ``token_counts`` for
o200k_base and cl100k_base counted at write time; 20 hot memories (stored
embeddings, mixed relevance to the query) and 50 vector matches (the store's
similarity). Seeded: the same seed gives the same workload on any tree.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

import numpy as np
import tiktoken
from ibex_context.models import CATEGORY_ORDER, ChatMessage, MemoryRecord, Source

HOT = 20
COLD = 50
DIM = 384
WORDS = (  # noqa: SIM905
    "the agent should always prefer concise answers when user asks about billing invoices deploy "
    "kubernetes cluster namespace pod restart policy memory limit config map secret rotation "
    "customer account region europe latency budget retry backoff timeout database index vacuum "
    "release notes version rollback canary traffic percent alert page on-call escalation team "
    "prefers python typing strict mypy ruff format tests coverage flaky quarantine nightly build"
).split()
EXTRAS = (
    "(see runbook)",
    "e.g.",
    "v1.2.3",
    "42",
    "3.14",
    "`kubectl get pods`",
    "x < y",
    "a & b",
    "--flag",
    "é",
    "日本",
)


def make_content(rng: random.Random, encoding: tiktoken.Encoding, target_tokens: int) -> str:
    sentences: list[str] = []
    while True:
        words = [rng.choice(WORDS) for _ in range(rng.randint(6, 18))]
        if rng.random() < 0.4:
            words.insert(rng.randrange(len(words)), rng.choice(EXTRAS))
        sentence = " ".join(words)
        sentences.append(sentence[0].upper() + sentence[1:] + rng.choice((".", ".", ".", "!", "?", ":")))
        text = (" " if rng.random() < 0.8 else "\n").join(sentences)
        if len(encoding.encode_ordinary(text)) >= target_tokens:
            return text


@dataclass(frozen=True)
class Workload:
    candidates: list[MemoryRecord]
    query: np.ndarray
    messages: tuple[ChatMessage, ...]
    directive: str
    now: float


def make_workload(seed: int, o200k: tiktoken.Encoding, cl100k: tiktoken.Encoding) -> Workload:
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    now = 1_790_000_000.0
    query = nrng.standard_normal(DIM).astype(np.float32)
    candidates: list[MemoryRecord] = []
    for i in range(HOT + COLD):
        content = make_content(rng, o200k, rng.randint(50, 400))
        hot = i < HOT
        embedding = None
        similarity = None
        if hot:
            # Mixed relevance: some near the query, most unrelated.
            mix = rng.random()
            embedding = (mix * query + (1 - mix) * nrng.standard_normal(DIM)).astype(np.float32)
        else:
            similarity = rng.uniform(0.1, 0.9)
        candidates.append(
            MemoryRecord(
                id=f"mem-{seed}-{i:03d}-{hashlib.sha1(content.encode()).hexdigest()[:8]}",
                content=content,
                category=rng.choice(CATEGORY_ORDER),
                confidence=rng.uniform(0.3, 1.0),
                usefulness=rng.uniform(0.0, 1.0),
                retrieval_count=rng.randint(0, 80),
                occurred_at=now - rng.uniform(0, 200) * 86_400,
                last_injected_at=None,
                token_counts={
                    "o200k_base": len(o200k.encode_ordinary(content)),
                    "cl100k_base": len(cl100k.encode_ordinary(content)),
                },
                embedding=embedding,
                similarity=similarity,
                source=Source.HOT if hot else Source.COLD,
            )
        )
    messages = (
        ChatMessage(role="system", content="You are a helpful platform assistant."),
        ChatMessage(
            role="user", content="Our canary deploy keeps rolling back; what did we decide about it?"
        ),
        ChatMessage(
            role="assistant", content="You decided to hold canaries at 5 % for an hour before promoting."
        ),
        ChatMessage(role="user", content="And what is the retry policy for the billing workers?"),
    )
    directive = (
        "You are the platform team's assistant. Answer briefly, cite runbooks by name, "
        "never run destructive commands without confirmation, and prefer the team's conventions."
    )
    return Workload(candidates, query, messages, directive, now)


def pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] / 1000.0
