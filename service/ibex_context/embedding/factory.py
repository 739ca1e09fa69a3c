"""Builds the configured embedder and checks it produces what the database stores."""

from __future__ import annotations

from ibex_context.embedding.base import Embedder
from ibex_context.embedding.batching import TurnObserver
from ibex_context.embedding.hashing import HashingEmbedder
from ibex_context.embedding.minilm import MiniLMEmbedder
from ibex_context.embedding.openai import OpenAIEmbedder
from ibex_context.errors import ConfigurationError, EmbeddingError
from ibex_context.settings import Settings


def build_embedder(settings: Settings, *, observe: TurnObserver | None = None) -> Embedder:
    """The embedder named by ``settings.embedder``, unwrapped: the caller decides where the
    query cache (``CachedEmbedder``) goes, so the write path can bypass it. ``observe`` gets
    the timings of each inference of an embedder that runs in worker threads (minilm).

    Raises ConfigurationError when its dimension is not ``settings.embedding_dim``.
    """
    embedder: Embedder
    if settings.embedder == "hashing":
        embedder = HashingEmbedder(settings.embedding_dim)
    elif settings.embedder == "minilm":
        embedder = MiniLMEmbedder.load(
            graph_dir=settings.embedder_graph_dir,
            query_precision=settings.embedding_query_precision,
            workers=settings.embedding_workers,
            observe=observe,
            query_model=settings.embedding_query_model,
            stand_in_after=settings.embedding_stand_in_ms / 1000,
            worker_nice=settings.embedding_worker_nice,
            store_worker_idle=settings.embedding_store_worker_idle,
        )
    else:
        embedder = OpenAIEmbedder.from_settings(settings)
    if embedder.dim != settings.embedding_dim:
        raise ConfigurationError(
            f"embedding_dim: {settings.embedding_dim} configured but the {settings.embedder!r} "
            f"embedder produces {embedder.dim} dimensions"
        )
    return embedder


async def check_embedder(embedder: Embedder, expected_dim: int) -> None:
    """Embeds one text for real and checks its dimension (start-up / readiness).

    Raises ConfigurationError on a dimension mismatch and EmbeddingError when the
    embedder fails.
    """
    try:
        [vector] = await embedder.embed(["ibex-context start-up check"])
    except EmbeddingError as exc:
        if "embedding_dim" in str(exc):
            raise ConfigurationError(str(exc)) from exc
        raise
    if vector.shape != (expected_dim,):
        raise ConfigurationError(
            f"embedding_dim: {expected_dim} configured but {embedder.name} produced {vector.shape[-1]}"
        )
