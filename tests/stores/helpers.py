"""Plain helpers shared by the store tests."""

from __future__ import annotations

from collections.abc import Callable

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
