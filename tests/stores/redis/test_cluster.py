"""The cache on a real three-primary Redis Cluster: both clients (redis-py's cluster
client and the request path's slot-routed pipelined one), tenants spread over the
nodes, purge finding keys on every node, and the redirections of a slot migration."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from ibex_context.devtools.redis_ha import RedisClusterProcesses, redis_cluster
from ibex_context.models import MemoryRecord
from ibex_context.settings import Settings
from ibex_context.stores.base import DirectiveState, MemoryCounters
from ibex_context.stores.redis.cache import RedisContextCache, directive_key, hot_data_key
from ibex_context.stores.redis.cluster_wire import PipelinedRedisCluster, key_slot
from ibex_context.stores.redis.topology import RedisTopology
from ibex_context.stores.redis.write_marks import WriteMarks
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from tests.stores.helpers import records, unit_vector

# Every wait below ends by this, however loaded the machine; none is a timing assertion.
PATIENCE_SECONDS = 60.0


def record(n: int) -> MemoryRecord:
    return MemoryRecord(
        id=str(uuid.UUID(int=n)), content=f"memory {n}", category="factual", embedding=unit_vector(n)
    )


async def slot_owners(port: int) -> dict[int, int]:
    """slot -> port of its primary, as the node on ``port`` says (CLUSTER SLOTS)."""
    async with aioredis.Redis(port=port) as node:
        ranges = await node.execute_command("CLUSTER", "SLOTS")
    owners: dict[int, int] = {}
    for start, end, primary, *_ in ranges:
        owners.update(dict.fromkeys(range(int(start), int(end) + 1), int(primary[1])))
    return owners


async def org_on_each_node(cluster: RedisClusterProcesses) -> dict[int, str]:
    """port -> an org id whose keys live on that primary."""
    owners = await slot_owners(cluster.ports[0])
    orgs: dict[int, str] = {}
    while len(orgs) < len(cluster.ports):
        org = str(uuid.uuid4())
        orgs.setdefault(owners[key_slot(f"{{{org}}}:x")], org)
    return orgs


async def keys_on(port: int) -> set[str]:
    async with aioredis.Redis(port=port) as node:
        return {key.decode() async for key in node.scan_iter(count=1000)}


@pytest.fixture
async def cluster_cache(redis_cluster_nodes: RedisClusterProcesses) -> AsyncIterator[RedisContextCache]:
    cache = RedisContextCache.from_settings(Settings(redis_url=redis_cluster_nodes.url, redis_cluster=True))
    await cache.warm_up()
    yield cache
    await cache.aclose()


async def test_the_slot_of_a_key_is_the_one_redis_computes(
    redis_cluster_nodes: RedisClusterProcesses,
) -> None:
    keys = [
        "plain",
        "",
        "{org}:directive:agent",
        "{}:empty-tag-hashes-the-whole-key",
        "{unclosed",
        "a{b}c{d}",
        "{{nested}}",
        "é{ünïcode}",
        *(directive_key(str(uuid.uuid4()), str(uuid.uuid4())) for _ in range(50)),
    ]
    async with aioredis.Redis(port=redis_cluster_nodes.ports[0]) as node:
        for key in keys:
            assert key_slot(key) == await node.execute_command("CLUSTER", "KEYSLOT", key), key


async def test_the_cache_works_end_to_end_with_tenants_on_every_node(
    cluster_cache: RedisContextCache, redis_cluster_nodes: RedisClusterProcesses
) -> None:
    orgs = await org_on_each_node(redis_cluster_nodes)
    agent = str(uuid.uuid4())
    for port, org in orgs.items():
        # Written by redis-py's cluster client (scripts by EVALSHA on the key's node) ...
        assert await cluster_cache.put_directive(
            org, agent, DirectiveState(f"be {port}", 3, {"o200k_base": 2})
        )
        assert await cluster_cache.replace_hot_set(
            org, agent, [(record(1), 0.9), (record(2), 0.5)], expected_generation=0
        )
        # ... and on the primary that owns the org's slot.
        assert {directive_key(org, agent), hot_data_key(org, agent)} <= await keys_on(port)
    for port, org in orgs.items():
        # Read back by the request path's own client, routed by slot.
        assert await cluster_cache.get_directive_state(org, agent) == DirectiveState(
            f"be {port}", 3, {"o200k_base": 2}
        )
        assert [r.id for r in records(await cluster_cache.get_hot_memories(org, agent, 10))] == [
            record(1).id,
            record(2).id,
        ]


async def test_writes_spanning_nodes_work_pipelined_and_transactional(
    cluster_cache: RedisContextCache, redis_cluster_nodes: RedisClusterProcesses
) -> None:
    orgs = list((await org_on_each_node(redis_cluster_nodes)).values())
    agent = str(uuid.uuid4())
    for org in orgs:
        await cluster_cache.replace_hot_set(org, agent, [(record(1), 0.1)], expected_generation=0)
    patched = await cluster_cache.patch_hot_counters_of_agents(
        {(org, agent): [MemoryCounters(org, agent, record(1).id, 4, 1e9)] for org in orgs}
    )
    assert patched == {(org, agent): 1 for org in orgs}
    for org in orgs:
        assert records(await cluster_cache.get_hot_memories(org, agent, 10))[0].retrieval_count == 4
        await cluster_cache.invalidate_hot_set(org, agent)  # MULTI/EXEC on the slot's node
        assert await cluster_cache.get_hot_memories(org, agent, 10) is None


async def test_purging_an_org_finds_its_keys_whichever_node_holds_them(
    cluster_cache: RedisContextCache, redis_cluster_nodes: RedisClusterProcesses
) -> None:
    orgs = await org_on_each_node(redis_cluster_nodes)
    agents = [str(uuid.uuid4()) for _ in range(3)]
    for port, org in orgs.items():
        for agent in agents:
            await cluster_cache.put_directive(org, agent, DirectiveState("d", 1, {}))
            await cluster_cache.replace_hot_set(org, agent, [(record(7), 0.3)], expected_generation=0)
        async with aioredis.Redis(port=port) as node:
            await node.set(f"{{{org}}}:org-wide-thing", "x")  # a stray key of no agent
    for port, org in orgs.items():
        found = await cluster_cache.agents_with_keys(org)
        assert found == set(agents)
        for agent in agents:
            assert await cluster_cache.purge_agent(org, agent, directive_tombstone_version=2) == 3
        assert await cluster_cache.purge_org_keys(org, sorted(found)) == 1
        left = {key for key in await keys_on(port) if key.startswith(f"{{{org}}}")}
        # Only the tombstones of each agent: the directive's "none" and the generation.
        assert left == {
            key for agent in agents for key in (directive_key(org, agent), f"{{{org}}}:hot_gen:{agent}")
        }


async def test_reads_follow_a_slot_migration_through_ask_then_moved(
    redis_cluster_nodes: RedisClusterProcesses,
) -> None:
    """Migrating the slot of an org by hand, as a resharding does: while its keys move
    the old node answers ASK for a moved key, after it MOVED; the read follows both."""
    reads = RedisTopology(redis_cluster_nodes.url, cluster=True).create_reads()
    assert isinstance(reads, PipelinedRedisCluster)
    org = str(uuid.uuid4())
    moving, staying = directive_key(org, "a1"), directive_key(org, "a2")
    slot = key_slot(moving)
    source = (await slot_owners(redis_cluster_nodes.ports[0]))[slot]
    target = next(port for port in redis_cluster_nodes.ports if port != source)
    nodes = {port: aioredis.Redis(port=port) for port in redis_cluster_nodes.ports}
    try:
        ids = {port: (await nodes[port].execute_command("CLUSTER", "MYID")).decode() for port in nodes}
        await nodes[source].mset({moving: b"1|moving", staying: b"1|staying"})
        assert await reads.get(moving) == b"1|moving"  # the map is read: the slot is on source

        await nodes[target].execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source])
        await nodes[source].execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])
        await nodes[source].execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", moving)
        assert await reads.get(moving) == b"1|moving"  # ASK: asked at target
        assert await reads.get(staying) == b"1|staying"  # still on source

        await nodes[source].execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", staying)
        for port in nodes:
            await nodes[port].execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[target])
        assert await reads.get(staying) == b"1|staying"  # MOVED: the map is re-read
        assert await reads.get(moving) == b"1|moving"
    finally:
        await reads.aclose()
        for node in nodes.values():
            await node.aclose()


async def test_a_stopped_node_fails_only_its_own_slots_reads_and_they_come_back_with_it(
    tmp_path: Path,
) -> None:
    """Reads of the other nodes' slots keep answering; those of the stopped node's
    raise RedisError (the repository degrades them) until it is back, then answer."""
    with redis_cluster(tmp_path / "cluster") as cluster:
        reads = RedisTopology(cluster.url, cluster=True).create_reads()
        try:
            orgs = await org_on_each_node(cluster)
            keys = {port: directive_key(org, "a") for port, org in orgs.items()}
            for port, key in keys.items():
                async with aioredis.Redis(port=port) as node:
                    await node.set(key, f"1|{port}")
            await reads.connect()
            stopped = cluster.nodes[1]
            stopped.stop()

            with pytest.raises(RedisError):
                await reads.get(keys[stopped.port])
            for port, key in keys.items():
                if port != stopped.port:
                    assert await reads.get(key) == f"1|{port}".encode()

            stopped.start()  # same port, same nodes.conf: it serves its slots again (data gone)
            deadline = time.monotonic() + PATIENCE_SECONDS
            while True:
                try:
                    assert await reads.get(keys[stopped.port]) is None
                    break
                except RedisError:
                    assert time.monotonic() < deadline, "the node's slots did not come back"
                    await asyncio.sleep(0.1)
        finally:
            await reads.aclose()


async def test_concurrent_and_cancelled_reads_across_nodes_each_get_their_own_reply(
    redis_cluster_nodes: RedisClusterProcesses,
) -> None:
    reads = RedisTopology(redis_cluster_nodes.url, cluster=True).create_reads()
    keys = [directive_key(str(uuid.uuid4()), "a") for _ in range(60)]
    async with RedisCluster.from_url(redis_cluster_nodes.url) as client:
        for key in keys:
            await client.set(key, f"1|{key}")
    try:
        cancelled = [asyncio.ensure_future(reads.get(key)) for key in keys[::3]]
        answered = [asyncio.ensure_future(reads.get(key)) for key in keys]
        await asyncio.sleep(0)
        for call in cancelled:
            call.cancel()
        assert await asyncio.gather(*answered) == [f"1|{key}".encode() for key in keys]
        assert await reads.get(keys[0]) == f"1|{keys[0]}".encode()
    finally:
        await reads.aclose()


async def test_every_other_cache_operation_runs_on_the_cluster(
    cluster_cache: RedisContextCache, redis_cluster_nodes: RedisClusterProcesses
) -> None:
    """Each script and multi-key command touches one agent's keys: one slot, one node."""
    org, agent = str(uuid.uuid4()), str(uuid.uuid4())
    assert await cluster_cache.put_directive(org, agent, DirectiveState("d", 1, {}))
    await cluster_cache.delete_directive(org, agent)
    assert await cluster_cache.get_directive_state(org, agent) is None

    generation = await cluster_cache.hot_set_generation(org, agent)
    assert await cluster_cache.replace_hot_set(org, agent, [(record(1), 0.5)], generation)
    assert await cluster_cache.add_hot_memories(org, agent, [(record(2), 0.9)])
    assert await cluster_cache.remove_hot_memories(org, agent, [record(1).id]) == 1
    assert [r.id for r in records(await cluster_cache.get_hot_memories(org, agent, 10))] == [record(2).id]
    assert await cluster_cache.hot_set_generation(org, agent) == generation + 2
    assert 0 < await cluster_cache.hot_set_ttl(org, agent) <= Settings().hot_set_ttl_seconds
    assert (await cluster_cache.check_health()).ok

    topology = RedisTopology(redis_cluster_nodes.url, cluster=True)
    marks = WriteMarks(topology.create_client(max_connections=2), topology.create_reads(), ttl_seconds=30)
    try:
        await marks.put(org, agent, 42)
        await marks.put(org, agent, 7)  # an older write finishing late never lowers the mark
        assert await marks.get(org, agent) == 42
    finally:
        await marks.aclose()
