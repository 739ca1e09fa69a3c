"""The hot set's compact record form round-trips every field the scorer reads."""

from __future__ import annotations

import json
import struct

import numpy as np
from ibex_context.models import MemoryRecord, Source
from ibex_context.stores.hot_record import COUNTERS, FORMAT_VERSION, decode_record, encode_record

from tests.stores.helpers import unit_vector


def test_a_record_round_trips_with_its_embedding_as_float32() -> None:
    record = MemoryRecord(
        id="0f8fad5b-d9cb-469f-a165-70867728950e",
        content="Prefers tea — ☕ not coffee",
        category="preference",
        confidence=0.75,
        usefulness=0.5,
        retrieval_count=3,
        occurred_at=1_700_000_000.25,
        last_injected_at=None,
        token_counts={"o200k_base": 7, "cl100k_base": 8},
        embedding=unit_vector(4),
        similarity=0.9,
        source=Source.COLD,
    )
    decoded = decode_record(encode_record(record))
    assert decoded is not None
    assert decoded.embedding is not None and decoded.embedding.dtype == np.float32
    np.testing.assert_array_equal(decoded.embedding, record.embedding)
    assert (decoded.id, decoded.content, decoded.category) == (record.id, record.content, record.category)
    assert (decoded.confidence, decoded.usefulness, decoded.retrieval_count) == (0.75, 0.5, 3)
    assert (decoded.occurred_at, decoded.last_injected_at) == (1_700_000_000.25, None)
    assert decoded.token_counts == {"o200k_base": 7, "cl100k_base": 8}
    # Hot records carry no similarity: the scorer computes relevance from the embedding.
    assert decoded.similarity is None and decoded.source is Source.HOT


def test_an_unknown_format_version_is_skipped() -> None:
    blob = encode_record(MemoryRecord(id="x", content="c", category="factual"))
    assert decode_record(b"\x03" + blob[1:]) is None


def test_missing_numbers_round_trip_as_none() -> None:
    decoded = decode_record(encode_record(MemoryRecord(id="x", content="c", category="factual")))
    assert decoded is not None
    assert (decoded.confidence, decoded.usefulness, decoded.occurred_at, decoded.last_injected_at) == (
        None,
        None,
        None,
        None,
    )
    assert decoded.embedding is None and decoded.token_counts == {}


def test_the_injection_counters_are_a_fixed_prefix_that_can_be_patched_in_place() -> None:
    record = MemoryRecord(
        id="x", content="c", category="factual", retrieval_count=3, embedding=unit_vector(5)
    )
    blob = encode_record(record)
    patched = COUNTERS.pack(FORMAT_VERSION, 9, 1_700_000_123.5) + blob[COUNTERS.size :]
    decoded = decode_record(patched)
    assert decoded is not None
    assert (decoded.retrieval_count, decoded.last_injected_at) == (9, 1_700_000_123.5)
    assert decoded.embedding is not None
    np.testing.assert_array_equal(decoded.embedding, record.embedding)


def test_records_written_in_format_1_are_still_read() -> None:
    fields = {"i": "x", "c": "tea", "k": "preference", "f": 0.5, "u": 0.25, "n": 2, "t": 1.0, "l": None}
    body = json.dumps({**fields, "o": {"o200k_base": 1}}).encode()
    vector = unit_vector(6).astype("<f4")
    blob = struct.pack("<BI", 1, len(body)) + body + vector.tobytes()
    decoded = decode_record(blob)
    assert decoded is not None
    assert (decoded.content, decoded.category, decoded.retrieval_count) == ("tea", "preference", 2)
    assert decoded.embedding is not None
    np.testing.assert_array_equal(decoded.embedding, vector)
