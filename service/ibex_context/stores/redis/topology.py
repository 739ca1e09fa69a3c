"""How Redis is deployed -- one server, Sentinel, or Cluster -- and the two clients of
each: redis-py's (writes, scripts, purge, health) and the request path's own
(``stores.redis.wire``: the directive's GET and the hot set's EVALSHA).

Settings: ``IBEX_REDIS_URL`` alone is one server. With ``IBEX_REDIS_SENTINELS`` and
``IBEX_REDIS_SENTINEL_MASTER`` the primary is the one the sentinels name (the URL
gives scheme, credentials and db). With ``IBEX_REDIS_CLUSTER`` the URL is a seed
node of a cluster. Combinations that cannot work are refused at start-up, naming
the variable.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeAlias

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff

from ibex_context.errors import ConfigurationError
from ibex_context.settings import Settings
from ibex_context.stores.redis.cluster_wire import PipelinedRedisCluster
from ibex_context.stores.redis.sentinel import SentinelLocator
from ibex_context.stores.redis.wire import PipelinedRedis, RedisEndpoint, RedisReads

RedisClient: TypeAlias = aioredis.Redis | RedisCluster
Mode = Literal["standalone", "sentinel", "cluster"]


@dataclass(frozen=True, slots=True)
class RedisTopology:
    """Where Redis is: ``url`` (one server, or a cluster's seed, or -- with sentinels --
    only scheme, credentials and db) and how it is deployed."""

    url: str
    ca_file: Path | None = None
    sentinels: tuple[tuple[str, int], ...] = ()
    sentinel_master: str = ""
    sentinel_password: str = ""
    cluster: bool = False

    def __post_init__(self) -> None:
        endpoint = RedisEndpoint.from_url(self.url, ca_file=self.ca_file)  # the URL's own checks
        if self.sentinels and self.cluster:
            raise ConfigurationError(
                "IBEX_REDIS_SENTINELS and IBEX_REDIS_CLUSTER: set one (Sentinel or Cluster), not both"
            )
        if self.sentinels and not self.sentinel_master:
            raise ConfigurationError("IBEX_REDIS_SENTINEL_MASTER: required with IBEX_REDIS_SENTINELS")
        if not self.sentinels and (self.sentinel_master or self.sentinel_password):
            raise ConfigurationError(
                "IBEX_REDIS_SENTINELS: required with IBEX_REDIS_SENTINEL_MASTER "
                "or IBEX_REDIS_SENTINEL_PASSWORD"
            )
        if self.mode != "standalone" and endpoint.unix_path is not None:
            raise ConfigurationError(f"IBEX_REDIS_URL: {self.mode} needs redis:// or rediss://, not unix://")
        if self.cluster and endpoint.db != 0:
            raise ConfigurationError(
                "IBEX_REDIS_URL: Redis Cluster has only db 0 (IBEX_REDIS_CLUSTER is set)"
            )

    @classmethod
    def from_settings(cls, settings: Settings) -> RedisTopology:
        return cls(
            url=settings.redis_url,
            ca_file=settings.redis_ca_file,
            sentinels=tuple(_host_port(entry) for entry in settings.redis_sentinels),
            sentinel_master=settings.redis_sentinel_master,
            sentinel_password=settings.redis_sentinel_password,
            cluster=settings.redis_cluster,
        )

    @property
    def mode(self) -> Mode:
        return "sentinel" if self.sentinels else "cluster" if self.cluster else "standalone"

    def endpoint(self) -> RedisEndpoint:
        return RedisEndpoint.from_url(self.url, ca_file=self.ca_file)

    def create_client(self, *, max_connections: int) -> RedisClient:
        """redis-py's client for this deployment: one immediate retry, no backoff.

        redis-py's default (10 retries with exponential backoff) turns a stopped Redis
        into seconds of waiting per call; a request has milliseconds. The single retry
        replaces a pooled connection that died with a Redis restart (or, with
        Sentinel, a failover). ``socket_timeout`` is a backstop for background work;
        requests are bounded by their deadline."""
        tls: dict[str, Any] = (
            {"ssl_ca_certs": str(self.ca_file)} if self.ca_file and self.url.startswith("rediss:") else {}
        )
        common: dict[str, Any] = {
            "retry": Retry(NoBackoff(), 1),
            "socket_connect_timeout": 1.0,
            "socket_timeout": 2.0,
            **tls,
        }
        if self.cluster:
            return RedisCluster.from_url(self.url, max_connections=max_connections, **common)
        if not self.sentinels:
            return aioredis.Redis.from_url(self.url, max_connections=max_connections, **common)
        endpoint = self.endpoint()
        secure = {"ssl": True, **tls} if endpoint.tls is not None else {}
        sentinel = Sentinel(  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis 8.2
            list(self.sentinels),
            sentinel_kwargs={
                "password": self.sentinel_password or None,
                "socket_connect_timeout": 1.0,
                "socket_timeout": 2.0,
                **secure,
            },
            username=endpoint.username,
            password=endpoint.password,
            db=endpoint.db,
            max_connections=max_connections,
            **common,
            **secure,
        )
        client: SentinelManagedRedis = sentinel.master_for(
            self.sentinel_master, redis_class=SentinelManagedRedis
        )
        client.sentinels_of = sentinel
        return client

    def create_reads(self) -> RedisReads:
        """The request path's client for this deployment."""
        endpoint = self.endpoint()
        if self.cluster:
            return PipelinedRedisCluster(endpoint)
        if not self.sentinels:
            return PipelinedRedis(endpoint)
        locate = SentinelLocator(
            self.sentinels,
            self.sentinel_master,
            primary_endpoint=endpoint,
            sentinel_endpoint=dataclasses.replace(
                endpoint, username=None, password=self.sentinel_password or None, db=0
            ),
        )
        return PipelinedRedis(endpoint, locate=locate)


class SentinelManagedRedis(aioredis.Redis):
    """redis-py's client of the primary the sentinels name (``Sentinel.master_for``);
    closing it closes its connections to the sentinels too, which redis-py leaves open."""

    sentinels_of: Sentinel | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        if self.sentinels_of is not None:
            for client in self.sentinels_of.sentinels:
                await client.aclose()


def _host_port(entry: str) -> tuple[str, int]:
    host, _, port = entry.strip().rpartition(":")
    host = host.strip("[]")  # an IPv6 address may come bracketed
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigurationError(f"IBEX_REDIS_SENTINELS: {entry!r} is not host:port")
    return host, int(port)
