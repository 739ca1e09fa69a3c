"""The hashing embedder is deterministic, lexical and normalised."""

from __future__ import annotations

import numpy as np
import pytest
from ibex_context.embedding.hashing import HashingEmbedder
from ibex_context.errors import ConfigurationError


async def test_the_same_text_always_gives_the_same_unit_vector() -> None:
    a, b = await HashingEmbedder(384).embed(["Lives in Lisbon", "Lives in Lisbon"])
    np.testing.assert_array_equal(a, b)
    assert a.dtype == np.float32 and a.shape == (384,)
    assert float(np.linalg.norm(a)) == pytest.approx(1.0, abs=1e-6)


async def test_texts_sharing_words_are_closer_than_unrelated_ones() -> None:
    query, same_words, unrelated = await HashingEmbedder(384).embed(
        ["where does the user live", "the user lives in Lisbon; where does she live?", "peanut allergy"]
    )
    assert float(query @ same_words) > float(query @ unrelated)


async def test_case_and_punctuation_do_not_matter_but_word_order_does() -> None:
    embedder = HashingEmbedder(384)
    a, b, swapped = await embedder.embed(["Dog bites man.", "dog BITES man", "man bites dog"])
    assert float(a @ b) == pytest.approx(1.0, abs=1e-6)
    assert float(a @ swapped) < 0.99  # bigrams differ


async def test_text_without_words_still_gives_a_unit_vector() -> None:
    [vector] = await HashingEmbedder(16).embed(["!!! ..."])
    assert float(np.linalg.norm(vector)) == pytest.approx(1.0)


def test_a_tiny_dimension_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="embedding_dim"):
        HashingEmbedder(4)


async def test_ascii_and_unicode_texts_split_into_the_same_words() -> None:
    # ASCII text takes a byte-level fast path; it must cut words exactly like \w+.
    embedder = HashingEmbedder(384)
    ascii_text, with_accent = await embedder.embed(
        ["tea_time, 2 cups; no-sugar!", "tea_time, 2 cups; no-sugar! é"]
    )
    [words_only] = await embedder.embed(["tea_time 2 cups no sugar é"])
    np.testing.assert_allclose(with_accent, words_only, atol=1e-6)
    assert float(ascii_text @ with_accent) > 0.8


async def test_vectors_do_not_depend_on_what_the_embedder_saw_before() -> None:
    fresh, used = HashingEmbedder(384), HashingEmbedder(384)
    await used.embed([f"warm up word{i} and more" for i in range(200)])
    [a] = await fresh.embed(["the user lives in Lisbon"])
    [b] = await used.embed(["the user lives in Lisbon"])
    np.testing.assert_array_equal(a, b)


def test_a_batch_embeds_every_text_bit_for_bit_as_one_at_a_time() -> None:
    # Bulk loads embed in batches; the service embeds queries one by one: the two must
    # agree exactly, including texts without words, one-word texts (no pairs, and no
    # pair across the boundary to the next text) and non-ASCII text.
    texts = [
        "The user lives in Lisbon and works at Acme Logistics.",
        "",
        "!!! ???",
        "word",
        "word word",
        "déjà vu, naïve café",
        "a b a b a b",
        "Deploys need written approval from the owner; rollbacks take forty minutes.",
    ]
    batch = HashingEmbedder(64).embed_many(texts)
    single = np.stack([HashingEmbedder(64).embed_one(text) for text in texts])
    assert batch.dtype == np.float32 and batch.shape == (len(texts), 64)
    np.testing.assert_array_equal(batch, single)
    assert HashingEmbedder(64).embed_many([]).shape == (0, 64)
