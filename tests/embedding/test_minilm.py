"""The numpy MiniLM matches the sentence-transformers reference and ranks by meaning."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from ibex_context.embedding.minilm import MiniLMEmbedder

REFERENCE = json.loads((Path(__file__).parent / "minilm_reference.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
async def minilm() -> AsyncIterator[MiniLMEmbedder]:
    embedder = MiniLMEmbedder.load()
    yield embedder
    await embedder.aclose()


async def test_embeddings_match_the_reference_implementation(minilm: MiniLMEmbedder) -> None:
    """Reference: sentence-transformers with torch 2.13.0 on CPU (see the fixture's header)."""
    vectors = await minilm.embed(REFERENCE["sentences"])
    for sentence, vector, expected in zip(
        REFERENCE["sentences"], vectors, REFERENCE["embeddings"], strict=True
    ):
        expected_vector = np.asarray(expected, dtype=np.float32)
        cosine = float(vector @ expected_vector / np.linalg.norm(expected_vector))
        assert cosine > 0.9999, sentence


async def test_vectors_are_unit_length_float32_of_384_dims(minilm: MiniLMEmbedder) -> None:
    [vector] = await minilm.embed(["Prefers tea"])
    assert vector.dtype == np.float32 and vector.shape == (384,) == (minilm.dim,)
    assert float(np.linalg.norm(vector)) == pytest.approx(1.0, abs=1e-5)


async def test_a_paraphrased_question_finds_the_right_fact_first(minilm: MiniLMEmbedder) -> None:
    facts = [
        "The deployment runs on Kubernetes with three replicas.",
        "The user's name is Priya",
        "Prefers answers in metric units.",
        "Allergic to peanuts.",
    ]
    [query, *fact_vectors] = await minilm.embed(["What should I call the user?", *facts])
    ranked = sorted(facts, key=lambda f: -float(query @ fact_vectors[facts.index(f)]))
    assert ranked[0] == "The user's name is Priya"


async def test_batch_results_keep_the_input_order_whatever_the_lengths(minilm: MiniLMEmbedder) -> None:
    texts = ["a much longer sentence about several different things", "short", "medium length text"]
    together = await minilm.embed(texts)
    one_by_one = [(await minilm.embed([t]))[0] for t in texts]
    for a, b in zip(together, one_by_one, strict=True):
        assert float(a @ b) > 0.9999


async def test_an_empty_batch_embeds_to_nothing(minilm: MiniLMEmbedder) -> None:
    assert await minilm.embed([]) == []
