"""Upserts, deletes and directives (``stores.postgres.writes``) on the real PostgreSQL."""

from __future__ import annotations

import uuid

import asyncpg
import pytest
from ibex_context.errors import InvalidRequest
from ibex_context.stores.postgres import (
    PostgresMemoryStore,
)

from tests.conftest import Tenant
from tests.stores.helpers import MakeMemory, records, unit_vector


async def test_upserting_new_texts_creates_them_in_input_order(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    batch = [make_memory(f"fact number {i}") for i in range(5)]
    results = await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, batch)
    assert [r.id for r in results] == [m.id for m in batch]
    assert {r.outcome for r in results} == {"created"}
    assert await pg_store.count_memories(tenant.org_id, tenant.agent_id) == 5


async def test_reupserting_the_same_text_is_unchanged_and_keeps_the_first_id(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    first = make_memory("The user's name is Priya")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [first])
    again = make_memory("The user's name is Priya")  # same text, a different generated id
    [result] = await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [again])
    assert (result.id, result.outcome) == (first.id, "unchanged")
    assert await pg_store.count_memories(tenant.org_id, tenant.agent_id) == 1


async def test_same_text_with_changed_fields_is_updated_in_place(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    first = make_memory("Prefers metric units", category="preference", confidence=0.6)
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [first])
    changed = make_memory("Prefers metric units", category="preference", confidence=0.9, metadata={"k": 1})
    [result] = await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [changed])
    assert (result.id, result.outcome) == (first.id, "updated")
    [stored] = await pg_store.fetch_memories(tenant.org_id, tenant.agent_id, [first.id])
    assert stored.confidence == pytest.approx(0.9)


async def test_an_existing_id_with_new_text_replaces_the_content(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    first = make_memory("Lives in Lisbon")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [first])
    moved = make_memory("Lives in Porto", id=first.id)
    [result] = await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [moved])
    assert (result.id, result.outcome) == (first.id, "updated")
    [stored] = await pg_store.fetch_memories(tenant.org_id, tenant.agent_id, [first.id])
    assert stored.content == "Lives in Porto"
    # The old text is free again: storing it creates a new memory.
    [again] = await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [make_memory("Lives in Lisbon")])
    assert again.outcome == "created"


async def test_duplicates_inside_one_batch_are_stored_once(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    a, b = make_memory("Owns a cat"), make_memory("Owns a cat")
    results = await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [a, b])
    assert [(r.id, r.outcome) for r in results] == [(a.id, "created"), (a.id, "unchanged")]
    assert await pg_store.count_memories(tenant.org_id, tenant.agent_id) == 1


async def test_delete_removes_only_the_named_memories_of_that_agent(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    keep, gone = make_memory("keep me"), make_memory("delete me")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [keep, gone])
    other_org = Tenant(org_id=str(uuid.uuid4()), agent_id=tenant.agent_id)
    assert await pg_store.delete_memories(other_org.org_id, other_org.agent_id, [gone.id]) == 0
    assert await pg_store.delete_memories(tenant.org_id, tenant.agent_id, [gone.id]) == 1
    remaining = await pg_store.fetch_memories(tenant.org_id, tenant.agent_id, [keep.id, gone.id])
    assert [m.id for m in remaining] == [keep.id]


async def test_the_same_agent_id_under_another_org_sees_nothing(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    memory = make_memory("secret of org A")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [memory])
    other_org = str(uuid.uuid4())
    assert records(await pg_store.search(other_org, tenant.agent_id, memory.embedding, 10)) == []
    assert await pg_store.fetch_memories(other_org, tenant.agent_id, [memory.id]) == []
    assert await pg_store.top_memories_for_hot_set(other_org, tenant.agent_id, 50) == []
    # The same text in the other org is a separate memory, not a duplicate.
    [result] = await pg_store.upsert_memories(other_org, tenant.agent_id, [make_memory("secret of org A")])
    assert result.outcome == "created" and result.id != memory.id


async def test_directive_versions_increase_across_set_and_clear(
    pg_store: PostgresMemoryStore, tenant: Tenant
) -> None:
    org, agent = tenant.org_id, tenant.agent_id
    assert await pg_store.get_directive(org, agent) is None
    brief = await pg_store.set_directive(org, agent, "Be brief.", {"o200k_base": 3})
    assert await pg_store.set_directive(org, agent, "Be brief.", {"o200k_base": 3}) == brief  # unchanged
    kind = await pg_store.set_directive(org, agent, "Be kind.", {"o200k_base": 3})
    assert kind > brief > 0
    directive = await pg_store.get_directive(org, agent)
    assert directive is not None
    assert (directive.content, directive.version, dict(directive.token_counts)) == (
        "Be kind.",
        kind,
        {"o200k_base": 3},
    )
    assert await pg_store.clear_directive(org, agent) is True
    assert await pg_store.clear_directive(org, agent) is False
    assert await pg_store.get_directive(org, agent) is None
    cleared = (await pg_store.get_directive_state(org, agent)).version
    assert cleared > kind
    assert await pg_store.set_directive(org, agent, "Be brief.", {}) > cleared


async def test_a_deleted_row_does_not_restart_directive_versions(
    pg_store: PostgresMemoryStore, tenant: Tenant
) -> None:
    # A purge deletes the row; the cache's tombstone is above every version handed out
    # before it, so the next directive must be above them too (migrations 0014, 0017).
    org, agent = tenant.org_id, tenant.agent_id
    first = await pg_store.set_directive(org, agent, "Be brief.", {})
    await pg_store.pool.execute(
        "DELETE FROM directives WHERE org_id = $1::uuid AND agent_id = $2::uuid", org, agent
    )
    assert await pg_store.set_directive(org, agent, "Be kind.", {}) > first


async def test_directive_versions_tell_the_time_of_the_write_not_other_tenants_write_rate(
    pg_store: PostgresMemoryStore, tenant: Tenant
) -> None:
    """From one deployment-wide sequence, the gap between two versions of A's directive
    was the number of directive writes every other tenant made in between."""
    org, agent = tenant.org_id, tenant.agent_id
    other_org = str(uuid.uuid4())

    async def clock() -> int:
        return int(await pg_store.pool.fetchval("SELECT directive_clock_version()"))

    first = await pg_store.set_directive(org, agent, "Be brief.", {})
    for i in range(50):
        await pg_store.set_directive(other_org, agent, f"other tenant's directive {i}", {})
    before = await clock()
    second = await pg_store.set_directive(org, agent, "Be kind.", {})
    after = await clock()
    assert first < second
    # The write's own time on the primary's clock: nothing counted across tenants.
    assert before <= second <= after
    cleared_before = await clock()
    assert await pg_store.clear_directive(org, agent) is True
    cleared = (await pg_store.get_directive_state(org, agent)).version
    assert cleared_before <= cleared <= await clock()


async def test_ids_that_are_not_uuids_are_rejected_naming_the_field(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    with pytest.raises(InvalidRequest, match="org_id"):
        records(await pg_store.search("not-a-uuid", tenant.agent_id, unit_vector(1), 5))
    with pytest.raises(InvalidRequest, match=r"ids\[1\]"):
        await pg_store.delete_memories(tenant.org_id, tenant.agent_id, [make_memory("x").id, "nope"])


async def test_vectors_are_stored_inline(postgres_dsn: str) -> None:
    conn = await asyncpg.connect(postgres_dsn)
    try:
        storage = await conn.fetchval(
            "SELECT attstorage::text FROM pg_attribute"
            " WHERE attrelid = 'memories'::regclass AND attname = 'embedding'"
        )
    finally:
        await conn.close()
    assert storage == "p"  # PLAIN: never TOASTed, so the exact scan reads no TOAST pages


async def test_occurred_at_is_stored_kept_on_updates_that_omit_it_and_defaults_to_the_write_time(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    imported = make_memory("met Ana at the Lisbon conference", occurred_at=1_683_554_160.5)
    fresh = make_memory("prefers window seats")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [imported, fresh])
    # The same text again without a time: unchanged, and the imported time stays.
    [again] = await pg_store.upsert_memories(
        tenant.org_id, tenant.agent_id, [make_memory("met Ana at the Lisbon conference")]
    )
    assert again.outcome == "unchanged"
    # A new time for the same text is an update.
    [moved] = await pg_store.upsert_memories(
        tenant.org_id, tenant.agent_id, [make_memory("prefers window seats", occurred_at=1_600_000_000.0)]
    )
    assert moved.outcome == "updated"
    stored = {
        m.content: m.occurred_at
        for m in await pg_store.fetch_memories(tenant.org_id, tenant.agent_id, [imported.id, fresh.id])
    }
    assert stored["met Ana at the Lisbon conference"] == pytest.approx(1_683_554_160.5)
    assert stored["prefers window seats"] == pytest.approx(1_600_000_000.0)
