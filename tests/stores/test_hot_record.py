"""The hot set's compact record form round-trips every field the scorer reads."""

from __future__ import annotations

import numpy as np
from ibex_context.models import MemoryRecord, Source
from ibex_context.stores.hot_record import decode_record, encode_record

from tests.stores.helpers import unit_vector


def test_a_record_round_trips_with_its_embedding_as_float32() -> None:
    record = MemoryRecord(
        id="0f8fad5b-d9cb-469f-a165-70867728950e",
        content="Prefers tea — ☕ not coffee",
        category="preference",
        confidence=0.75,
        usefulness=0.5,
        retrieval_count=3,
        created_at=1_700_000_000.25,
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
    assert (decoded.created_at, decoded.last_injected_at) == (1_700_000_000.25, None)
    assert decoded.token_counts == {"o200k_base": 7, "cl100k_base": 8}
    # Hot records carry no similarity: the scorer computes relevance from the embedding.
    assert decoded.similarity is None and decoded.source is Source.HOT


def test_an_unknown_format_version_is_skipped() -> None:
    blob = encode_record(MemoryRecord(id="x", content="c", category="factual"))
    assert decode_record(b"\x02" + blob[1:]) is None
