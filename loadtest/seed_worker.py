"""What one seeding process computes: memory texts within the stored token range, their
stored token counts and their vectors, with the tokenizers and the embedder it builds once.

``loadtest.seed`` runs it in a pool of processes (its initializer fills ``WORKER``);
``loadtest.vectors`` uses it in process for its reference samples.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
from ibex_context.memory_api.writes import STORED_ENCODINGS

from loadtest import corpus

MIN_TOKENS, MAX_TOKENS = 50, 400

# Per process: the tokenizers, the embedder and the vector shape, built once (loading o200k
# takes ~0.6 s; a model even longer).
WORKER: dict[str, Any] = {}


def fit_tokens(
    text: str, count: Any, rng: random.Random, low: int, high: int, counts: dict[str, int] | None = None
) -> tuple[str, dict[str, int]]:
    """Pads or trims ``text`` until every stored encoding counts between ``low`` and ``high``
    (``counts``: the text's counts when already known)."""
    if counts is None:
        counts = {name: count(name, text) for name in STORED_ENCODINGS}
    else:
        counts = {name: counts[name] for name in STORED_ENCODINGS}
    while min(counts.values()) < low:
        text = f"{text} {rng.choice(corpus.FILLER)}"
        counts = {name: count(name, text) for name in STORED_ENCODINGS}
    while max(counts.values()) > high:
        words = text.split()
        text = " ".join(words[: max(1, int(len(words) * high / max(counts.values())) - 2)]).rstrip(",;") + "."
        counts = {name: count(name, text) for name in STORED_ENCODINGS}
    return text, counts


def ensure_worker_tokenizers() -> None:
    """This process's token counters (what ``memory_texts`` needs), built once."""
    if "count" in WORKER:
        return
    from ibex_context.pipeline.layout import stored_token_counts
    from ibex_context.tokens.encodings import EncodingRegistry

    registry = EncodingRegistry()
    encodings = {name: registry.get(name) for name in STORED_ENCODINGS}
    missing = [name for name, enc in encodings.items() if not enc.exact]
    if missing:
        raise SystemExit(f"seed: encodings not available offline: {missing}")
    WORKER["count"] = lambda name, text: encodings[name].count(text)
    # What the write path stores (content and block-body counts): one source of truth.
    WORKER["stored_counts"] = lambda text: stored_token_counts(text, encodings.values())


def worker_embedder(name: str, dim: int = 384) -> Any:
    """This process's embedder ``name``, built once (loading MiniLM takes seconds)."""
    key = f"embedder:{name}:{dim}"
    if key not in WORKER:
        WORKER[key] = build_embedder(name, dim)
    return WORKER[key]


def build_embedder(name: str, dim: int) -> Any:
    """The service's own embedder, so stored vectors match what it computes for queries."""
    try:
        from ibex_context.embedding.factory import build_embedder as factory
        from ibex_context.settings import Settings

        return factory(Settings(embedder=name, embedding_dim=dim))  # type: ignore[arg-type]
    except ImportError:
        if name != "hashing":
            raise
        from ibex_context.embedding.hashing import HashingEmbedder

        return HashingEmbedder(dim)


def embed(texts: Sequence[str], dim: int, rng: np.random.Generator) -> np.ndarray:
    """The texts' vectors as the rows of one float32 matrix."""
    shape = WORKER.get("shape")
    if shape is not None:  # drawn from the model of MiniLM's vectors (loadtest.vectors)
        return shape.draw(len(texts), rng)[0]
    embedder = WORKER.get("embedder")
    if embedder is None:
        vectors = rng.standard_normal((len(texts), dim), dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors
    embed_many = getattr(embedder, "embed_many", None)
    if embed_many is not None:  # the hashing embedder: one vectorised batch
        return np.asarray(embed_many(texts), dtype=np.float32)
    out: list[np.ndarray] = []
    for i in range(0, len(texts), 64):
        out.extend(asyncio.run(embedder.embed(list(texts[i : i + 64]))))
    return np.stack(out).astype(np.float32) if out else np.zeros((0, dim), dtype=np.float32)


def _within(counts: dict[str, int]) -> bool:
    return all(MIN_TOKENS <= counts[name] <= MAX_TOKENS for name in STORED_ENCODINGS)


def memory_texts(
    rng: random.Random, memories: int
) -> tuple[list[corpus.MemorySpec], list[str], list[dict[str, int]], list[bytes]]:
    """``memories`` distinct memories drawn from ``rng``: their specs, texts (within the
    stored token range), stored token counts and content hashes (in a worker process)."""
    count = WORKER["count"]
    stored_counts = WORKER["stored_counts"]
    specs: list[corpus.MemorySpec] = []
    texts: list[str] = []
    token_counts: list[dict[str, int]] = []
    hashes: list[bytes] = []
    seen: set[bytes] = set()
    while len(specs) < memories:
        spec = corpus.memory_spec(rng)
        # The stored counts hold every stored encoding's count of the content: most
        # texts are in range as generated and are tokenised once, not twice.
        text, counts = spec.content, stored_counts(spec.content)
        if not _within(counts):
            text, _ = fit_tokens(text, count, rng, MIN_TOKENS, MAX_TOKENS, counts)
            counts = stored_counts(text)
        digest = hashlib.sha256(text.encode("utf-8")).digest()
        if digest in seen:  # the schema allows one row per content per agent
            continue
        seen.add(digest)
        specs.append(spec)
        texts.append(text)
        token_counts.append(counts)
        hashes.append(digest)
    return specs, texts, token_counts, hashes
