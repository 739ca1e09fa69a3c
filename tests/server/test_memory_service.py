"""MemoryService at the edge (``server/memory_service.py``): the read requests in (every
failure names its field, every amount of work a caller can ask for is bounded), a
stored row on the wire, and pages converted in chunks. The calls end to end are
test_memory_reads.py's, test_export_import.py's, test_purge.py's and test_validation.py's."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import numpy as np
import pytest
from ibex_context.errors import InvalidRequest
from ibex_context.server import memory_service
from ibex_context.server.memory_service import (
    CONVERT_CHUNK,
    DEFAULT_EXPORT_PAGE_SIZE,
    DEFAULT_TOP_K,
    MAX_GET_IDS,
    MAX_PAGE_SIZE,
    MAX_QUERY_CHARS,
    MAX_TOP_K,
    stored_memory,
)
from ibex_context.stores.base import ListOrder, StoredRow
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb

# --- the read requests in -----------------------------------------------------------

DIM = 8


def _field_of(call: object) -> str:
    assert callable(call)
    with pytest.raises(InvalidRequest) as caught:
        call()
    return caught.value.field


def test_a_page_size_of_0_means_the_default_and_others_are_bounded() -> None:
    assert memory_service.page_size(0, DEFAULT_EXPORT_PAGE_SIZE) == DEFAULT_EXPORT_PAGE_SIZE
    assert memory_service.page_size(1, 100) == 1
    assert memory_service.page_size(MAX_PAGE_SIZE, 100) == MAX_PAGE_SIZE
    for bad in (-1, MAX_PAGE_SIZE + 1):
        assert _field_of(lambda bad=bad: memory_service.page_size(bad, 100)) == "page_size"


def test_get_takes_at_most_max_get_ids_valid_ids() -> None:
    ids = [str(uuid.uuid4()) for _ in range(MAX_GET_IDS)]
    assert memory_service.get_ids(ids) == ids
    assert _field_of(lambda: memory_service.get_ids([*ids, str(uuid.uuid4())])) == "ids"
    assert _field_of(lambda: memory_service.get_ids(["not-a-uuid"])).startswith("ids")


def test_list_categories_are_normalised_deduplicated_and_known() -> None:
    query = memory_service.list_query(
        pb.ListMemoriesRequest(categories=[" Factual", "factual", "PREFERENCE"])
    )
    assert query.filters.categories == ("factual", "preference")
    assert query.order is ListOrder.CREATED_DESC  # unspecified: newest first
    assert query.page_size == memory_service.DEFAULT_LIST_PAGE_SIZE
    request = pb.ListMemoriesRequest(categories=["factual", "gossip"])
    assert _field_of(lambda: memory_service.list_query(request)) == "categories[1]"


def test_list_orders_map_to_the_store_and_unknown_ones_are_refused() -> None:
    ascending = memory_service.list_query(pb.ListMemoriesRequest(order=pb.MEMORY_ORDER_OCCURRED_ASC))
    assert ascending.order is ListOrder.OCCURRED_ASC
    assert _field_of(lambda: memory_service.list_query(pb.ListMemoriesRequest(order=99))) == "order"


def test_list_time_bounds_must_be_real_times_between_1970_and_9999() -> None:
    request = pb.ListMemoriesRequest()
    request.created_after.seconds, request.created_after.nanos = 1_700_000_000, 123_456_789
    query = memory_service.list_query(request)
    assert query.filters.created_after is not None
    assert query.filters.created_after.timestamp() == pytest.approx(1_700_000_000.123456)
    assert query.filters.created_before is None

    negative = pb.ListMemoriesRequest()
    negative.occurred_before.seconds = -1
    assert _field_of(lambda: memory_service.list_query(negative)) == "occurred_before"
    bad_nanos = pb.ListMemoriesRequest()
    bad_nanos.occurred_after.nanos = 1_000_000_000
    assert _field_of(lambda: memory_service.list_query(bad_nanos)) == "occurred_after"


def test_search_takes_exactly_one_of_text_and_vector() -> None:
    assert memory_service.search_query(pb.SearchMemoriesRequest(query="where is the key"), DIM) == (
        "where is the key",
        None,
        DEFAULT_TOP_K,
    )
    for request in (
        pb.SearchMemoriesRequest(),
        pb.SearchMemoriesRequest(query="   "),
        pb.SearchMemoriesRequest(query="both", query_embedding=[1.0] * DIM),
    ):
        assert _field_of(lambda request=request: memory_service.search_query(request, DIM)) == "query"
    too_long = pb.SearchMemoriesRequest(query="x" * (MAX_QUERY_CHARS + 1))
    assert _field_of(lambda: memory_service.search_query(too_long, DIM)) == "query"


def test_a_search_vector_is_normalised_and_must_fit_the_service() -> None:
    _, vector, _ = memory_service.search_query(
        pb.SearchMemoriesRequest(query_embedding=[3.0, 4.0] + [0.0] * 6), DIM
    )
    assert vector is not None and vector.dtype == np.float32
    np.testing.assert_allclose(vector[:2], [0.6, 0.8], rtol=1e-6)
    for embedding in ([1.0] * (DIM - 1), [0.0] * DIM, [float("nan")] + [1.0] * (DIM - 1)):
        request = pb.SearchMemoriesRequest(query_embedding=embedding)
        assert (
            _field_of(lambda request=request: memory_service.search_query(request, DIM)) == "query_embedding"
        )


def test_top_k_is_bounded() -> None:
    assert (
        memory_service.search_query(pb.SearchMemoriesRequest(query="q", top_k=MAX_TOP_K), DIM)[2] == MAX_TOP_K
    )
    request = pb.SearchMemoriesRequest(query="q", top_k=MAX_TOP_K + 1)
    assert _field_of(lambda: memory_service.search_query(request, DIM)) == "top_k"


def test_an_export_agent_is_optional_but_must_be_a_uuid_when_given() -> None:
    agent = str(uuid.uuid4())
    assert memory_service.optional_agent("") is None
    assert memory_service.optional_agent(agent.upper()) == agent
    assert _field_of(lambda: memory_service.optional_agent("agent-7")) == "agent_id"


# --- the answers out ----------------------------------------------------------------


def _row(n: int = 0, **changes: object) -> StoredRow:
    fields: dict[str, object] = {
        "agent_id": "6f1c2a54-0000-4000-8000-000000000001",
        "id": f"6f1c2a54-0000-4000-8000-{n:012d}",
        "content": f"memory {n}",
        "category": "factual",
        "confidence": 0.75,
        "usefulness": 0.5,
        "metadata": {},
        "occurred_at": 1_700_000_000_123_456,
        "created_at": 1_700_000_001_000_000,
        "updated_at": 1_700_000_002_000_001,
        "retrieval_count": 3,
        "last_injected_at": None,
        "embedding": None,
    }
    fields.update(changes)
    return StoredRow(**fields)  # type: ignore[arg-type]


def test_a_stored_row_keeps_its_microseconds_on_the_wire() -> None:
    message = stored_memory(_row())

    assert (message.occurred_at.seconds, message.occurred_at.nanos) == (1_700_000_000, 123_456_000)
    assert (message.updated_at.seconds, message.updated_at.nanos) == (1_700_000_002, 1_000)
    assert (message.id, message.content, message.category) == (_row().id, "memory 0", "factual")
    assert message.retrieval_count == 3 and message.confidence == 0.75


def test_what_a_row_lacks_is_left_unset_and_what_it_has_is_carried() -> None:
    bare = stored_memory(_row())
    assert not bare.HasField("last_injected_at") and len(bare.embedding) == 0 and not bare.metadata

    full = stored_memory(
        _row(
            last_injected_at=1_700_000_003_000_000,
            metadata={"source": "chat", "turn": 4},
            embedding=np.array([0.6, 0.8], dtype=np.float32),
        )
    )
    assert full.last_injected_at.seconds == 1_700_000_003
    assert dict(full.metadata) == {"source": "chat", "turn": 4}
    assert list(full.embedding) == [np.float32(0.6), np.float32(0.8)]


async def test_a_page_is_converted_in_order_yielding_to_the_loop_between_chunks() -> None:
    rows = [_row(n) for n in range(2 * CONVERT_CHUNK + 5)]
    ticks = 0

    async def count_ticks() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(count_ticks())
    await asyncio.sleep(0)
    before = ticks
    messages = await memory_service._converted(rows)
    ticker.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await ticker

    assert [m.id for m in messages] == [r.id for r in rows]
    # Three chunks: the loop ran other work at least between them.
    assert ticks - before >= 2
