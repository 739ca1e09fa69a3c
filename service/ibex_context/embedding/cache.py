"""An LRU of embeddings in front of any embedder, for the per-request query.

An agent loop asks the same last user message across the several LLM calls of one
turn (one per tool call): the query is embedded once per turn, not once per call.
Keys are (model name, sha256 of the caller's org and the text with its whitespace runs
collapsed and its ends stripped): texts are not kept as keys, two models never share
entries, and two spellings that tokenise alike share one entry (the normalised text is
what is embedded). Entries are per org: a call's ``embed_us`` reaches its caller, and a
near-zero embedding time for a text org B never sent would tell B that another org sent
it recently. A full cache evicts the least recently used entry of the org holding most
entries, so one org's flood of new questions evicts its own entries, not another org's.
An agent loop's repeats are one org's own, so they still hit (the
agent-loop replay's hit rate is the same either way: benchmarks/embedding_cache.py).
Concurrent misses for the same org and text are coalesced: one inner call, every
caller gets its result. The inner call runs in its own task, so a caller whose
deadline cancels it does not cancel the work the others wait for, and the result
still lands in the cache for the next call. Cached vectors are read-only: callers
share them.

A query's cost grows with its length (all-MiniLM-L6-v2: ~0.4 ms of CPU a word piece on
one core, ~90 ms at its 256 limit), and one long query holds the embedding worker every
other call's query waits for. With ``query_max_tokens``, an embedder that counts tokens
(``TokenisedEmbedder``) embeds only the query's last ``query_max_tokens`` tokens (the
end of the last user message, where its question usually is); the cache key is that tail.

``begin`` starts the embedding of one query and returns at once, so the assembler
starts it before anything else of the call; with an embedder that runs in threads
(``ThreadedEmbedder``) the work is handed to a worker thread right there, not on a
later turn of the event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Sequence

from ibex_context.embedding.base import Embedder, ThreadedEmbedder, TokenisedEmbedder
from ibex_context.models import FloatVector

_Key = tuple[str, bytes]


def normalise_query(text: str) -> str:
    """``text`` with its whitespace runs collapsed to one space and its ends stripped:
    the embedders tokenise on whitespace, so the vector is the same."""
    return " ".join(text.split())


def _retrieve_exception(future: asyncio.Future[FloatVector]) -> None:
    # A started embedding nobody waited for (the call ended first) must not log
    # "exception was never retrieved" when it fails.
    if not future.cancelled():
        future.exception()


class CachedEmbedder:
    def __init__(self, inner: Embedder, max_entries: int, *, query_max_tokens: int = 0) -> None:
        self._inner = inner
        self._submit = inner.submit_queries if isinstance(inner, ThreadedEmbedder) else None
        self._tail = (
            inner.text_tail if isinstance(inner, TokenisedEmbedder) and query_max_tokens > 0 else None
        )
        self._query_max_tokens = query_max_tokens
        self._max_entries = max_entries
        # Entries by org, each org's least recently used first: when the cache is full the
        # org holding most entries loses its oldest, so one org's flood of new questions
        # evicts its own entries, not a quieter org's.
        self._entries: dict[str, OrderedDict[_Key, FloatVector]] = {}
        self._size = 0
        self._inflight: dict[_Key, asyncio.Future[FloatVector]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # Read at scrape time (``Metrics.track_query_embedding_cache``): no cost per call.
        self.hits = 0  # found in the cache
        self.shared = 0  # joined an embedding already in flight
        self.misses = 0  # embedded

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def dim(self) -> int:
        return self._inner.dim

    def counts(self) -> tuple[int, int, int]:
        """(hits, shared, misses) so far: the metric's source."""
        return self.hits, self.shared, self.misses

    def __len__(self) -> int:
        return self._size

    def _key(self, org_id: str, text: str) -> _Key:
        digest = hashlib.sha256(org_id.encode("utf-8"))
        digest.update(b"\x00")
        digest.update(text.encode("utf-8"))
        return (self._inner.name, digest.digest())

    def begin(self, text: str, *, org_id: str = "") -> asyncio.Future[FloatVector]:
        """The embedding of ``text`` for ``org_id``'s call: already done when that org's
        entry is cached, else started now.

        The future is shared by every caller of the same org and text: await it through
        ``asyncio.shield`` so a caller's timeout does not cancel it for the others.
        """
        normalised = self.query_text(text)
        key = self._key(org_id, normalised)
        done = self._cached(org_id, key)
        if done is not None:
            return done
        pending = self._inflight.get(key)
        if pending is not None:
            self.shared += 1
            return pending
        self.misses += 1
        return self._start([key], [normalised], org_id)[0]

    async def embed(self, texts: Sequence[str], *, org_id: str = "") -> list[FloatVector]:
        """The embeddings of ``texts`` for ``org_id``'s call (cached per org)."""
        normalised = [self.query_text(text) for text in texts]
        keys = [self._key(org_id, text) for text in normalised]
        waits: list[asyncio.Future[FloatVector] | None] = []
        new_keys: dict[_Key, str] = {}
        for key, text in zip(keys, normalised, strict=True):
            done = self._cached(org_id, key)
            if done is not None:
                waits.append(done)
            elif key in self._inflight:
                self.shared += 1
                waits.append(self._inflight[key])
            elif key in new_keys:
                self.shared += 1
                waits.append(None)
            else:
                new_keys[key] = text
                self.misses += 1
                waits.append(None)
        if new_keys:
            futures = self._start(list(new_keys), list(new_keys.values()), org_id)
            started = dict(zip(new_keys, futures, strict=True))
            waits = [wait or started[key] for key, wait in zip(keys, waits, strict=True)]
        return [await asyncio.shield(wait) for wait in waits if wait is not None]

    def query_text(self, text: str) -> str:
        """What is embedded (and keyed) for ``text``: normalised, and its tail when long."""
        normalised = normalise_query(text)
        return self._tail(normalised, self._query_max_tokens) if self._tail else normalised

    def _cached(self, org_id: str, key: _Key) -> asyncio.Future[FloatVector] | None:
        """A done future of the cached embedding (a hit, now the org's most recent entry),
        or None when ``key`` is not cached."""
        entries = self._entries.get(org_id)
        cached = entries.get(key) if entries is not None else None
        if entries is None or cached is None:
            return None
        entries.move_to_end(key)
        self.hits += 1
        done: asyncio.Future[FloatVector] = asyncio.get_running_loop().create_future()
        done.set_result(cached)
        return done

    def _start(self, keys: list[_Key], texts: list[str], org_id: str) -> list[asyncio.Future[FloatVector]]:
        """One inner call for ``texts`` (distinct, none cached or in flight), started now."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[FloatVector]] = []
        for key in keys:
            future: asyncio.Future[FloatVector] = loop.create_future()
            future.add_done_callback(_retrieve_exception)
            self._inflight[key] = future
            futures.append(future)
        # A threaded embedder gets the work now; any other starts in the task.
        submitted = asyncio.wrap_future(self._submit(texts, tenant=org_id)) if self._submit else None
        task = asyncio.create_task(self._compute(org_id, keys, futures, texts, submitted), name="embed-miss")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return futures

    async def _compute(
        self,
        org_id: str,
        keys: list[_Key],
        futures: list[asyncio.Future[FloatVector]],
        texts: list[str],
        submitted: asyncio.Future[list[FloatVector]] | None,
    ) -> None:
        try:
            vectors = await (submitted if submitted is not None else self._inner.embed(texts))
            for key, future, vector in zip(keys, futures, vectors, strict=True):
                vector.flags.writeable = False
                if self._max_entries > 0:
                    self._store(org_id, key, vector)
                if not future.done():
                    future.set_result(vector)
        except asyncio.CancelledError:
            for future in futures:
                future.cancel()
            raise
        except Exception as exc:
            for future in futures:
                if not future.done():
                    future.set_exception(exc)
        finally:
            for key in keys:
                self._inflight.pop(key, None)

    def _store(self, org_id: str, key: _Key, vector: FloatVector) -> None:
        entries = self._entries.setdefault(org_id, OrderedDict())
        if key not in entries:
            self._size += 1
        entries[key] = vector
        entries.move_to_end(key)
        while self._size > self._max_entries:
            # The org holding most entries: orgs caching at once are few next to the entries.
            largest_org, largest = max(self._entries.items(), key=lambda item: len(item[1]))
            largest.popitem(last=False)
            self._size -= 1
            if not largest:
                del self._entries[largest_org]

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await self._inner.aclose()


async def embed_for_org(embedder: Embedder, org_id: str, texts: Sequence[str]) -> list[FloatVector]:
    """``embedder.embed(texts)`` for a call of ``org_id``: through the query cache's
    entries of that org when ``embedder`` is the cache."""
    if isinstance(embedder, CachedEmbedder):
        return await embedder.embed(texts, org_id=org_id)
    return await embedder.embed(texts)
