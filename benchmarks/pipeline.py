"""Single-call replay of the pure stages the assembler runs after retrieval.

Run: ``.venv/bin/python benchmarks/pipeline.py [--calls N] [--out FILE]``
(prints a markdown table; ``--out`` also writes it).

What one call does here is what ``Assembler._compose`` does, stage for stage:

* score:  ``score_candidates`` over 70 candidates (20 hot memories with their
  stored embedding, 50 cold hits with the store's similarity);
* pack:   the directive-only injection and its exact count, the budget, each
  candidate's ``memory_cost``, ``section_overhead``, ``pack``;
* format: ``format_context`` with the packed memories and the exact count of
  the injected message (with the drop-the-weakest repair loop).

Candidates look like what the stores return: English-like contents of 50-400
tokens with some punctuation, markup-ish characters, numbers and code, and
``token_counts`` for o200k_base and cl100k_base counted at write time.

Three cache states, since the counter's caches are part of the cost:

* ``first call``: a fresh ``MessageTokenCounter`` every call (a restarted pod:
  nothing about these memories is cached);
* ``new session``: the same counter, another nonce every call (a new session
  of an agent whose memories this pod has costed before);
* ``next turn``: the same counter and nonce (the session's next turn, mostly
  the same hot and cold memories).

CPU time per stage is ``time.thread_time_ns``; p50 and p99 over ``--calls``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tiktoken
from ibex_context.candidates import Candidates
from ibex_context.models import CATEGORY_ORDER, ChatMessage, MemoryRecord, ScoredMemory, Source
from ibex_context.pipeline.budget import compute_budget
from ibex_context.pipeline.costing import count_injected, memory_cost, section_overhead
from ibex_context.pipeline.formatting import format_context
from ibex_context.pipeline.packing import pack_costed
from ibex_context.pipeline.scoring import score_candidates
from ibex_context.profiles.model import Format, Profile
from ibex_context.tokens.catalogue import resolve_model
from ibex_context.tokens.counting import MessageTokenCounter
from ibex_context.tokens.encodings import EncodingRegistry

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


StageTimes = dict[str, int]


def compose(
    w: Workload,
    profile: Profile,
    model_name: str,
    registry: EncodingRegistry,
    counter: MessageTokenCounter,
    nonce: str = "0123456789abcdef",
) -> tuple[StageTimes, int, int]:
    """``Assembler._compose`` after retrieval, with per-stage CPU time."""
    fmt: Format = profile.format
    model = resolve_model(model_name, profile.models)
    encoding = registry.get(model.encoding)
    messages_tokens = counter.count_messages(w.messages, encoding)
    times: StageTimes = {}

    def injection_tokens(memories: list[ScoredMemory]) -> int:
        return count_injected(
            w.messages,
            directive=w.directive,
            memories=memories,
            fmt=fmt,
            mode=profile.injection_mode,
            nonce=nonce,
            encoding=encoding,
            counter=counter,
        )

    t0 = time.thread_time_ns()
    scored = score_candidates(Candidates.from_records(w.candidates), w.query, profile.scoring, now=w.now)
    t1 = time.thread_time_ns()
    times["score"] = t1 - t0

    directive_tokens = injection_tokens([])
    budget = compute_budget(
        model,
        messages_tokens=messages_tokens,
        directive_tokens=directive_tokens,
        limits=profile.budget,
        exact=True,
    )
    costs = [memory_cost(m, encoding, fmt, counter=counter) for m in scored]
    overhead = (
        section_overhead(
            encoding,
            fmt,
            nonce=nonce,
            categories={m.memory.category for m in scored},
            include_message_framing=not w.directive,
            counter=counter,
        )
        if scored
        else 0
    )
    packed = pack_costed(
        scored, costs, max(0, budget.memory_budget - overhead), max_items=profile.budget.max_memories
    )
    t2 = time.thread_time_ns()
    times["pack"] = t2 - t1

    selected: list[ScoredMemory] = list(packed.selected)
    injected = directive_tokens
    while selected:
        injected = injection_tokens(selected)
        if injected <= directive_tokens + budget.memory_budget:
            break
        selected.pop()
    if not selected:
        injected = directive_tokens
    format_context(
        w.messages,
        directive=w.directive,
        memories=selected,
        fmt=fmt,
        mode=profile.injection_mode,
        nonce=nonce,
    )
    t3 = time.thread_time_ns()
    times["format"] = t3 - t2
    times["total"] = t3 - t0
    return times, len(selected), injected


def run(
    calls: int,
    fmt: Format,
    model_name: str,
    caches: str,
    registry: EncodingRegistry,
    workloads: list[Workload],
) -> tuple[dict[str, list[int]], list[int], list[int]]:
    profile = Profile(format=fmt)
    samples: dict[str, list[int]] = {"score": [], "pack": [], "format": [], "total": []}
    kept: list[int] = []
    injected: list[int] = []
    shared = MessageTokenCounter(registry)
    warm = caches != "first call"
    for i in range(calls + (len(workloads) if warm else 0)):
        counter = shared if warm else MessageTokenCounter(registry)
        w = workloads[i % len(workloads)]
        # A new session has its own nonce (the HMAC covers the session id).
        nonce = f"{i:016x}" if caches == "new session" else "0123456789abcdef"
        times, n, tokens = compose(w, profile, model_name, registry, counter, nonce)
        if warm and i < len(workloads):
            continue  # the first pass fills the cache
        for k, v in times.items():
            samples[k].append(v)
        kept.append(n)
        injected.append(tokens)
    return samples, kept, injected


def pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] / 1000.0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--formats", default="xml,markdown,json")
    args = parser.parse_args(argv)
    registry = EncodingRegistry(Path(tempfile.gettempdir()) / "ibex-bench-tiktoken")
    o200k = registry.get("o200k_base")._tokenizer
    cl100k = registry.get("cl100k_base")._tokenizer
    assert o200k is not None and cl100k is not None
    workloads = [make_workload(seed, o200k, cl100k) for seed in range(10)]
    lines = [
        "| model | format | caches | score p50 / p99 | pack p50 / p99 | format p50 / p99 "
        "| **total p50 / p99** | kept | injected tokens |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    cases: list[tuple[str, Format]] = [("gpt-4o", f) for f in args.formats.split(",")]  # type: ignore[misc]
    cases.append(("gpt-4", "xml"))
    for model_name, fmt in cases:
        for caches in ("first call", "new session", "next turn"):
            samples, kept, injected = run(args.calls, fmt, model_name, caches, registry, workloads)
            cells = [
                f"{pct(samples[k], 0.5):.0f} / {pct(samples[k], 0.99):.0f}"
                for k in ("score", "pack", "format")
            ]
            total = f"**{pct(samples['total'], 0.5):.0f} / {pct(samples['total'], 0.99):.0f}**"
            lines.append(
                f"| {model_name} | {fmt} | {caches} | "
                + " | ".join(cells)
                + f" | {total} | {statistics.median(kept):.0f} | {statistics.median(injected):.0f} |"
            )
            print(lines[-1], flush=True)
    setup = (
        f"CPU µs per call (thread CPU time), {args.calls} calls per row over 10 workloads of "
        f"{HOT} hot + {COLD} cold candidates, 50-400-token contents; Python {platform.python_version()}, "
        f"numpy {np.__version__}, tiktoken {tiktoken.__version__}, {platform.machine()}, "
        f"{os.cpu_count()} vCPUs shared, load average {os.getloadavg()[0]:.1f} at the end."
    )
    table = "\n".join([setup, "", *lines, ""])
    if args.out:
        args.out.write_text(table)
    print(setup)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
