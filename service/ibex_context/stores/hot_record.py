"""The compact form of a memory inside the Redis hot set (pure functions).

    b"\\x01" | uint32 LE n | n bytes of JSON | float32 LE embedding

The JSON holds the scalar fields and token counts with short keys; the embedding
is raw float32 so decoding it is one ``np.frombuffer`` (no base64, no per-float
parsing). The version byte lets a reader skip records written by a newer format.
"""

from __future__ import annotations

import json
import struct

import numpy as np

from ibex_context.models import MemoryRecord, Source

FORMAT_VERSION = 1
_HEADER = struct.Struct("<BI")


def encode_record(record: MemoryRecord) -> bytes:
    fields = {
        "i": record.id,
        "c": record.content,
        "k": record.category,
        "f": record.confidence,
        "u": record.usefulness,
        "n": record.retrieval_count,
        "t": record.created_at,
        "l": record.last_injected_at,
        "o": dict(record.token_counts),
    }
    body = json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    embedding = b"" if record.embedding is None else np.asarray(record.embedding, dtype="<f4").tobytes()
    return _HEADER.pack(FORMAT_VERSION, len(body)) + body + embedding


def decode_record(data: bytes) -> MemoryRecord | None:
    """The record, or None for a format this version does not know."""
    version, length = _HEADER.unpack_from(data)
    if version != FORMAT_VERSION:
        return None
    start = _HEADER.size
    fields = json.loads(data[start : start + length])
    tail = len(data) - start - length
    embedding = (
        np.frombuffer(data, dtype="<f4", offset=start + length).astype(np.float32, copy=False)
        if tail
        else None
    )
    return MemoryRecord(
        id=fields["i"],
        content=fields["c"],
        category=fields["k"],
        confidence=fields["f"],
        usefulness=fields["u"],
        retrieval_count=fields["n"],
        created_at=fields["t"],
        last_injected_at=fields["l"],
        token_counts=fields["o"],
        embedding=embedding,
        similarity=None,
        source=Source.HOT,
    )
