from __future__ import annotations

from pathlib import Path

import pytest
from ibex_context.tokens.encodings import EncodingRegistry


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> EncodingRegistry:
    """One registry for the session: the first o200k load takes ~0.6 s."""
    registry = EncodingRegistry(Path(tmp_path_factory.mktemp("tiktoken-cache")))
    registry.preload(["o200k_base", "cl100k_base"])
    return registry
