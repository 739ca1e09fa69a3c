"""Validation of the memory API's read requests: every failure names its field, and
every amount of work a caller can ask for is bounded."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from ibex_context.errors import InvalidRequest
from ibex_context.server import read_validation
from ibex_context.server.read_validation import (
    DEFAULT_EXPORT_PAGE_SIZE,
    DEFAULT_TOP_K,
    MAX_GET_IDS,
    MAX_PAGE_SIZE,
    MAX_QUERY_CHARS,
    MAX_TOP_K,
)
from ibex_context.stores.base import ListOrder
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb

DIM = 8


def _field_of(call: object) -> str:
    assert callable(call)
    with pytest.raises(InvalidRequest) as caught:
        call()
    return caught.value.field


def test_a_page_size_of_0_means_the_default_and_others_are_bounded() -> None:
    assert read_validation.page_size(0, DEFAULT_EXPORT_PAGE_SIZE) == DEFAULT_EXPORT_PAGE_SIZE
    assert read_validation.page_size(1, 100) == 1
    assert read_validation.page_size(MAX_PAGE_SIZE, 100) == MAX_PAGE_SIZE
    for bad in (-1, MAX_PAGE_SIZE + 1):
        assert _field_of(lambda bad=bad: read_validation.page_size(bad, 100)) == "page_size"


def test_get_takes_at_most_max_get_ids_valid_ids() -> None:
    ids = [str(uuid.uuid4()) for _ in range(MAX_GET_IDS)]
    assert read_validation.get_ids(ids) == ids
    assert _field_of(lambda: read_validation.get_ids([*ids, str(uuid.uuid4())])) == "ids"
    assert _field_of(lambda: read_validation.get_ids(["not-a-uuid"])).startswith("ids")


def test_list_categories_are_normalised_deduplicated_and_known() -> None:
    query = read_validation.list_query(
        pb.ListMemoriesRequest(categories=[" Factual", "factual", "PREFERENCE"])
    )
    assert query.filters.categories == ("factual", "preference")
    assert query.order is ListOrder.CREATED_DESC  # unspecified: newest first
    assert query.page_size == read_validation.DEFAULT_LIST_PAGE_SIZE
    request = pb.ListMemoriesRequest(categories=["factual", "gossip"])
    assert _field_of(lambda: read_validation.list_query(request)) == "categories[1]"


def test_list_orders_map_to_the_store_and_unknown_ones_are_refused() -> None:
    ascending = read_validation.list_query(pb.ListMemoriesRequest(order=pb.MEMORY_ORDER_OCCURRED_ASC))
    assert ascending.order is ListOrder.OCCURRED_ASC
    assert _field_of(lambda: read_validation.list_query(pb.ListMemoriesRequest(order=99))) == "order"


def test_list_time_bounds_must_be_real_times_between_1970_and_9999() -> None:
    request = pb.ListMemoriesRequest()
    request.created_after.seconds, request.created_after.nanos = 1_700_000_000, 123_456_789
    query = read_validation.list_query(request)
    assert query.filters.created_after is not None
    assert query.filters.created_after.timestamp() == pytest.approx(1_700_000_000.123456)
    assert query.filters.created_before is None

    negative = pb.ListMemoriesRequest()
    negative.occurred_before.seconds = -1
    assert _field_of(lambda: read_validation.list_query(negative)) == "occurred_before"
    bad_nanos = pb.ListMemoriesRequest()
    bad_nanos.occurred_after.nanos = 1_000_000_000
    assert _field_of(lambda: read_validation.list_query(bad_nanos)) == "occurred_after"


def test_search_takes_exactly_one_of_text_and_vector() -> None:
    assert read_validation.search_query(pb.SearchMemoriesRequest(query="where is the key"), DIM) == (
        "where is the key",
        None,
        DEFAULT_TOP_K,
    )
    for request in (
        pb.SearchMemoriesRequest(),
        pb.SearchMemoriesRequest(query="   "),
        pb.SearchMemoriesRequest(query="both", query_embedding=[1.0] * DIM),
    ):
        assert _field_of(lambda request=request: read_validation.search_query(request, DIM)) == "query"
    too_long = pb.SearchMemoriesRequest(query="x" * (MAX_QUERY_CHARS + 1))
    assert _field_of(lambda: read_validation.search_query(too_long, DIM)) == "query"


def test_a_search_vector_is_normalised_and_must_fit_the_service() -> None:
    _, vector, _ = read_validation.search_query(
        pb.SearchMemoriesRequest(query_embedding=[3.0, 4.0] + [0.0] * 6), DIM
    )
    assert vector is not None and vector.dtype == np.float32
    np.testing.assert_allclose(vector[:2], [0.6, 0.8], rtol=1e-6)
    for embedding in ([1.0] * (DIM - 1), [0.0] * DIM, [float("nan")] + [1.0] * (DIM - 1)):
        request = pb.SearchMemoriesRequest(query_embedding=embedding)
        assert (
            _field_of(lambda request=request: read_validation.search_query(request, DIM)) == "query_embedding"
        )


def test_top_k_is_bounded() -> None:
    assert (
        read_validation.search_query(pb.SearchMemoriesRequest(query="q", top_k=MAX_TOP_K), DIM)[2]
        == MAX_TOP_K
    )
    request = pb.SearchMemoriesRequest(query="q", top_k=MAX_TOP_K + 1)
    assert _field_of(lambda: read_validation.search_query(request, DIM)) == "top_k"


def test_an_export_agent_is_optional_but_must_be_a_uuid_when_given() -> None:
    agent = str(uuid.uuid4())
    assert read_validation.optional_agent("") is None
    assert read_validation.optional_agent(agent.upper()) == agent
    assert _field_of(lambda: read_validation.optional_agent("agent-7")) == "agent_id"
