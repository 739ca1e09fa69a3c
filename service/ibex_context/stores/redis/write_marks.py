"""Each agent's last write's WAL position (its *write mark*), kept in Redis under the
org's hash tag so every process and pod sees it, and in this process too: the read
routing (``stores.postgres.read_routing``, ADR-0013) sends an agent's searches to a
replica only once it has replayed the mark."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from ibex_context.settings import Settings
from ibex_context.stores.redis.errors import cache_errors
from ibex_context.stores.redis.topology import RedisClient, RedisTopology
from ibex_context.stores.redis.wire import RedisReads

# Keeps the larger position: writers of one agent finishing out of order must not
# lower its mark.
_PUT_MARK = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > current then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
"""


def write_mark_key(org_id: str, agent_id: str) -> str:
    return f"{{{org_id}}}:written_lsn:{agent_id}"


class WriteMarks:
    """Each agent's last write's WAL position: in Redis for every process, and here.

    A mark lives ``ttl_seconds``; ``get`` answers 0 for an agent without one.
    """

    def __init__(
        self,
        client: RedisClient,
        reads: RedisReads,
        *,
        ttl_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._reads = reads
        self._ttl = ttl_seconds
        self._clock = clock
        self._put = client.register_script(_PUT_MARK)
        # (org, agent) -> (position, written at): covers this process's own writes when
        # Redis is down; entries go once older than the TTL.
        self._local: dict[tuple[str, str], tuple[int, float]] = {}

    @classmethod
    def from_settings(cls, settings: Settings, ttl_seconds: float) -> WriteMarks:
        """Marks on the service's Redis (its own few connections)."""
        topology = RedisTopology.from_settings(settings)
        return cls(
            topology.create_client(max_connections=4), topology.create_reads(), ttl_seconds=ttl_seconds
        )

    @cache_errors
    async def put(self, org_id: str, agent_id: str, lsn: int) -> None:
        """Records the mark here, then in Redis (raises CacheError if that fails)."""
        key = (org_id, agent_id)
        previous = self._local.get(key)
        self._local[key] = (max(lsn, previous[0] if previous else 0), self._clock())
        await self._put(keys=[write_mark_key(org_id, agent_id)], args=[lsn, math.ceil(self._ttl * 1000)])

    @cache_errors
    async def get(self, org_id: str, agent_id: str) -> int:
        """The agent's mark (0: none). Raises CacheError when Redis cannot answer."""
        local = self._local.get((org_id, agent_id))
        remote = await self._reads.get(write_mark_key(org_id, agent_id))
        return max(int(remote) if remote else 0, local[0] if local else 0)

    async def aclose(self) -> None:
        await self._reads.aclose()
        await self._client.aclose()

    def forget_expired(self) -> None:
        oldest = self._clock() - self._ttl
        for key in [k for k, (_, at) in self._local.items() if at < oldest]:
            del self._local[key]
