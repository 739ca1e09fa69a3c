"""MemoryClient: the write side raises typed errors; a write that failed never looks like one that worked."""

from __future__ import annotations

import numpy as np
import pytest
from ibex_context.devtools.scripted_service import closed_port
from ibex_context.models import NewMemory
from ibex_context_client import FeedbackKind, MemoryClient, MemoryClientError, MemoryRequestInvalid
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb

from tests.client.memory_service import memory_server


async def test_upsert_sends_every_field_in_batches_and_returns_one_result_per_memory() -> None:
    memories = [
        NewMemory(f"fact {i}", "factual", confidence=0.9, usefulness=0.4, metadata={"source": "import"})
        for i in range(5)
    ]
    memories[0] = NewMemory("with vector", "preference", embedding=np.array([0.5, -0.25], dtype=np.float32))
    async with memory_server() as (target, service), MemoryClient(target, batch_size=2) as client:
        results = await client.upsert_memories("org", "agent", memories)

    assert [r.outcome for r in results] == ["created"] * 5
    assert service.batches == [2, 2, 1]
    stored = list(service.memories[("org", "agent")].values())
    assert stored[0].content == "with vector" and list(stored[0].embedding) == [0.5, -0.25]
    assert stored[1].category == "factual"
    assert stored[1].confidence == pytest.approx(0.9) and stored[1].usefulness == pytest.approx(0.4)
    assert stored[1].metadata["source"] == "import"


async def test_upsert_takes_memories_already_in_wire_form_as_import_parses_them() -> None:
    wire = [pb.MemoryInput(content=f"line {i}", category="factual", confidence=0.7) for i in range(3)]
    async with memory_server() as (target, service), MemoryClient(target, batch_size=2) as client:
        results = await client.upsert_memories("org", "agent", [NewMemory("typed", "preference"), *wire])

    assert len(results) == 4 and service.batches == [2, 2]
    stored = list(service.memories[("org", "agent")].values())
    assert [m.content for m in stored] == ["typed", "line 0", "line 1", "line 2"]
    assert stored[3].confidence == pytest.approx(0.7)


async def test_directives_delete_and_feedback_round_trip() -> None:
    async with memory_server() as (target, _), MemoryClient(target) as client:
        first = await client.set_directive("org", "agent", "Be brief.")
        second = await client.set_directive("org", "agent", "Be briefer.")
        cleared = await client.clear_directive("org", "agent")
        cleared_again = await client.clear_directive("org", "agent")
        (created,) = await client.upsert_memories("org", "agent", [NewMemory("x", "factual", id="m-1")])
        deleted = await client.delete_memories("org", "agent", [created.id, "missing"])
        updates = await client.record_feedback(
            "org", "agent", {"m-1": FeedbackKind.POSITIVE, "m-2": "negative"}
        )

    assert (first, second, cleared, cleared_again, deleted) == (1, 2, True, False, 1)
    assert [(u.memory_id, u.new_usefulness) for u in updates] == [
        ("m-1", pytest.approx(0.6)),
        ("m-2", pytest.approx(0.4)),
    ]


async def test_a_rejected_request_raises_naming_the_field() -> None:
    async with memory_server() as (target, _), MemoryClient(target) as client:
        with pytest.raises(MemoryRequestInvalid) as caught:
            await client.set_directive("", "agent", "x")
    assert caught.value.field == "org_id"
    assert caught.value.method == "SetDirective"


async def test_a_failed_later_batch_says_how_many_were_written_before_it() -> None:
    memories = [NewMemory("ok", "factual"), NewMemory("ok too", "factual"), NewMemory("", "factual")]
    async with memory_server() as (target, service), MemoryClient(target, batch_size=2) as client:
        with pytest.raises(MemoryRequestInvalid) as caught:
            await client.upsert_memories("org", "agent", memories)
    assert service.batches == [2]
    assert "2 memories before this batch were written" in str(caught.value)
    assert caught.value.field == "memories[2].content"  # the caller's index, not the batch's


async def test_an_unreachable_service_raises_instead_of_pretending() -> None:
    async with MemoryClient(f"127.0.0.1:{closed_port()}", timeout=2) as client:
        with pytest.raises(MemoryClientError) as caught:
            await client.set_directive("org", "agent", "x")
    assert caught.value.reason == "client_unavailable"
    assert not isinstance(caught.value, MemoryRequestInvalid)


async def test_an_unknown_feedback_kind_is_refused_before_sending() -> None:
    async with memory_server() as (target, _), MemoryClient(target) as client:
        with pytest.raises(ValueError):
            await client.record_feedback("org", "agent", {"m-1": "ecstatic"})
