"""Which PostgreSQL answers a call's searches: a read replica when it holds the agent's
writes, else the primary (ADR-0013).

The API promises that a memory upserted is injected on the next call. A replica
replays the primary's WAL a little later, so each write of an agent records the
primary's WAL position after its commit (a *write mark*, ``base.WriteMarkStore``:
``stores.redis.write_marks`` keeps it where every process and pod sees it), and an
agent's searches go to a replica only when its replayed position is at or past the
agent's mark.

A background task polls every ``poll_seconds``: the primary's WAL position, then each
replica's replayed position. A replica's *lag* is how long ago the primary was at a
position the replica has now replayed: it holds every write committed before then.
A replica that did not answer its last poll, or lags by more than
``max_lag_seconds``, takes no reads. So a mark older than ``max_lag_seconds`` (plus
two polls) can no longer send anyone to a replica that misses its write: that is the
mark's TTL, and Redis keeps one small key per recently written agent.

Nothing here fails a call: no replica usable, or the mark unreadable (Redis down),
answers "the primary". The known replayed positions are always older than the
replica's real ones, so a decision errs towards the primary.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import asyncpg
from ibex_context_client.tasks import cancel_and_wait

from ibex_context.errors import CacheError, StoreError, failure_name
from ibex_context.stores.base import StoreHealth, WriteMarkStore

if TYPE_CHECKING:
    from ibex_context.settings import Settings
    from ibex_context.stores.postgres.store import PostgresMemoryStore

_log = logging.getLogger(__name__)

# Why a search went where it did (bounded: these are metric label values).
REPLICA = "replica"
NO_REPLICA = "no_replica"  # none configured answered its last poll within the lag bound
BEHIND_WRITE = "behind_write"  # usable replicas have not replayed the agent's last write yet
MARK_UNKNOWN = "mark_unknown"  # the agent's write mark could not be read (Redis)
REPLICA_FAILED = "replica_failed"  # the replica's search failed; repeated on the primary
ROUTE_REASONS = (REPLICA, NO_REPLICA, BEHIND_WRITE, MARK_UNKNOWN, REPLICA_FAILED)

# A mark no replica reaches: the agent reads from the primary until the mark expires.
ALWAYS_PRIMARY = 2**62

RouteRecorder = Callable[[str, str], None]  # (target "primary"/"replica", reason)
# How ``build_read_routing`` gets the write marks: given their TTL in seconds.
WriteMarksFactory = Callable[[float], WriteMarkStore]
_T = TypeVar("_T")


def parse_lsn(text: str) -> int:
    """``'16/B374D848'`` (pg_lsn's text form) -> the 64-bit position."""
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    """What health and metrics say about one replica (named by position, never by host)."""

    name: str
    up: bool
    lag_seconds: float
    lag_bytes: int
    replayed_lsn: int


_DRIVER_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError)


class _Watcher:
    """One connection of the poller's own, so polls never take a connection from the
    pools the calls search on (nor open one there)."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn: asyncpg.Connection | None = None

    async def position(self, sql: str, timeout: float) -> str | None:
        """``sql``'s one value; raises the driver's errors (and reconnects next time)."""
        try:
            if self._conn is None or self._conn.is_closed():
                self._conn = await asyncpg.connect(self._dsn, timeout=timeout)
            value: str | None = await self._conn.fetchval(sql, timeout=timeout)
            return value
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()


class _Replica:
    def __init__(self, name: str, dsn: str) -> None:
        self.name = name
        self.dsn = dsn
        self.watcher = _Watcher(dsn)
        self.pool: asyncpg.Pool | None = None
        self.up = False
        self.replayed = 0
        self.caught_up_at = -math.inf  # monotonic: holds every write committed before it
        self.lag_bytes = 0


class ReadRouting:
    """Chooses the pool of each search (``pool_for``) and records writes (``note_write``).

    ``connect`` makes a replica's pool (``stores.postgres.create_pool`` with the
    primary's settings); it is retried by every poll until the replica answers.
    """

    def __init__(
        self,
        primary: asyncpg.Pool,
        primary_dsn: str,
        replica_dsns: Sequence[str],
        marks: WriteMarkStore,
        connect: Callable[[str], Awaitable[asyncpg.Pool]],
        *,
        poll_seconds: float,
        max_lag_seconds: float,
        record_route: RouteRecorder | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._primary = primary
        self._primary_watcher = _Watcher(primary_dsn)
        self._primary_answered = True
        self._replicas = [_Replica(f"replica-{n}", dsn) for n, dsn in enumerate(replica_dsns)]
        self._marks = marks
        self._connect = connect
        self._poll_seconds = poll_seconds
        self._max_lag = max_lag_seconds
        self._record_route = record_route or (lambda target, reason: None)
        self._clock = clock
        # (time before asking, the primary's position then): the primary had committed
        # nothing past the position at that time. Kept for max_lag_seconds and a bit.
        self._primary_positions: deque[tuple[float, int]] = deque()
        self._turn = itertools.count()
        self._poller: asyncio.Task[None] | None = None

    @staticmethod
    def mark_ttl_seconds(max_lag_seconds: float, poll_seconds: float) -> float:
        """How long a write mark must live (see the module doc)."""
        return max_lag_seconds + 2 * poll_seconds + 1.0

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        if self._poller is None and self._replicas:
            self._poller = asyncio.get_running_loop().create_task(self._poll_forever(), name="ibex-replicas")

    async def aclose(self) -> None:
        poller, self._poller = self._poller, None
        await cancel_and_wait(poller)
        for replica in self._replicas:
            pool, replica.pool = replica.pool, None
            if pool is not None:
                await pool.close()
            await replica.watcher.aclose()
        await self._primary_watcher.aclose()
        await self._marks.aclose()

    async def _poll_forever(self) -> None:
        while True:
            try:
                await self.poll()
            except Exception as exc:  # the poller must outlive any one failure
                _log.warning("polling the replicas failed: %s", type(exc).__name__)
            await asyncio.sleep(self._poll_seconds)

    async def poll(self) -> None:
        """One round: the primary's position, then every replica's replayed position."""
        timeout = max(1.0, 4 * self._poll_seconds)
        asked_at = self._clock()
        try:
            position = parse_lsn(
                await self._primary_watcher.position("SELECT pg_current_wal_lsn()::text", timeout) or "0/0"
            )
        except _DRIVER_ERRORS as exc:
            if self._primary_answered:
                _log.warning("reading the primary's WAL position failed: %s", type(exc).__name__)
            self._primary_answered = False
        else:
            self._primary_answered = True
            self._primary_positions.append((asked_at, position))
        while (
            len(self._primary_positions) > 1
            and self._primary_positions[1][0] < asked_at - 2 * self._max_lag - 1
        ):
            self._primary_positions.popleft()
        await asyncio.gather(*(self._poll_replica(replica, timeout) for replica in self._replicas))
        self._marks.forget_expired()

    async def _poll_replica(self, replica: _Replica, timeout: float) -> None:
        try:
            text = await replica.watcher.position("SELECT pg_last_wal_replay_lsn()::text", timeout)
            if replica.pool is None and text is not None:
                # Opening and warming a pool takes longer than a poll's statement.
                replica.pool = await asyncio.wait_for(self._connect(replica.dsn), max(10.0, timeout))
        except (*_DRIVER_ERRORS, StoreError) as exc:
            if replica.up:
                _log.warning("%s stopped answering: %s", replica.name, type(exc).__name__)
            replica.up = False
            return
        if text is None:  # not in recovery: a promoted replica is no replica of ours
            replica.up = False
            return
        replica.replayed = parse_lsn(text)
        replica.up = True
        for at, position in reversed(self._primary_positions):
            if position <= replica.replayed:
                replica.caught_up_at = max(replica.caught_up_at, at)
                break
        if self._primary_positions:
            replica.lag_bytes = max(0, self._primary_positions[-1][1] - replica.replayed)

    # ---------------------------------------------------------------- routing

    def _usable(self, replica: _Replica, now: float) -> bool:
        return replica.up and replica.pool is not None and now - replica.caught_up_at <= self._max_lag

    async def pool_for(self, org_id: str, agent_id: str) -> tuple[asyncpg.Pool, str | None]:
        """The pool to search the agent's memories on, and the replica's name (None: the
        primary). Never raises."""
        now = self._clock()
        usable = [r for r in self._replicas if self._usable(r, now)]
        if not usable:
            if self._replicas:
                self._record_route("primary", NO_REPLICA)
            return self._primary, None
        try:
            mark = await self._marks.get(org_id, agent_id)
        except CacheError:
            self._record_route("primary", MARK_UNKNOWN)
            return self._primary, None
        holding = [r for r in usable if r.replayed >= mark]
        if not holding:
            self._record_route("primary", BEHIND_WRITE)
            return self._primary, None
        chosen = holding[next(self._turn) % len(holding)]
        assert chosen.pool is not None
        self._record_route("replica", REPLICA)
        return chosen.pool, chosen.name

    async def routed(
        self, org_id: str, agent_id: str, search: Callable[[asyncpg.Pool | None], Awaitable[_T]]
    ) -> _T:
        """``search`` on a replica that has replayed the agent's writes, else on the
        primary (``None``); a replica that fails is reported and the primary answers."""
        pool, replica = await self.pool_for(org_id, agent_id)
        if replica is None:
            return await search(None)
        try:
            return await search(pool)
        except StoreError:  # the replica failed (StoreUnavailable is one): the primary answers
            self.replica_failed(replica)
            return await search(None)

    def replica_failed(self, name: str) -> None:
        """A search on ``name`` failed: no more reads there until it answers a poll."""
        for replica in self._replicas:
            if replica.name == name:
                replica.up = False
        self._record_route("primary", REPLICA_FAILED)

    async def note_write(self, org_id: str, agent_id: str) -> None:
        """After a write of the agent committed: its mark is the primary's position now.

        Never raises: the write stands. When the position cannot be read, this process
        sends the agent's reads to the primary for a mark's lifetime; when Redis cannot
        store the mark, this process still has it (other processes may then read the
        agent from a replica for up to ``max_lag_seconds``: logged).
        """
        if not self._replicas:
            return
        try:
            lsn = parse_lsn(await self._primary.fetchval("SELECT pg_current_wal_insert_lsn()::text"))
        except _DRIVER_ERRORS as exc:
            _log.warning("reading the write's WAL position failed: %s", type(exc).__name__)
            lsn = ALWAYS_PRIMARY
        try:
            await self._marks.put(org_id, agent_id, lsn)
        except CacheError as exc:
            _log.warning("storing a write mark in Redis failed: %s", failure_name(exc))

    # ---------------------------------------------------------------- health

    def statuses(self) -> list[ReplicaStatus]:
        now = self._clock()
        return [
            ReplicaStatus(
                name=r.name,
                up=self._usable(r, now),
                lag_seconds=max(0.0, now - r.caught_up_at) if r.caught_up_at > -math.inf else math.inf,
                lag_bytes=r.lag_bytes,
                replayed_lsn=r.replayed,
            )
            for r in self._replicas
        ]

    async def check_health(self) -> StoreHealth:
        """Ok while at least one replica takes reads (reads fall back to the primary
        otherwise: calls are not failed either way)."""
        statuses = self.statuses()
        extra = {
            s.name: f"{'up' if s.up else 'down'} lag={s.lag_seconds:.3f}s lag_bytes={s.lag_bytes}"
            for s in statuses
        }
        usable = sum(s.up for s in statuses)
        return StoreHealth(
            ok=usable > 0, detail=f"postgres replicas: {usable}/{len(statuses)} taking reads", extra=extra
        )


def build_read_routing(
    settings: Settings,
    postgres: PostgresMemoryStore,
    marks: WriteMarksFactory,
    record_route: RouteRecorder | None = None,
) -> ReadRouting | None:
    """The routing of ``settings.postgres_read_dsns``; None when there are none.
    ``marks`` makes the write marks (``stores.redis.WriteMarks.from_settings``) only then."""
    if not settings.postgres_read_dsns:
        return None
    ttl = ReadRouting.mark_ttl_seconds(
        settings.postgres_replica_max_lag_seconds, settings.postgres_replica_poll_seconds
    )
    return ReadRouting(
        postgres.pool,
        settings.postgres_dsn,
        settings.postgres_read_dsns,
        marks(ttl),
        functools.partial(
            postgres.open_read_pool, min_size=settings.postgres_pool_min, max_size=settings.postgres_pool_max
        ),
        poll_seconds=settings.postgres_replica_poll_seconds,
        max_lag_seconds=settings.postgres_replica_max_lag_seconds,
        record_route=record_route,
    )
