"""The hot set's records: every field the scorer reads comes back, as the columns of ``Candidates``."""

from __future__ import annotations

import numpy as np
from ibex_context.models import MemoryRecord, Source
from ibex_context.stores.redis.hot_record import COUNTERS, FORMAT_VERSION, decode_records, encode_record

from tests.stores.helpers import unit_vector

COUNTS = {"o200k_base": 7, "o200k_base/xml": 12, "cl100k_base": 8}


def stored(n: int, **fields: object) -> MemoryRecord:
    values: dict[str, object] = {
        "id": f"0f8fad5b-d9cb-469f-a165-7086772895{n:02d}",
        "content": f"Prefers tea — ☕ not coffee ({n})\nsince 2020 \U0001f375",
        "category": "preference",
        "confidence": 0.75,
        "usefulness": 0.5 + n / 100,
        "retrieval_count": n,
        "occurred_at": 1_700_000_000.25 + n,
        "last_injected_at": None if n % 2 else 1_700_000_100.5,
        "token_counts": {key: count + n for key, count in COUNTS.items()},
        "embedding": unit_vector(n),
        "similarity": 0.9,
        "source": Source.COLD,
    }
    values.update(fields)
    return MemoryRecord(**values)  # type: ignore[arg-type]


def read(records: list[MemoryRecord]) -> list[MemoryRecord]:
    """The decoded columns, one record per row (to compare them with what was written)."""
    return decode_records([encode_record(record) for record in records]).records()


def assert_same(decoded: MemoryRecord, record: MemoryRecord) -> None:
    assert (decoded.id, decoded.content, decoded.category) == (record.id, record.content, record.category)
    assert (decoded.confidence, decoded.usefulness, decoded.retrieval_count) == (
        record.confidence,
        record.usefulness,
        record.retrieval_count,
    )
    assert (decoded.occurred_at, decoded.last_injected_at) == (record.occurred_at, record.last_injected_at)
    assert decoded.token_counts == record.token_counts
    if record.embedding is None:
        assert decoded.embedding is None
    else:
        assert decoded.embedding is not None and decoded.embedding.dtype == np.float32
        np.testing.assert_array_equal(decoded.embedding, record.embedding)
    # Hot records carry no similarity: the scorer computes relevance from the embedding.
    assert decoded.similarity is None and decoded.source is Source.HOT


def test_records_read_back_in_the_order_read_with_every_field() -> None:
    records = [stored(n) for n in range(5)]
    decoded = read(records)
    assert len(decoded) == 5
    for got, record in zip(decoded, records, strict=True):
        assert_same(got, record)


def test_a_read_of_nothing_is_empty() -> None:
    assert len(decode_records([])) == 0


def test_missing_numbers_read_back_as_none() -> None:
    bare = MemoryRecord(id="x", content="c", category="factual")
    [decoded] = read([bare])
    assert (decoded.confidence, decoded.usefulness, decoded.occurred_at, decoded.last_injected_at) == (
        None,
        None,
        None,
        None,
    )
    assert decoded.embedding is None and decoded.token_counts == {}


def test_records_that_disagree_on_counts_or_embedding_read_back_each_as_written() -> None:
    # Written by versions with other encodings, or a record without an embedding.
    records = [
        stored(1),
        stored(2, token_counts={"o200k_base": 3}),
        stored(3, embedding=None),
        stored(4, token_counts={}),
    ]
    for got, record in zip(read(records), records, strict=True):
        assert_same(got, record)


def test_vectors_of_a_dimension_other_than_the_sets_most_common_read_back_as_none() -> None:
    # One matrix holds the vectors; a record written across an embedder change has a
    # vector no query of the deployment's dimension can be compared with anyway.
    records = [stored(1), stored(2, embedding=unit_vector(2)[:8]), stored(3)]
    decoded = decode_records([encode_record(record) for record in records])
    assert decoded.vectors.shape == (2, unit_vector(1).shape[0])
    assert decoded.vector_rows.tolist() == [0, -1, 1]
    assert_same(decoded.record(2), records[2])
    assert decoded.record(1).embedding is None


def test_texts_are_cut_by_characters_not_bytes() -> None:
    # Multi-byte characters before a field shift every later field's byte offset.
    records = [
        stored(1, id="é" * 3, category="ß", content="日本語のテキスト"),
        stored(2, content=""),
        stored(3, category="factual", content="plain"),
    ]
    assert [(r.id, r.category, r.content) for r in read(records)] == [
        (r.id, r.category, r.content) for r in records
    ]


def test_each_record_gets_its_own_token_counts() -> None:
    first, second = decode_records([encode_record(stored(1)), encode_record(stored(2))]).token_counts
    assert first is not second
    assert (first["o200k_base"], second["o200k_base"]) == (COUNTS["o200k_base"] + 1, COUNTS["o200k_base"] + 2)


def test_the_injection_counters_are_a_fixed_prefix_that_can_be_patched_in_place() -> None:
    record = stored(3, retrieval_count=3)
    blob = encode_record(record)
    assert blob[0] == FORMAT_VERSION
    patched = COUNTERS.pack(FORMAT_VERSION, 9, 1_700_000_123.5) + blob[COUNTERS.size :]
    [decoded] = decode_records([patched]).records()
    assert (decoded.retrieval_count, decoded.last_injected_at) == (9, 1_700_000_123.5)
    assert decoded.content == record.content and decoded.token_counts == record.token_counts
    assert decoded.embedding is not None
    np.testing.assert_array_equal(decoded.embedding, record.embedding)
