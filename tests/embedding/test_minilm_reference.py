"""The numpy MiniLM (the served graph's reference) matches sentence-transformers and ranks by meaning."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from ibex_context.embedding.minilm_reference import (
    MiniLMModel,
    default_model_dir,
    embed_one_by_one,
    load_tokenizer,
)
from ibex_context.models import FloatVector

REFERENCE = json.loads((Path(__file__).parent / "minilm_reference.json").read_text(encoding="utf-8"))


class NumpyMiniLM:
    def __init__(self) -> None:
        self.model = MiniLMModel.load(default_model_dir())
        self.tokenizer = load_tokenizer(default_model_dir())

    def embed(self, texts: list[str]) -> list[FloatVector]:
        return embed_one_by_one(self.model, self.tokenizer, texts)


@pytest.fixture(scope="module")
def minilm() -> NumpyMiniLM:
    return NumpyMiniLM()


def test_embeddings_match_the_reference_implementation(minilm: NumpyMiniLM) -> None:
    """Reference: sentence-transformers with torch 2.13.0 on CPU (see the fixture's header)."""
    vectors = minilm.embed(REFERENCE["sentences"])
    for sentence, vector, expected in zip(
        REFERENCE["sentences"], vectors, REFERENCE["embeddings"], strict=True
    ):
        expected_vector = np.asarray(expected, dtype=np.float32)
        cosine = float(vector @ expected_vector / np.linalg.norm(expected_vector))
        assert cosine > 0.9999, sentence


def test_vectors_are_unit_length_float32_of_384_dims(minilm: NumpyMiniLM) -> None:
    [vector] = minilm.embed(["Prefers tea"])
    assert vector.dtype == np.float32 and vector.shape == (384,)
    assert float(np.linalg.norm(vector)) == pytest.approx(1.0, abs=1e-5)


def test_a_paraphrased_question_finds_the_right_fact_first(minilm: NumpyMiniLM) -> None:
    facts = [
        "The deployment runs on Kubernetes with three replicas.",
        "The user's name is Priya",
        "Prefers answers in metric units.",
        "Allergic to peanuts.",
    ]
    [query, *fact_vectors] = minilm.embed(["What should I call the user?", *facts])
    ranked = sorted(facts, key=lambda f: -float(query @ fact_vectors[facts.index(f)]))
    assert ranked[0] == "The user's name is Priya"
