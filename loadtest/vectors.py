"""Stored vectors shaped like MiniLM's, for data sets of any size.

Embedding one seeded memory with MiniLM in fp32 (as the service stores it) costs ~37 ms
of a core here (a 93-word text): 1M memories would take ~5 hours of this machine's two
cores. Random-like vectors (the hashing toy's) are no stand-in: a graph search on them
needs a far wider ``ef_search`` than on sentence embeddings, which sit in clusters of
low dimension. So large data sets draw their vectors from a model of real ones:

* **the reference**: ``REFERENCE_MEMORIES`` memories written by the seed's own text
  generator (``seed_worker.memory_texts``, on a random stream of their own), embedded by the
  service's MiniLM embedder as it stores them (fp32), and one question about each
  (``corpus.query_from_memory``) embedded as the service embeds queries. Two samples,
  one to fit and one to check against, cached in ``vector_cache_dir()`` by the texts'
  digest and the embedder's graph version, so later runs never embed them again;
* **the model** (``VectorShape``): k-means clusters of the reference vectors; per cluster
  its mean, its ``RANK`` main directions with their spread, the spread left in the
  other directions, and how each real question lies from its memory (its cosine to the
  memory and its direction away from it);
* **a draw**: a cluster by its share, its mean plus Gaussian spread along its directions
  plus the rest, normalised; a question about a drawn memory lies from it as a real
  question of its cluster lies from its own memory.

A drawn vector is not its memory text's embedding: the lexical search finds the
memories a question names, the vector search finds drawn neighbours. What the model
keeps is the geometry a graph search pays for. ``benchmarks.agent_graph --check``
measures it: at 10k memories, one agent's graph built on real and on drawn vectors,
recall@50 against exact and search time at the same settings
(``benchmarks/results/agent-graphs-*.md``).
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# The stored vectors a seed can write: the embedder's of each text, drawn from the model
# of MiniLM's, or random unit vectors.
VECTORS = ("embedder", "shaped", "random")
REFERENCE_MEMORIES = 10_000
# The two reference samples' random streams: one fits the model, one checks it.
FIT_SAMPLE, CHECK_SAMPLE = "reference-fit", "reference-check"
CLUSTERS = 64
# Bumped whenever what ``fit_shape`` stores changes: a cached model of another version is refitted.
MODEL_VERSION = 2
RANK = 32
_KMEANS_ROUNDS = 30
_EMBED_CHUNK = 200


def vector_cache_dir() -> Path:
    base = os.environ.get("IBEX_VECTOR_CACHE") or Path(
        os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")
    )
    return Path(base) / "ibex-context" / "vectors"


# --------------------------------------------------------------------------- the reference


@dataclass(frozen=True, slots=True)
class ReferenceSample:
    """Real MiniLM vectors of seeded memories and of one question about each."""

    name: str
    texts: list[str]
    questions: list[str]
    vectors: np.ndarray  # (n, dim) float32, unit rows: what the service stores
    question_vectors: np.ndarray  # (n, dim) float32, unit rows: what it searches with


def reference_texts(name: str, memories: int) -> tuple[list[str], list[str]]:
    """The sample's memory texts and a question about each (deterministic in ``name``)."""
    from loadtest import corpus, seed_worker

    seed_worker.ensure_worker_tokenizers()
    rng = random.Random(name)
    _, texts, _, _ = seed_worker.memory_texts(rng, memories)
    return texts, [corpus.query_from_memory(rng, t) for t in texts]


def _embed_chunk(texts: Sequence[str], questions: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    from loadtest import seed_worker

    embedder = seed_worker.worker_embedder("minilm")
    stored = np.asarray(embedder.embed_sync(list(texts)), dtype=np.float32)
    asked = np.asarray(embedder.embed_sync(list(questions), query=True), dtype=np.float32)
    return stored, asked


def _embedder_version() -> str:
    from ibex_context.embedding.minilm_graph import GRAPH_VERSION

    return f"minilm-g{GRAPH_VERSION}"


def reference_sample(
    name: str, *, memories: int = REFERENCE_MEMORIES, jobs: int | None = None
) -> ReferenceSample:
    """The named sample, from the cache or embedded now on ``jobs`` processes (minutes)."""
    texts, questions = reference_texts(name, memories)
    digest = hashlib.sha256("\n".join([_embedder_version(), *texts, *questions]).encode()).hexdigest()[:16]
    path = vector_cache_dir() / f"{name}-{memories}-{digest}.npz"
    if path.exists():
        with np.load(path) as data:
            return ReferenceSample(name, texts, questions, data["vectors"], data["question_vectors"])
    chunks = [
        (texts[i : i + _EMBED_CHUNK], questions[i : i + _EMBED_CHUNK])
        for i in range(0, len(texts), _EMBED_CHUNK)
    ]
    with ProcessPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        parts = list(pool.map(_embed_chunk, *zip(*chunks, strict=True)))
    vectors = np.concatenate([p[0] for p in parts])
    question_vectors = np.concatenate([p[1] for p in parts])
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.npz")
    np.savez(partial, vectors=vectors, question_vectors=question_vectors)
    partial.replace(path)
    return ReferenceSample(name, texts, questions, vectors, question_vectors)


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True, slots=True)
class VectorShape:
    """Clusters of real vectors, each a mean, main directions with spreads and a rest."""

    means: np.ndarray  # (k, dim)
    shares: np.ndarray  # (k,) sums to 1
    directions: np.ndarray  # (k, rank, dim), unit rows (zero rows past a small cluster's rank)
    spreads: np.ndarray  # (k, rank) standard deviation along each direction
    rest: np.ndarray  # (k,) standard deviation in every other direction
    offsets: np.ndarray  # (m, dim) each real question's direction away from its memory (unit)
    alignments: np.ndarray  # (m,) each real question's cosine to its memory
    offset_clusters: np.ndarray  # (m,) the cluster of each offset's memory

    @property
    def dim(self) -> int:
        return int(self.means.shape[1])

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial.npz")
        np.savez(partial, **{name: getattr(self, name) for name in self.__slots__})
        partial.replace(path)

    @staticmethod
    def load(path: Path) -> VectorShape:
        with np.load(path) as data:
            return VectorShape(**{name: data[name] for name in VectorShape.__slots__})

    def draw(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` unit vectors and the cluster each was drawn from."""
        clusters = rng.choice(len(self.shares), size=n, p=self.shares)
        out = np.empty((n, self.dim), dtype=np.float32)
        for c in np.unique(clusters):
            rows = np.flatnonzero(clusters == c)
            spread = rng.standard_normal((rows.size, self.spreads.shape[1])) * self.spreads[c]
            out[rows] = (
                self.means[c]
                + spread @ self.directions[c]
                + rng.standard_normal((rows.size, self.dim)) * self.rest[c]
            )
        out /= np.linalg.norm(out, axis=1, keepdims=True)
        return out, clusters

    def questions(self, vectors: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """A question about each of ``vectors`` (stored vectors, drawn or real), made as a
        real question in the vector's cluster (the nearest mean) was made from its memory:
        the same cosine to the memory, the same direction away from it."""
        clusters = (vectors @ self.means.T).argmax(axis=1)
        out = np.empty_like(vectors)
        every = np.arange(len(self.offsets))
        for i, (vector, cluster) in enumerate(zip(vectors, clusters, strict=True)):
            same = np.flatnonzero(self.offset_clusters == cluster)
            j = rng.choice(same if same.size else every)
            away = self.offsets[j] - (self.offsets[j] @ vector) * vector
            cosine = self.alignments[j]
            out[i] = cosine * vector + away * (np.sqrt(max(1.0 - cosine**2, 0.0)) / np.linalg.norm(away))
        return out


def kmeans(
    points: np.ndarray, k: int, rng: np.random.Generator, rounds: int = _KMEANS_ROUNDS, restarts: int = 4
) -> np.ndarray:
    """Each point's cluster: Lloyd's rounds from k-means++ seeds, the tightest of
    ``restarts`` tries (one unlucky seeding merges two clusters for good)."""
    squared = (points**2).sum(axis=1)
    best: tuple[float, np.ndarray] | None = None
    for _ in range(restarts):
        centres = [points[rng.integers(len(points))]]
        nearest = np.full(len(points), np.inf)
        for _ in range(1, k):
            nearest = np.minimum(nearest, ((points - centres[-1]) ** 2).sum(axis=1))
            centres.append(points[rng.choice(len(points), p=nearest / nearest.sum())])
        centre = np.stack(centres)
        for _ in range(rounds):
            distances = squared[:, None] - 2 * points @ centre.T + (centre**2).sum(1)[None, :]
            labels = distances.argmin(axis=1)
            for c in range(k):
                members = points[labels == c]
                if len(members):
                    centre[c] = members.mean(axis=0)
        inertia = float(((points - centre[labels]) ** 2).sum())
        if best is None or inertia < best[0]:
            best = (inertia, labels)
    assert best is not None
    return best[1]


def fit_shape(
    sample: ReferenceSample, *, clusters: int = CLUSTERS, rank: int = RANK, seed: int = 0
) -> VectorShape:
    points = sample.vectors.astype(np.float64)
    n, dim = points.shape
    labels = kmeans(points, clusters, np.random.default_rng(seed))
    means = np.zeros((clusters, dim))
    directions = np.zeros((clusters, rank, dim))
    spreads = np.zeros((clusters, rank))
    rest = np.zeros(clusters)
    shares = np.bincount(labels, minlength=clusters) / n
    for c in range(clusters):
        members = points[labels == c]
        if not len(members):
            continue
        means[c] = members.mean(axis=0)
        if len(members) < 2:
            continue
        centred = members - means[c]
        _, singular, basis = np.linalg.svd(centred, full_matrices=False)
        variances = singular**2 / (len(members) - 1)
        kept = min(rank, len(variances))
        directions[c, :kept] = basis[:kept]
        spreads[c, :kept] = np.sqrt(variances[:kept])
        rest[c] = np.sqrt(max(variances[kept:].sum(), 0.0) / max(dim - kept, 1))
    alignments = np.einsum("nd,nd->n", sample.question_vectors, sample.vectors)
    away = sample.question_vectors - alignments[:, None] * sample.vectors
    away /= np.maximum(np.linalg.norm(away, axis=1, keepdims=True), 1e-12)
    return VectorShape(
        means=means.astype(np.float32),
        shares=shares,
        directions=directions.astype(np.float32),
        spreads=spreads.astype(np.float32),
        rest=rest.astype(np.float32),
        offsets=away.astype(np.float32),
        alignments=alignments.astype(np.float32),
        offset_clusters=labels,
    )


def fitted_shape(*, jobs: int | None = None) -> Path:
    """The model fitted to the fit sample: its cached file (fitted, and the sample embedded,
    on first use)."""
    sample = reference_sample(FIT_SAMPLE, jobs=jobs)
    digest = hashlib.sha256(sample.vectors.tobytes()).hexdigest()[:16]
    path = vector_cache_dir() / f"shape-v{MODEL_VERSION}-k{CLUSTERS}-r{RANK}-{digest}.npz"
    if not path.exists():
        fit_shape(sample).save(path)
    return path


def main() -> int:
    """Embeds (or finds) both reference samples and fits the model: ``python -m loadtest.vectors``."""
    import time

    started = time.perf_counter()
    for name in (FIT_SAMPLE, CHECK_SAMPLE):
        sample = reference_sample(name)
        print(f"{name}: {len(sample.texts)} memories, {time.perf_counter() - started:.0f} s")
    print(f"model: {fitted_shape()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
