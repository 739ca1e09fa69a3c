"""build_embedder picks the configured embedder and refuses a dimension mismatch."""

from __future__ import annotations

import pytest
from ibex_context.embedding.cache import CachedEmbedder
from ibex_context.embedding.factory import build_embedder, check_embedder
from ibex_context.embedding.hashing import HashingEmbedder
from ibex_context.errors import ConfigurationError
from ibex_context.settings import Settings


async def test_the_hashing_embedder_is_wrapped_in_the_query_cache() -> None:
    embedder = build_embedder(Settings(embedder="hashing", embedding_dim=128, embedding_cache_size=100))
    assert isinstance(embedder, CachedEmbedder) and embedder.dim == 128
    await check_embedder(embedder, 128)


def test_no_cache_when_its_size_is_zero() -> None:
    embedder = build_embedder(Settings(embedder="hashing", embedding_dim=64, embedding_cache_size=0))
    assert isinstance(embedder, HashingEmbedder)


def test_minilm_with_another_dimension_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="embedding_dim"):
        build_embedder(Settings(embedder="minilm", embedding_dim=1024))


async def test_the_start_up_check_catches_a_dimension_mismatch() -> None:
    with pytest.raises(ConfigurationError, match="embedding_dim"):
        await check_embedder(HashingEmbedder(64), 384)
