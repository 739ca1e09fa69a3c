"""Wire formats (``stores.postgres.codecs``): pure, no store."""

from __future__ import annotations

import gc
import struct

import numpy as np
from ibex_context.stores.postgres import (
    TokenCountsDecoder,
    decode_vectors,
)


def test_token_counts_are_parsed_once_per_distinct_text_into_one_mapping_the_collector_ignores() -> None:
    decode = TokenCountsDecoder(limit=2)
    first, second = decode('{"o200k_base": 7}'), decode('{"o200k_base": 7}')
    assert first == second == {"o200k_base": 7} and first is second  # nothing copied per row
    # Thousands are held at once: none may lengthen the cyclic collector's full collections.
    assert not gc.is_tracked(first)
    # Past its limit the memo starts over instead of growing.
    assert decode('{"a": 1}') == {"a": 1} and decode('{"b": 2}') == {"b": 2}
    assert decode('{"o200k_base": 7}') == {"o200k_base": 7}


def test_vectors_in_pgvectors_binary_form_become_one_matrix_of_the_most_common_dimension() -> None:
    def binary(*values: float) -> bytes:
        return struct.pack(">HH", len(values), 0) + np.asarray(values, dtype=">f4").tobytes()

    matrix, rows = decode_vectors([binary(1.0, 2.0), None, binary(3.0, 4.0, 5.0), binary(-1.5, 0.25)])
    assert matrix.dtype == np.float32 and matrix.tolist() == [[1.0, 2.0], [-1.5, 0.25]]
    assert rows.tolist() == [0, -1, -1, 1]
    nothing, none = decode_vectors([None, None])
    assert nothing.shape[0] == 0 and none.tolist() == [-1, -1]
