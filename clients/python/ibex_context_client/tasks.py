"""Stopping a background task: the one way the service and its clients do it."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancels ``task`` (if any) and waits until it has finished unwinding.

    Its cancellation is not an error here; any other exception it ends with propagates.
    """
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
