"""Every dialog turn of a conversation becomes one memory of one agent, written
through the public write client (``MemoryClient.upsert_memories``).

The turn embeddings the baselines need are computed here once per run and sent
with the memories, so the service stores exactly the vectors the cosine baseline
ranks with, and ingest does not pay for MiniLM again for every budget's agents.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from ibex_context_client import NewMemory
from ibex_context_client.memory import MemoryClient

from benchmarks.quality.locomo import Conversation

CATEGORY = "episodic"


@dataclass(frozen=True, slots=True)
class Tenant:
    org_id: str
    agent_id: str

    @classmethod
    def fresh(cls) -> Tenant:
        return cls(str(uuid.uuid4()), str(uuid.uuid4()))


@dataclass(frozen=True, slots=True)
class IngestedConversation:
    """One conversation stored for one agent: the id the service gave each turn."""

    conversation: Conversation
    tenant: Tenant
    memory_ids: tuple[str, ...]  # by turn index

    def turns_by_memory_id(self) -> dict[str, list[int]]:
        """Turn indices per memory id (two turns with the same text would share one)."""
        by_id: dict[str, list[int]] = {}
        for index, memory_id in enumerate(self.memory_ids):
            by_id.setdefault(memory_id, []).append(index)
        return by_id


def new_memories(conversation: Conversation, vectors: npt.NDArray[np.float32] | None) -> list[NewMemory]:
    return [
        NewMemory(
            content=turn.content,
            category=CATEGORY,
            metadata={"dia_id": turn.dia_id},
            embedding=vectors[index] if vectors is not None else None,
            occurred_at=turn.occurred_at.timestamp(),
        )
        for index, turn in enumerate(conversation.turns)
    ]


async def ingest(
    client: MemoryClient,
    conversation: Conversation,
    tenant: Tenant,
    vectors: npt.NDArray[np.float32] | None,
) -> IngestedConversation:
    results = await client.upsert_memories(
        tenant.org_id, tenant.agent_id, new_memories(conversation, vectors)
    )
    if len(results) != len(conversation.turns):
        raise RuntimeError(
            f"{conversation.sample_id}: {len(results)} results for {len(conversation.turns)} turns"
        )
    return IngestedConversation(conversation, tenant, tuple(r.id for r in results))


def evidence_indices(conversation: Conversation) -> list[list[int]]:
    """Per question, the turn indices of its evidence."""
    index = {turn.dia_id: i for i, turn in enumerate(conversation.turns)}
    return [[index[e] for e in q.evidence] for q in conversation.questions]


def duplicate_turns(ingested: Sequence[IngestedConversation]) -> int:
    """Turns that share their memory with an earlier turn of the same conversation."""
    return sum(len(c.memory_ids) - len(set(c.memory_ids)) for c in ingested)
