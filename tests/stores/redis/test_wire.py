"""PipelinedRedis (the request path's reads) against real Redis servers.

The directive and hot-set results themselves are covered through RedisContextCache in
test_redis.py and test_repository.py, which read through this client; here: the
connection's behaviour (pipelining, cancellation, failures, URL semantics).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import ssl
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from ibex_context.devtools.embedded import RedisProcess, redis_server_binary
from ibex_context.devtools.redis_ha import RedisSentinelSet
from ibex_context.errors import ConfigurationError
from ibex_context.stores.redis.cache import RedisContextCache, create_redis_client
from ibex_context.stores.redis.wire import LuaScript, PipelinedRedis, RedisEndpoint, SharedAttempt
from redis.exceptions import AuthenticationError, ReadOnlyError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# Holds Redis (which runs one command at a time) for ARGV[1] milliseconds, then answers ARGV[2].
SLOW = LuaScript(
    """
local until_ms = nil
repeat
  local now = redis.call('TIME')
  local ms = now[1] * 1000 + math.floor(now[2] / 1000)
  until_ms = until_ms or ms + tonumber(ARGV[1])
until ms >= until_ms
return ARGV[2]
"""
)


@pytest.fixture
async def admin(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def wire(redis_url: str) -> AsyncIterator[PipelinedRedis]:
    client = PipelinedRedis.from_url(redis_url)
    yield client
    await client.aclose()


async def _connections_received(admin: aioredis.Redis) -> int:
    return int((await admin.info("stats"))["total_connections_received"])


@contextlib.contextmanager
def _stopped(redis: RedisProcess) -> Iterator[None]:
    """Redis frozen (SIGSTOP): connected, reading nothing, answering nothing."""
    assert redis.pid is not None
    os.kill(redis.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        if redis.running:
            os.kill(redis.pid, signal.SIGCONT)


async def test_concurrent_calls_share_one_connection_and_each_gets_its_own_reply(
    throwaway_redis: RedisProcess,
) -> None:
    admin = aioredis.Redis.from_url(throwaway_redis.url)
    wire = PipelinedRedis.from_url(throwaway_redis.url)
    try:
        keys = [f"key:{i}" for i in range(200)]
        await admin.mset({key: f"value {i}".encode() for i, key in enumerate(keys)})
        before = await _connections_received(admin)
        # All 200 requests are written before the first reply is read: one pipeline.
        got = await asyncio.gather(*(wire.get(key) for key in keys), wire.get("missing"))
        assert got == [*(f"value {i}".encode() for i in range(200)), None]
        assert await _connections_received(admin) == before + 1
    finally:
        await wire.aclose()
        await admin.aclose()


async def test_a_cancelled_call_leaves_its_reply_to_be_dropped_and_the_next_call_reads_its_own(
    throwaway_redis: RedisProcess,
) -> None:
    admin = aioredis.Redis.from_url(throwaway_redis.url)
    wire = PipelinedRedis.from_url(throwaway_redis.url)
    try:
        await admin.set("directive", b"mine")
        await wire.connect()
        before = await _connections_received(admin)
        # A read cancelled by its deadline while Redis is still working on it.
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.02):
                await wire.evalsha(SLOW, (), (150, "the slow reply"))
        # The next calls are queued behind the slow reply, which must not reach them.
        assert await asyncio.gather(wire.get("directive"), wire.get("missing")) == [b"mine", None]
        # The same connection throughout: nothing was torn down to recover.
        assert await _connections_received(admin) == before
        task = asyncio.ensure_future(wire.evalsha(SLOW, (), (50, "late")))
        await asyncio.sleep(0.01)
        task.cancel()
        assert await wire.get("directive") == b"mine"
    finally:
        await wire.aclose()
        await admin.aclose()


async def test_an_unknown_script_is_loaded_and_run_once_more(wire: PipelinedRedis) -> None:
    script = LuaScript(f"-- {uuid.uuid4()}\nreturn {{ARGV[1], KEYS[1]}}")
    assert await wire.evalsha(script, ("k",), ("a",)) == [b"a", b"k"]  # NOSCRIPT, then loaded
    assert await wire.evalsha(script, ("k",), (7,)) == [b"7", b"k"]


async def test_an_error_reply_raises_and_the_connection_stays_usable(
    wire: PipelinedRedis, admin: aioredis.Redis
) -> None:
    failing = LuaScript("return redis.error_reply('BROKEN on purpose')")
    key = f"key:{uuid.uuid4()}"
    await admin.set(key, b"v")
    results = await asyncio.gather(
        wire.get(key), wire.evalsha(failing, (), ()), wire.get(key), return_exceptions=True
    )
    assert results[0] == b"v" and results[2] == b"v"
    assert isinstance(results[1], ResponseError) and "BROKEN on purpose" in str(results[1])


async def test_redis_killed_mid_call_fails_the_pending_calls_then_the_next_call_reconnects(
    throwaway_redis: RedisProcess,
) -> None:
    wire = PipelinedRedis.from_url(throwaway_redis.url)
    try:
        assert await wire.get("k") is None
        with _stopped(throwaway_redis):
            pending = [asyncio.ensure_future(wire.get("k")) for _ in range(3)]
            await asyncio.sleep(0.02)
            assert not any(task.done() for task in pending)
            assert throwaway_redis.pid is not None
            os.kill(throwaway_redis.pid, signal.SIGKILL)  # the kernel closes its sockets
            started = time.monotonic()
            for task in pending:
                with pytest.raises(RedisConnectionError):
                    await task
            assert time.monotonic() - started < 1.0  # failed by the lost connection, not a timer
        throwaway_redis.stop()
        # Redis down: each call fails at once (connection refused), mapped by the repository.
        with pytest.raises(RedisConnectionError, match="connecting to Redis failed"):
            await wire.get("k")
        throwaway_redis.start()
        admin = aioredis.Redis.from_url(throwaway_redis.url)
        try:
            await admin.set("k", b"back")
        finally:
            await admin.aclose()
        assert await wire.get("k") == b"back"
    finally:
        await wire.aclose()


async def test_a_hung_redis_is_dropped_after_the_reply_timeout_and_pending_replies_are_bounded(
    throwaway_redis: RedisProcess,
) -> None:
    wire = PipelinedRedis(RedisEndpoint.from_url(throwaway_redis.url), reply_timeout=0.2, max_pending=2)
    try:
        assert await wire.get("k") is None
        with _stopped(throwaway_redis):
            first = asyncio.ensure_future(wire.get("k"))
            # A caller cancelled by its deadline keeps its slot until the connection goes.
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.01):
                    await wire.get("k")
            with pytest.raises(RedisConnectionError, match="2 replies outstanding"):
                await wire.get("k")
            with pytest.raises(RedisTimeoutError, match="answered nothing"):
                await asyncio.wait_for(first, 2.0)
        assert await wire.get("k") is None  # a new connection once Redis runs again
    finally:
        await wire.aclose()


async def test_auth_and_select_come_from_the_url(throwaway_redis: RedisProcess) -> None:
    port = throwaway_redis.port
    admin = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/3")
    try:
        await admin.execute_command("ACL", "SETUSER", "reader", "on", ">reader-pw", "~*", "+@all")
        await admin.set("in-db-3", b"three")
        await admin.config_set("requirepass", "default-pw")
    finally:
        await admin.aclose()
    for url in (f"redis://reader:reader-pw@127.0.0.1:{port}/3", f"redis://:default-pw@127.0.0.1:{port}/3"):
        wire = PipelinedRedis.from_url(url)
        try:
            assert await wire.get("in-db-3") == b"three"
        finally:
            await wire.aclose()
    other_db = PipelinedRedis.from_url(f"redis://:default-pw@127.0.0.1:{port}/0")
    wrong = PipelinedRedis.from_url(f"redis://reader:nope@127.0.0.1:{port}/3")
    anonymous = PipelinedRedis.from_url(f"redis://127.0.0.1:{port}/3")
    try:
        assert await other_db.get("in-db-3") is None
        with pytest.raises(AuthenticationError):  # a ConnectionError: the repository maps it
            await wrong.get("in-db-3")
        with pytest.raises(ResponseError, match="NOAUTH"):
            await anonymous.get("in-db-3")
    finally:
        for client in (other_db, wrong, anonymous):
            await client.aclose()


async def test_a_unix_socket_url_with_a_db_number(tmp_path: Path) -> None:
    socket_path = tmp_path / "redis.sock"
    options = ["--port", "0", "--unixsocket", str(socket_path), "--save", "", "--dir", str(tmp_path)]
    server = subprocess.Popen(
        [str(redis_server_binary()), *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(250):
            if socket_path.exists():
                break
            await asyncio.sleep(0.02)
        admin = aioredis.Redis(unix_socket_path=str(socket_path), db=2)
        try:
            await admin.set("k", b"over a unix socket")
        finally:
            await admin.aclose()
        wire = PipelinedRedis.from_url(f"unix://{socket_path}?db=2")
        try:
            assert await wire.get("k") == b"over a unix socket"
        finally:
            await wire.aclose()
    finally:
        server.terminate()
        server.wait(10)


def _self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    request = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    subject = ["-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"]
    subprocess.run(
        [*request, *subject, "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return cert, key


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


async def test_rediss_speaks_tls_and_verifies_the_server_by_default(
    throwaway_redis: RedisProcess, tmp_path: Path
) -> None:
    """Through a TLS-terminating proxy in front of the real Redis (the embedded one has no TLS)."""
    cert, key = _self_signed_certificate(tmp_path)
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(cert, key)
    pipes: list[asyncio.Task[None]] = []

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", throwaway_redis.port)
        pipes.append(asyncio.ensure_future(_pipe(reader, upstream_writer)))
        pipes.append(asyncio.ensure_future(_pipe(upstream_reader, writer)))

    proxy = await asyncio.start_server(forward, "127.0.0.1", 0, ssl=server_side)
    port = proxy.sockets[0].getsockname()[1]
    url = f"rediss://localhost:{port}/0"
    trusted = ssl.create_default_context(cafile=str(cert))
    wire = PipelinedRedis(dataclasses.replace(RedisEndpoint.from_url(url), tls=trusted))
    default = PipelinedRedis.from_url(url)  # the system's CAs do not know this certificate
    try:
        assert RedisEndpoint.from_url(url).tls is not None
        assert await wire.get("k") is None
        with pytest.raises(RedisConnectionError, match="SSLCertVerificationError"):
            await default.get("k")
    finally:
        await wire.aclose()
        await default.aclose()
        proxy.close()
        for task in pipes:
            task.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)
        await proxy.wait_closed()


async def test_the_cache_opens_the_reads_connection_at_warm_up_and_closes_it_with_the_rest(
    throwaway_redis: RedisProcess,
) -> None:
    admin = aioredis.Redis.from_url(throwaway_redis.url)
    cache = RedisContextCache(
        create_redis_client(throwaway_redis.url, max_connections=4),
        PipelinedRedis.from_url(throwaway_redis.url),
        directive_ttl_seconds=60,
        hot_set_size=5,
        hot_set_ttl_seconds=60,
    )

    async def clients() -> int:
        return int((await admin.info("clients"))["connected_clients"])

    try:
        assert await clients() == 1
        await cache.warm_up(connections=2)
        assert await clients() == 1 + 2 + 1  # admin, the pool's two, the reads' one
        before = await _connections_received(admin)
        assert await cache.get_directive_state("o", "a") is None
        assert await cache.get_hot_memories("o", "a", 5) is None
        assert await _connections_received(admin) == before  # no set-up on the first reads
        await cache.aclose()
        for _ in range(250):
            if await clients() == 1:
                break
            await asyncio.sleep(0.02)
        assert await clients() == 1
    finally:
        await cache.aclose()
        await admin.aclose()


def test_urls_are_read_as_redis_py_reads_them() -> None:
    endpoint = RedisEndpoint.from_url("redis://user:p%40ss@cache.example:6380/4")
    assert (endpoint.host, endpoint.port, endpoint.db) == ("cache.example", 6380, 4)
    assert (endpoint.username, endpoint.password, endpoint.tls) == ("user", "p@ss", None)
    assert RedisEndpoint.from_url("redis://cache.example") == RedisEndpoint(host="cache.example")
    unix = RedisEndpoint.from_url("unix://:secret@/run/redis.sock?db=5")
    assert (unix.unix_path, unix.db, unix.password) == ("/run/redis.sock", 5, "secret")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis://:secret@host:6379/0?ssl_cert_reqs=none", "ssl_cert_reqs not supported"),
        ("redis://:secret@host:6379/0?socket_timeout=5", "socket_timeout not supported"),
        ("http://:secret@host:6379/0", "scheme"),
        ("unix://:secret@", "socket path"),
    ],
)
def test_what_this_client_cannot_honour_is_refused_at_start_up_without_the_credentials(
    url: str, problem: str
) -> None:
    with pytest.raises(ConfigurationError, match=problem) as refused:
        RedisEndpoint.from_url(url)
    assert "secret" not in str(refused.value)


def test_reads_work_on_uvloop_the_services_default_loop(redis_url: str) -> None:
    # uvloop's transports are not asyncio.Transport instances: the client must not care.
    import uvloop

    key = f"wire-uvloop-{uuid.uuid4()}"

    async def set_then_read() -> object:
        admin = aioredis.Redis.from_url(redis_url)
        wire = PipelinedRedis.from_url(redis_url)
        try:
            await admin.set(key, b"on uvloop")
            return await wire.get(key)
        finally:
            await wire.aclose()
            await admin.delete(key)
            await admin.aclose()

    assert uvloop.run(set_then_read()) == b"on uvloop"


# --- a primary that is not (or no longer) one: Sentinel's failovers ----------------------------------


def _a_replica(sentinels: RedisSentinelSet) -> RedisProcess:
    primary = sentinels.primary_port()
    return next(server for server in sentinels.servers if server.port != primary)


async def test_a_readonly_reply_closes_the_connection_so_the_next_call_connects_afresh(
    redis_sentinels: RedisSentinelSet,
) -> None:
    """A demoted primary answers writes READONLY: the caller gets that error, and the
    connection is dropped, so the next call opens a new one (with Sentinel: asks again)."""
    replica = _a_replica(redis_sentinels)
    wire = PipelinedRedis.from_url(replica.url)
    try:
        async with aioredis.Redis(port=replica.port) as admin:
            await wire.connect()
            before = await _connections_received(admin)
            with pytest.raises(ReadOnlyError):
                await wire.execute(("SET", "{o}:k", "v"))
            assert await wire.get("{o}:absent") is None
            assert await _connections_received(admin) == before + 1
    finally:
        await wire.aclose()


async def test_a_server_named_as_primary_that_is_a_replica_is_refused(
    redis_sentinels: RedisSentinelSet,
) -> None:
    """A sentinel's answer may be a moment stale: the server's own ROLE decides."""
    replica = _a_replica(redis_sentinels)
    endpoint = RedisEndpoint.from_url(replica.url)

    async def stale_sentinel() -> RedisEndpoint:
        return endpoint

    wire = PipelinedRedis(endpoint, locate=stale_sentinel)
    try:
        with pytest.raises(RedisConnectionError, match="not \\(or no longer\\) one"):
            await wire.get("{o}:k")
    finally:
        await wire.aclose()


async def test_a_shared_attempt_serves_every_caller_of_its_run_and_outlives_a_cancelled_one() -> None:
    runs: asyncio.Queue[asyncio.Event] = asyncio.Queue()
    ended: list[object] = []

    async def attempt() -> int:
        release = asyncio.Event()
        runs.put_nowait(release)
        await release.wait()
        return len(ended) + 1

    def finished(future: asyncio.Future[int]) -> None:
        ended.append(future.exception() or future.result())

    shared = SharedAttempt(attempt, finished)
    impatient = asyncio.create_task(shared.join())
    patient = asyncio.create_task(shared.join())
    first = await runs.get()
    impatient.cancel()  # its deadline: the attempt the other waits for goes on
    await asyncio.sleep(0)
    first.set()
    assert await patient == 1 and runs.empty() and ended == [1]
    assert impatient.cancelled()

    again = asyncio.create_task(shared.join())  # the next ask after it ended: a new attempt
    (await runs.get()).set()
    assert await again == 2 and ended == [1, 2]


async def test_a_cancelled_shared_attempt_fails_its_callers_and_the_next_ask_starts_anew() -> None:
    ended: list[bool] = []

    async def never() -> None:
        await asyncio.Event().wait()

    shared = SharedAttempt(never, lambda future: ended.append(future.cancelled()))
    waiting = asyncio.create_task(shared.join())
    await asyncio.sleep(0)
    shared.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert ended == [True]
    shared.cancel()  # nothing running: nothing to do
