"""RedisTopology: which Redis deployment the settings describe, and the combinations
refused at start-up (each error names the variable to fix, never a credential)."""

from __future__ import annotations

import pytest
from ibex_context.errors import ConfigurationError
from ibex_context.settings import Settings
from ibex_context.stores.redis.cluster_wire import PipelinedRedisCluster
from ibex_context.stores.redis.topology import RedisTopology
from ibex_context.stores.redis.wire import PipelinedRedis
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster


def topology(**settings: object) -> RedisTopology:
    return RedisTopology.from_settings(Settings(**settings))  # type: ignore[arg-type]


def test_the_url_alone_is_one_server() -> None:
    assert topology(redis_url="redis://127.0.0.1:6379/2").mode == "standalone"


def test_sentinels_are_read_from_the_environment_as_a_json_list_of_host_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("IBEX_REDIS_SENTINELS", '["10.0.0.1:26379", "sentinel-2:26380", "[::1]:26381"]')
    monkeypatch.setenv("IBEX_REDIS_SENTINEL_MASTER", "mymaster")
    found = RedisTopology.from_settings(Settings())
    assert found.mode == "sentinel"
    assert found.sentinels == (("10.0.0.1", 26379), ("sentinel-2", 26380), ("::1", 26381))
    assert found.sentinel_master == "mymaster"


def test_sentinels_may_also_be_separated_by_commas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IBEX_REDIS_SENTINELS", "s-0:26379, s-1:26379,")
    monkeypatch.setenv("IBEX_REDIS_SENTINEL_MASTER", "mymaster")
    assert RedisTopology.from_settings(Settings()).sentinels == (("s-0", 26379), ("s-1", 26379))


def test_cluster_mode_is_a_flag_and_the_url_a_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IBEX_REDIS_CLUSTER", "true")
    monkeypatch.setenv("IBEX_REDIS_URL", "rediss://:secret@cache.example:6380")
    assert RedisTopology.from_settings(Settings()).mode == "cluster"


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"redis_sentinels": ("s:26379",)}, "IBEX_REDIS_SENTINEL_MASTER"),
        ({"redis_sentinel_master": "m"}, "IBEX_REDIS_SENTINELS"),
        ({"redis_sentinel_password": "p"}, "IBEX_REDIS_SENTINELS"),
        (
            {"redis_sentinels": ("s:26379",), "redis_sentinel_master": "m", "redis_cluster": True},
            "IBEX_REDIS_SENTINELS and IBEX_REDIS_CLUSTER",
        ),
        ({"redis_sentinels": ("s",), "redis_sentinel_master": "m"}, "IBEX_REDIS_SENTINELS"),
        ({"redis_sentinels": ("s:0",), "redis_sentinel_master": "m"}, "IBEX_REDIS_SENTINELS"),
        ({"redis_cluster": True, "redis_url": "redis://:pw@h:6379/1"}, "IBEX_REDIS_URL"),
        ({"redis_cluster": True, "redis_url": "unix:///run/redis.sock"}, "IBEX_REDIS_URL"),
        (
            {"redis_sentinels": ("s:1",), "redis_sentinel_master": "m", "redis_url": "unix:///r.sock"},
            "IBEX_REDIS_URL",
        ),
    ],
)
def test_combinations_that_cannot_work_are_refused_naming_the_variable(
    settings: dict[str, object], named: str
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        topology(**settings)
    assert str(refused.value).startswith(f"{named}:")
    assert "pw" not in str(refused.value)


async def test_each_mode_builds_its_own_pair_of_clients() -> None:
    one = topology(redis_url="redis://127.0.0.1:1/0")
    sentinel = topology(redis_sentinels=("127.0.0.1:1",), redis_sentinel_master="m")
    cluster = topology(redis_cluster=True, redis_url="redis://127.0.0.1:1")
    clients = [(t.create_client(max_connections=2), t.create_reads()) for t in (one, sentinel, cluster)]
    try:
        assert isinstance(clients[0][0], Redis) and type(clients[0][1]) is PipelinedRedis
        assert isinstance(clients[1][0], Redis) and type(clients[1][1]) is PipelinedRedis
        assert isinstance(clients[2][0], RedisCluster) and isinstance(clients[2][1], PipelinedRedisCluster)
    finally:
        for client, reads in clients:
            await reads.aclose()
            await client.aclose()
