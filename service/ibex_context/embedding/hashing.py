"""A deterministic lexical embedder: feature hashing of word unigrams and bigrams.

Each lower-cased word and each pair of adjacent words is hashed (blake2b) to a
bucket and a sign; the vector is the signed bucket counts, L2-normalised. Texts
sharing words are close, paraphrases with other words are not: it is for tests,
load tests and deployments without a model, never a semantic model. It is pure
CPU, microseconds per text, so it runs on the event loop.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Sequence

import numpy as np

from ibex_context.errors import ConfigurationError
from ibex_context.models import FloatVector

_WORD = re.compile(r"\w+", re.UNICODE)


class HashingEmbedder:
    def __init__(self, dim: int = 384) -> None:
        if dim < 8:
            raise ConfigurationError(f"embedding_dim: the hashing embedder needs at least 8, got {dim}")
        self._dim = dim

    @property
    def name(self) -> str:
        return f"hashing-uni-bigram-{self._dim}"

    @property
    def dim(self) -> int:
        return self._dim

    def embed_one(self, text: str) -> FloatVector:
        words = _WORD.findall(text.lower())
        features = words + [f"{a} {b}" for a, b in itertools.pairwise(words)]
        vector = np.zeros(self._dim, dtype=np.float32)
        for feature in features:
            digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest()
            value = int.from_bytes(digest, "little")
            vector[value % self._dim] += 1.0 if (value >> 63) & 1 else -1.0
        norm = float(np.linalg.norm(vector))
        if norm == 0.0:
            # No words at all: a fixed unit vector keeps the contract (normalised, finite).
            vector[0] = 1.0
            return vector
        vector /= norm
        return vector

    async def embed(self, texts: Sequence[str]) -> list[FloatVector]:
        return [self.embed_one(text) for text in texts]

    async def aclose(self) -> None:
        return None
