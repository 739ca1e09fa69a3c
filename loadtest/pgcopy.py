"""PostgreSQL's binary COPY format, written by hand for bulk loads (pure functions).

A worker process encodes its rows straight to the bytes ``COPY ... FROM STDIN
(FORMAT binary)`` reads, so the process that talks to PostgreSQL only forwards
buffers: no per-row Python objects cross the process boundary and no per-value
encoding happens on the event loop (the seeder's rows are ~2.5 kB, 1.5 kB of it
the vector). Layouts are PostgreSQL's send functions: uuid 16 bytes, text and
bytea raw, real and integer big-endian, timestamptz microseconds since
2000-01-01 UTC, jsonb a version byte then the text, pgvector's vector a uint16
dimension, a uint16 zero and big-endian float32s.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

import numpy as np

# Signature, flags (no OIDs), header extension length.
HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
TRAILER = struct.pack(">h", -1)
_NULL = struct.pack(">i", -1)
_POSTGRES_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)

_int16 = struct.Struct(">h").pack
_int32 = struct.Struct(">i").pack
_int64 = struct.Struct(">q").pack
_float32 = struct.Struct(">f").pack
_vector_header = struct.Struct(">HH").pack


def row(fields: Sequence[bytes | None]) -> bytes:
    """One tuple: the field count, then each field's length and bytes (NULL: -1)."""
    parts = [_int16(len(fields))]
    for value in fields:
        parts.append(_NULL if value is None else _int32(len(value)) + value)
    return b"".join(parts)


def uuid_value(value: uuid.UUID) -> bytes:
    return value.bytes


def text_value(value: str) -> bytes:
    return value.encode("utf-8")


def real_value(value: float) -> bytes:
    return _float32(value)


def integer_value(value: int) -> bytes:
    return _int32(value)


def timestamptz_value(value: datetime | None) -> bytes | None:
    if value is None:
        return None
    delta = value - _POSTGRES_EPOCH
    return _int64((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds)


def jsonb_value(json_text: str) -> bytes:
    return b"\x01" + json_text.encode("utf-8")


def vector_values(vectors: np.ndarray) -> list[bytes]:
    """pgvector's binary form of each row of a (rows, dim) matrix."""
    big_endian = np.ascontiguousarray(vectors, dtype=">f4")
    header = _vector_header(big_endian.shape[1], 0)
    return [header + vector.tobytes() for vector in big_endian]
