"""Which plan runs an agent's vector (cold) search: the service decides, not the planner.

An agent with few memories is searched exactly: its rows by the tenant key, every
distance computed (cost proportional to its size, exact answers). An agent past the
exact scan's limit (``Settings.cold_exact_max_memories``, where the exact scan's cost
reaches a graph walk's, measured) gets an HNSW graph of its own (a partial index,
``stores.postgres.graphs``) and is searched through it once it is ready (cost roughly
flat in its size, approximate answers, recall measured per data shape); until then,
exactly (ADR-0009). The partitions' shared graphs are gone (migration 0021): every write
paid for them, and only agents waiting for their own graph walked them.

The agent's size comes from ``memory_stats.memories``, which statement triggers keep
true for every writer (migration 0005). The store caches it per agent for
``ttl`` seconds: a plan chosen on a count a minute old costs speed at worst, never
correctness (both plans return the agent's nearest memories; HNSW approximately).
"""

from __future__ import annotations

import enum
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ibex_context.candidates import Candidates
from ibex_context.models import FloatVector

if TYPE_CHECKING:
    from ibex_context.settings import Settings


class ColdPlan(enum.StrEnum):
    """The values are the plan's name in metadata and in the metric's label."""

    EXACT = "exact"
    # The agent's own graph (``stores.postgres.graphs``): of its vectors in half precision
    # (migration 0019), dense or, while the agent is small, sparse (0022); or as stored for
    # a graph built before 0019 (0013).
    AGENT_HALFVEC = "agent_halfvec"
    AGENT_SPARSE = "agent_sparse"
    AGENT = "agent"

    @property
    def function(self) -> str:
        """The name of its SQL function, ``ibex_cold_<function>`` (a sparse graph is
        searched by the same statement as a dense one, at its own width)."""
        return ColdPlan.AGENT_HALFVEC.value if self is ColdPlan.AGENT_SPARSE else self.value

    @property
    def walks_graph(self) -> bool:
        """Whether the plan walks an HNSW graph, whose width the search passes
        (``GraphSearchWidth``); the exact scan computes every distance."""
        return self is not ColdPlan.EXACT


def choose_plan(own_graph: ColdPlan | None) -> ColdPlan:
    """The agent's own graph's plan once it has one (past the exact scan's limit, when its
    build is done); else the exact scan, at any size."""
    return own_graph if own_graph is not None else ColdPlan.EXACT


# pgvector's largest hnsw.ef_search.
MAX_EF_SEARCH = 1000


@dataclass(frozen=True, slots=True)
class GraphSearchWidth:
    """How many candidates the graph search keeps (``hnsw.ef_search``), by the graph and
    the agent's size.

    A larger agent needs a wider search for the same recall. Agents' own graphs built
    before migration 0019 (full precision, m 32): 200 gives
    recall@50 0.994 mean / 0.98 p5 at 10k MiniLM memories, a 100k-memory agent needs 400
    for 0.969-0.974 / 0.84-0.88. An own graph in half precision (m 48, 0019) holds more
    per candidate: 100 gives 0.995 / 0.98 at 10k, 200 gives 0.978 / 0.90 at 100k
    (ADR-0015). A sparse one (m 16, 0022, when configured) needs 300 at 10k for
    0.995 / 0.96. A wider search than needed costs time for nothing.
    """

    ef_search: int
    large_agent_ef_search: int
    large_agent_memories: int
    # The own graphs in half precision; by default as wide as the others.
    own_graph_ef_search: int | None = None
    own_graph_large_agent_ef_search: int | None = None
    # The sparse own graphs, whatever the agent's size; by default as the dense ones.
    sparse_graph_ef_search: int | None = None
    # A walk repeated because it missed (``walk_missed``); 0: never repeated.
    rewalk_ef_search: int = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> GraphSearchWidth:
        """The widths the settings give (``Settings.model_construct()``: their defaults)."""
        return cls(
            ef_search=settings.hnsw_ef_search,
            large_agent_ef_search=settings.hnsw_ef_search_large_agents,
            large_agent_memories=settings.cold_large_agent_memories,
            own_graph_ef_search=settings.hnsw_ef_search_own_graph,
            own_graph_large_agent_ef_search=settings.hnsw_ef_search_own_graph_large_agents,
            sparse_graph_ef_search=settings.hnsw_ef_search_sparse_graph,
            rewalk_ef_search=settings.hnsw_ef_search_rewalk,
        )

    def for_agent(
        self, memories: int, limit: int, plan: ColdPlan | None = None, *, rewalk: bool = False
    ) -> int:
        """The ef_search for a search of ``limit`` rows among ``memories`` through
        ``plan``'s graph: never below ``limit`` (the graph keeps at most ef_search
        candidates), at most pgvector's 1000. ``rewalk``: for the walk repeated after a
        miss, never narrower than the first."""
        first = self._first_walk(memories, limit, plan)
        return min(MAX_EF_SEARCH, max(self.rewalk_ef_search, first)) if rewalk else first

    def _first_walk(self, memories: int, limit: int, plan: ColdPlan | None) -> int:
        large = memories > self.large_agent_memories
        if plan is ColdPlan.AGENT_SPARSE and self.sparse_graph_ef_search is not None:
            return min(MAX_EF_SEARCH, max(self.sparse_graph_ef_search, limit))
        if plan in (ColdPlan.AGENT_HALFVEC, ColdPlan.AGENT_SPARSE):
            own = self.own_graph_large_agent_ef_search if large else self.own_graph_ef_search
            if own is not None:
                return min(MAX_EF_SEARCH, max(own, limit))
        width = self.large_agent_ef_search if large else self.ef_search
        return min(MAX_EF_SEARCH, max(width, limit))


# How much nearer than the walk's best a lexical match must be to count as a miss: a
# graph in half precision rounds its similarities by up to ~1e-3.
WALK_MISS_MARGIN = 0.002


def walk_missed(walked: Candidates, lexical: Candidates, query: FloatVector) -> bool:
    """Whether the lexical search found a memory that the graph walk did not return and
    that is nearer to the question than one it did (``nearer_than_walk``)."""
    if len(walked) == 0 or len(lexical) == 0:
        return False
    present = lexical.vector_rows >= 0
    return nearer_than_walk(
        walked.ids,
        float(np.nanmin(walked.similarity)),
        [i for i, has in zip(lexical.ids, present, strict=True) if has],
        lexical.vectors[lexical.vector_rows[present]],
        query,
    )


def nearer_than_walk(
    walked_ids: Collection[str],
    walked_farthest: float,
    lexical_ids: Sequence[str],
    lexical_vectors: npt.NDArray[np.float32],
    query: FloatVector,
) -> bool:
    """Whether a lexical match (``lexical_vectors[i]`` is ``lexical_ids[i]``'s) that the walk
    did not return is nearer to ``query`` by cosine than the farthest memory it returned
    (``walked_farthest``), by more than ``WALK_MISS_MARGIN``: then the walk's answer is not
    the nearest memories, and a wider walk finds more of them.

    A greedy walk that ends in the wrong neighbourhood returns its nearest memories there:
    on a 100k agent's graph a few questions in a hundred get few or none of their exact top
    50, the neighbours sitting in a tight group the walk reaches only with a wider beam
    (large-agents-2026-12-06.md section 21). The walk cannot tell; a memory the question's
    words found shows it. The bar is the walk's farthest, not its nearest: on a real 100k
    agent it flags 5 % of the walks, lifting recall@50 from 0.974 / 0.88 p5 to 0.987 / 0.96
    where the nearest flagged 1.2 % for 0.980 / 0.92 (section 24). Vectors of another
    dimension than the query's (stored by another model) are not compared.
    """
    if not len(lexical_ids) or lexical_vectors.ndim != 2 or lexical_vectors.shape[1] != query.shape[-1]:
        return False
    walked = set(walked_ids)
    unseen = [i for i, memory in enumerate(lexical_ids) if memory not in walked]
    if not unseen:
        return False
    return float(np.max(lexical_vectors[unseen] @ query)) > walked_farthest + WALK_MISS_MARGIN


@dataclass(slots=True)
class ColdMatches(Candidates):
    """The vector search's candidates, nearest first, with the plan that found them.

    ``Candidates`` like every store's search result; the retrieval reads ``plan``
    (when present) into the cold source's metadata, and ``rewalked``: the graph walk was
    repeated wider after it missed (``walk_missed``).
    """

    plan: ColdPlan = ColdPlan.EXACT
    rewalked: bool = False

    @staticmethod
    def of(found: Candidates, plan: ColdPlan, *, rewalked: bool = False) -> ColdMatches:
        matches = ColdMatches(*(getattr(found, name) for name in _CANDIDATE_FIELDS))
        matches.plan = plan
        matches.rewalked = rewalked
        return matches


_CANDIDATE_FIELDS = tuple(f.name for f in fields(Candidates))


@dataclass(slots=True)
class _Entry:
    memories: int
    own_graph: ColdPlan | None
    expires_at: float


class AgentSizes:
    """A bounded cache of agents' memory counts, each kept ``ttl`` seconds.

    Least recently used agents are dropped past ``capacity``. Keys are the tenant's
    (org_id, agent_id) pair; nothing here is logged or exported.
    """

    def __init__(
        self, *, ttl: float = 60.0, capacity: int = 100_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ttl = ttl
        self._capacity = capacity
        self._clock = clock
        self._entries: OrderedDict[tuple[object, object], _Entry] = OrderedDict()

    def get(self, key: tuple[object, object]) -> int | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires_at <= self._clock():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry.memories

    def own_graph(self, key: tuple[object, object]) -> ColdPlan | None:
        """The plan of the agent's own graph when its count was read (None: it had none,
        or it is not cached)."""
        entry = self._entries.get(key)
        return entry.own_graph if entry is not None and entry.expires_at > self._clock() else None

    def forget(self, key: tuple[object, object]) -> None:
        """Drops the agent's entry, if cached: its next lookup reads the store again."""
        self._entries.pop(key, None)

    def put(self, key: tuple[object, object], memories: int, *, own_graph: ColdPlan | None = None) -> None:
        self._entries[key] = _Entry(memories, own_graph, self._clock() + self._ttl)
        self._entries.move_to_end(key)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)
