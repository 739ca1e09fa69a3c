"""The request path's reads against Redis Cluster: ``redis_wire``'s pipelined
connection, one per primary, each command sent to the primary of its key's slot.

The slot map comes from ``CLUSTER SLOTS``, asked of any node known (the seed from
the URL first). It is refreshed when a reply says a slot moved (MOVED: the command
is repeated at the node named, and the map re-read on a later call), and after a
connection failure (a primary may have failed over); with a map in hand, at most
every ``MIN_REFRESH_SECONDS``. ASK (a slot being migrated)
repeats the one command at the node named, preceded by ASKING, without touching
the map. Every node's connection keeps ``PipelinedRedis``'s guarantees
(cancellation-safe, bounded pending replies, one shared reconnection).
"""

from __future__ import annotations

import asyncio
import binascii
import dataclasses
import logging
import math

from redis.exceptions import AskError, ClusterError, MovedError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ibex_context.stores.redis.wire import (
    Argument,
    PipelinedRedis,
    RedisEndpoint,
    RedisReads,
    SharedAttempt,
    open_connection,
    pack_command,
)

_log = logging.getLogger(__name__)

SLOTS = 16384
# MOVED/ASK hops one command may take before the call fails (a map in flux).
MAX_REDIRECTS = 3
# With a map in hand, it is re-read at most this often: while a primary is down every
# call of its slots fails, and each must not cost the other slots' calls a refresh.
MIN_REFRESH_SECONDS = 0.5

Address = tuple[str, int]


def key_slot(key: str | bytes) -> int:
    """The key's cluster slot (Redis Cluster specification): CRC16 (XMODEM) of the
    hash tag -- the text between the first ``{`` and the next ``}``, when not empty --
    else of the whole key, modulo 16384."""
    data = key.encode() if isinstance(key, str) else key
    start = data.find(b"{")
    if start >= 0:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1 : end]
    return binascii.crc_hqx(data, 0) % SLOTS


class PipelinedRedisCluster(RedisReads):
    """GET and EVALSHA routed by slot, one pipelined connection per primary."""

    def __init__(
        self,
        seed: RedisEndpoint,
        *,
        connect_timeout: float = 1.0,
        reply_timeout: float = 2.0,
        max_pending: int = 1024,
    ) -> None:
        if seed.unix_path is not None:
            raise ValueError("a cluster is reached over TCP")
        self._seed = seed
        self._connect_timeout = connect_timeout
        self._reply_timeout = reply_timeout
        self._max_pending = max_pending
        self._slots: list[Address | None] = [None] * SLOTS
        self._nodes: dict[Address, PipelinedRedis] = {}
        self._stale = True
        self._has_map = False
        self._refreshed_at = -math.inf  # when the last refresh ended, loop time
        self._refreshing = SharedAttempt(self._refresh, self._refresh_finished)
        self._closed = False

    async def execute(self, command: tuple[Argument, ...], *, key: str) -> object:
        slot = key_slot(key)
        address = await self._primary_of(slot)
        asking = False
        for _hop in range(MAX_REDIRECTS + 1):
            node = self._node(address)
            try:
                return await node.execute(command, asking=asking)
            except MovedError as moved:
                # The slot has a new owner for good: go there, and re-read the whole
                # map on a later call (a resharding rarely moves one slot alone).
                address, asking = _redirected(moved, address), False
                self._slots[slot] = address
                self._stale = True
            except AskError as ask:
                address, asking = _redirected(ask, address), True
            except (RedisConnectionError, RedisTimeoutError):
                self._stale = True  # a primary may have failed over
                raise
        raise ClusterError(f"slot {slot}: more than {MAX_REDIRECTS} redirections")

    async def connect(self) -> None:
        await self._refresh_if_stale()
        await asyncio.gather(*(self._node(address).connect() for address in set(self._addresses())))

    async def aclose(self) -> None:
        self._closed = True
        self._refreshing.cancel()
        nodes, self._nodes = self._nodes, {}
        for node in nodes.values():
            await node.aclose()

    def _addresses(self) -> list[Address]:
        return [address for address in self._slots if address is not None]

    async def _primary_of(self, slot: int) -> Address:
        await self._refresh_if_stale()
        address = self._slots[slot]
        if address is None:
            raise ClusterError(f"slot {slot} is served by no node")
        return address

    def _node(self, address: Address) -> PipelinedRedis:
        node = self._nodes.get(address)
        if node is None:
            if self._closed:
                raise RedisConnectionError("the client was closed")
            node = self._nodes[address] = PipelinedRedis(
                dataclasses.replace(self._seed, host=address[0], port=address[1]),
                connect_timeout=self._connect_timeout,
                reply_timeout=self._reply_timeout,
                max_pending=self._max_pending,
            )
        return node

    async def _refresh_if_stale(self) -> None:
        if not self._stale:
            return
        recently = asyncio.get_running_loop().time() - self._refreshed_at < MIN_REFRESH_SECONDS
        if recently and self._has_map:
            return  # the map in hand serves meanwhile (MOVED patches its slots)
        if self._closed:
            raise RedisConnectionError("the client was closed")
        # Shared and shielded, as PipelinedRedis's reconnection.
        await self._refreshing.join()

    def _refresh_finished(self, attempt: asyncio.Future[None]) -> None:
        self._refreshed_at = asyncio.get_running_loop().time()
        if not attempt.cancelled():
            attempt.exception()  # retrieved: no "never retrieved" when every caller gave up

    async def _refresh(self) -> None:
        """Reads the slot map from the first node that answers: the known primaries,
        then the seed (the map may be empty, or every primary replaced)."""
        seed = (self._seed.host, self._seed.port)
        candidates = list(dict.fromkeys([*self._addresses(), seed]))
        failures: list[str] = []
        for address in candidates:
            try:
                async with asyncio.timeout(self._connect_timeout):
                    slots = await self._ask_slots(address)
            except (RedisError, OSError, TimeoutError) as exc:
                failures.append(type(exc).__name__)
                continue
            self._install(slots)
            return
        raise RedisConnectionError(f"no cluster node answered CLUSTER SLOTS ({', '.join(failures)})")

    async def _ask_slots(self, address: Address) -> list[tuple[int, int, Address]]:
        endpoint = dataclasses.replace(self._seed, host=address[0], port=address[1])
        connection = await open_connection(endpoint)
        try:
            reply = await connection.request(pack_command(("CLUSTER", "SLOTS")))
        finally:
            connection.close(RedisConnectionError, "asked")
        if not isinstance(reply, list):
            raise ClusterError(f"CLUSTER SLOTS answered a {type(reply).__name__}")
        ranges = []
        for start, end, primary, *_replicas in reply:
            # An empty host means "the address you asked" (cluster-announce-hostname unset).
            host = primary[0].decode() or address[0]
            ranges.append((int(start), int(end), (host, int(primary[1]))))
        return ranges

    def _install(self, ranges: list[tuple[int, int, Address]]) -> None:
        slots: list[Address | None] = [None] * SLOTS
        for start, end, address in ranges:
            slots[start : end + 1] = [address] * (end + 1 - start)
        self._slots, self._stale, self._has_map = slots, False, True
        # Connections to nodes that no longer serve a slot are closed (their callers'
        # replies fail as a lost connection would).
        serving = set(self._addresses())
        for address in [address for address in self._nodes if address not in serving]:
            self._nodes.pop(address).close()
        _log.debug("cluster slot map read: %d primaries", len(serving))


def _redirected(error: AskError, asked: Address) -> Address:
    """Where a MOVED or ASK reply sends the command; an empty host (a node that does not
    know its own address) means the host that was asked."""
    return (error.host or asked[0], int(error.port))
