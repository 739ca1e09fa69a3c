"""The served MiniLM (ONNX Runtime) gives the numpy reference's vectors, batched or not."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from ibex_context.embedding.minilm import MiniLMEmbedder, length_batches
from ibex_context.embedding.minilm_reference import (
    MiniLMModel,
    default_model_dir,
    embed_one_by_one,
    load_tokenizer,
)
from ibex_context.errors import ConfigurationError
from ibex_context.models import FloatVector

REFERENCE = json.loads((Path(__file__).parent / "minilm_reference.json").read_text(encoding="utf-8"))
# Texts of very different lengths in one batch, so most of them are padded.
FIXED_TEXTS = [
    *REFERENCE["sentences"],
    "What did I tell you about my service dog?",
    "Mira's service dog, Juniper, is trained to alert her before a seizure.",
    "ok",
    "The quarterly report is due on Friday; Sam owns the revenue section and Ana the costs. " * 4,
]


@pytest.fixture(scope="module")
async def minilm() -> AsyncIterator[MiniLMEmbedder]:
    embedder = MiniLMEmbedder.load(workers=2)
    yield embedder
    await embedder.aclose()


@pytest.fixture(scope="module")
def numpy_vectors() -> list[FloatVector]:
    """Each fixed text alone through the numpy forward pass: no padding anywhere."""
    directory = default_model_dir()
    return embed_one_by_one(MiniLMModel.load(directory), load_tokenizer(directory), FIXED_TEXTS)


def _cosine(a: FloatVector, b: FloatVector) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


async def test_one_batch_of_mixed_lengths_gives_the_numpy_reference_vectors(
    minilm: MiniLMEmbedder, numpy_vectors: list[FloatVector]
) -> None:
    vectors = await minilm.embed(FIXED_TEXTS)
    for text, served, reference in zip(FIXED_TEXTS, vectors, numpy_vectors, strict=True):
        assert _cosine(served, reference) >= 0.9999, text


async def test_each_text_alone_gives_the_numpy_reference_vector(
    minilm: MiniLMEmbedder, numpy_vectors: list[FloatVector]
) -> None:
    for text, reference in zip(FIXED_TEXTS, numpy_vectors, strict=True):
        [served] = await minilm.embed([text])
        assert _cosine(served, reference) >= 0.9999, text


async def test_the_vectors_match_sentence_transformers(minilm: MiniLMEmbedder) -> None:
    vectors = await minilm.embed(REFERENCE["sentences"])
    for sentence, served, expected in zip(
        REFERENCE["sentences"], vectors, REFERENCE["embeddings"], strict=True
    ):
        assert _cosine(served, np.asarray(expected, dtype=np.float32)) >= 0.9999, sentence


async def test_vectors_are_unit_length_float32_of_384_dims(minilm: MiniLMEmbedder) -> None:
    [vector] = await minilm.embed(["Prefers tea"])
    assert vector.dtype == np.float32 and vector.shape == (384,) == (minilm.dim,)
    assert float(np.linalg.norm(vector)) == pytest.approx(1.0, abs=1e-5)
    assert minilm.name == "all-MiniLM-L6-v2"


async def test_batch_results_keep_the_input_order_whatever_the_lengths(minilm: MiniLMEmbedder) -> None:
    texts = ["a much longer sentence about several different things", "short", "medium length text"]
    together = await minilm.embed(texts)
    one_by_one = [(await minilm.embed([t]))[0] for t in texts]
    for a, b in zip(together, one_by_one, strict=True):
        assert float(a @ b) > 0.9999


async def test_an_empty_batch_embeds_to_nothing(minilm: MiniLMEmbedder) -> None:
    assert await minilm.embed([]) == []


def test_texts_are_batched_by_length_so_padding_stays_small() -> None:
    assert length_batches([3, 40, 4, 5, 90, 41], max_batch=8) == [[0, 2, 3], [1, 5], [4]]
    assert length_batches([5, 5, 5], max_batch=2) == [[0, 1], [2]]


def test_a_directory_without_weights_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"no model\.safetensors"):
        MiniLMEmbedder.load(tmp_path, graph_dir=tmp_path)


def test_fewer_than_one_worker_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="embedding_workers"):
        MiniLMEmbedder(session=None, tokenizer=load_tokenizer(default_model_dir()), workers=0)
