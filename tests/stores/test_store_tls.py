"""Redis (``rediss://``) and PostgreSQL (verify-full) over TLS with a private CA from a file:
verified against that CA, host name included; a server certificate of another CA is refused."""

from __future__ import annotations

import asyncio
import ssl
import uuid
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import asyncpg
import pytest
import redis.exceptions
from ibex_context.devtools.certs import Authority
from ibex_context.settings import Settings
from ibex_context.stores.postgres import PostgresMemoryStore, postgres_tls
from ibex_context.stores.postgres.migrate import migrate
from ibex_context.stores.redis.cache import RedisContextCache, create_redis_client
from ibex_context.stores.redis.wire import PipelinedRedis

from tests.stores.tls_terminator import server_context, terminator

pytestmark = pytest.mark.integration


@pytest.fixture
def private_ca(tmp_path: Path) -> tuple[Authority, Path]:
    ca = Authority.create("stores CA")
    path = tmp_path / "stores-ca.crt"
    path.write_bytes(ca.cert_pem)
    return ca, path


def postgres_socket(dsn: str) -> str:
    directory = parse_qs(urlsplit(dsn).query)["host"][0]
    return f"{directory}/.s.PGSQL.5432"


async def test_postgres_verify_full_against_a_private_ca(
    postgres_dsn: str, private_ca: tuple[Authority, Path], tmp_path: Path
) -> None:
    ca, ca_file = private_ca
    socket = postgres_socket(postgres_dsn)
    context = server_context(ca.server(), tmp_path)
    async with terminator(context, lambda: asyncio.open_unix_connection(socket), postgres=True) as port:
        dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        # The migration command and the store's pool both go through the CA.
        assert await migrate(dsn, 384, ca_file=ca_file) == []
        store = await PostgresMemoryStore.from_settings(Settings(postgres_dsn=dsn, postgres_ca_file=ca_file))
        try:
            assert await store.pool.fetchval("SELECT 1") == 1
        finally:
            await store.aclose()
        other = tmp_path / "other-ca.crt"
        other.write_bytes(Authority.create("other CA").cert_pem)
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncpg.connect(dsn, ssl=postgres_tls(other), timeout=10)
        # A CA set is verify-full whatever the DSN says: its sslmode cannot turn it down.
        for weaker in ("disable", "prefer", "require"):
            with pytest.raises(ssl.SSLCertVerificationError):
                await asyncpg.connect(f"{dsn}?sslmode={weaker}", ssl=postgres_tls(other), timeout=10)


async def test_rediss_against_a_private_ca_on_both_redis_clients(
    redis_url: str, private_ca: tuple[Authority, Path], tmp_path: Path
) -> None:
    ca, ca_file = private_ca
    plain = urlsplit(redis_url)
    context = server_context(ca.server(), tmp_path)
    upstream = lambda: asyncio.open_connection(plain.hostname, plain.port)  # noqa: E731
    async with terminator(context, upstream) as port:
        url = f"rediss://127.0.0.1:{port}/0"
        cache = RedisContextCache.from_settings(Settings(redis_url=url, redis_ca_file=ca_file))
        try:
            # redis-py (writes, health) and the request path's own wire client.
            await cache.warm_up(connections=1)
            assert await cache.get_directive_state(str(uuid.uuid4()), str(uuid.uuid4())) is None
        finally:
            await cache.aclose()
        other = tmp_path / "other-ca.crt"
        other.write_bytes(Authority.create("other CA").cert_pem)
        client = create_redis_client(url, max_connections=1, ca_file=other)
        wire = PipelinedRedis.from_url(url, ca_file=other)
        try:
            with pytest.raises(redis.exceptions.ConnectionError, match="certificate verify failed"):
                await client.ping()
            with pytest.raises(redis.exceptions.ConnectionError) as failed:
                await wire.connect()
            assert isinstance(failed.value.__cause__, ssl.SSLCertVerificationError)
        finally:
            await client.aclose()
            await wire.aclose()
