from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest
from ibex_context.devtools.scripted_service import RunningServer, scripted_server


@pytest.fixture
async def server() -> AsyncIterator[RunningServer]:
    """A healthy AssembleContext server on a real socket (the scripted one)."""
    async with scripted_server() as running:
        yield running


@pytest.fixture
def client_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="ibex_context_client")
    return caplog
