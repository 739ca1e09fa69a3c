"""How many connections the memory API's writes hold (``stores.postgres.write_slots``): at
most the slots, waiting writes granted org by org, a writer that gives up holding none."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from ibex_context.stores.postgres import PostgresMemoryStore, create_pool
from ibex_context.stores.postgres.write_slots import WriteSlots

from tests.conftest import Tenant
from tests.stores.helpers import EF_SEARCH, MakeMemory, unit_vector

WAIT = 5.0  # seconds: every wait is bounded
WAIT_STEPS = 5000  # of 1 ms


async def _hold(slots: WriteSlots, org: str, order: list[str], release: asyncio.Event) -> None:
    async with slots.slot(org):
        order.append(org)
        await release.wait()


async def test_no_more_writers_than_slots_hold_one_at_once() -> None:
    slots = WriteSlots(2)
    release = asyncio.Event()
    order: list[str] = []
    writers = [asyncio.ensure_future(_hold(slots, "A", order, release)) for _ in range(5)]
    await asyncio.sleep(0.01)
    assert slots.held == 2 and slots.waiting == 3 and len(order) == 2
    release.set()
    await asyncio.wait_for(asyncio.gather(*writers), WAIT)
    assert slots.held == 0 and slots.waiting == 0 and len(order) == 5


async def test_another_orgs_write_waits_for_one_of_the_floods_not_all_of_them() -> None:
    slots = WriteSlots(1)
    gates = [asyncio.Event() for _ in range(12)]
    order: list[str] = []
    flood = [asyncio.ensure_future(_hold(slots, "A", order, gates[i])) for i in range(10)]
    await asyncio.sleep(0.01)
    quiet = asyncio.ensure_future(_hold(slots, "B", order, gates[10]))
    await asyncio.sleep(0.01)
    for gate in gates:  # each holder in turn
        gate.set()
        await asyncio.sleep(0.01)
    await asyncio.wait_for(asyncio.gather(*flood, quiet), WAIT)
    assert order[:3] == ["A", "A", "B"]  # A's first held the slot; then one more of A's, then B


async def test_an_org_new_to_the_queue_goes_before_orgs_served_lately() -> None:
    slots = WriteSlots(1)
    gates = [asyncio.Event() for _ in range(6)]
    order: list[str] = []
    writers = [asyncio.ensure_future(_hold(slots, "A", order, gates[0]))]
    await asyncio.sleep(0.01)
    for i, org in enumerate(("A", "A", "B"), start=1):  # waiting: A twice, then B
        writers.append(asyncio.ensure_future(_hold(slots, org, order, gates[i])))
        await asyncio.sleep(0.01)
    gates[0].set()  # the slot goes to A's next (A and B never served: A waited first)
    await asyncio.sleep(0.01)
    writers.append(asyncio.ensure_future(_hold(slots, "C", order, gates[4])))  # C arrives
    await asyncio.sleep(0.01)
    for gate in gates[1:5]:
        gate.set()
        await asyncio.sleep(0.01)
    await asyncio.wait_for(asyncio.gather(*writers), WAIT)
    assert order == ["A", "A", "B", "C", "A"]  # a round robin gave A, A, B, A, C


async def test_a_writer_that_gives_up_while_waiting_holds_no_slot() -> None:
    slots = WriteSlots(1)
    release = asyncio.Event()
    order: list[str] = []
    holder = asyncio.ensure_future(_hold(slots, "A", order, release))
    await asyncio.sleep(0.01)
    gone = asyncio.ensure_future(_hold(slots, "B", order, release))
    await asyncio.sleep(0.01)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    assert slots.waiting == 0
    release.set()
    await asyncio.wait_for(holder, WAIT)
    assert slots.held == 0 and order == ["A"]
    async with slots.slot("C"):
        assert slots.held == 1


def test_there_is_at_least_one_slot() -> None:
    with pytest.raises(ValueError, match="capacity"):
        WriteSlots(0)


POOL = 4  # connections of the store's pool in the test below


async def test_a_flood_of_large_writes_leaves_the_calls_their_connections(
    postgres_dsn: str, new_tenant: Callable[[], Tenant], make_memory: MakeMemory
) -> None:
    """One org's twelve writes of 300 memories at once (vectors brought: nothing else slows
    them) used to hold every connection of the pool while another org's searches waited;
    they now hold at most the write slots, and the other org's search and write go on."""
    pool = await create_pool(postgres_dsn, min_size=POOL, max_size=POOL, ef_search=EF_SEARCH)
    store = PostgresMemoryStore(pool, ef_search=EF_SEARCH, write_connections=1)
    flooding_org, quiet = new_tenant().org_id, new_tenant()
    await store.upsert_memories(
        quiet.org_id, quiet.agent_id, [make_memory("quiet one", embedding=unit_vector(1))]
    )
    try:
        flood = asyncio.ensure_future(
            asyncio.gather(
                *(
                    store.upsert_memories(
                        flooding_org,
                        new_tenant().agent_id,
                        [make_memory(f"flood {n} {i}", embedding=unit_vector(i)) for i in range(300)],
                    )
                    for n in range(12)
                )
            )
        )
        for _ in range(WAIT_STEPS):  # until the flood has begun
            if pool.get_idle_size() < POOL or flood.done():
                break
            await asyncio.sleep(0.001)
        least_free, samples = POOL, 0
        while not flood.done():
            least_free = min(least_free, pool.get_idle_size() + POOL - pool.get_size())
            await asyncio.wait_for(store.search(quiet.org_id, quiet.agent_id, unit_vector(1), 5), WAIT)
            samples += 1
            await asyncio.sleep(0.005)
        await asyncio.wait_for(flood, 60)
        await asyncio.wait_for(
            store.upsert_memories(quiet.org_id, quiet.agent_id, [make_memory("quiet two")]), WAIT
        )
    finally:
        await store.aclose()
    # Searches kept answering while the flood ran (without the slots the first waited for
    # all of it), and the flood never held more than the write slot's connection.
    assert samples >= 5 and least_free >= POOL - 1
