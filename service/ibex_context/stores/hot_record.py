"""The compact form of a memory inside the Redis hot set (pure functions).

Format 2 (written), all little-endian:

    header  B version=2 | I4 retrieval_count | d last_injected_at
            | d occurred_at | d confidence | d usefulness          (NaN = None)
            | H len(id) | H len(category) | I4 len(content) | H len(token_counts)
    body    id | category | content (UTF-8) | token_counts (JSON) | float32 embedding

Numbers live at fixed offsets so decoding is one ``struct.unpack_from``, the text
is sliced and decoded without a JSON pass (JSON-parsing the content was the largest
part of decoding format 1), and the embedding is one ``np.frombuffer``. The
injection counters are the first 13 bytes, so the Redis script that records
injections (``stores.redis``) patches them in place without decoding the rest.

Format 1 (``b"\\x01" | uint32 n | n bytes of JSON | float32 embedding``) is still
read, so hot sets written before an upgrade keep serving until their TTL; any
other version byte is skipped (a record from a newer format).
"""

from __future__ import annotations

import json
import math
import struct

import numpy as np

from ibex_context.models import MemoryRecord, Source

FORMAT_VERSION = 2
_V1 = 1
_V1_HEADER = struct.Struct("<BI")
HEADER = struct.Struct("<BIddddHHIH")
# The prefix the injection recorder rewrites: version, retrieval_count, last_injected_at.
COUNTERS = struct.Struct("<BId")
_NAN = math.nan


def _number(value: float | None) -> float:
    return _NAN if value is None else float(value)


def _optional(value: float) -> float | None:
    return None if value != value else value  # NaN encodes None


def encode_record(record: MemoryRecord) -> bytes:
    ident = record.id.encode("utf-8")
    category = record.category.encode("utf-8")
    content = record.content.encode("utf-8")
    counts = json.dumps(dict(record.token_counts), separators=(",", ":")).encode("utf-8")
    embedding = b"" if record.embedding is None else np.asarray(record.embedding, dtype="<f4").tobytes()
    header = HEADER.pack(
        FORMAT_VERSION,
        record.retrieval_count,
        _number(record.last_injected_at),
        _number(record.occurred_at),
        _number(record.confidence),
        _number(record.usefulness),
        len(ident),
        len(category),
        len(content),
        len(counts),
    )
    return b"".join((header, ident, category, content, counts, embedding))


def decode_record(data: bytes) -> MemoryRecord | None:
    """The record, or None for a format this version does not know."""
    if data[0] == _V1:
        return _decode_v1(data)
    if data[0] != FORMAT_VERSION:
        return None
    (_, count, last, created, confidence, usefulness, n_id, n_cat, n_content, n_counts) = HEADER.unpack_from(
        data
    )
    start = HEADER.size
    cat_at = start + n_id
    content_at = cat_at + n_cat
    counts_at = content_at + n_content
    vector_at = counts_at + n_counts
    return MemoryRecord(
        data[start:cat_at].decode("utf-8"),
        data[content_at:counts_at].decode("utf-8"),
        data[cat_at:content_at].decode("utf-8"),
        _optional(confidence),
        _optional(usefulness),
        count,
        _optional(created),
        _optional(last),
        json.loads(data[counts_at:vector_at]),
        np.frombuffer(data, dtype="<f4", offset=vector_at) if len(data) > vector_at else None,
        None,
        Source.HOT,
    )


def _decode_v1(data: bytes) -> MemoryRecord:
    _, length = _V1_HEADER.unpack_from(data)
    start = _V1_HEADER.size
    fields = json.loads(data[start : start + length])
    tail = len(data) - start - length
    embedding = np.frombuffer(data, dtype="<f4", offset=start + length) if tail else None
    return MemoryRecord(
        id=fields["i"],
        content=fields["c"],
        category=fields["k"],
        confidence=fields["f"],
        usefulness=fields["u"],
        retrieval_count=fields["n"],
        occurred_at=fields["t"],
        last_injected_at=fields["l"],
        token_counts=fields["o"],
        embedding=embedding,
        similarity=None,
        source=Source.HOT,
    )
