"""The static query table distilled from MiniLM's weights: what it holds, what a query's
vector is, and how the MiniLM embedder serves it (as every query's model or as the
stand-in for a late one)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest
from ibex_context.embedding.minilm import MiniLMEmbedder
from ibex_context.embedding.minilm_graph import (
    GRAPH_VERSION,
    default_graph_dir,
    ensure_graph,
    open_session,
    weights_version,
)
from ibex_context.embedding.minilm_reference import HIDDEN, default_model_dir, load_tokenizer
from ibex_context.embedding.static_table import (
    DROPPED_COMPONENTS,
    TABLE_VERSION,
    StaticQueries,
    ensure_table,
    table_file_name,
)
from ibex_context.errors import ConfigurationError

QUESTION = "What did I tell you about my service dog?"
STORED = [
    "Mira's service dog, Juniper, is trained to alert her before a seizure.",
    "The quarterly report is due on Friday; Sam owns the revenue section.",
    "We moved the team offsite from Lisbon to Porto because of the flights.",
    "Her favourite dessert is a lemon tart from the bakery on Rua Augusta.",
]


@pytest.fixture(scope="module")
def table() -> np.ndarray:
    # Built once per machine into the graph cache directory (~20 s), then read.
    return np.load(ensure_table(default_model_dir(), default_graph_dir()))


@pytest.fixture(scope="module")
def static(table: np.ndarray) -> StaticQueries:
    return StaticQueries(table, load_tokenizer(default_model_dir()))


@pytest.fixture(scope="module")
async def static_minilm() -> AsyncIterator[MiniLMEmbedder]:
    embedder = MiniLMEmbedder.load(query_model="static")
    yield embedder
    await embedder.aclose()


def test_the_table_is_named_for_the_weights_the_graph_and_its_own_version() -> None:
    assert table_file_name() == (
        f"all-MiniLM-L6-v2-w{weights_version()}-g{GRAPH_VERSION}-static{TABLE_VERSION}.npy"
    )


def test_an_existing_table_is_read_not_built_again() -> None:
    path = ensure_table(default_model_dir(), default_graph_dir())
    before = path.stat().st_mtime_ns
    assert ensure_table(default_model_dir(), default_graph_dir()) == path
    assert path.stat().st_mtime_ns == before


def test_the_table_has_a_row_per_word_piece_centred_with_the_shared_directions_removed(
    table: np.ndarray,
) -> None:
    tokenizer = load_tokenizer(default_model_dir())
    assert table.shape == (tokenizer.get_vocab_size(), HIDDEN) and table.dtype == np.float32
    ordinary = [i for p, i in tokenizer.get_vocab().items() if not (p.startswith("[") and p.endswith("]"))]
    rows = table[ordinary].astype(np.float64)
    assert np.abs(rows.mean(axis=0)).max() < 1e-4
    singular = np.linalg.svd(rows, compute_uv=False)
    # The removed directions carry nothing any more (the model's own outputs already
    # span three fewer than its 384: its LayerNorm and the normalisation).
    flat = int((singular < 1e-3 * singular[0]).sum())
    assert DROPPED_COMPONENTS <= flat <= DROPPED_COMPONENTS + 3


def test_a_pieces_row_starts_from_its_vector_alone_through_the_fp32_graph(table: np.ndarray) -> None:
    tokenizer = load_tokenizer(default_model_dir())
    session = open_session(ensure_graph(default_model_dir(), default_graph_dir()))
    ids = [tokenizer.token_to_id(p) for p in ("dog", "seizure", "porto")]
    batch = np.array([[101, i, 102] for i in ids], dtype=np.int64)
    [alone] = session.run(["embeddings"], {"input_ids": batch, "attention_mask": np.ones_like(batch)})
    # Centring and the projection are one affine map: differences between rows are the
    # differences between the pieces' own vectors, with the shared directions removed.
    rows = table[ids]
    alone_diff, rows_diff = alone[0] - alone[1], rows[0] - rows[1]
    assert float(alone_diff @ rows_diff) / (np.linalg.norm(alone_diff) * np.linalg.norm(rows_diff)) > 0.8


def test_a_querys_vector_has_unit_length_and_does_not_depend_on_its_batch_mates(
    static: StaticQueries,
) -> None:
    [alone] = static.embed([QUESTION])
    together = static.embed([*STORED, QUESTION])
    assert alone.dtype == np.float32 and alone.shape == (HIDDEN,)
    assert abs(float(np.linalg.norm(alone)) - 1.0) < 1e-5
    assert np.array_equal(together[-1], alone)


def test_a_text_without_a_piece_of_its_own_still_gets_a_unit_vector(static: StaticQueries) -> None:
    [vector] = static.embed(["[CLS] [SEP]"])
    assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5


async def test_a_static_question_finds_its_memory_among_minilm_stored_vectors(
    static_minilm: MiniLMEmbedder, static: StaticQueries
) -> None:
    stored = np.stack(await static_minilm.embed(STORED))  # always MiniLM fp32
    [query] = static.embed([QUESTION])
    scores = stored @ query
    assert int(np.argmax(scores)) == 0, scores


async def test_with_static_queries_a_query_is_computed_at_once_without_a_worker(
    static_minilm: MiniLMEmbedder, static: StaticQueries
) -> None:
    future = static_minilm.submit_queries([QUESTION], tenant="org-a")
    assert future.done()
    assert np.array_equal(future.result()[0], static.embed([QUESTION])[0])
    assert static_minilm.name == "all-MiniLM-L6-v2/static", "static vectors are cached apart from MiniLM's"
    assert static_minilm.stand_in is None, "static queries are never late"


async def test_minilm_queries_with_a_stand_in_load_the_table_and_expire_queued_queries() -> None:
    embedder = MiniLMEmbedder.load(stand_in_after=0.015)
    try:
        assert embedder.stand_in is not None
        assert embedder.name == "all-MiniLM-L6-v2"
        [vector] = await embedder.embed([QUESTION])
        assert vector.shape == (HIDDEN,)
    finally:
        await embedder.aclose()


async def test_static_first_queries_are_minilms_with_the_table_beside_them() -> None:
    embedder = MiniLMEmbedder.load(query_model="static-first")
    try:
        assert embedder.stand_in is not None and embedder.query_model == "static-first"
        assert embedder.name == "all-MiniLM-L6-v2", "the cache holds MiniLM's vectors"
        [vector] = embedder.submit_queries([QUESTION]).result(timeout=10)
        assert np.array_equal(vector, embedder.embed_sync([QUESTION], query=True)[0])
    finally:
        await embedder.aclose()


@pytest.mark.parametrize("model", ["static", "static-first"])
def test_queries_that_need_the_table_without_it_are_refused(model: str) -> None:
    with pytest.raises(ConfigurationError, match=f"embedding_query_model: {model}"):
        MiniLMEmbedder(object(), load_tokenizer(default_model_dir()), query_model=model)  # type: ignore[arg-type]
