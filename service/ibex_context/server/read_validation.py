"""Validation of the memory API's read, export and purge requests.

Every failure names the field; page sizes, id lists and top-k are bounded so no
single call can ask a store for an unbounded amount of work.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime

import numpy as np
from google.protobuf.timestamp_pb2 import Timestamp
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb

from ibex_context.errors import InvalidRequest, LimitExceeded
from ibex_context.memory_api.reads import ListQuery
from ibex_context.models import Category, FloatVector
from ibex_context.server.validation import memory_ids, uuid_field
from ibex_context.stores.base import ListOrder, MemoryFilter

MAX_GET_IDS = 1000
MAX_PAGE_SIZE = 1000
DEFAULT_LIST_PAGE_SIZE = 100
DEFAULT_EXPORT_PAGE_SIZE = 500
MAX_TOP_K = 200
DEFAULT_TOP_K = 10
MAX_QUERY_CHARS = 8192
# Categories a list may filter by: more than there are is only repeats (a bound, not a
# setting: the categories are the proto's).
MAX_LIST_CATEGORIES = 32

_ORDERS = {
    pb.MEMORY_ORDER_UNSPECIFIED: ListOrder.CREATED_DESC,
    pb.MEMORY_ORDER_CREATED_DESC: ListOrder.CREATED_DESC,
    pb.MEMORY_ORDER_CREATED_ASC: ListOrder.CREATED_ASC,
    pb.MEMORY_ORDER_OCCURRED_DESC: ListOrder.OCCURRED_DESC,
    pb.MEMORY_ORDER_OCCURRED_ASC: ListOrder.OCCURRED_ASC,
}


def page_size(value: int, default: int, field: str = "page_size") -> int:
    if value == 0:
        return default
    if not 1 <= value <= MAX_PAGE_SIZE:
        raise InvalidRequest(field, f"must be between 1 and {MAX_PAGE_SIZE} (0 for {default}), got {value}")
    return value


def get_ids(ids: Sequence[str]) -> list[str]:
    if len(ids) > MAX_GET_IDS:
        raise InvalidRequest("ids", f"has {len(ids)} ids; at most {MAX_GET_IDS} per call")
    return memory_ids(ids)


def _time(message: pb.ListMemoriesRequest, field: str) -> datetime | None:
    if not message.HasField(field):
        return None
    stamp: Timestamp = getattr(message, field)
    if not 0 <= stamp.nanos < 1_000_000_000:
        raise InvalidRequest(field, "has nanos outside 0..999999999")
    if not 0 <= stamp.seconds <= 253_402_300_799:  # 1970 .. 9999-12-31
        raise InvalidRequest(field, "must lie between 1970 and 9999")
    return datetime.fromtimestamp(stamp.seconds, tz=UTC).replace(microsecond=stamp.nanos // 1000)


def list_query(message: pb.ListMemoriesRequest) -> ListQuery:
    if len(message.categories) > MAX_LIST_CATEGORIES:
        raise LimitExceeded(
            "max_list_categories",
            f"categories has {len(message.categories)} entries; at most {MAX_LIST_CATEGORIES} per call",
        )
    categories = []
    known = {c.value for c in Category}
    for i, category in enumerate(message.categories):
        name = category.strip().lower()
        if name not in known:
            raise InvalidRequest(f"categories[{i}]", f"unknown category; expected one of {sorted(known)}")
        categories.append(name)
    order = _ORDERS.get(message.order)
    if order is None:
        raise InvalidRequest("order", f"unknown order {message.order}")
    filters = MemoryFilter(
        categories=tuple(dict.fromkeys(categories)),
        created_after=_time(message, "created_after"),
        created_before=_time(message, "created_before"),
        occurred_after=_time(message, "occurred_after"),
        occurred_before=_time(message, "occurred_before"),
    )
    return ListQuery(
        order=order,
        filters=filters,
        page_size=page_size(message.page_size, DEFAULT_LIST_PAGE_SIZE),
        page_token=message.page_token,
        with_embedding=message.include_embedding,
    )


def search_query(
    message: pb.SearchMemoriesRequest, embedding_dim: int
) -> tuple[str, FloatVector | None, int]:
    """(query text, query vector or None to embed the text, top k)."""
    has_text, has_vector = bool(message.query.strip()), len(message.query_embedding) > 0
    if has_text == has_vector:
        raise InvalidRequest("query", "give exactly one of query (text) and query_embedding")
    if len(message.query) > MAX_QUERY_CHARS:
        raise InvalidRequest("query", f"has {len(message.query)} characters; at most {MAX_QUERY_CHARS}")
    vector = None
    if has_vector:
        vector = np.asarray(message.query_embedding, dtype=np.float32)
        if vector.shape[0] != embedding_dim:
            raise InvalidRequest(
                "query_embedding",
                f"has {vector.shape[0]} dimensions; the service is configured for {embedding_dim}",
            )
        norm = float(np.linalg.norm(vector))
        if not math.isfinite(norm) or norm == 0.0:
            raise InvalidRequest("query_embedding", "must be finite and non-zero")
        vector = vector / norm
    top_k = message.top_k or DEFAULT_TOP_K
    if not 1 <= top_k <= MAX_TOP_K:
        raise InvalidRequest(
            "top_k", f"must be between 1 and {MAX_TOP_K} (0 for {DEFAULT_TOP_K}), got {top_k}"
        )
    return message.query, vector, top_k


def optional_agent(agent_id: str) -> str | None:
    return uuid_field(agent_id, "agent_id", required=False) or None
