"""How values cross the wire to and from PostgreSQL: pure functions, no I/O.

pgvector's binary ``vector`` (to numpy and back), ``jsonb`` through ``json``,
``token_counts`` text parsed once per distinct value, and tenant ids checked as UUIDs
(bad input names its field).
"""

from __future__ import annotations

import json
import re
import struct
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg
import numpy as np
import numpy.typing as npt

from ibex_context.errors import InvalidRequest
from ibex_context.models import FloatVector


class VectorParam:
    """Wraps a vector inside a ``vector[]`` parameter: asyncpg would iterate a bare
    numpy array as a nested array dimension."""

    __slots__ = ("array",)

    def __init__(self, array: FloatVector) -> None:
        self.array = array


def encode_vector(value: Any) -> bytes:
    if isinstance(value, VectorParam):
        value = value.array
    array = np.asarray(value, dtype=">f4")
    if array.ndim != 1:
        raise ValueError("a vector must be one-dimensional")
    return struct.pack(">HH", array.shape[0], 0) + array.tobytes()


def decode_vector(data: bytes) -> FloatVector:
    (dim,) = struct.unpack_from(">H", data)
    return np.frombuffer(data, dtype=">f4", count=dim, offset=4).astype(np.float32)


async def init_connection(conn: asyncpg.Connection) -> None:
    """Sets a pooled connection's codecs: binary ``vector`` <-> numpy, ``jsonb`` <-> json."""
    await conn.set_type_codec(
        "vector", schema="public", encoder=encode_vector, decoder=decode_vector, format="binary"
    )
    await conn.set_type_codec("jsonb", schema="pg_catalog", encoder=json.dumps, decoder=json.loads)


# Lowercase hyphenated UUID text, as str(uuid.UUID) writes it (a regex match is
# several times cheaper than parsing).
CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def as_uuid(value: str, field: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except (ValueError, AttributeError, TypeError):
        raise InvalidRequest(field, "must be a UUID") from None


NO_VECTORS = np.zeros((0, 0), dtype=np.float32)
# pgvector's binary vector: uint16 dimensions, uint16 unused, then big-endian float32s.
_VECTOR_HEADER_BYTES = 4


def decode_vectors(values: Sequence[bytes | None]) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.intp]]:
    """Vectors in ``vector_send`` form as one matrix and each value's row of it (-1: none);
    all of one length (one deployment writes one dimension) are decoded in one go."""
    lengths = [len(v) if v is not None else -1 for v in values]
    length = max(dict.fromkeys(lengths), key=lengths.count)
    if length < 0:
        return NO_VECTORS, np.full(len(values), -1, dtype=np.intp)
    alike = [i for i, n in enumerate(lengths) if n == length]
    present = [v for v in values if v is not None and len(v) == length]
    buffer = b"".join(present)
    words = np.frombuffer(buffer, dtype=">f4").reshape(len(alike), length // 4)
    rows = np.full(len(values), -1, dtype=np.intp)
    rows[alike] = np.arange(len(alike))
    return words[:, _VECTOR_HEADER_BYTES // 4 :].astype(np.float32), rows


def epoch(value: float | None) -> float | None:
    return None if value is None else float(value)


class TokenCountsDecoder:
    """Parses ``token_counts`` JSON text, each distinct text once.

    Rows repeat the same few small objects (two encodings, counts in the low
    hundreds), so a bounded memo turns ~50 ``json.loads`` per search into dictionary
    look-ups. Equal texts share one mapping, typed read-only (``Mapping``): nothing is
    copied per row. A plain dict of strings to ints, not a ``MappingProxyType``: the
    collector does not track it, where 8,192 tracked proxies lengthened every full
    collection on the request path.
    """

    __slots__ = ("_limit", "_parsed")

    def __init__(self, limit: int = 8192) -> None:
        self._limit = limit
        self._parsed: dict[str, Mapping[str, int]] = {}

    def __call__(self, text: str) -> Mapping[str, int]:
        counts = self._parsed.get(text)
        if counts is None:
            if len(self._parsed) >= self._limit:
                self._parsed.clear()
            counts = self._parsed[text] = json.loads(text)
        return counts
