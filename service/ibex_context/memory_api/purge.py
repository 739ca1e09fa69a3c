"""Purging a tenant (an agent, or a whole org) from PostgreSQL and Redis.

Order matters: PostgreSQL first (the truth), then Redis. The Redis step deletes
every key of the agent and leaves two content-free tombstones for a minute
(``stores.redis.PURGE_TOMBSTONE_SECONDS``) that refuse the cache fills of readers
that read PostgreSQL before its purge; without them a hot-set rebuild or a
directive fill in flight could write purged content back. A call that runs out
of its time budget, or finds rows a racing writer committed before its final
count, says ``complete=False``;
calling again resumes (every step is idempotent). A Redis failure fails the call
(UNAVAILABLE): retrying it finds PostgreSQL already clean and redoes Redis.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from ibex_context.errors import CacheError, StoreUnavailable

_T = TypeVar("_T")


class AgentRowsPurged(Protocol):
    """What one pass over an agent's rows in PostgreSQL deleted."""

    @property
    def memories_deleted(self) -> int: ...
    @property
    def directives_deleted(self) -> int: ...
    @property
    def complete(self) -> bool: ...
    @property
    def directive_tombstone_version(self) -> int: ...


class TenantRows(Protocol):
    """The truth's side of a purge (``stores.postgres.tenant_data.TenantData``)."""

    def agents_of_org(self, org_id: str) -> Awaitable[list[str]]: ...
    def purge_agent(
        self, org_id: str, agent_id: str, *, out_of_time: Callable[[], bool]
    ) -> Awaitable[AgentRowsPurged]: ...
    def count_agent_rows(self, org_id: str, agent_id: str) -> Awaitable[int]: ...


class TenantCache(Protocol):
    """The cache's side of a purge (``stores.redis.RedisContextCache``); when Redis fails it
    raises ``errors.CacheError``."""

    def agents_with_keys(self, org_id: str) -> Awaitable[set[str]]: ...
    def purge_org_keys(self, org_id: str, purged_agents: Sequence[str]) -> Awaitable[int]: ...
    def purge_agent(self, org_id: str, agent_id: str, directive_tombstone_version: int) -> Awaitable[int]: ...


@dataclass(frozen=True, slots=True)
class PurgeReport:
    memories_deleted: int
    directives_deleted: int
    agents_purged: int
    cache_keys_deleted: int
    complete: bool


class TenantPurge:
    def __init__(
        self,
        *,
        data: TenantRows,
        cache: TenantCache,
        call_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        purged: Callable[[str, str], Awaitable[None]] | None = None,
    ) -> None:
        self._data = data
        self._cache = cache
        self._call_seconds = call_seconds
        self._clock = clock
        # Told of each agent purged: read replicas must not serve what the primary
        # deleted (``ReadRouting.note_write``).
        self._purged = purged

    async def purge_agent(self, org_id: str, agent_id: str) -> PurgeReport:
        return await self._purge(org_id, [agent_id], self._clock() + self._call_seconds)

    async def purge_org(self, org_id: str) -> PurgeReport:
        deadline = self._clock() + self._call_seconds
        agents = set(await self._data.agents_of_org(org_id))
        agents |= await self._redis(self._cache.agents_with_keys(org_id))
        report = await self._purge(org_id, sorted(agents), deadline)
        if not report.complete:
            return report
        stray = await self._redis(self._cache.purge_org_keys(org_id, sorted(agents)))
        return replace(report, cache_keys_deleted=report.cache_keys_deleted + stray)

    async def _purge(self, org_id: str, agents: list[str], deadline: float) -> PurgeReport:
        memories = directives = keys = purged = 0
        complete = True
        for agent_id in agents:
            if purged and self._clock() >= deadline:
                complete = False
                break
            outcome = await self._data.purge_agent(
                org_id, agent_id, out_of_time=lambda: self._clock() >= deadline
            )
            memories += outcome.memories_deleted
            directives += outcome.directives_deleted
            purged += 1
            # Also after an incomplete PostgreSQL step: the cache must not keep serving
            # what is already deleted there.
            keys += await self._redis(
                self._cache.purge_agent(org_id, agent_id, outcome.directive_tombstone_version)
            )
            if self._purged is not None:
                await self._purged(org_id, agent_id)
            # Counted last: a write that committed before this count was either deleted
            # or is found here (the caller retries); one after it is a new memory.
            if not outcome.complete or await self._data.count_agent_rows(org_id, agent_id):
                complete = False
                break
        return PurgeReport(memories, directives, purged, keys, complete)

    async def _redis(self, call: Awaitable[_T]) -> _T:
        try:
            return await call
        except CacheError as exc:  # the call fails UNAVAILABLE
            raise StoreUnavailable(str(exc)) from None
