"""Plain helpers shared by the store tests."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable

import asyncpg
import numpy as np
from ibex_context.candidates import Candidates
from ibex_context.models import FloatVector, MemoryRecord
from ibex_context.stores.base import PreparedMemory

DIM = 384
# hnsw.ef_search of the store fixtures' pools.
EF_SEARCH = 64

# make_memory(content, *, category=..., confidence=..., id=..., embedding=...) -> PreparedMemory
MakeMemory = Callable[..., PreparedMemory]


def unit_vector(seed: int) -> FloatVector:
    vector = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    vector /= np.linalg.norm(vector)
    return vector


def near(base: FloatVector, noise: float, seed: int) -> FloatVector:
    """A unit vector at a controlled distance from ``base``: larger noise, farther."""
    vector = base + noise * unit_vector(seed)
    return (vector / np.linalg.norm(vector)).astype(np.float32)


def at_similarity(base: FloatVector, similarity: float, seed: int) -> FloatVector:
    """A unit vector whose cosine similarity to the unit vector ``base`` is exactly ``similarity``."""
    other = unit_vector(seed)
    orthogonal = other - float(other @ base) * base
    orthogonal /= np.linalg.norm(orthogonal)
    vector = similarity * base + np.sqrt(1.0 - similarity**2) * orthogonal
    return vector.astype(np.float32)


def records(found: Candidates | None) -> list[MemoryRecord]:
    """A search's or hot-set read's candidates one record per row (none for a missing
    hot set): what the tests compare field by field."""
    return [] if found is None else found.records()


async def tenant_in_the_partition_of(conn: asyncpg.Connection, org_id: str, agent_id: str) -> tuple[str, str]:
    """A fresh (org_id, agent_id) that hashes to the same partition of ``memories``."""
    bound = await conn.fetchval(
        "SELECT pg_get_expr(c.relpartbound, c.oid) FROM pg_class AS c WHERE c.oid ="
        " (SELECT tableoid FROM memories WHERE org_id = $1 AND agent_id = $2 LIMIT 1)",
        uuid.UUID(org_id),
        uuid.UUID(agent_id),
    )
    modulus, remainder = (int(n) for n in re.findall(r"\d+", bound))
    for _ in range(100 * modulus):
        candidate = (uuid.uuid4(), uuid.uuid4())
        if await conn.fetchval(
            "SELECT satisfies_hash_partition('memories'::regclass, $1, $2, $3::uuid, $4::uuid)",
            modulus,
            remainder,
            *candidate,
        ):
            return str(candidate[0]), str(candidate[1])
    raise AssertionError("no tenant found in that partition")
