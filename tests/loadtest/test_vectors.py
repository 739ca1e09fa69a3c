"""The model of MiniLM's vectors: fitted to a reference sample, drawn from at any size.

These fit planted clusters (the real reference takes minutes of MiniLM to embed); that the
model's draws search like the real vectors is measured, not asserted here:
``benchmarks.agent_graph --check``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import numpy as np

from loadtest import seed
from loadtest.vectors import ReferenceSample, VectorShape, fit_shape, kmeans

DIM = 48


def _planted(n: int, clusters: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors in ``clusters`` tight groups, each spread along a few directions of its own."""
    centres = rng.standard_normal((clusters, DIM))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    labels = rng.integers(clusters, size=n)
    directions = rng.standard_normal((clusters, 3, DIM))
    directions *= 0.15 / np.linalg.norm(directions, axis=2, keepdims=True)
    points = centres[labels] + np.einsum("nk,nkd->nd", rng.standard_normal((n, 3)), directions[labels])
    points += rng.standard_normal((n, DIM)) * 0.01
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    return points.astype(np.float32), labels


def _sample(n: int = 2_000, clusters: int = 8) -> tuple[ReferenceSample, np.ndarray]:
    rng = np.random.default_rng(1)
    vectors, labels = _planted(n, clusters, rng)
    questions = vectors + rng.standard_normal(vectors.shape).astype(np.float32) * 0.05
    questions /= np.linalg.norm(questions, axis=1, keepdims=True)
    sample = ReferenceSample(
        "planted", [f"m{i}" for i in range(n)], [f"q{i}" for i in range(n)], vectors, questions
    )
    return sample, labels


def _agreement(a: np.ndarray, b: np.ndarray, k: int) -> float:
    """The share of points k-means put with the same planted group (best match per cluster)."""
    table = np.zeros((k, b.max() + 1))
    np.add.at(table, (a, b), 1)
    return float(table.max(axis=1).sum() / len(a))


def test_kmeans_recovers_planted_clusters() -> None:
    sample, labels = _sample()
    found = kmeans(sample.vectors.astype(np.float64), 8, np.random.default_rng(0))
    assert _agreement(found, labels, 8) > 0.95


def test_drawn_vectors_are_unit_rows_and_the_same_seed_draws_the_same() -> None:
    shape = fit_shape(_sample()[0], clusters=8, rank=4)
    first, clusters = shape.draw(500, np.random.default_rng(3))
    again, _ = shape.draw(500, np.random.default_rng(3))
    other, _ = shape.draw(500, np.random.default_rng(4))
    assert first.shape == (500, DIM) and first.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    assert set(np.unique(clusters)) <= set(range(8))


def test_draws_keep_the_clusters_and_their_spread() -> None:
    sample, _ = _sample()
    shape = fit_shape(sample, clusters=8, rank=4)
    drawn, clusters = shape.draw(4_000, np.random.default_rng(5))
    # Each draw lies nearest its own cluster's mean, as real members do.
    assert (drawn @ shape.means.T).argmax(axis=1).tolist() == clusters.tolist()
    # Shares follow the reference's.
    np.testing.assert_allclose(np.bincount(clusters, minlength=8) / 4_000, shape.shares, atol=0.03)

    # Nearest-neighbour distances match the reference's within a fifth (same density).
    def nearest(points: np.ndarray) -> float:
        sims = points[:500] @ points.T
        np.fill_diagonal(sims[:, :500], -1)
        return float(np.median(1 - sims.max(axis=1)))

    real = nearest(sample.vectors)
    assert abs(nearest(drawn[: len(sample.vectors)]) - real) < 0.2 * real


def test_a_question_sits_as_near_its_memory_as_real_questions_do() -> None:
    sample, _ = _sample()
    shape = fit_shape(sample, clusters=8, rank=4)
    drawn, _ = shape.draw(300, np.random.default_rng(6))
    questions = shape.questions(drawn, np.random.default_rng(7))
    real = np.einsum("nd,nd->n", sample.vectors, sample.question_vectors)
    synthetic = np.einsum("nd,nd->n", drawn, questions)
    np.testing.assert_allclose(np.linalg.norm(questions, axis=1), 1.0, atol=1e-5)
    assert abs(float(np.median(synthetic)) - float(np.median(real))) < 0.01


def test_a_saved_model_loads_equal(tmp_path: Path) -> None:
    shape = fit_shape(_sample()[0], clusters=8, rank=4)
    shape.save(tmp_path / "shape.npz")
    loaded = VectorShape.load(tmp_path / "shape.npz")
    for name in VectorShape.__slots__:
        np.testing.assert_array_equal(getattr(loaded, name), getattr(shape, name))


async def test_a_seed_with_shaped_vectors_stores_draws_from_the_model(
    private_postgres_dsn: str, tmp_path: Path
) -> None:
    sample, _ = _sample(clusters=4)
    # The model in the service's dimension: the planted one, padded with zeros.
    padded = ReferenceSample(
        sample.name,
        sample.texts,
        sample.questions,
        np.pad(sample.vectors, ((0, 0), (0, 384 - DIM))),
        np.pad(sample.question_vectors, ((0, 0), (0, 384 - DIM))),
    )
    shape = fit_shape(padded, clusters=4, rank=4)
    shape.save(tmp_path / "shape.npz")
    plan = seed.SeedPlan(agents=2, memories=40, orgs=1, vectors="shaped", queries_per_agent=2)
    report = await asyncio.wait_for(
        seed.seed(
            private_postgres_dsn,
            plan,
            tmp_path / "agents.json",
            jobs=1,
            reset=True,
            shape=tmp_path / "shape.npz",
            log=lambda _line: None,
        ),
        timeout=180,
    )
    assert report.memories == 80
    conn = await asyncpg.connect(private_postgres_dsn)
    try:
        stored = np.stack([r["e"] for r in await conn.fetch("SELECT embedding::real[] AS e FROM memories")])
    finally:
        await conn.close()
    # Unit vectors in the model's subspace, each nearest one of its means.
    np.testing.assert_allclose(np.linalg.norm(stored, axis=1), 1.0, atol=1e-4)
    assert np.abs(stored[:, DIM:]).max() < 0.05
    assert (stored @ shape.means.T).max(axis=1).min() > 0.5
