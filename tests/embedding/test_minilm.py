"""The served MiniLM (ONNX Runtime) gives the numpy reference's vectors, batched or not."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ibex_context.embedding.base import TenantQueuedEmbedder, embed_to_store
from ibex_context.embedding.batching import EmbeddingTurn
from ibex_context.embedding.minilm import MiniLMEmbedder, length_batches
from ibex_context.embedding.minilm_graph import default_graph_dir, ensure_graph, open_session
from ibex_context.embedding.minilm_reference import (
    MiniLMModel,
    default_model_dir,
    embed_one_by_one,
    load_tokenizer,
)
from ibex_context.errors import ConfigurationError
from ibex_context.models import FloatVector

REFERENCE = json.loads((Path(__file__).parent / "minilm_reference.json").read_text(encoding="utf-8"))
# Texts of very different lengths in one batch, so most of them are padded.
FIXED_TEXTS = [
    *REFERENCE["sentences"],
    "What did I tell you about my service dog?",
    "Mira's service dog, Juniper, is trained to alert her before a seizure.",
    "ok",
    "The quarterly report is due on Friday; Sam owns the revenue section and Ana the costs. " * 4,
]


@pytest.fixture(scope="module")
async def minilm() -> AsyncIterator[MiniLMEmbedder]:
    embedder = MiniLMEmbedder.load(workers=2, query_precision="fp32")
    yield embedder
    await embedder.aclose()


@pytest.fixture(scope="module")
async def minilm_int8_queries() -> AsyncIterator[MiniLMEmbedder]:
    embedder = MiniLMEmbedder.load(query_precision="int8")  # the default, said here
    yield embedder
    await embedder.aclose()


@pytest.fixture(scope="module")
def numpy_vectors() -> list[FloatVector]:
    """Each fixed text alone through the numpy forward pass: no padding anywhere."""
    directory = default_model_dir()
    return embed_one_by_one(MiniLMModel.load(directory), load_tokenizer(directory), FIXED_TEXTS)


def _cosine(a: FloatVector, b: FloatVector) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


async def test_one_batch_of_mixed_lengths_gives_the_numpy_reference_vectors(
    minilm: MiniLMEmbedder, numpy_vectors: list[FloatVector]
) -> None:
    vectors = await minilm.embed(FIXED_TEXTS)
    for text, served, reference in zip(FIXED_TEXTS, vectors, numpy_vectors, strict=True):
        assert _cosine(served, reference) >= 0.9999, text


async def test_each_text_alone_gives_the_numpy_reference_vector(
    minilm: MiniLMEmbedder, numpy_vectors: list[FloatVector]
) -> None:
    for text, reference in zip(FIXED_TEXTS, numpy_vectors, strict=True):
        [served] = await minilm.embed([text])
        assert _cosine(served, reference) >= 0.9999, text


async def test_the_vectors_match_sentence_transformers(minilm: MiniLMEmbedder) -> None:
    vectors = await minilm.embed(REFERENCE["sentences"])
    for sentence, served, expected in zip(
        REFERENCE["sentences"], vectors, REFERENCE["embeddings"], strict=True
    ):
        assert _cosine(served, np.asarray(expected, dtype=np.float32)) >= 0.9999, sentence


async def test_vectors_are_unit_length_float32_of_384_dims(minilm: MiniLMEmbedder) -> None:
    [vector] = await minilm.embed(["Prefers tea"])
    assert vector.dtype == np.float32 and vector.shape == (384,) == (minilm.dim,)
    assert float(np.linalg.norm(vector)) == pytest.approx(1.0, abs=1e-5)
    assert minilm.name == "all-MiniLM-L6-v2"


async def test_batch_results_keep_the_input_order_whatever_the_lengths(minilm: MiniLMEmbedder) -> None:
    texts = ["a much longer sentence about several different things", "short", "medium length text"]
    together = await minilm.embed(texts)
    one_by_one = [(await minilm.embed([t]))[0] for t in texts]
    for a, b in zip(together, one_by_one, strict=True):
        assert float(a @ b) > 0.9999


async def test_an_empty_batch_embeds_to_nothing(minilm: MiniLMEmbedder) -> None:
    assert await minilm.embed([]) == []


async def test_int8_queries_stay_within_cosine_0_99_of_the_reference_and_differ_from_fp32(
    minilm_int8_queries: MiniLMEmbedder, numpy_vectors: list[FloatVector]
) -> None:
    queries = await asyncio.wrap_future(minilm_int8_queries.submit_queries(FIXED_TEXTS))
    cosines = [_cosine(q, r) for q, r in zip(queries, numpy_vectors, strict=True)]
    # The shortest texts move most ("ok": 0.974); LoCoMo's questions 0.992 at worst.
    assert min(cosines) >= 0.97 and float(np.mean(cosines)) >= 0.99, cosines
    assert min(cosines) < 0.9999  # the quantised graph answered, not the fp32 one
    for query in queries:
        assert query.dtype == np.float32 and float(np.linalg.norm(query)) == pytest.approx(1.0, abs=1e-5)


async def test_an_int8_query_vector_depends_on_its_text_alone_not_on_the_queries_beside_it(
    minilm_int8_queries: MiniLMEmbedder,
) -> None:
    # One batch, padded to its longest text: only the float sums' order may differ.
    together = minilm_int8_queries.embed_sync(FIXED_TEXTS, query=True)
    for text, vector in zip(FIXED_TEXTS, together, strict=True):
        [alone] = minilm_int8_queries.embed_sync([text], query=True)
        np.testing.assert_allclose(vector, alone, rtol=0, atol=1e-5, err_msg=text)


class HeldSession:
    """An onnxruntime session whose first run waits for ``release``."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self.running = threading.Event()
        self.release = threading.Event()

    def run(self, outputs: list[str], inputs: dict[str, Any]) -> Any:
        self.running.set()
        assert self.release.wait(10)
        return self._session.run(outputs, inputs)


class SteppedSession:
    """An onnxruntime session each of whose runs waits for a permit of its own."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self.started: queue.Queue[int] = queue.Queue()
        self.permits = threading.Semaphore(0)

    def run(self, outputs: list[str], inputs: dict[str, Any]) -> Any:
        self.started.put(len(inputs["input_ids"]))
        assert self.permits.acquire(timeout=10)
        return self._session.run(outputs, inputs)


async def test_queued_queries_are_computed_one_an_inference_each_handed_over_when_its_own_is_done() -> None:
    directory = default_model_dir()
    graphs = default_graph_dir()
    stepped = SteppedSession(open_session(ensure_graph(directory, graphs, "int8")))
    embedder = MiniLMEmbedder(
        open_session(ensure_graph(directory, graphs)), load_tokenizer(directory), query_session=stepped
    )
    try:
        first = embedder.submit_queries(["Which city did they move to?"], tenant="org-0")
        assert stepped.started.get(timeout=10) == 1
        queued = [
            embedder.submit_queries([q], tenant=f"org-{i}")
            for i, q in enumerate(["When did Melanie paint a sunrise?", "What is the dog called?"], 1)
        ]
        for done, waiting in ((first, queued[0]), (queued[0], queued[1])):
            stepped.permits.release()
            await asyncio.wrap_future(done)
            # The next query runs alone, and is not handed over until its own inference ends.
            assert stepped.started.get(timeout=10) == 1
            assert not waiting.done()
        stepped.permits.release()
        await asyncio.wrap_future(queued[1])
    finally:
        for _ in range(3):
            stepped.permits.release()
        await embedder.aclose()


async def test_int8_queries_batched_in_one_turn_get_their_own_vectors() -> None:
    # Turns of several queries (``queries_per_turn``; a job of several query texts is run
    # in chunks too): each query's vector is the one it gets alone.
    directory = default_model_dir()
    graphs = default_graph_dir()
    held = HeldSession(open_session(ensure_graph(directory, graphs, "int8")))
    turns: list[EmbeddingTurn] = []
    embedder = MiniLMEmbedder(
        open_session(ensure_graph(directory, graphs)),
        load_tokenizer(directory),
        query_session=held,
        observe=turns.append,
        queries_per_turn=4,
    )
    try:
        first = embedder.submit_queries(["Which city did they move to?"], tenant="org-0")
        assert held.running.wait(10)
        questions = ["When did Melanie paint a sunrise?", "What is the service dog called?", "Trip?"]
        futures = [embedder.submit_queries([q], tenant=f"org-{i}") for i, q in enumerate(questions, 1)]
        held.release.set()
        vectors = [(await asyncio.wrap_future(f))[0] for f in (first, *futures)]
        # A turn is observed after its vectors are handed over: wait for the second's report.
        for _ in range(100):  # at most 5 s
            if len(turns) >= 2:
                break
            await asyncio.sleep(0.05)
        assert [turn.texts for turn in turns] == [1, 3]
        for question, vector in zip(["Which city did they move to?", *questions], vectors, strict=True):
            [alone] = embedder.embed_sync([question], query=True)
            np.testing.assert_allclose(vector, alone, rtol=0, atol=1e-5, err_msg=question)
    finally:
        held.release.set()
        await embedder.aclose()


async def test_texts_to_store_are_embedded_in_fp32_whatever_the_query_precision(
    minilm_int8_queries: MiniLMEmbedder, numpy_vectors: list[FloatVector]
) -> None:
    stored = await minilm_int8_queries.embed(FIXED_TEXTS)
    for text, vector, reference in zip(FIXED_TEXTS, stored, numpy_vectors, strict=True):
        assert _cosine(vector, reference) >= 0.9999, text


async def test_an_orgs_texts_to_store_are_queued_as_its_own_and_embedded_as_any_others(
    minilm_int8_queries: MiniLMEmbedder, numpy_vectors: list[FloatVector]
) -> None:
    assert isinstance(minilm_int8_queries, TenantQueuedEmbedder)
    stored = await embed_to_store(minilm_int8_queries, "org-a", FIXED_TEXTS)
    for text, vector, reference in zip(FIXED_TEXTS, stored, numpy_vectors, strict=True):
        assert _cosine(vector, reference) >= 0.9999, text


async def test_fp32_queries_are_the_stored_texts_vectors(minilm: MiniLMEmbedder) -> None:
    [query] = await asyncio.wrap_future(minilm.submit_queries(["What did I tell you about my service dog?"]))
    [stored] = await minilm.embed(["What did I tell you about my service dog?"])
    assert _cosine(query, stored) > 0.99999


def test_texts_are_batched_by_length_so_padding_stays_small() -> None:
    assert length_batches([3, 40, 4, 5, 90, 41], max_batch=8) == [[0, 2, 3], [1, 5], [4]]
    assert length_batches([5, 5, 5], max_batch=2) == [[0, 1], [2]]


def test_a_directory_without_weights_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"no model\.safetensors"):
        MiniLMEmbedder.load(tmp_path, graph_dir=tmp_path)


def test_fewer_than_one_worker_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="embedding_workers"):
        MiniLMEmbedder(session=None, tokenizer=load_tokenizer(default_model_dir()), workers=0)


def test_onnxruntime_writes_no_telemetry(tmp_path: Path) -> None:
    """onnxruntime's PyPI build keeps telemetry events under $HOME/.cache for upload unless told not to:
    a process opening our session, running it and failing a run leaves nothing in its home."""
    env = {k: v for k, v in os.environ.items() if k != "ORT_DISABLE_TELEMETRY"}
    env["HOME"] = str(tmp_path)
    script = (
        "import numpy as np\n"
        "from ibex_context.embedding.minilm import MiniLMEmbedder\n"
        "e = MiniLMEmbedder.load()\n"
        "assert len(e.embed_sync(['a service dog'])[0]) == 384\n"
        "ids = np.array([[101, 7592, 102]], dtype=np.int64)\n"
        "try:\n"
        "    e._session.run(None, {'input_ids': ids, 'attention_mask': ids[:, :2]})\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "Fail", done.stdout + done.stderr
    assert [p.relative_to(tmp_path) for p in tmp_path.rglob("*")] == []


LONG_MESSAGE = (
    "Here is the thread from the vendor, pasted as it came: the quarterly numbers moved again, "
    "the renewal is due next month, finance wants the revised quote before Thursday and the "
    "warehouse team asked twice about the loading dock schedule. So what did we agree about "
    "the budget for the new dock?"
)


def test_the_tail_of_a_long_text_makes_at_most_the_word_pieces_asked(minilm: MiniLMEmbedder) -> None:
    tail = minilm.text_tail(LONG_MESSAGE, 24)
    assert LONG_MESSAGE.endswith(tail) and len(tail) < len(LONG_MESSAGE)
    pieces = minilm._whole.encode(tail, add_special_tokens=False).ids
    assert 20 <= len(pieces) <= 24
    assert tail.endswith("the budget for the new dock?")


def test_a_tail_starts_at_a_whole_word_and_never_exceeds_the_bound(minilm: MiniLMEmbedder) -> None:
    # Words of several word pieces each, so most bounds fall inside a word.
    text = "unbelievably dockmasterships reconfigurations antidisestablishmentarianism overwhelmingly"
    assert len(minilm._whole.encode(text, add_special_tokens=False).ids) > 10
    last_word_pieces = len(minilm._whole.encode("overwhelmingly", add_special_tokens=False).ids)
    for bound in range(last_word_pieces, 40):
        tail = minilm.text_tail(text, bound)
        assert text.endswith(tail) and tail
        assert tail == text or text[len(text) - len(tail) - 1] == " ", (bound, tail)
        assert len(minilm._whole.encode(tail, add_special_tokens=False).ids) <= bound
    # A last word longer than the bound: its end, never nothing.
    assert "overwhelmingly".endswith(minilm.text_tail(text, 1)) and minilm.text_tail(text, 1)


def test_a_text_within_the_word_pieces_asked_is_its_own_tail(minilm: MiniLMEmbedder) -> None:
    assert minilm.text_tail("what about the dock?", 24) == "what about the dock?"
    assert minilm.text_tail(LONG_MESSAGE, 0) == LONG_MESSAGE  # 0: no bound
    assert minilm.text_tail(LONG_MESSAGE, 1000) == LONG_MESSAGE


async def test_a_long_query_is_embedded_as_its_tail_and_keyed_by_it(minilm: MiniLMEmbedder) -> None:
    from ibex_context.embedding.cache import CachedEmbedder

    queries = CachedEmbedder(minilm, max_entries=10, query_max_tokens=24)
    [bounded] = await queries.embed([LONG_MESSAGE])
    [tail] = await minilm.embed([minilm.text_tail(LONG_MESSAGE, 24)])
    [whole] = await minilm.embed([LONG_MESSAGE])
    assert _cosine(bounded, tail) > 0.9999
    assert _cosine(bounded, whole) < 0.99  # the whole message is another vector
    # Another message with the same tail is the same query: one embedding.
    await queries.embed(["Different preamble entirely, and yet " + minilm.text_tail(LONG_MESSAGE, 24)])
    assert queries.counts()[0] == 1
