"""An LRU of embeddings in front of any embedder, for the per-request query.

Keyed by (model name, sha256 of the text), so texts are not kept as keys and two
models never share entries. Concurrent misses for the same text are coalesced:
one call to the inner embedder, every caller gets its result. The inner call runs
in its own task, so a caller whose deadline cancels it does not cancel the work
the others wait for, and the result still lands in the cache for the next call.
Cached vectors are read-only: callers share them.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Sequence

from ibex_context.embedding.base import Embedder
from ibex_context.models import FloatVector

_Key = tuple[str, bytes]


class CachedEmbedder:
    def __init__(self, inner: Embedder, max_entries: int) -> None:
        self._inner = inner
        self._max_entries = max_entries
        self._entries: OrderedDict[_Key, FloatVector] = OrderedDict()
        self._inflight: dict[_Key, tuple[asyncio.Task[list[FloatVector]], int]] = {}
        self.hits = 0
        self.misses = 0

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def dim(self) -> int:
        return self._inner.dim

    def __len__(self) -> int:
        return len(self._entries)

    def _key(self, text: str) -> _Key:
        return (self._inner.name, hashlib.sha256(text.encode("utf-8")).digest())

    async def embed(self, texts: Sequence[str]) -> list[FloatVector]:
        keys = [self._key(text) for text in texts]
        found: dict[int, FloatVector] = {}
        waits: dict[int, tuple[asyncio.Task[list[FloatVector]], int]] = {}
        new_keys: dict[_Key, int] = {}  # key -> position in the new inner call
        new_texts: list[str] = []
        for i, key in enumerate(keys):
            cached = self._entries.get(key)
            if cached is not None:
                self._entries.move_to_end(key)
                found[i] = cached
                self.hits += 1
            elif key in self._inflight:
                waits[i] = self._inflight[key]
                self.hits += 1
            else:
                if key not in new_keys:
                    new_keys[key] = len(new_texts)
                    new_texts.append(texts[i])
                    self.misses += 1
        if new_texts:
            task = asyncio.create_task(self._compute(list(new_keys), new_texts), name="embed-miss")
            for key, position in new_keys.items():
                self._inflight[key] = (task, position)
            for i, key in enumerate(keys):
                if i not in found and i not in waits:
                    waits[i] = (task, new_keys[key])
        for i, (task, position) in waits.items():
            found[i] = (await asyncio.shield(task))[position]
        return [found[i] for i in range(len(keys))]

    async def _compute(self, keys: list[_Key], texts: list[str]) -> list[FloatVector]:
        try:
            vectors = await self._inner.embed(texts)
            for key, vector in zip(keys, vectors, strict=True):
                vector.flags.writeable = False
                if self._max_entries > 0:
                    self._entries[key] = vector
                    self._entries.move_to_end(key)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)
            return vectors
        finally:
            for key in keys:
                self._inflight.pop(key, None)

    async def aclose(self) -> None:
        for task, _ in list(self._inflight.values()):
            task.cancel()
        await self._inner.aclose()
