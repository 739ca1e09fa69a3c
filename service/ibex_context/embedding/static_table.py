"""A static query embedder distilled from all-MiniLM-L6-v2's own weights: one vector per
word piece, a query's vector their normalised sum (``IBEX_EMBEDDING_QUERY_MODEL``).

The table is the model's answer for each word piece of its vocabulary alone (``[CLS]
piece [SEP]`` through the fp32 graph, mean-pooled), the way model2vec distils a static
model, then post-processed as "all but the top" (Mu & Viswanath, 2018): the mean over the
ordinary pieces is subtracted and the ``DROPPED_COMPONENTS`` directions the pieces share
most are projected out, so a query's sum is not dominated by what every piece has in
common. Nothing is trained and no corpus is read: the table is a function of the packaged
weights and the two constants below.

Its vectors live in the same 384 dimensions as the stored ones (MiniLM fp32), so a query
embedded here is searched against every stored memory without re-embedding anything. A
query costs a tokenisation and a sum of a few rows: tens of microseconds, no worker
thread, no queue. It is not MiniLM: its cosines to the stored vectors run lower (about
0.6 times MiniLM's on LoCoMo), and which queries it serves is the quality benchmark's
call (benchmarks/results/embedding-turns-2026-12-06.md §5).

The table (30,522 x 384 float32, 47 MB) is built once like the graphs: at image build
(``python -m ibex_context.embedding.model_files DIR`` writes it beside the graphs) or at the
first start of a checkout into the graph cache directory, in about 20 s of one core.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from ibex_context.embedding.minilm_graph import (
    GRAPH_VERSION,
    ensure_graph,
    open_session,
    weights_version,
    write_atomically,
)
from ibex_context.embedding.minilm_reference import HIDDEN
from ibex_context.models import FloatVector

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# What embeds a minilm embedder's queries (``IBEX_EMBEDDING_QUERY_MODEL``): MiniLM; the
# table alone; or the table first (the vector search starts with its vector at once) and
# MiniLM's vector, when in time, scoring what that search found (``pipeline.retrieval``).
QueryModel = Literal["minilm", "static", "static-first"]

# Bump when the table's computation changes: cached tables are rebuilt.
TABLE_VERSION = 1
# The shared directions projected out of every piece's vector. "All but the top" suggests
# about dims / 100 (4 here); on the LoCoMo dev conversations' questions against MiniLM's
# stored vectors, cosine recall@20 was 31.3 % with none, 32.1 % with 3, 34.8 % with 10
# (MiniLM's own queries: 32.5 %).
DROPPED_COMPONENTS = 10
# Pieces run through the model at once while the table is built.
_BUILD_BATCH = 1024

_F32 = npt.NDArray[np.float32]


def table_file_name() -> str:
    """``all-MiniLM-L6-v2-w<weights version>-g<GRAPH_VERSION>-static<TABLE_VERSION>.npy``."""
    return f"all-MiniLM-L6-v2-w{weights_version()}-g{GRAPH_VERSION}-static{TABLE_VERSION}.npy"


def _special_id(tokenizer: Tokenizer, piece: str) -> int:
    index = tokenizer.token_to_id(piece)
    if index is None:
        raise ValueError(f"static table: the vocabulary has no {piece}")
    return int(index)


def _ordinary(tokenizer: Tokenizer) -> npt.NDArray[np.bool_]:
    """Which ids are word pieces, not ``[PAD]``, ``[CLS]``, ``[unused0]`` and the like."""
    ordinary = np.ones(tokenizer.get_vocab_size(), dtype=np.bool_)
    for piece, index in tokenizer.get_vocab().items():
        if piece.startswith("[") and piece.endswith("]"):
            ordinary[index] = False
    return ordinary


def distil_table(session: Any, tokenizer: Tokenizer, *, dropped: int = DROPPED_COMPONENTS) -> _F32:
    """Each word piece's row: its vector alone from ``session`` (the fp32 graph), centred
    on the ordinary pieces' mean, with their ``dropped`` top principal directions removed."""
    size = tokenizer.get_vocab_size()
    cls, sep = _special_id(tokenizer, "[CLS]"), _special_id(tokenizer, "[SEP]")
    table = np.empty((size, HIDDEN), dtype=np.float32)
    for start in range(0, size, _BUILD_BATCH):
        count = min(_BUILD_BATCH, size - start)
        ids = np.empty((count, 3), dtype=np.int64)
        ids[:, 0], ids[:, 1], ids[:, 2] = cls, np.arange(start, start + count), sep
        [table[start : start + count]] = session.run(
            ["embeddings"], {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        )
    ordinary = _ordinary(tokenizer)
    centred = table - table[ordinary].mean(axis=0)
    if dropped > 0:
        _, _, directions = np.linalg.svd(centred[ordinary], full_matrices=False)
        top = directions[:dropped]
        centred -= (centred @ top.T) @ top
    result: _F32 = np.ascontiguousarray(centred, dtype=np.float32)
    return result


def ensure_table(model_dir: Path, graph_dir: Path) -> Path:
    """The table's path in ``graph_dir``, distilled from ``model_dir``'s weights if absent
    (through the fp32 graph, built first if absent too)."""
    target = graph_dir / table_file_name()
    if target.exists():
        return target
    from ibex_context.embedding.minilm_reference import load_tokenizer

    table = distil_table(open_session(ensure_graph(model_dir, graph_dir)), load_tokenizer(model_dir))

    def write(path: Path) -> None:
        with path.open("wb") as file:  # a file object: np.save would add ".npy" to a path
            np.save(file, table, allow_pickle=False)

    write_atomically(target, write)
    return target


class StaticQueries:
    """Query vectors from the distilled table: pure, on the caller's thread."""

    def __init__(self, table: _F32, tokenizer: Tokenizer) -> None:
        if table.ndim != 2 or table.shape != (tokenizer.get_vocab_size(), HIDDEN):
            raise ValueError(f"static table: shape {table.shape} does not match the vocabulary")
        self._table = table
        self._tokenizer = tokenizer
        self._special = frozenset(int(i) for i in np.flatnonzero(~_ordinary(tokenizer)))
        self._unknown = _special_id(tokenizer, "[UNK]")

    @classmethod
    def load(cls, path: Path, tokenizer: Tokenizer) -> StaticQueries:
        """The table at ``path``, memory-mapped read-only (pages shared between processes)."""
        return cls(np.load(path, mmap_mode="r", allow_pickle=False), tokenizer)

    def embed(self, texts: Sequence[str]) -> list[FloatVector]:
        """Each text's vector: the normalised sum of its pieces' rows (``[UNK]``'s row for
        a text with no piece of its own, so every vector has unit length)."""
        vectors: list[FloatVector] = []
        for encoding in self._tokenizer.encode_batch(list(texts)):
            ids = [i for i in encoding.ids if i not in self._special] or [self._unknown]
            summed = self._table[ids].sum(axis=0, dtype=np.float32)
            norm = float(np.linalg.norm(summed))
            vectors.append((summed / norm if norm > 0 else summed).astype(np.float32, copy=False))
        return vectors
