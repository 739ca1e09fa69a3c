"""build_embedder picks the configured embedder and refuses a dimension mismatch."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from ibex_context.embedding.factory import build_embedder, check_embedder
from ibex_context.embedding.hashing import HashingEmbedder
from ibex_context.errors import ConfigurationError
from ibex_context.settings import Settings


async def test_the_configured_embedder_is_built_with_the_configured_dimension() -> None:
    embedder = build_embedder(Settings(embedder="hashing", embedding_dim=128))
    assert isinstance(embedder, HashingEmbedder) and embedder.dim == 128
    await check_embedder(embedder, 128)


async def test_minilm_is_built_from_the_packaged_weights() -> None:
    embedder = build_embedder(Settings(embedder="minilm", embedding_dim=384))
    try:
        assert embedder.name == "all-MiniLM-L6-v2"
        await check_embedder(embedder, 384)
    finally:
        await embedder.aclose()


def test_minilm_with_another_dimension_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="embedding_dim"):
        build_embedder(Settings(embedder="minilm", embedding_dim=1024))


async def test_the_start_up_check_catches_a_dimension_mismatch() -> None:
    with pytest.raises(ConfigurationError, match="embedding_dim"):
        await check_embedder(HashingEmbedder(64), 384)


def _thread_nice_values() -> list[int]:
    """Each thread's nice value (/proc/self/task/<tid>/stat, field 19)."""
    values = []
    for stat in Path("/proc/self/task").glob("*/stat"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            values.append(int(stat.read_text().rsplit(")", 1)[1].split()[16]))
    return values


async def test_minilm_workers_run_at_the_configured_nice_below_the_process() -> None:
    process = os.getpriority(os.PRIO_PROCESS, 0)
    embedder = build_embedder(Settings(embedder="minilm", embedding_dim=384, embedding_worker_nice=7))
    try:
        await check_embedder(embedder, 384)  # the worker has computed a query by now
        assert min(19, process + 7) in _thread_nice_values()
    finally:
        await embedder.aclose()
