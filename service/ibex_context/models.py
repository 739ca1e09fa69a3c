"""Plain values passed between the stages of the pipeline.

Stages take and return these; nothing here does I/O. Times are seconds since the
epoch (floats) so the scorer can vectorise them without datetime objects.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

# The wire's values, one source for the client and the service (re-exported here).
from ibex_context_client.messages import DEFAULT_CONFIDENCE as DEFAULT_CONFIDENCE
from ibex_context_client.messages import DEFAULT_USEFULNESS as DEFAULT_USEFULNESS
from ibex_context_client.messages import ROLES as ROLES
from ibex_context_client.messages import Category as Category
from ibex_context_client.messages import ChatMessage as ChatMessage

FloatVector = npt.NDArray[np.float32]


CATEGORY_ORDER: tuple[str, ...] = tuple(c.value for c in Category)


class Source(enum.IntEnum):
    """Where a candidate came from; values match the wire enum MemorySource."""

    HOT = 1
    COLD = 2
    HOT_AND_COLD = 3


class Degradation(enum.IntEnum):
    """How much of the assembly ran; values match the wire enum DegradationLevel."""

    FULL = 1
    HOT_ONLY = 2
    DIRECTIVE_ONLY = 3
    PASS_THROUGH = 4
    COLD_ONLY = 16
    PARTIAL = 17


@dataclass(frozen=True, slots=True)
class AssemblyRequest:
    """A validated AssembleContext request (``server.assembly_service``): what the pipeline
    assembles for."""

    org_id: str
    agent_id: str
    session_id: str
    model: str
    request_id: str
    messages: tuple[ChatMessage, ...]


@dataclass(frozen=True, slots=True)
class Directive:
    content: str
    version: int = 0
    # Tokens of the content per tiktoken encoding, counted once when it was written.
    token_counts: Mapping[str, int] = field(default_factory=dict)


# Not frozen: a frozen dataclass's __init__ sets each field through object.__setattr__,
# and one is built per injected memory on every call (the candidates themselves travel
# as columns, ``candidates.Candidates``); treat instances as values all the same.
@dataclass(slots=True)
class MemoryRecord:
    """A stored memory as retrieval hands it to scoring.

    ``similarity`` is the cosine similarity to the query when the source computed
    it (cold search); hot memories carry their ``embedding`` instead so the
    scorer can compute a real relevance for them.
    """

    id: str
    content: str
    category: str
    confidence: float | None = None
    usefulness: float | None = None
    retrieval_count: int = 0
    # When the information came to be (the write time unless the writer gave one).
    occurred_at: float | None = None
    last_injected_at: float | None = None
    token_counts: Mapping[str, int] = field(default_factory=dict)
    embedding: FloatVector | None = None
    similarity: float | None = None
    source: Source = Source.COLD
    # BM25 score of the memory's words against the query's, when the lexical search
    # found it; None: not among its results (or no lexical search ran).
    lexical_score: float | None = None


# Not frozen, like ``MemoryRecord``: one is built per injected memory on every call;
# treat instances as values all the same.
@dataclass(slots=True)
class ScoredMemory:
    """A candidate with its score and every component of it (``pipeline.scoring``)."""

    memory: MemoryRecord
    score: float
    relevance: float
    recency: float
    usefulness: float
    confidence: float
    frequency: float
    tokens: int = 0
    semantic: float = 0.0
    lexical: float = 0.0


@dataclass(frozen=True, slots=True)
class NewMemory:
    """A memory to write (the write side), validated by the service: its embedding is the
    store's float32 vector (the client's ``ibex_context_client.NewMemory`` is the caller's
    draft of it)."""

    content: str
    category: str
    confidence: float = DEFAULT_CONFIDENCE
    usefulness: float = DEFAULT_USEFULNESS
    id: str | None = None
    metadata: Mapping[str, object] = field(default_factory=dict)
    embedding: FloatVector | None = None
    # When the information came to be, seconds since the epoch; None: now.
    occurred_at: float | None = None
