"""devtools.redis_ha: the Redis Cluster and the Sentinel set the tests run against."""

from __future__ import annotations

import time

import redis
from ibex_context.devtools.redis_ha import SENTINEL_MASTER, RedisClusterProcesses, RedisSentinelSet


def test_the_cluster_spreads_every_slot_over_its_three_primaries(
    redis_cluster_nodes: RedisClusterProcesses,
) -> None:
    with redis.Redis(port=redis_cluster_nodes.ports[0]) as node:
        ranges = node.execute_command("CLUSTER", "SLOTS")
        assert node.cluster("INFO")["cluster_state"] == "ok"
    covered = sum(int(end) - int(start) + 1 for start, end, *_ in ranges)
    owners = {int(primary[1]) for _start, _end, primary, *_ in ranges}
    assert covered == 16384
    assert owners == set(redis_cluster_nodes.ports)
    assert redis_cluster_nodes.url == f"redis://127.0.0.1:{redis_cluster_nodes.ports[0]}/0"


def test_the_sentinels_name_the_primary_and_its_replica_follows_it(redis_sentinels: RedisSentinelSet) -> None:
    assert len(redis_sentinels.sentinels) == 3
    primary_port = redis_sentinels.primary_port()
    (replica,) = [server for server in redis_sentinels.servers if server.port != primary_port]
    with redis.Redis(port=primary_port) as primary, redis.Redis(port=replica.port) as follower:
        assert primary.info("replication")["role"] == "master"
        primary.set("{devtools}:replicated", "yes")
        deadline = time.monotonic() + 60
        while follower.get("{devtools}:replicated") != b"yes":
            assert time.monotonic() < deadline, "the replica did not follow"
            time.sleep(0.05)
    for entry in redis_sentinels.sentinels:
        with redis.Redis(port=int(entry.rpartition(":")[2])) as sentinel:
            assert int(sentinel.sentinel_get_master_addr_by_name(SENTINEL_MASTER)[1]) == primary_port
