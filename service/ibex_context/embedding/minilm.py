"""all-MiniLM-L6-v2 on ONNX Runtime, offline: no torch, no network (``IBEX_EMBEDDER=minilm``).

The graph is built once from the packaged weights (``embedding.minilm_graph``: at image
build, or at the first start of a checkout into a cache directory) and run by
onnxruntime with one intra-op thread per inference: on 2 shared cores a second thread
made one query slower, not faster (docs/adr/0011). Inferences run in a small pool of
worker threads (``workers``, ``embedding.batching``), never on the event loop;
onnxruntime releases the GIL while it computes, so a worker's inference and the loop's
own work overlap. A worker computes one query an inference, the org served longest ago
first, and hands each vector over as soon as it is computed (``QUERIES_PER_TURN``); the
texts to store go a few at a time to a store worker of their own, which runs on what the
calls leave of the core, so a query never waits for a write's inference.

Queries can run on a second graph, the first quantised to int8 (``query_precision``,
``embedding.minilm_graph``): about half the CPU where the processor has int8 dot-product
instructions, vectors within cosine 0.98 of fp32's, each token's activations scaled on
their own, so queries batch like fp32 ones. The texts it stores are always
embedded in fp32, so stored vectors do not depend on the setting and the setting can
change without re-embedding anything.

Texts are tokenised in one batch call, sorted by length and run in batches padded to
their longest text, with the attention mask keeping padding out of attention and
pooling: each text's vector equals the one it gets alone (tests/embedding/test_minilm.py
checks both against the numpy reference, ``embedding.minilm_reference``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ibex_context.embedding.batching import EmbeddingQueue, TurnObserver
from ibex_context.embedding.minilm_graph import Precision, default_graph_dir, ensure_graph, open_session
from ibex_context.embedding.minilm_reference import (
    HIDDEN,
    MODEL_NAME,
    default_model_dir,
    load_tokenizer,
)
from ibex_context.embedding.static_table import QueryModel, StaticQueries, ensure_table
from ibex_context.errors import ConfigurationError, EmbeddingError
from ibex_context.models import FloatVector

if TYPE_CHECKING:
    from tokenizers import Tokenizer

_log = logging.getLogger(__name__)


def length_batches(lengths: Sequence[int], max_batch: int) -> list[list[int]]:
    """Indices grouped so padding stays small: sorted by length, and a batch is closed
    when full or when the next text is over twice as long as the batch's shortest."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and len(batches[-1]) < max_batch and lengths[i] <= 2 * lengths[batches[-1][0]]:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


# Texts to store a worker embeds in one inference: a write's next few. 4 short texts cost
# ~7.5 ms of CPU a text against ~11 ms alone in fp32 (8: ~7.1 ms), and a turn of 4 ends
# within a call's deadline.
TURN_TEXTS = 4

# Queries a worker embeds in one inference: one. Queued queries shared inferences of up to
# 4 until 2026-12-07; with int8 queries of mixed lengths that saved no CPU (each batch is
# padded to its longest query: 9.15 ms of CPU a query against 8.86 one at a time), and
# every query of a turn waited for the whole turn: one a turn, the waits' p95 fell 77.9 ->
# 54.2 ms and their p99 116 -> 84 ms at 35 calls a second on one core (benchmarks.embedding_turns;
# benchmarks/results/embedding-turns-2026-12-06.md section 9).
QUERIES_PER_TURN = 1


def _untruncated(tokenizer: Tokenizer) -> Tokenizer:
    import tokenizers

    whole = tokenizers.Tokenizer.from_str(tokenizer.to_str())
    whole.no_truncation()
    return whole


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384 dims) on the CPU, off the event loop."""

    def __init__(
        self,
        session: Any,
        tokenizer: Tokenizer,
        *,
        query_session: Any | None = None,
        workers: int = 1,
        max_batch: int = 32,
        turn_texts: int = TURN_TEXTS,
        queries_per_turn: int = QUERIES_PER_TURN,
        observe: TurnObserver | None = None,
        static_queries: StaticQueries | None = None,
        query_model: QueryModel = "minilm",
        query_expiry: float | None = None,
        worker_nice: int = 0,
        store_worker_idle: bool = True,
    ) -> None:
        """``session`` embeds the texts to store; ``query_session`` the queries (default:
        ``session``); ``observe`` gets each worker turn's timings. ``static_queries``: the
        distilled table, which embeds every query when ``query_model`` is "static" and is
        the stand-in otherwise (``stand_in_queries``). ``queries_per_turn`` and ``turn_texts``:
        the queued queries and the texts to store a worker embeds in one inference.
        ``query_expiry``: seconds after which a query still queued is not computed (its
        caller has moved on to the stand-in).
        ``worker_nice`` and ``store_worker_idle``: the workers' priorities
        (``embedding.batching.EmbeddingQueue``)."""
        if workers < 1:
            raise ConfigurationError(f"embedding_workers: at least 1, got {workers}")
        if query_model != "minilm" and static_queries is None:
            raise ConfigurationError(f"embedding_query_model: {query_model} needs the static table")
        self._static = static_queries
        self._query_model = query_model
        self._session = session
        self._query_session = query_session if query_session is not None else session
        # The int8 graph scales each token's activations on their own
        # (``embedding.minilm_graph``), so queries batch as the fp32 graph's do: a query's
        # vector is the one it gets alone, whatever runs beside it.
        self._tokenizer = tokenizer
        # The same vocabulary without truncation, for ``text_tail``'s offsets.
        self._whole = _untruncated(tokenizer)
        self._max_batch = max_batch
        self._queue = EmbeddingQueue(
            self._embed_or_error,
            workers=workers,
            max_batch=turn_texts,
            queries_per_turn=queries_per_turn,
            name="minilm",
            observe=observe,
            query_expiry=query_expiry,
            nice=worker_nice,
            store_worker_idle=store_worker_idle,
        )

    @classmethod
    def load(
        cls,
        model_dir: Path | None = None,
        *,
        graph_dir: Path | None = None,
        query_precision: Precision = "int8",
        workers: int = 1,
        max_batch: int = 32,
        observe: TurnObserver | None = None,
        query_model: QueryModel = "minilm",
        stand_in_after: float = 0.0,
        worker_nice: int = 0,
        store_worker_idle: bool = True,
        queries_per_turn: int = QUERIES_PER_TURN,
    ) -> MiniLMEmbedder:
        """Reads the tokenizer and opens the graphs (under a second each), building a
        graph first when ``graph_dir`` has none (a few seconds, once); call at start-up.
        The static table is loaded (distilled first when absent: ~20 s, once) for static
        queries or a stand-in after ``stand_in_after`` seconds (0: none)."""
        # The weights first: an install without them should be told what to install.
        directory = model_dir or default_model_dir()
        if not (directory / "model.safetensors").exists():
            raise ConfigurationError(f"embedder: no model.safetensors in {directory}")
        started = time.perf_counter()
        graphs = graph_dir or default_graph_dir()
        session = open_session(ensure_graph(directory, graphs))
        query_session = (
            open_session(ensure_graph(directory, graphs, query_precision))
            if query_precision != "fp32"
            else None
        )
        tokenizer = load_tokenizer(directory)
        static = (
            StaticQueries.load(ensure_table(directory, graphs), tokenizer)
            if query_model != "minilm" or stand_in_after > 0
            else None
        )
        _log.info(
            "minilm: onnx graphs ready",
            extra={
                "seconds": round(time.perf_counter() - started, 2),
                "query_precision": query_precision,
                "query_model": query_model,
            },
        )
        return cls(
            session,
            tokenizer,
            query_session=query_session,
            workers=workers,
            max_batch=max_batch,
            observe=observe,
            static_queries=static,
            query_model=query_model,
            query_expiry=stand_in_after if query_model != "static" and stand_in_after > 0 else None,
            worker_nice=worker_nice,
            store_worker_idle=store_worker_idle,
            queries_per_turn=queries_per_turn,
        )

    @property
    def name(self) -> str:
        # The query cache's key: static query vectors are not MiniLM's.
        return f"{MODEL_NAME}/static" if self._query_model == "static" else MODEL_NAME

    @property
    def dim(self) -> int:
        return HIDDEN

    def embed_sync(self, texts: Sequence[str], *, query: bool = False) -> list[FloatVector]:
        """The blocking computation (of queries or of texts to store); ``embed`` and
        ``submit_queries`` run it in a worker thread."""
        session = self._query_session if query else self._session
        token_ids: list[list[int]] = [e.ids for e in self._tokenizer.encode_batch(list(texts))]
        vectors: list[FloatVector | None] = [None] * len(texts)
        for chunk in length_batches([len(ids) for ids in token_ids], self._max_batch):
            length = max(len(token_ids[i]) for i in chunk)
            ids = np.zeros((len(chunk), length), dtype=np.int64)
            mask = np.zeros((len(chunk), length), dtype=np.int64)
            for row, i in enumerate(chunk):
                ids[row, : len(token_ids[i])] = token_ids[i]
                mask[row, : len(token_ids[i])] = 1
            [embeddings] = session.run(["embeddings"], {"input_ids": ids, "attention_mask": mask})
            for i, vector in zip(chunk, embeddings, strict=True):
                vectors[i] = np.ascontiguousarray(vector, dtype=np.float32)
        return [v for v in vectors if v is not None]

    def text_tail(self, text: str, max_tokens: int) -> str:
        """The end of ``text`` that makes at most ``max_tokens`` word pieces (the model's
        own [CLS] and [SEP] aside), starting at a whole word. A word piece spans at least
        one character, so a text of at most ``max_tokens`` characters is returned without
        tokenising it."""
        if max_tokens <= 0 or len(text) <= max_tokens:
            return text
        encoding = self._whole.encode(text, add_special_tokens=False)
        offsets, words = encoding.offsets, encoding.word_ids
        first = len(offsets) - max_tokens
        if first <= 0:
            return text
        # Start at a whole word: a word's later pieces alone would tokenise differently.
        # (Unless the last word alone is longer than the bound: then its end, cut as is.)
        start = first
        while start < len(offsets) and words[start] is not None and words[start] == words[start - 1]:
            start += 1
        return text[offsets[start if start < len(offsets) else first][0] :]

    def submit_queries(self, texts: Sequence[str], *, tenant: str = "") -> Future[list[FloatVector]]:
        """Hands ``tenant``'s queries to the worker threads now (``ThreadedEmbedder``); static
        queries are computed here, on the caller's thread (microseconds: no worker)."""
        if self._query_model == "static" and self._static is not None:
            done: Future[list[FloatVector]] = Future()
            done.set_result(self._static.embed(texts))
            return done
        return self._queue.submit(texts, query=True, tenant=tenant)

    @property
    def stand_in(self) -> StaticQueries | None:
        """The static table beside MiniLM's queries (the first stage, or the stand-in for a
        late vector) when loaded for that; None with static queries: they are never late."""
        return self._static if self._query_model != "static" else None

    @property
    def query_model(self) -> QueryModel:
        return self._query_model

    def _embed_or_error(self, texts: list[str], query: bool) -> list[FloatVector]:
        try:
            return self.embed_sync(texts, query=query)
        except (ValueError, RuntimeError, MemoryError) as exc:
            # onnxruntime's own failures derive from RuntimeError.
            raise EmbeddingError(f"minilm: {type(exc).__name__}") from exc

    async def embed(self, texts: Sequence[str]) -> list[FloatVector]:
        """The vectors of texts to store (fp32, whatever the query precision)."""
        return await asyncio.wrap_future(self.submit_stored(texts))

    def submit_stored(self, texts: Sequence[str], *, tenant: str = "") -> Future[list[FloatVector]]:
        """Hands ``tenant``'s texts to store to the worker threads (``TenantQueuedEmbedder``)."""
        return self._queue.submit(texts, query=False, tenant=tenant)

    async def aclose(self) -> None:
        self._queue.close()
