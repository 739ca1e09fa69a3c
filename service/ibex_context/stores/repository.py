"""The stores as the pipeline and the write side use them: PostgreSQL behind a Redis cache.

Consistency model (details and reasons: docs/adr/0003-stores.md):

* PostgreSQL is the truth; every write lands there first and fails if it fails.
* The cache is then written through (directive, hot-set members). If Redis fails,
  the write still succeeds; the affected cache entries are invalidated, and if
  that fails too the invalidation is retried in the background until Redis
  answers. Version guards (directive) and a generation counter (hot set) keep a
  slow cache fill from overwriting a newer write.
* Reads never block on a rebuild: a missing hot set returns [] at once and
  schedules one rebuild per agent in the background. Writes do build a missing
  hot set (after their commit), so a write is visible to the reads that follow. A missing directive entry
  is read from PostgreSQL and cached, including "no directive" (negative entry) for
  an agent whose directive was cleared. Unknown ids leave nothing in Redis: no
  negative entry for an agent that never had a directive, no hot set for an agent
  with no memories (each unknown (org, agent) pair cost two keys for up to an hour,
  so a caller cycling random ids filled Redis). Such agents cost one PostgreSQL
  primary-key read and one background hot-set query per call instead.
* Searches may go to a read replica (``stores.postgres.read_routing``): only one that has
  replayed the agent's last write, so a write is visible to the reads that follow
  there too; a replica's failure repeats the search on the primary.
* A Redis failure on the read path: the directive is read from PostgreSQL (still
  served); the hot set raises ``StoreUnavailable`` so the assembly reports the hot
  source as failed (the request itself never fails; the pipeline degrades).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

from ibex_context.candidates import Candidates
from ibex_context.errors import CacheError, StoreError, StoreUnavailable, failure_name
from ibex_context.models import Directive, FloatVector, MemoryRecord
from ibex_context.stores.base import (
    DirectiveState,
    FeedbackUpdate,
    InjectionRecord,
    MemoryCounters,
    PreparedMemory,
    StoreHealth,
    UpsertResult,
)
from ibex_context.stores.hot_score import hot_set_score
from ibex_context.stores.postgres import PostgresMemoryStore
from ibex_context.stores.postgres.read_routing import ReadRouting
from ibex_context.stores.redis import RedisContextCache

_log = logging.getLogger(__name__)
LOG_INTERVAL_SECONDS = 10.0
_AgentKey = tuple[str, str]
# A cache operation that drops one agent's entry (its hot set, its directive).
_Invalidation = Callable[[str, str], Awaitable[None]]


class ContextRepository:
    """Implements DirectiveReader, HotMemoryReader, ColdMemorySearch, MemoryWriter,
    InjectionRecorder and HealthProbe over ``postgres`` and ``cache``.

    It owns only its background tasks (hot-set rebuilds, invalidation retries);
    ``aclose()`` stops them. The stores are closed by whoever created them.
    """

    def __init__(
        self,
        postgres: PostgresMemoryStore,
        cache: RedisContextCache,
        *,
        clock: Callable[[], float] = time.time,
        invalidation_retry_seconds: float = 1.0,
        read_routing: ReadRouting | None = None,
    ) -> None:
        self._postgres = postgres
        # None: every read on the primary.
        self._routing = read_routing
        self._cache = cache
        self._clock = clock
        self._retry_interval = invalidation_retry_seconds
        self._rebuilds: dict[_AgentKey, asyncio.Task[bool]] = {}
        self._pending_hot_invalidations: set[_AgentKey] = set()
        self._pending_directive_invalidations: set[_AgentKey] = set()
        self._retrier: asyncio.Task[None] | None = None
        self._last_logged: dict[str, float] = {}

    async def aclose(self) -> None:
        tasks = [*self._rebuilds.values(), *([self._retrier] if self._retrier else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._rebuilds.clear()
        self._retrier = None

    # ================================================================ reads

    async def get_directive(self, org_id: str, agent_id: str) -> Directive | None:
        try:
            cached = await self._cache.get_directive_state(org_id, agent_id)
        except CacheError as exc:
            self._log_cache_failure("directive cache read", exc)
            return await self._postgres.get_directive(org_id, agent_id)
        if cached is not None:
            return cached.to_directive()
        state = await self._postgres.get_directive_state(org_id, agent_id)
        if state.version == 0:
            return None  # never had a directive: nothing to cache (see the module doc)
        try:
            await self._cache.put_directive(org_id, agent_id, state)
        except CacheError as exc:
            self._log_cache_failure("directive cache fill", exc)
        return state.to_directive()

    async def get_hot_memories(self, org_id: str, agent_id: str, limit: int) -> Candidates:
        """The hot set's best ``limit``; none while a missing hot set is rebuilt in the background.

        Raises StoreUnavailable when Redis fails, so the failure is reported, not hidden.
        """
        try:
            records = await self._cache.get_hot_memories(org_id, agent_id, limit)
        except CacheError as exc:
            raise StoreUnavailable(str(exc)) from exc
        if records is None:
            self.schedule_hot_set_rebuild(org_id, agent_id)
            return Candidates.empty()
        return records

    async def search(
        self,
        org_id: str,
        agent_id: str,
        embedding: FloatVector,
        limit: int,
        *,
        with_vectors: bool = False,
        wider: bool = False,
    ) -> Candidates:
        if self._routing is None:
            return await self._postgres.search(
                org_id, agent_id, embedding, limit, with_vectors=with_vectors, wider=wider
            )
        return await self._routing.routed(
            org_id,
            agent_id,
            lambda on: self._postgres.search(
                org_id, agent_id, embedding, limit, with_vectors=with_vectors, wider=wider, on=on
            ),
        )

    async def search_lexical(self, org_id: str, agent_id: str, query: str, limit: int) -> Candidates:
        if self._routing is None:
            return await self._postgres.search_lexical(org_id, agent_id, query, limit)
        return await self._routing.routed(
            org_id, agent_id, lambda on: self._postgres.search_lexical(org_id, agent_id, query, limit, on=on)
        )

    # ================================================================ hot set rebuild

    def schedule_hot_set_rebuild(self, org_id: str, agent_id: str) -> asyncio.Task[bool]:
        """Starts a rebuild unless one is already running for the agent; returns its task."""
        key = (org_id, agent_id)
        running = self._rebuilds.get(key)
        if running is not None and not running.done():
            return running
        task = asyncio.create_task(self.rebuild_hot_set(org_id, agent_id), name="rebuild-hot-set")
        self._rebuilds[key] = task
        task.add_done_callback(lambda done: self._rebuild_finished(key, done))
        return task

    def _rebuild_finished(self, key: _AgentKey, task: asyncio.Task[bool]) -> None:
        if self._rebuilds.get(key) is task:
            del self._rebuilds[key]
        if not task.cancelled() and (exc := task.exception()) is not None:
            _log.warning("hot set rebuild failed: %s", failure_name(exc))

    async def rebuild_hot_set(self, org_id: str, agent_id: str) -> bool:
        """Replaces the hot set with PostgreSQL's top N; False when a write raced it."""
        generation = await self._cache.hot_set_generation(org_id, agent_id)
        records = await self._postgres.top_memories_for_hot_set(org_id, agent_id, self._cache.hot_set_size)
        return await self._cache.replace_hot_set(org_id, agent_id, self._scored(records), generation)

    def _scored(self, records: Iterable[MemoryRecord]) -> list[tuple[MemoryRecord, float]]:
        now = self._clock()
        return [(record, hot_set_score(record, now)) for record in records]

    async def _refresh_hot_members(self, org_id: str, agent_id: str, ids: Sequence[str]) -> None:
        """Writes the changed memories (re-read, re-scored) into the hot set after a commit.

        When the agent has no hot set, it is built now from PostgreSQL (after the
        commit, so it includes this write): a write is followed by reads that expect
        its memories, and writes can afford one more query. Failures here only cost
        cache freshness; the write has already succeeded and is not failed for them.
        """
        if not ids:
            return
        try:
            records = await self._postgres.fetch_memories(org_id, agent_id, ids)
            if not await self._cache.add_hot_memories(org_id, agent_id, self._scored(records)):
                await self.rebuild_hot_set(org_id, agent_id)
        except CacheError as exc:
            self._log_cache_failure("hot set write", exc)
            await self._invalidate_hot_set(org_id, agent_id)
        except StoreError as exc:  # PostgreSQL's (a CacheError is caught above)
            self._log_cache_failure("hot set refresh read", exc)

    # ================================================================ writes

    async def upsert_memories(
        self, org_id: str, agent_id: str, memories: Sequence[PreparedMemory]
    ) -> list[UpsertResult]:
        results = await self._postgres.upsert_memories(org_id, agent_id, memories)
        if self._routing is not None:  # before returning: the next call must see the write
            await self._routing.note_write(org_id, agent_id)
        changed = list(dict.fromkeys(r.id for r in results if r.outcome != "unchanged"))
        await self._refresh_hot_members(org_id, agent_id, changed)
        return results

    async def delete_memories(self, org_id: str, agent_id: str, ids: Sequence[str]) -> int:
        deleted = await self._postgres.delete_memories(org_id, agent_id, ids)
        if self._routing is not None:
            await self._routing.note_write(org_id, agent_id)
        try:
            removed = await self._cache.remove_hot_memories(org_id, agent_id, ids)
        except CacheError as exc:
            self._log_cache_failure("hot set delete", exc)
            await self._invalidate_hot_set(org_id, agent_id)
            return deleted
        if removed:
            # The hot set is one short of its top N now: refill it from PostgreSQL.
            self.schedule_hot_set_rebuild(org_id, agent_id)
        return deleted

    async def set_directive(
        self, org_id: str, agent_id: str, content: str, token_counts: Mapping[str, int]
    ) -> int:
        state = await self._postgres.set_directive_state(org_id, agent_id, content, token_counts)
        await self._write_directive_through(org_id, agent_id, state)
        return state.version

    async def clear_directive(self, org_id: str, agent_id: str) -> bool:
        version = await self._postgres.clear_directive_version(org_id, agent_id)
        if version is None:
            state = await self._postgres.get_directive_state(org_id, agent_id)
        else:
            state = DirectiveState(content=None, version=version, token_counts={})
        await self._write_directive_through(org_id, agent_id, state)
        return version is not None

    async def _write_directive_through(self, org_id: str, agent_id: str, state: DirectiveState) -> None:
        try:
            await self._cache.put_directive(org_id, agent_id, state)
        except CacheError as exc:
            self._log_cache_failure("directive cache write", exc)
            await self._invalidate_directive(org_id, agent_id)

    async def record_feedback(
        self, org_id: str, agent_id: str, session_id: str | None, feedback: Sequence[tuple[str, str]]
    ) -> list[FeedbackUpdate]:
        updates = await self._postgres.record_feedback(org_id, agent_id, session_id, feedback)
        await self._refresh_hot_members(org_id, agent_id, list(dict.fromkeys(u.memory_id for u in updates)))
        return updates

    async def record_injections(self, injections: Sequence[InjectionRecord]) -> None:
        """Counts the injections in PostgreSQL (``memory_usage``), then patches the
        counters and scores of the members already in each agent's hot set, in Redis
        alone (no PostgreSQL read, no vector traffic; see ``RedisContextCache.patch_hot_counters``)."""
        counters = await self._postgres.record_injection_counters(injections)
        by_agent: dict[_AgentKey, list[MemoryCounters]] = {}
        for item in counters:
            by_agent.setdefault((item.org_id, item.agent_id), []).append(item)
        try:
            outcomes: dict[_AgentKey, int | CacheError] = dict(
                await self._cache.patch_hot_counters_of_agents(by_agent)
            )
        except CacheError as exc:
            outcomes = dict.fromkeys(by_agent, exc)
        for (org_id, agent_id), outcome in outcomes.items():
            if isinstance(outcome, CacheError):
                self._log_cache_failure("hot set score refresh", outcome)
                await self._invalidate_hot_set(org_id, agent_id)

    # ================================================================ invalidation

    async def _invalidate_hot_set(self, org_id: str, agent_id: str) -> None:
        await self._invalidate(
            self._cache.invalidate_hot_set, self._pending_hot_invalidations, org_id, agent_id
        )

    async def _invalidate_directive(self, org_id: str, agent_id: str) -> None:
        await self._invalidate(
            self._cache.delete_directive, self._pending_directive_invalidations, org_id, agent_id
        )

    async def _invalidate(
        self, drop: _Invalidation, pending: set[_AgentKey], org_id: str, agent_id: str
    ) -> None:
        """Drops the agent's entry; when Redis fails, it is kept in ``pending`` for the retrier."""
        try:
            await drop(org_id, agent_id)
        except CacheError:
            pending.add((org_id, agent_id))
            self._ensure_retrier()

    @property
    def pending_invalidations(self) -> int:
        return len(self._pending_hot_invalidations) + len(self._pending_directive_invalidations)

    def _ensure_retrier(self) -> None:
        if self._retrier is None or self._retrier.done():
            self._retrier = asyncio.create_task(self._retry_invalidations(), name="retry-cache-invalidation")

    async def _retry_invalidations(self) -> None:
        """Until Redis answers: a cache entry a failed write could not update must not survive."""
        while self._pending_hot_invalidations or self._pending_directive_invalidations:
            await asyncio.sleep(self._retry_interval)
            for drop, pending in (
                (self._cache.invalidate_hot_set, self._pending_hot_invalidations),
                (self._cache.delete_directive, self._pending_directive_invalidations),
            ):
                for key in list(pending):
                    try:
                        await drop(*key)
                    except CacheError:
                        break
                    pending.discard(key)

    def _log_cache_failure(self, operation: str, exc: BaseException) -> None:
        """One warning per operation per ``LOG_INTERVAL_SECONDS``: a Redis outage would
        otherwise log on every request."""
        now = time.monotonic()
        if now - self._last_logged.get(operation, -math.inf) >= LOG_INTERVAL_SECONDS:
            self._last_logged[operation] = now
            _log.warning("%s failed: %s", operation, failure_name(exc))

    # ================================================================ health

    async def check_health(self) -> StoreHealth:
        """OK while PostgreSQL answers: without Redis the service degrades but still serves."""
        postgres, redis = await asyncio.gather(self._postgres.check_health(), self._cache.check_health())
        return StoreHealth(
            ok=postgres.ok,
            detail=f"{postgres.detail}; {redis.detail}",
            extra={"postgres": "ok" if postgres.ok else "down", "redis": "ok" if redis.ok else "down"},
        )
