"""How MemoryService answers (``server/memory_service.py``): a stored row on the wire,
and pages converted in chunks. The calls end to end are test_memory_reads.py's,
test_export_import.py's and test_purge.py's."""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np
from ibex_context.server import memory_service
from ibex_context.server.memory_service import CONVERT_CHUNK, stored_memory
from ibex_context.stores.base import StoredRow


def _row(n: int = 0, **changes: object) -> StoredRow:
    fields: dict[str, object] = {
        "agent_id": "6f1c2a54-0000-4000-8000-000000000001",
        "id": f"6f1c2a54-0000-4000-8000-{n:012d}",
        "content": f"memory {n}",
        "category": "factual",
        "confidence": 0.75,
        "usefulness": 0.5,
        "metadata": {},
        "occurred_at": 1_700_000_000_123_456,
        "created_at": 1_700_000_001_000_000,
        "updated_at": 1_700_000_002_000_001,
        "retrieval_count": 3,
        "last_injected_at": None,
        "embedding": None,
    }
    fields.update(changes)
    return StoredRow(**fields)  # type: ignore[arg-type]


def test_a_stored_row_keeps_its_microseconds_on_the_wire() -> None:
    message = stored_memory(_row())

    assert (message.occurred_at.seconds, message.occurred_at.nanos) == (1_700_000_000, 123_456_000)
    assert (message.updated_at.seconds, message.updated_at.nanos) == (1_700_000_002, 1_000)
    assert (message.id, message.content, message.category) == (_row().id, "memory 0", "factual")
    assert message.retrieval_count == 3 and message.confidence == 0.75


def test_what_a_row_lacks_is_left_unset_and_what_it_has_is_carried() -> None:
    bare = stored_memory(_row())
    assert not bare.HasField("last_injected_at") and len(bare.embedding) == 0 and not bare.metadata

    full = stored_memory(
        _row(
            last_injected_at=1_700_000_003_000_000,
            metadata={"source": "chat", "turn": 4},
            embedding=np.array([0.6, 0.8], dtype=np.float32),
        )
    )
    assert full.last_injected_at.seconds == 1_700_000_003
    assert dict(full.metadata) == {"source": "chat", "turn": 4}
    assert list(full.embedding) == [np.float32(0.6), np.float32(0.8)]


async def test_a_page_is_converted_in_order_yielding_to_the_loop_between_chunks() -> None:
    rows = [_row(n) for n in range(2 * CONVERT_CHUNK + 5)]
    ticks = 0

    async def count_ticks() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(count_ticks())
    await asyncio.sleep(0)
    before = ticks
    messages = await memory_service._converted(rows)
    ticker.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await ticker

    assert [m.id for m in messages] == [r.id for r in rows]
    # Three chunks: the loop ran other work at least between them.
    assert ticks - before >= 2
