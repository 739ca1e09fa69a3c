from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from ibex_context_client import ContextClient

from tests.observability.harness import Observed, ObservedFactory, observed_server


@pytest.fixture
def observed_factory() -> ObservedFactory:
    return observed_server


@pytest.fixture
async def observed() -> AsyncIterator[Observed]:
    async with observed_server() as running:
        yield running


@pytest.fixture
async def client(observed: Observed) -> AsyncIterator[ContextClient]:
    async with ContextClient(observed.target, timeout=5.0) as c:
        yield c
