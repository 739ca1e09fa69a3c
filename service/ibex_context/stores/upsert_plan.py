"""Deciding, without I/O, what an upsert batch does to the rows already stored.

Rules, applied to the batch in order (earlier items are visible to later ones):

0. The id names a stored memory Y and the text is stored as another memory X: the
   whole batch is refused (``InvalidRequest`` naming ``memories[i].id`` and both
   ids), nothing is written. A text is stored once per agent, so Y cannot take X's
   text; answering with X's id, ``unchanged``, silently dropped the change asked
   of Y. Delete X first, or update X.
1. The content hash is already stored for the agent: the same text. The row keeps
   its id. ``unchanged`` when category, confidence, usefulness and metadata are
   equal and the batch gives no other occurred-at time (confidence and usefulness
   compared as float32, as stored); otherwise those fields are updated: ``updated``.
   Content identity wins over an id that is not stored: re-sending a known text
   under a new id does not create a duplicate, and the result carries the stored
   memory's id.
2. Otherwise the id is already stored: its content is replaced (text, hash,
   embedding, token counts and the fields): ``updated``.
3. Otherwise: ``created``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ibex_context.errors import InvalidRequest
from ibex_context.stores.base import PreparedMemory, UpsertResult


@dataclass(frozen=True, slots=True)
class StoredMemory:
    """The columns of a stored row that decide an upsert's outcome."""

    id: str
    content_hash: bytes
    category: str
    confidence: float
    usefulness: float
    metadata: Mapping[str, object]
    occurred_at: float | None = None


@dataclass(frozen=True, slots=True)
class UpsertPlan:
    inserts: tuple[PreparedMemory, ...]
    # Each with ``id`` set to the stored row it overwrites.
    updates: tuple[PreparedMemory, ...]
    results: tuple[UpsertResult, ...]


def _same_fields(stored: StoredMemory, memory: PreparedMemory) -> bool:
    return (
        stored.category == memory.category
        and np.float32(stored.confidence) == np.float32(memory.confidence)
        and np.float32(stored.usefulness) == np.float32(memory.usefulness)
        and dict(stored.metadata) == dict(memory.metadata)
        and (memory.occurred_at is None or memory.occurred_at == stored.occurred_at)
    )


def _as_stored(memory: PreparedMemory) -> StoredMemory:
    return StoredMemory(
        id=memory.id,
        content_hash=memory.content_hash,
        category=memory.category,
        confidence=memory.confidence,
        usefulness=memory.usefulness,
        metadata=memory.metadata,
        occurred_at=memory.occurred_at,
    )


def plan_upsert(existing: Iterable[StoredMemory], batch: Sequence[PreparedMemory]) -> UpsertPlan:
    by_hash: dict[bytes, StoredMemory] = {}
    by_id: dict[str, StoredMemory] = {}
    for row in existing:
        by_hash[row.content_hash] = row
        by_id[row.id] = row
    # id -> the write to make; an insert stays an insert when a later item changes it.
    writes: dict[str, tuple[bool, PreparedMemory]] = {}
    results: list[UpsertResult] = []
    for index, memory in enumerate(batch):
        same_text = by_hash.get(memory.content_hash)
        if same_text is not None and same_text.id != memory.id and memory.id in by_id:
            raise InvalidRequest(
                f"memories[{index}].id",
                f"memory {memory.id} cannot take the text of memory {same_text.id} (a text is "
                f"stored once per agent): delete {same_text.id} first, or update it; nothing was written",
            )
        if same_text is not None:
            if _same_fields(same_text, memory):
                results.append(UpsertResult(id=same_text.id, outcome="unchanged"))
                continue
            target = replace(memory, id=same_text.id)
            outcome = "updated"
        elif memory.id in by_id:
            target = memory
            del by_hash[by_id[memory.id].content_hash]
            outcome = "updated"
        else:
            target = memory
            outcome = "created"
        is_insert = writes[target.id][0] if target.id in writes else outcome == "created"
        writes[target.id] = (is_insert, target)
        stored = _as_stored(target)
        by_hash[stored.content_hash] = stored
        by_id[stored.id] = stored
        results.append(UpsertResult(id=target.id, outcome=outcome))
    inserts = tuple(m for is_insert, m in writes.values() if is_insert)
    updates = tuple(m for is_insert, m in writes.values() if not is_insert)
    return UpsertPlan(inserts=inserts, updates=updates, results=tuple(results))
