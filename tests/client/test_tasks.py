"""``cancel_and_wait`` stops a background task and returns once it has unwound."""

from __future__ import annotations

import asyncio

import pytest
from ibex_context_client.tasks import cancel_and_wait


async def test_it_cancels_the_task_and_waits_for_its_clean_up() -> None:
    cleaned = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0)  # clean-up that takes a turn of the loop
            cleaned.set()

    task = asyncio.create_task(forever())
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    assert task.cancelled() and cleaned.is_set()


async def test_no_task_and_a_finished_task_are_nothing_to_do() -> None:
    await cancel_and_wait(None)
    done = asyncio.create_task(asyncio.sleep(0))
    await done
    await cancel_and_wait(done)
    assert done.done() and not done.cancelled()


async def test_an_error_the_task_ends_with_propagates() -> None:
    async def failing() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            raise RuntimeError("clean-up failed")

    task = asyncio.create_task(failing())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="clean-up failed"):
        await cancel_and_wait(task)
