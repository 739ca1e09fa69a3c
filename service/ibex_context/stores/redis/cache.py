"""Redis: the cache of directives and of each agent's hot set.

Keys are hash-tagged by the org (``{org_id}:...``) so one agent's keys live in one
cluster slot and the Lua scripts below may touch them together:

* ``{org}:directive:{agent}``        "<version>|<JSON>" — the directive, or a
  negative entry ("<version>|-") meaning "this agent's directive was cleared"
  (never for an agent that never had one: see ``stores.repository``). Writes go
  through ``PUT_DIRECTIVE`` which refuses a version older than the cached one, so
  a slow reader filling the cache cannot overwrite a newer write.
* ``{org}:hot_memories:{agent}``     ZSET memory id -> write-time score (top N).
* ``{org}:hot_memory_data:{agent}``  HASH memory id -> encoded record
  (``stores.redis.hot_record``), plus the field ``~`` marking the hot set as built. A
  rebuild that finds no memories writes no key: a caller cycling random agent
  ids would otherwise fill Redis with markers. An agent whose last memory was
  deleted keeps the marker and no ZSET ("empty", told apart from "missing").
* ``{org}:hot_gen:{agent}``          counter bumped by every write to the hot set.
  A rebuild reads it before querying PostgreSQL and replaces the set only if it
  is unchanged, so a rebuild can never install a snapshot older than a write.

The hot set's TTL is set when it is rebuilt and not extended by writes: expiry is
the periodic reconciliation with PostgreSQL (recency decays, trims drop members).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError, RedisError

from ibex_context.candidates import Candidates
from ibex_context.errors import CacheError
from ibex_context.models import MemoryRecord
from ibex_context.settings import Settings
from ibex_context.stores.base import DirectiveState, MemoryCounters, StoreHealth
from ibex_context.stores.hot_score import frequency_lua, frequency_weight
from ibex_context.stores.redis.errors import DRIVER_ERRORS, cache_error, cache_errors
from ibex_context.stores.redis.hot_record import COUNTERS, FORMAT_VERSION, decode_records, encode_record
from ibex_context.stores.redis.topology import RedisClient, RedisTopology
from ibex_context.stores.redis.wire import LuaScript, RedisReads

BUILT_MARKER = "~"
# Cluster mode: agents' scripts sent at once where a pipeline would carry them.
CLUSTER_CONCURRENCY = 16
# The generation counter outlives any hot set by far; it only needs to exist while
# a rebuild is in flight.
GENERATION_TTL_SECONDS = 86_400

# Answers false when the hot set is missing, else the best ``limit`` records in rank
# order, as stored (``stores.redis.hot_record.decode_records`` reads them). A record of an
# older format makes the whole set read as missing, so the repository rebuilds it in
# this one.
_READ_HOT = f"""
if redis.call('EXISTS', KEYS[2]) == 0 then return false end
local limit = tonumber(ARGV[1])
if limit <= 0 then return {{}} end
local ids = redis.call('ZRANGE', KEYS[1], 0, limit - 1, 'REV')
if #ids == 0 then return {{}} end
local records = redis.call('HMGET', KEYS[2], unpack(ids))
local found = {{}}
for i = 1, #records do
  local record = records[i]
  -- A member without data (which no script leaves) is skipped, not an error.
  if record then
    if string.byte(record, 1) ~= {FORMAT_VERSION} then return false end
    found[#found + 1] = record
  end
end
return found
"""

_REPLACE_HOT = """
local gen = tonumber(redis.call('GET', KEYS[3]) or '0')
if gen ~= tonumber(ARGV[1]) then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
if #ARGV < 3 then return 1 end
redis.call('HSET', KEYS[2], '~', '1')
for i = 3, #ARGV, 3 do
  redis.call('ZADD', KEYS[1], ARGV[i + 1], ARGV[i])
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 2])
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 1
"""

_ADD_HOT = """
redis.call('INCR', KEYS[3])
redis.call('EXPIRE', KEYS[3], ARGV[2])
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
for i = 3, #ARGV, 3 do
  redis.call('ZADD', KEYS[1], ARGV[i + 1], ARGV[i])
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 2])
end
local excess = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[1])
if excess > 0 then
  local dropped = redis.call('ZRANGE', KEYS[1], 0, excess - 1)
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, excess - 1)
  redis.call('HDEL', KEYS[2], unpack(dropped))
end
-- The ZSET may have just been created (the agent had no memories): same expiry as the data.
local ttl = redis.call('PTTL', KEYS[2])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1
"""

_REMOVE_HOT = """
redis.call('INCR', KEYS[3])
redis.call('EXPIRE', KEYS[3], ARGV[1])
local removed = redis.call('ZREM', KEYS[1], unpack(ARGV, 2))
redis.call('HDEL', KEYS[2], unpack(ARGV, 2))
return removed
"""

# Records injections in the hot set without PostgreSQL: for each member that is in
# the hot set (as a record of the current format), set its counters to the values
# PostgreSQL returned (in the record's fixed-offset prefix, see ``stores.redis.hot_record``)
# and move its score by the change of the frequency term, the only term the counters
# feed: score += weight * (frequency(new) - frequency(old)), ``ranking.frequency``
# generated as Lua (``hot_score.frequency_lua``). Members that are not
# there are not added (that would make a partial hot set look complete); records of
# an older format are left as they are (a read rebuilds their set). Bumps the
# generation when it changed anything, so a rebuild that read PostgreSQL before these
# counters were committed cannot install its older snapshot over them.
# ARGV: generation TTL, weight, then the patches packed (``_PATCH``: 36-byte member id,
# uint32 retrieval_count, float64 last_injected_at; little-endian), 48 bytes each.
_PATCH_COUNTERS = f"""
local weight = tonumber(ARGV[2])
local packed = ARGV[3]
local patched = 0
for at = 1, #packed, 48 do
  local id = string.sub(packed, at, at + 35)
  local count, last = struct.unpack('<I4d', packed, at + 36)
  local blob = redis.call('HGET', KEYS[2], id)
  if blob and string.byte(blob, 1) == {FORMAT_VERSION} then
    local _, old_count, old_last = struct.unpack('<BI4d', blob)
    if old_last == old_last and old_last > last then last = old_last end
    local delta = weight * ({frequency_lua("count")} - {frequency_lua("old_count")})
    local counters = struct.pack('<BI4d', {FORMAT_VERSION}, count, last)
    redis.call('HSET', KEYS[2], id, counters .. string.sub(blob, {COUNTERS.size + 1}))
    -- XX: data and member are written and trimmed together; never add a member here.
    if delta ~= 0 then redis.call('ZADD', KEYS[1], 'XX', 'INCR', delta, id) end
    patched = patched + 1
  end
end
if patched > 0 then
  redis.call('INCR', KEYS[3])
  redis.call('EXPIRE', KEYS[3], ARGV[1])
end
return patched
"""

_PUT_DIRECTIVE = """
local current = redis.call('GET', KEYS[1])
if current then
  local version = tonumber(string.match(current, '^(%d+)|'))
  if version and version > tonumber(ARGV[1]) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. ARGV[2], 'EX', ARGV[3])
return 1
"""


# A purge leaves, per agent, two content-free tombstones for this long: a directive
# entry "no directive" with a version above any a reader can have read before the purge
# and at most the next one set (migrations 0014, 0017; so a cache fill that read PostgreSQL
# before the purge is refused by ``PUT_DIRECTIVE``, a directive set after it is not) and a bumped
# hot-set generation (so a rebuild that read before the purge is refused by
# ``REPLACE_HOT``). Both expire well after any such reader (PostgreSQL's
# statement_timeout is 30 s); nothing of the tenant is left after that.
PURGE_TOMBSTONE_SECONDS = 60

# KEYS: directive, hot set, hot data, generation, then any other key of the agent.
# ARGV: tombstone seconds, tombstone version. Returns the keys that held data.
_PURGE_AGENT = """
local deleted = redis.call('DEL', KEYS[2], KEYS[3])
for i = 5, #KEYS do deleted = deleted + redis.call('DEL', KEYS[i]) end
local directive = redis.call('GET', KEYS[1])
if directive and not string.match(directive, '^' .. ARGV[2] .. '|') then deleted = deleted + 1 end
redis.call('SET', KEYS[1], ARGV[2] .. '|-', 'EX', ARGV[1])
redis.call('INCR', KEYS[4])
redis.call('EXPIRE', KEYS[4], ARGV[1])
return deleted
"""


def create_redis_client(url: str, *, max_connections: int, ca_file: Path | None = None) -> aioredis.Redis:
    """redis-py's client of one Redis server (``RedisTopology.create_client`` says how
    it is configured, and builds the Sentinel and Cluster ones)."""
    client = RedisTopology(url, ca_file=ca_file).create_client(max_connections=max_connections)
    assert isinstance(client, aioredis.Redis)
    return client


def directive_key(org_id: str, agent_id: str) -> str:
    return f"{{{org_id}}}:directive:{agent_id}"


def hot_set_key(org_id: str, agent_id: str) -> str:
    return f"{{{org_id}}}:hot_memories:{agent_id}"


def hot_data_key(org_id: str, agent_id: str) -> str:
    return f"{{{org_id}}}:hot_memory_data:{agent_id}"


def hot_generation_key(org_id: str, agent_id: str) -> str:
    return f"{{{org_id}}}:hot_gen:{agent_id}"


def encode_directive(state: DirectiveState) -> bytes:
    payload = (
        "-" if state.content is None else json.dumps({"c": state.content, "t": dict(state.token_counts)})
    )
    return payload.encode("utf-8")


def decode_directive(value: bytes) -> DirectiveState:
    version, _, payload = value.partition(b"|")
    if payload == b"-":
        return DirectiveState(content=None, version=int(version), token_counts={})
    fields = json.loads(payload)
    return DirectiveState(content=fields["c"], version=int(version), token_counts=fields["t"])


# One patch as the script reads it: the member id (canonical UUID text), the new
# retrieval_count and last_injected_at. A batch's patches of one agent travel as one
# argument: redis-py encodes each argument in Python (three per memory made packing a
# 1,000-injection batch the bookkeeping's largest cost, benchmarks/results/bookkeeping-2026-11-26.md).
_PATCH = struct.Struct("<36sId")
_UUID_TEXT_LENGTH = 36


def _patch_args(counters: Sequence[MemoryCounters]) -> list[str | float | int | bytes]:
    weight = frequency_weight()
    pack = _PATCH.pack
    patches = []
    for item in counters:
        member = item.memory_id.encode("ascii")
        if len(member) != _UUID_TEXT_LENGTH:  # '36s' would pad or cut it silently
            raise ValueError(f"memory_id {item.memory_id!r} is not a canonical UUID")
        # Injected memories always have a time; 0 keeps the member's own if ever not.
        at = item.last_injected_at if item.last_injected_at is not None else 0.0
        patches.append(pack(member, item.retrieval_count, at))
    return [GENERATION_TTL_SECONDS, weight, b"".join(patches)]


class RedisContextCache:
    """Directive and hot-set cache. Raises ``errors.CacheError`` on failure;
    the repository decides what a failure means (miss, or best-effort invalidation).

    Two clients of the same Redis (one server, Sentinel or Cluster:
    ``stores.redis.topology``): ``reads`` (``stores.redis.wire``) serves the two
    reads every AssembleContext call makes (directive, hot set), at 30-60 % of
    redis-py's CPU and safe to cancel; ``client`` (redis-py) does everything else.
    It owns both: ``aclose()`` closes them."""

    def __init__(
        self,
        client: RedisClient,
        reads: RedisReads,
        *,
        directive_ttl_seconds: int,
        hot_set_size: int,
        hot_set_ttl_seconds: int,
    ) -> None:
        self._client = client
        self._reads = reads
        self._directive_ttl = directive_ttl_seconds
        self._hot_set_size = hot_set_size
        self._hot_set_ttl = hot_set_ttl_seconds
        self._read_hot = LuaScript(_READ_HOT)
        # Registered once; redis-py runs them with EVALSHA and loads them on NOSCRIPT.
        self._replace_hot = client.register_script(_REPLACE_HOT)
        self._add_hot = client.register_script(_ADD_HOT)
        self._remove_hot = client.register_script(_REMOVE_HOT)
        self._patch_counters = client.register_script(_PATCH_COUNTERS)
        self._put_directive = client.register_script(_PUT_DIRECTIVE)
        self._purge_agent = client.register_script(_PURGE_AGENT)

    @classmethod
    def from_settings(cls, settings: Settings) -> RedisContextCache:
        topology = RedisTopology.from_settings(settings)
        return cls(
            topology.create_client(max_connections=settings.redis_max_connections),
            topology.create_reads(),
            directive_ttl_seconds=settings.directive_cache_ttl_seconds,
            hot_set_size=settings.hot_set_size,
            hot_set_ttl_seconds=settings.hot_set_ttl_seconds,
        )

    @property
    def hot_set_size(self) -> int:
        return self._hot_set_size

    async def aclose(self) -> None:
        await self._reads.aclose()
        await self._client.aclose()

    @cache_errors
    async def warm_up(self, connections: int = 4) -> None:
        """Loads the scripts (so EVALSHA never meets NOSCRIPT on a request) and opens
        the reads' connection and ``connections`` pooled ones, so the first requests pay
        no set-up."""
        await self._client.script_load(self._read_hot.source)
        for script in (
            self._replace_hot,
            self._add_hot,
            self._remove_hot,
            self._patch_counters,
            self._put_directive,
        ):
            await self._client.script_load(script.script)
        await asyncio.gather(self._reads.connect(), *(self._client.ping() for _ in range(connections)))

    # ---------------------------------------------------------------- directive

    @cache_errors
    async def get_directive_state(self, org_id: str, agent_id: str) -> DirectiveState | None:
        """The cached state (content None = cached "no directive"), or None when not cached."""
        value = await self._reads.get(directive_key(org_id, agent_id))
        return None if value is None else decode_directive(value)

    @cache_errors
    async def put_directive(self, org_id: str, agent_id: str, state: DirectiveState) -> bool:
        """Caches ``state`` unless a newer version is cached; True when written."""
        written = await self._put_directive(
            keys=[directive_key(org_id, agent_id)],
            args=[state.version, encode_directive(state), self._directive_ttl],
        )
        return bool(written)

    @cache_errors
    async def delete_directive(self, org_id: str, agent_id: str) -> None:
        await self._client.delete(directive_key(org_id, agent_id))

    # ---------------------------------------------------------------- hot set

    def _hot_keys(self, org_id: str, agent_id: str) -> list[str]:
        return [
            hot_set_key(org_id, agent_id),
            hot_data_key(org_id, agent_id),
            hot_generation_key(org_id, agent_id),
        ]

    @cache_errors
    async def get_hot_memories(self, org_id: str, agent_id: str, limit: int) -> Candidates | None:
        """The best ``limit`` hot memories in one round trip, in rank order; None when the
        hot set is missing."""
        records = await self._reads.evalsha(
            self._read_hot, (hot_set_key(org_id, agent_id), hot_data_key(org_id, agent_id)), (limit,)
        )
        if records is None:
            return None
        if not isinstance(records, list):
            raise RedisError(f"the hot-set read answered a {type(records).__name__}")
        return decode_records(records)

    @cache_errors
    async def hot_set_generation(self, org_id: str, agent_id: str) -> int:
        value = await self._client.get(hot_generation_key(org_id, agent_id))
        return int(value) if value is not None else 0

    @cache_errors
    async def replace_hot_set(
        self,
        org_id: str,
        agent_id: str,
        scored: Sequence[tuple[MemoryRecord, float]],
        expected_generation: int,
    ) -> bool:
        """Installs a rebuilt hot set unless a write happened since ``expected_generation``."""
        args: list[str | bytes | float | int] = [expected_generation, self._hot_set_ttl]
        for record, score in scored[: self._hot_set_size]:
            args += [record.id, score, encode_record(record)]
        return bool(await self._replace_hot(keys=self._hot_keys(org_id, agent_id), args=args))

    @cache_errors
    async def add_hot_memories(
        self, org_id: str, agent_id: str, scored: Sequence[tuple[MemoryRecord, float]]
    ) -> bool:
        """Adds or re-scores members and trims to the size; False when there is no hot set
        (it is not created partially: the next read rebuilds it whole)."""
        args: list[str | bytes | float | int] = [self._hot_set_size, GENERATION_TTL_SECONDS]
        for record, score in scored:
            args += [record.id, score, encode_record(record)]
        return bool(await self._add_hot(keys=self._hot_keys(org_id, agent_id), args=args))

    @cache_errors
    async def patch_hot_counters(self, org_id: str, agent_id: str, counters: Sequence[MemoryCounters]) -> int:
        """Sets the injection counters of members already in the hot set and moves their
        scores accordingly (no PostgreSQL read, no record re-encoding); returns how many
        members were patched. Members not in the hot set are left out."""
        if not counters:
            return 0
        patched = await self._patch_counters(
            keys=self._hot_keys(org_id, agent_id), args=_patch_args(counters)
        )
        return int(patched)

    @cache_errors
    async def patch_hot_counters_of_agents(
        self, counters_by_agent: Mapping[tuple[str, str], Sequence[MemoryCounters]]
    ) -> dict[tuple[str, str], int | CacheError]:
        """``patch_hot_counters`` for several agents in one round trip (a pipeline,
        not a transaction: each agent's script is atomic on its own). Per agent: the
        members patched, or the error its script raised (as a CacheError)."""
        agents = [agent for agent, counters in counters_by_agent.items() if counters]
        if not agents:
            return {}
        if isinstance(self._client, RedisCluster):
            results = await self._patch_counters_concurrently(agents, counters_by_agent)
            return {
                agent: cache_error(result) if isinstance(result, Exception) else result
                for agent, result in zip(agents, results, strict=True)
            }
        results = await self._patch_counters_pipelined(agents, counters_by_agent)
        if any(isinstance(result, NoScriptError) for result in results):
            # A node that lost its scripts (restart, failover, a cluster node added):
            # the pipeline cannot load them itself in Cluster mode; load, run again.
            await self._client.script_load(self._patch_counters.script)
            results = await self._patch_counters_pipelined(agents, counters_by_agent)
        return {
            agent: cache_error(result) if isinstance(result, Exception) else int(result)
            for agent, result in zip(agents, results, strict=True)
        }

    async def _patch_counters_concurrently(
        self,
        agents: Sequence[tuple[str, str]],
        counters_by_agent: Mapping[tuple[str, str], Sequence[MemoryCounters]],
    ) -> list[int | Exception]:
        """Cluster mode: redis-py refuses scripts in a cluster pipeline, so each agent's
        script is its own command, ``CLUSTER_CONCURRENCY`` at a time (within the pool)."""

        async def patch(org_id: str, agent_id: str) -> int | Exception:
            try:
                return int(
                    await self._patch_counters(
                        keys=self._hot_keys(org_id, agent_id),
                        args=_patch_args(counters_by_agent[(org_id, agent_id)]),
                    )
                )
            except DRIVER_ERRORS as exc:
                return exc

        results: list[int | Exception] = []
        for start in range(0, len(agents), CLUSTER_CONCURRENCY):
            chunk = agents[start : start + CLUSTER_CONCURRENCY]
            results += await asyncio.gather(*(patch(org, agent) for org, agent in chunk))
        return results

    async def _patch_counters_pipelined(
        self,
        agents: Sequence[tuple[str, str]],
        counters_by_agent: Mapping[tuple[str, str], Sequence[MemoryCounters]],
    ) -> list[Any]:
        async with self._client.pipeline(transaction=False) as pipe:
            for org_id, agent_id in agents:
                await self._patch_counters(
                    keys=self._hot_keys(org_id, agent_id),
                    args=_patch_args(counters_by_agent[(org_id, agent_id)]),
                    # A pipeline (redis-py's stub names only clients): queued, sent by execute.
                    client=pipe,  # type: ignore[arg-type]
                )
            results: list[Any] = await pipe.execute(raise_on_error=False)
        return results

    @cache_errors
    async def remove_hot_memories(self, org_id: str, agent_id: str, ids: Sequence[str]) -> int:
        """Removes members; returns how many were in the hot set."""
        if not ids:
            return 0
        removed = await self._remove_hot(
            keys=self._hot_keys(org_id, agent_id), args=[GENERATION_TTL_SECONDS, *ids]
        )
        return int(removed)

    @cache_errors
    async def invalidate_hot_set(self, org_id: str, agent_id: str) -> None:
        """Drops the hot set; bumps the generation so an in-flight rebuild does not land."""
        keys = self._hot_keys(org_id, agent_id)
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.incr(keys[2])
            pipe.expire(keys[2], GENERATION_TTL_SECONDS)
            pipe.delete(keys[0], keys[1])
            await pipe.execute()

    @cache_errors
    async def hot_set_ttl(self, org_id: str, agent_id: str) -> int:
        """Seconds left before the hot set expires (-2 when missing)."""
        ttl: int = await self._client.ttl(hot_data_key(org_id, agent_id))
        return ttl

    # ---------------------------------------------------------------- purge

    @cache_errors
    async def agents_with_keys(self, org_id: str) -> set[str]:
        """Agent ids named by any key of the org (SCAN over its hash-tagged prefix):
        also agents that were only ever read, whose keys hold empty cache entries."""
        agents: set[str] = set()
        async for key in self._client.scan_iter(match=f"{{{org_id}}}:*", count=1000):
            name = key.decode() if isinstance(key, bytes) else str(key)
            suffix = name.rpartition(":")[2]
            # Every per-agent key ends with the agent's id; anything else is no agent.
            with contextlib.suppress(ValueError):
                agents.add(str(uuid.UUID(suffix)))
        return agents

    @cache_errors
    async def purge_org_keys(self, org_id: str, purged_agents: Sequence[str]) -> int:
        """Deletes the org's keys that belong to none of ``purged_agents`` (whose keys
        ``purge_agent`` handled, tombstones included): org-wide keys of any kind."""
        agents = set(purged_agents)
        stray = [
            name
            async for key in self._client.scan_iter(match=f"{{{org_id}}}:*", count=1000)
            if (name := key.decode() if isinstance(key, bytes) else str(key)).rpartition(":")[2] not in agents
        ]
        deleted = 0
        for start in range(0, len(stray), 500):
            deleted += int(await self._client.unlink(*stray[start : start + 500]))
        return deleted

    @cache_errors
    async def purge_agent(self, org_id: str, agent_id: str, directive_tombstone_version: int) -> int:
        """Deletes every key of the agent and leaves the tombstones (see
        ``PURGE_TOMBSTONE_SECONDS``; the directive's of ``directive_tombstone_version``,
        from ``TenantData.purge_agent``) in one atomic script; returns how many keys
        held data. Keys of kinds this module does not name (found by SCAN) go too."""
        known = [directive_key(org_id, agent_id), *self._hot_keys(org_id, agent_id)]
        others = [
            name
            async for key in self._client.scan_iter(match=f"{{{org_id}}}:*:{agent_id}", count=1000)
            if (name := key.decode() if isinstance(key, bytes) else str(key)) not in known
        ]
        deleted = await self._purge_agent(
            keys=[*known, *others], args=[PURGE_TOMBSTONE_SECONDS, directive_tombstone_version]
        )
        return int(deleted)

    # ---------------------------------------------------------------- health

    async def check_health(self) -> StoreHealth:
        try:
            await self._client.ping()
        except DRIVER_ERRORS as exc:
            return StoreHealth(ok=False, detail=f"redis: {type(exc).__name__}")
        return StoreHealth(ok=True, detail="redis: ok")
