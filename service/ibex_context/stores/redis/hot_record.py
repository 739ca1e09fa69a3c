"""The hot set's records in Redis, and how a read decodes them (pure functions).

Each member of an agent's hot set is one record (format 3), all little-endian:

    header   B version=3 | I4 retrieval_count | d last_injected_at
             | d occurred_at | d confidence | d usefulness              (NaN = None)
             | I4 token counts (k) | I4 embedding dimensions (d)
             | I4 characters of: id, category, content, count keys
    numbers  k x uint32 token counts | d x float32 embedding
    text     id | category | content | count keys joined by "\\n"      (UTF-8)

The read script (``stores.redis``) returns the best records as they are stored
(any other shape costs Redis more: cutting and joining them in Lua doubled its CPU
per read, benchmarks/results/hot_read-2026-11-26.md). ``decode_records`` turns them
into records without a Python loop over per-record decoding: records that agree on
``k`` and ``d`` (those one deployment writes) share every offset, so each part of
all of them is cut by one ``map`` of a slice and joined: the headers unpack into
columns (``zip(*map(HEADER.unpack_from, ...))``), the numbers into one
``np.frombuffer`` table whose columns are the token counts and whose other columns
are the embedding matrix, the texts into one UTF-8 decode, cut at the character
offsets the headers give. The result is the pipeline's ``Candidates`` (columns):
no object is built per record but its strings and its token-count dict (by ``map``).

The injection counters are the first 13 bytes, so the Redis script that records
injections patches them in place without decoding the rest (``COUNTERS``).

Records of older formats (1 and 2, before this one) are not decoded: the read
script treats a hot set holding one as missing, so the repository rebuilds it in
the new format (see docs/adr/0003-stores.md, "Hot-set records").
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from itertools import accumulate, chain, repeat
from operator import itemgetter

import numpy as np

from ibex_context.candidates import Candidates, Rows, VectorMatrix
from ibex_context.models import FloatVector, MemoryRecord, Source

FORMAT_VERSION = 3
HEADER = struct.Struct("<BIddddIIIIII")
# The prefix the injection recorder rewrites: version, retrieval_count, last_injected_at.
COUNTERS = struct.Struct("<BId")
# Token-count keys are encoding names and "<encoding>/<format>": never a newline.
_KEY_SEPARATOR = "\n"
_NAN = math.nan


def _number(value: float | None) -> float:
    return _NAN if value is None else float(value)


def encode_record(record: MemoryRecord) -> bytes:
    keys = list(record.token_counts)
    joined_keys = _KEY_SEPARATOR.join(keys)
    embedding = b"" if record.embedding is None else np.asarray(record.embedding, dtype="<f4").tobytes()
    header = HEADER.pack(
        FORMAT_VERSION,
        record.retrieval_count,
        _number(record.last_injected_at),
        _number(record.occurred_at),
        _number(record.confidence),
        _number(record.usefulness),
        len(keys),
        len(embedding) // 4,
        len(record.id),
        len(record.category),
        len(record.content),
        len(joined_keys),
    )
    counts = np.asarray([record.token_counts[key] for key in keys], dtype="<u4").tobytes()
    text = "".join((record.id, record.category, record.content, joined_keys)).encode("utf-8")
    return b"".join((header, counts, embedding, text))


def decode_records(records: Sequence[bytes]) -> Candidates:
    """The records a read returned (all of this format: the read script checks), in its
    order, as the columns the pipeline consumes: no object per record."""
    n = len(records)
    if n == 0:
        return Candidates.empty()
    (_, counts, last, occurred, confidence, usefulness, ks, dims, *chars) = zip(
        *map(HEADER.unpack_from, records), strict=True
    )
    k, d = ks[0], dims[0]
    if ks.count(k) == n and dims.count(d) == n:
        token_values, vectors, vector_rows, text = _cut_alike(records, k, d)
    else:
        token_values, vectors, vector_rows, text = _cut_one_by_one(records, ks, dims)
    ends = list(accumulate(chain.from_iterable(zip(*chars, strict=True))))
    fields = [text[start:end] for start, end in zip([0, *ends], ends, strict=False)]
    return Candidates(
        fields[0::4],
        fields[2::4],
        fields[1::4],
        np.array(confidence, dtype=np.float64),
        np.array(usefulness, dtype=np.float64),
        np.array(counts, dtype=np.float64),
        np.array(occurred, dtype=np.float64),
        np.array(last, dtype=np.float64),
        _token_counts(fields[3::4], token_values),
        np.full(n, np.nan),
        np.full(n, np.nan),
        np.full(n, int(Source.HOT), dtype=np.int8),
        vectors,
        vector_rows,
    )


def _token_counts(joined_keys: list[str], values: list[list[int]]) -> list[Mapping[str, int]]:
    """One mapping per record, built by ``map`` (no Python loop over the records)."""
    return list(map(dict, map(zip, _count_keys(joined_keys), values)))


def _count_keys(joined: list[str]) -> Iterable[list[str]]:
    first = joined[0]
    if joined.count(first) == len(joined):
        return repeat(first.split(_KEY_SEPARATOR) if first else [], len(joined))
    return [keys.split(_KEY_SEPARATOR) if keys else [] for keys in joined]


def _cut_alike(records: Sequence[bytes], k: int, d: int) -> tuple[list[list[int]], VectorMatrix, Rows, str]:
    """Records that agree on k and d (one deployment writes no others) share their
    offsets: each part of all of them is one slice per record (``map``, no Python
    loop), joined into one table of numbers and one text."""
    n = len(records)
    text_at = HEADER.size + 4 * (k + d)
    numbers = b"".join(map(itemgetter(slice(HEADER.size, text_at)), records))
    table = np.frombuffer(numbers, dtype="<u4").reshape(n, k + d)
    text = b"".join(map(itemgetter(slice(text_at, None)), records)).decode("utf-8")
    if d:
        vectors: VectorMatrix = table[:, k:].view(np.float32)
        vector_rows = np.arange(n, dtype=np.intp)
    else:
        vectors, vector_rows = np.zeros((0, 0), dtype=np.float32), np.full(n, -1, dtype=np.intp)
    return table[:, :k].tolist(), vectors, vector_rows, text


def _cut_one_by_one(
    records: Sequence[bytes], ks: Sequence[int], dims: Sequence[int]
) -> tuple[list[list[int]], VectorMatrix, Rows, str]:
    """Records that disagree (written with other encodings, or without an embedding):
    the vectors of the most common dimension are kept (``candidates``)."""
    values: list[list[int]] = []
    embeddings: list[FloatVector | None] = []
    texts: list[bytes] = []
    for record, k, d in zip(records, ks, dims, strict=True):
        text_at = HEADER.size + 4 * (k + d)
        words = np.frombuffer(record, dtype="<u4", count=k + d, offset=HEADER.size)
        values.append(words[:k].tolist())
        embeddings.append(words[k:].view("<f4") if d else None)
        texts.append(record[text_at:])
    matrix = Candidates.from_records([MemoryRecord("", "", "", embedding=e) for e in embeddings], Source.HOT)
    return values, matrix.vectors, matrix.vector_rows, b"".join(texts).decode("utf-8")
