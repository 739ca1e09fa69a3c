from __future__ import annotations

from pathlib import Path

import pytest
from ibex_context.tokens.encodings import EncodingRegistry


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> EncodingRegistry:
    """Both exact encodings, loaded once for the pipeline's tests."""
    registry = EncodingRegistry(Path(tmp_path_factory.mktemp("tiktoken-cache")))
    registry.preload(["o200k_base", "cl100k_base"])
    return registry


# The store fixtures of tests/stores (real PostgreSQL): the post-response queue records into them.
from tests.stores.conftest import make_memory, pg_store  # noqa: E402

__all__ = ["make_memory", "pg_store", "registry"]
