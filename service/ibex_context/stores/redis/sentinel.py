"""Where the primary is, as Redis Sentinel says: the request path's own client asks
the sentinels each time it opens its connection, so a failover is followed on the
first call after the old primary's connection fails (or answers READONLY), and
checks the server named answers ROLE as a primary (``redis_wire``).

redis-py's side uses redis-py's own Sentinel support (``stores.redis.topology``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError

from ibex_context.stores.redis.wire import RedisEndpoint, open_connection, pack_command


class SentinelLocator:
    """Asks the sentinels, all at once, where ``master`` is (``SENTINEL MASTER``) and
    takes the answer of the highest configuration epoch among the first majority that
    answers (or among all that answered within ``ask_timeout`` each): a sentinel that
    has not yet learnt of a failover, or one that does not answer, cannot hold the
    client back. Each sentinel is reached as ``sentinel_endpoint`` says (its password,
    TLS) at its own host and port; the answer keeps ``primary_endpoint``'s
    credentials, db and TLS."""

    def __init__(
        self,
        sentinels: Sequence[tuple[str, int]],
        master: str,
        *,
        primary_endpoint: RedisEndpoint,
        sentinel_endpoint: RedisEndpoint,
        ask_timeout: float = 0.5,
    ) -> None:
        if not sentinels:
            raise ValueError("no sentinels")
        self._sentinels = tuple(sentinels)
        self._master = master
        self._primary = primary_endpoint
        self._sentinel = sentinel_endpoint
        self._ask_timeout = ask_timeout

    async def __call__(self) -> RedisEndpoint:
        asks = [asyncio.ensure_future(self._ask(host, port)) for host, port in self._sentinels]
        majority = len(asks) // 2 + 1
        answers: list[tuple[int, str, int]] = []
        failures: list[str] = []
        try:
            for asked in asyncio.as_completed(asks):
                try:
                    answer = await asked
                except (RedisError, OSError, TimeoutError) as exc:
                    failures.append(type(exc).__name__)
                    continue
                if answer is None:
                    failures.append("unknown master")
                    continue
                answers.append(answer)
                if len(answers) >= majority:
                    break
        finally:
            for ask in asks:
                ask.cancel()
            await asyncio.gather(*asks, return_exceptions=True)
        if not answers:
            raise RedisConnectionError(f"no sentinel named the primary ({', '.join(failures)})")
        _epoch, host, port = max(answers)
        return dataclasses.replace(self._primary, host=host, port=port, unix_path=None)

    async def _ask(self, host: str, port: int) -> tuple[int, str, int] | None:
        """(configuration epoch, host, port) of the master, as this sentinel knows it."""
        async with asyncio.timeout(self._ask_timeout):
            sentinel = dataclasses.replace(self._sentinel, host=host, port=port, db=0)
            connection = await open_connection(sentinel)
            try:
                reply = await connection.request(pack_command(("SENTINEL", "MASTER", self._master)))
            except ResponseError:  # "No such master with that name"
                return None
            finally:
                connection.close(RedisConnectionError, "asked")
        if not isinstance(reply, list):
            return None
        fields = dict(zip(reply[::2], reply[1::2], strict=True))
        return int(fields[b"config-epoch"]), fields[b"ip"].decode(), int(fields[b"port"])
