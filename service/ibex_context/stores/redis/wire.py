"""A narrow Redis client for the request path's two reads: the directive (GET) and the
hot set (EVALSHA of the read script). Everything else keeps redis-py (``stores.redis``).

Why not redis-py for these two: its asyncio client spends ~360 k instructions (~200 µs
here) per GET with pool checkout, command parsing, response callbacks and connection
release, where this one spends ~100 k (``benchmarks/results/redis_reads-2026-11-26.md``).
And redis-py's connection release is not cancellation-safe, so a read cancelled by
its deadline had to be shielded (an extra task per call).

Design: ONE persistent connection per process and server (behind Sentinel: the
primary the sentinels name, ``stores.redis.sentinel``; in a Cluster: one per primary,
``stores.redis.cluster_wire``), requests pipelined on it and replies
matched to requests in order (a FIFO of futures); hiredis encodes the commands
(``pack_command``) and parses the replies (``Reader``). Redis executes commands one
at a time anyway, so one pipelined socket loses nothing to a pool and needs no
checkout or release. Consequences that make it safe:

* Cancellation: a cancelled caller's future stays in the FIFO, done; its reply is
  read and dropped when it arrives. Nothing is ever half-sent or half-read by a
  caller, so the connection stays aligned and usable.
* Failures: a lost connection fails every pending future with redis-py's
  ``ConnectionError`` (a ``RedisError``, which the repository maps); the next call
  reconnects, lazily, one attempt shared by the callers waiting for it and bounded
  by ``connect_timeout``. Callers are bounded by their own deadlines besides.
* Failover: a READONLY reply (a primary demoted under us) closes the connection too,
  and with Sentinel each new connection asks where the primary is and checks ROLE.
* Bounded: at most ``max_pending`` replies outstanding (then calls fail at once),
  and a connection that answers nothing for ``reply_timeout`` while replies are
  outstanding is dropped, so a hung Redis cannot pile up cancelled slots.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import hashlib
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar, cast
from urllib.parse import urlsplit

import hiredis
from redis.asyncio.connection import parse_url
from redis.exceptions import (
    AskError,
    AuthenticationError,
    MovedError,
    NoScriptError,
    ReadOnlyError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ibex_context.errors import ConfigurationError

Argument = str | bytes | int | float
# What parse_url may return that this client implements; anything else in the URL is
# refused at start-up rather than silently ignored.
_URL_FIELDS = frozenset({"host", "port", "path", "db", "username", "password", "connection_class"})


@dataclass(frozen=True, slots=True)
class RedisEndpoint:
    """Where and as whom to connect: what a ``redis://``, ``rediss://`` or ``unix://`` URL says."""

    host: str = "localhost"
    port: int = 6379
    unix_path: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = None
    # Set for rediss://: verified against the system's CAs and the host name, as redis-py does.
    tls: ssl.SSLContext | None = None

    @classmethod
    def from_url(cls, url: str, *, ca_file: Path | None = None) -> RedisEndpoint:
        """Parsed by redis-py's own ``parse_url`` (one source for the URL's meaning);
        raises ConfigurationError, naming no credential, for what this client cannot honour.
        ``ca_file``: the CA bundle that verifies a ``rediss://`` server (else the system's)."""
        try:
            fields = parse_url(url)
        except ValueError as exc:
            raise ConfigurationError(f"redis_url: {exc}") from None
        unsupported = sorted(set(fields) - _URL_FIELDS)
        if unsupported:
            raise ConfigurationError(
                f"redis_url: query parameter(s) {', '.join(unsupported)} not supported "
                "(supported: db; TLS via rediss:// with the system's CAs)"
            )
        scheme = urlsplit(url).scheme
        db = int(fields.get("db", 0))
        username, password = fields.get("username"), fields.get("password")
        if scheme == "unix":
            path = fields.get("path")
            if not path:
                raise ConfigurationError("redis_url: unix:// needs a socket path")
            return cls(unix_path=str(path), db=db, username=username, password=password)
        return cls(
            host=str(fields.get("host", "localhost")),
            port=int(fields.get("port", 6379)),
            db=db,
            username=username,
            password=password,
            tls=ssl.create_default_context(cafile=ca_file) if scheme == "rediss" else None,
        )


class LuaScript:
    """A script run by its SHA-1 (EVALSHA), loaded on NOSCRIPT."""

    __slots__ = ("sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()


def pack_command(command: tuple[Argument, ...]) -> bytes:
    # The stub declares a 1-tuple; pack_command takes a tuple of any length.
    packed: bytes = hiredis.pack_command(command)  # type: ignore[arg-type]
    return packed


class _Replies(asyncio.Protocol):
    """One connection: requests written in order, replies handed to their futures in order."""

    def __init__(self, *, max_pending: int, reply_timeout: float) -> None:
        self._loop = asyncio.get_running_loop()
        # Error replies come back as ResponseError instances (not raised): see data_received.
        self._reader = hiredis.Reader(replyError=ResponseError)
        self._pending: collections.deque[asyncio.Future[object]] = collections.deque()
        self._max_pending = max_pending
        self._reply_timeout = reply_timeout
        self._transport: asyncio.Transport | None = None
        self._replies = 0  # replies received: the watchdog's measure of progress
        self._watchdog: asyncio.TimerHandle | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's transports (the service's default
        # loop) implement asyncio.Transport's methods without deriving from it.
        self._transport = cast(asyncio.Transport, transport)

    def request(self, packed: bytes) -> asyncio.Future[object]:
        """Sends one command; the future gets its reply. Cancelling the future only
        abandons the reply: its slot stays in the FIFO until the reply is read."""
        if self.closed or self._transport is None:
            raise RedisConnectionError("connection to Redis closed")
        if len(self._pending) >= self._max_pending:
            raise RedisConnectionError(f"Redis has {self._max_pending} replies outstanding")
        waiter: asyncio.Future[object] = self._loop.create_future()
        self._transport.write(packed)
        self._pending.append(waiter)
        if self._watchdog is None:
            self._watchdog = self._loop.call_later(self._reply_timeout, self._check_progress, self._replies)
        return waiter

    def data_received(self, data: bytes) -> None:
        reader, pending = self._reader, self._pending
        reader.feed(data)
        while True:
            try:
                reply = reader.gets()
            except hiredis.ProtocolError as exc:
                self.close(RedisConnectionError, f"Redis protocol error: {exc}")
                return
            if reply is False:  # hiredis's "not enough data yet" (RESP2 has no boolean)
                return
            self._replies += 1
            if not pending:  # RESP2 without subscriptions sends nothing unasked
                self.close(RedisConnectionError, "Redis sent a reply nobody asked for")
                return
            waiter = pending.popleft()
            if waiter.done():  # its caller was cancelled: the reply is dropped
                continue
            if isinstance(reply, ResponseError):
                error = _error_of(reply)
                waiter.set_exception(error)
                if isinstance(error, ReadOnlyError):
                    # A primary demoted by a failover: the next call connects afresh
                    # (and, with Sentinel, asks again where the primary is).
                    self.close(RedisConnectionError, "Redis is no longer the primary")
                    return
            else:
                waiter.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.close(RedisConnectionError, "connection to Redis lost")

    def _check_progress(self, replies_when_armed: int) -> None:
        self._watchdog = None
        if not self._pending:
            return
        if self._replies == replies_when_armed:
            self.close(RedisTimeoutError, f"Redis answered nothing for {self._reply_timeout} s")
        else:
            self._watchdog = self._loop.call_later(self._reply_timeout, self._check_progress, self._replies)

    def close(self, error: Callable[[str], Exception], message: str) -> None:
        """Closes the connection and fails every pending caller with ``error(message)``."""
        if self.closed:
            return
        self.closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        pending, self._pending = self._pending, collections.deque()
        for waiter in pending:
            if not waiter.done():
                waiter.set_exception(error(message))
        if self._transport is not None:
            self._transport.abort()


def _error_of(reply: ResponseError) -> ResponseError:
    """redis-py's exception for the error replies a caller acts on."""
    message = str(reply)
    kind, _, detail = message.partition(" ")
    if kind == "NOSCRIPT":  # Redis restarted or its scripts were flushed: load and retry
        return NoScriptError(message)
    if kind == "MOVED":  # Cluster: "MOVED <slot> <host>:<port>"
        return MovedError(detail)
    if kind == "ASK":  # Cluster, slot migrating: "ASK <slot> <host>:<port>"
        return AskError(detail)
    if kind == "READONLY":
        return ReadOnlyError(message)
    return reply


class RedisReads(abc.ABC):
    """The request path's reads, on whatever serves the key: ``execute`` routes a command."""

    @abc.abstractmethod
    async def execute(self, command: tuple[Argument, ...], *, key: str) -> object:
        """Sends ``command`` to the server of ``key`` and returns its reply."""

    @abc.abstractmethod
    async def connect(self) -> None:
        """Opens the connection(s) now (start-up), so the first request pays no set-up."""

    @abc.abstractmethod
    async def aclose(self) -> None: ...

    async def get(self, key: str) -> bytes | None:
        reply = await self.execute(("GET", key), key=key)
        if reply is None or isinstance(reply, bytes):
            return reply
        raise ResponseError(f"GET answered a {type(reply).__name__}")

    async def evalsha(self, script: LuaScript, keys: Sequence[str], args: Sequence[Argument]) -> object:
        """Runs ``script`` (its keys share a slot: routed by the first); on NOSCRIPT loads
        it where it ran and runs it again, once."""
        command: tuple[Argument, ...] = ("EVALSHA", script.sha, len(keys), *keys, *args)
        route = keys[0] if keys else ""  # a script without keys may run anywhere
        try:
            return await self.execute(command, key=route)
        except NoScriptError:
            await self.execute(("SCRIPT", "LOAD", script.source), key=route)
            return await self.execute(command, key=route)


Locate = Callable[[], Awaitable[RedisEndpoint]]


class PipelinedRedis(RedisReads):
    """GET and EVALSHA over one pipelined connection (see the module doc).

    ``locate``, when given, says where to connect each time a connection is opened
    (Sentinel: the current primary) and the server must then be a primary (ROLE);
    otherwise it is always ``endpoint``.

    Raises redis-py's exceptions: ``ConnectionError``/``TimeoutError`` when Redis
    cannot be reached or stops answering, ``ResponseError`` for an error reply.
    """

    def __init__(
        self,
        endpoint: RedisEndpoint,
        *,
        locate: Locate | None = None,
        connect_timeout: float = 1.0,
        reply_timeout: float = 2.0,
        max_pending: int = 1024,
    ) -> None:
        self._endpoint = endpoint
        self._locate = locate
        self._connect_timeout = connect_timeout
        self._reply_timeout = reply_timeout
        self._max_pending = max_pending
        self._connection: _Replies | None = None
        self._connecting = SharedAttempt(self._connect, self._connect_finished)
        self._closed = False

    @classmethod
    def from_url(cls, url: str, *, ca_file: Path | None = None) -> PipelinedRedis:
        return cls(RedisEndpoint.from_url(url, ca_file=ca_file))

    async def execute(self, command: tuple[Argument, ...], *, key: str = "", asking: bool = False) -> object:
        """``command``'s reply; ``asking`` sends ASKING first, on the same connection
        (Cluster: the one command may then use a slot being imported)."""
        connection = self._connection
        if connection is None or connection.closed:
            connection = await self._reconnect()
        if not asking:
            return await connection.request(pack_command(command))
        # Both written before any await: nothing can come between them on the connection.
        asked = connection.request(pack_command(("ASKING",)))
        try:
            reply = connection.request(pack_command(command))
        except RedisConnectionError:
            asked.cancel()  # its reply is dropped when it comes
            raise
        outcomes = await asyncio.gather(asked, reply, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return outcomes[1]

    async def connect(self) -> None:
        if self._connection is None or self._connection.closed:
            await self._reconnect()

    async def aclose(self) -> None:
        self.close()
        # Let the transport's close run its callbacks before the loop may end.
        await asyncio.sleep(0)

    def close(self) -> None:
        """Closes the connection (pending callers fail as if it were lost); for good."""
        self._closed = True
        self._connecting.cancel()
        if self._connection is not None:
            self._connection.close(RedisConnectionError, "the client was closed")
            self._connection = None

    async def _reconnect(self) -> _Replies:
        if self._closed:
            raise RedisConnectionError("the client was closed")
        return await self._connecting.join()

    def _connect_finished(self, attempt: asyncio.Future[_Replies]) -> None:
        # Retrieving the outcome here also keeps a failure whose callers all gave up
        # from being logged as "exception never retrieved".
        if not attempt.cancelled() and attempt.exception() is None:
            self._connection = attempt.result()

    async def _connect(self) -> _Replies:
        try:
            async with asyncio.timeout(self._connect_timeout):
                endpoint = self._endpoint if self._locate is None else await self._locate()
                return await open_connection(
                    endpoint,
                    max_pending=self._max_pending,
                    reply_timeout=self._reply_timeout,
                    require_primary=self._locate is not None,
                )
        except TimeoutError:
            raise RedisTimeoutError(f"connecting to Redis took over {self._connect_timeout} s") from None


_T = TypeVar("_T")


class SharedAttempt(Generic[_T]):
    """One attempt at a time (a connection, a map refresh), shared by every caller that
    asks while it runs; the next ask after it ended starts a new one.

    Shielded: a caller cancelled by its deadline does not abort the attempt the others
    (and the next calls) wait for. ``finished`` runs when the attempt ends, however it
    ends, and must retrieve its outcome (else a failure whose callers all gave up is
    logged as "exception never retrieved").
    """

    def __init__(
        self,
        start: Callable[[], Awaitable[_T]],
        finished: Callable[[asyncio.Future[_T]], None],
    ) -> None:
        self._start = start
        self._finished = finished
        self._attempt: asyncio.Future[_T] | None = None

    async def join(self) -> _T:
        attempt = self._attempt
        if attempt is None:
            attempt = self._attempt = asyncio.ensure_future(self._start())
            attempt.add_done_callback(self._ended)
        return await asyncio.shield(attempt)

    def cancel(self) -> None:
        if self._attempt is not None:
            self._attempt.cancel()

    def _ended(self, attempt: asyncio.Future[_T]) -> None:
        self._attempt = None
        self._finished(attempt)


async def open_connection(
    endpoint: RedisEndpoint,
    *,
    max_pending: int = 16,
    reply_timeout: float = 2.0,
    require_primary: bool = False,
) -> _Replies:
    """A connected, authenticated connection to ``endpoint`` (its db selected); with
    ``require_primary``, refused (ConnectionError) unless the server is a primary.
    Unbounded in time: callers bound it."""
    loop = asyncio.get_running_loop()

    def protocol() -> _Replies:
        return _Replies(max_pending=max_pending, reply_timeout=reply_timeout)

    try:
        if endpoint.unix_path is not None:
            _, connection = await loop.create_unix_connection(protocol, endpoint.unix_path)
        else:
            _, connection = await loop.create_connection(
                protocol,
                endpoint.host,
                endpoint.port,
                ssl=endpoint.tls,
                server_hostname=endpoint.host if endpoint.tls is not None else None,
            )
    except OSError as exc:  # refused, unreachable, TLS verification...
        raise RedisConnectionError(f"connecting to Redis failed: {type(exc).__name__}") from exc
    try:
        await _handshake(connection, endpoint, require_primary=require_primary)
    except BaseException:
        connection.close(RedisConnectionError, "set-up failed")
        raise
    return connection


async def _handshake(connection: _Replies, endpoint: RedisEndpoint, *, require_primary: bool) -> None:
    """AUTH and SELECT, pipelined, as redis-py does them for the same URL; ROLE when the
    server must be a primary (a sentinel's answer may be a moment stale)."""
    commands: list[tuple[Argument, ...]] = []
    if endpoint.username is not None:
        commands.append(("AUTH", endpoint.username, endpoint.password or ""))
    elif endpoint.password is not None:
        commands.append(("AUTH", endpoint.password))
    if endpoint.db:
        commands.append(("SELECT", endpoint.db))
    if require_primary:
        commands.append(("ROLE",))
    waiters = [connection.request(pack_command(command)) for command in commands]
    # Every reply is retrieved (no "never retrieved" warning when the first failed).
    outcomes = await asyncio.gather(*waiters, return_exceptions=True)
    for command, outcome in zip(commands, outcomes, strict=True):
        if isinstance(outcome, ResponseError):
            if command[0] == "AUTH":
                raise AuthenticationError(f"Redis refused the URL's credentials: {outcome}")
            raise outcome
        if isinstance(outcome, BaseException):
            raise outcome
        if command[0] == "ROLE" and not (isinstance(outcome, list) and outcome and outcome[0] == b"master"):
            raise RedisConnectionError("the Redis named as primary is not (or no longer) one")
