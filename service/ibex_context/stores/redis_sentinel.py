"""Where the primary is, as Redis Sentinel says: the request path's own client asks
the sentinels each time it opens its connection, so a failover is followed on the
first call after the old primary's connection fails (or answers READONLY).

redis-py's side uses redis-py's own Sentinel support (``stores.redis_topology``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from ibex_context.stores.redis_wire import RedisEndpoint, open_connection, pack_command


class SentinelLocator:
    """Asks the sentinels, in turn, for ``master``'s address; the first that knows
    answers. Each sentinel is reached as ``sentinel_endpoint`` says (its password,
    TLS) at its own host and port; the answer keeps ``primary_endpoint``'s
    credentials, db and TLS. Unbounded in time: the caller bounds it."""

    def __init__(
        self,
        sentinels: Sequence[tuple[str, int]],
        master: str,
        *,
        primary_endpoint: RedisEndpoint,
        sentinel_endpoint: RedisEndpoint,
    ) -> None:
        if not sentinels:
            raise ValueError("no sentinels")
        self._sentinels = list(sentinels)
        self._master = master
        self._primary = primary_endpoint
        self._sentinel = sentinel_endpoint

    async def __call__(self) -> RedisEndpoint:
        failures = []
        for index, (host, port) in enumerate(self._sentinels):
            try:
                address = await self._ask(host, port)
            except (RedisError, OSError) as exc:
                failures.append(type(exc).__name__)
                continue
            if address is None:
                failures.append("unknown master")
                continue
            # The one that answered is asked first next time.
            self._sentinels.insert(0, self._sentinels.pop(index))
            return dataclasses.replace(self._primary, host=address[0], port=address[1], unix_path=None)
        raise RedisConnectionError(f"no sentinel named the primary ({', '.join(failures)})")

    async def _ask(self, host: str, port: int) -> tuple[str, int] | None:
        connection = await open_connection(dataclasses.replace(self._sentinel, host=host, port=port, db=0))
        try:
            question = pack_command(("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self._master))
            reply = await connection.request(question)
        finally:
            connection.close(RedisConnectionError, "asked")
        if not isinstance(reply, list) or len(reply) != 2:
            return None
        return reply[0].decode(), int(reply[1])
