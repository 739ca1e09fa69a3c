"""A deterministic lexical embedder: feature hashing of word unigrams and bigrams.

Each lower-cased word is hashed (blake2b, 64 bits) to a bucket (``hash % dim``)
and a sign (the top bit); each pair of adjacent words gets a 64-bit hash mixed
from its two word hashes (splitmix64 finaliser), bucketed the same way. The vector
is the signed bucket counts, L2-normalised. Texts sharing words are close,
paraphrases with other words are not: it is for tests, load tests and deployments
without a model, never a semantic model.

Cost: one dictionary look-up per word (word hashes are memoised per embedder,
bounded) and a handful of numpy operations per text, so a 2,000-character query
costs well under a millisecond and it runs on the event loop. Version 2 of the
vectors (bigram hashes mixed from word hashes instead of hashing the pair's text;
unigram buckets are unchanged): ``name`` says so, so caches keyed by it do not
mix the two.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np

from ibex_context.errors import ConfigurationError
from ibex_context.models import FloatVector

_WORD = re.compile(r"\w+", re.UNICODE)
# For ASCII text, ``\w`` is [A-Za-z0-9_]: mapping every other byte to a space and
# splitting gives the same words as the regex, about 5x faster.
_ASCII_WORD_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_ASCII_SEPARATORS = bytes(c if c in _ASCII_WORD_BYTES else 0x20 for c in range(256))
# Words seen by one embedder; cleared when full (a bound, not an LRU: refilling is cheap).
WORD_CACHE_SIZE = 65_536
_PAIR_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)
_MIX = np.uint64(0xBF58476D1CE4E5B9)


def _words(text: str) -> list[bytes]:
    """The lower-cased words of ``text`` (``\\w+``), UTF-8 encoded."""
    lowered = text.lower()
    if lowered.isascii():
        return lowered.encode("ascii").translate(_ASCII_SEPARATORS).split()
    return [word.encode("utf-8") for word in _WORD.findall(lowered)]


def _word_hash(word: bytes) -> bytes:
    """64 bits of blake2b, kept as the 8 bytes (little-endian when read as a number)."""
    return hashlib.blake2b(word, digest_size=8).digest()


def _pair_hashes(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """64-bit hashes of ordered word pairs: a multiply-xorshift mix of both word hashes."""
    x: np.ndarray = first * _PAIR_MULTIPLIER + second  # wraps modulo 2**64, as intended
    x ^= x >> np.uint64(32)
    x *= _MIX
    x ^= x >> np.uint64(29)
    return x


class HashingEmbedder:
    def __init__(self, dim: int = 384) -> None:
        if dim < 8:
            raise ConfigurationError(f"embedding_dim: the hashing embedder needs at least 8, got {dim}")
        self._dim = dim
        self._word_hashes: dict[bytes, bytes] = {}

    @property
    def name(self) -> str:
        return f"hashing-v2-uni-bigram-{self._dim}"

    @property
    def dim(self) -> int:
        return self._dim

    def _hashes(self, words: list[bytes]) -> np.ndarray:
        cache = self._word_hashes
        try:
            joined = b"".join(map(cache.__getitem__, words))
        except KeyError:
            if len(cache) >= WORD_CACHE_SIZE:
                cache.clear()
            for word in words:
                if word not in cache:
                    cache[word] = _word_hash(word)
            joined = b"".join(map(cache.__getitem__, words))
        return np.frombuffer(joined, dtype="<u8")

    def embed_one(self, text: str) -> FloatVector:
        words = _words(text)
        if not words:
            # No words at all: a fixed unit vector keeps the contract (normalised, finite).
            vector = np.zeros(self._dim, dtype=np.float32)
            vector[0] = 1.0
            return vector
        unigrams = self._hashes(words)
        features = np.concatenate((unigrams, _pair_hashes(unigrams[:-1], unigrams[1:])))
        dim = self._dim
        # Bucket ``hash % dim``, sign from the top bit: counted in one bincount over
        # 2*dim slots (negative features in the first half, positive in the second).
        slots = features % np.uint64(dim) + (features >> np.uint64(63)) * np.uint64(dim)
        halves = np.bincount(slots.astype(np.intp), minlength=2 * dim)
        counts = (halves[dim:] - halves[:dim]).astype(np.float32)
        norm = float(np.sqrt(counts @ counts))
        if norm == 0.0:
            # Every feature cancelled out: same fallback as a text without words.
            counts[0] = 1.0
            return counts
        counts /= norm
        return counts

    def embed_many(self, texts: Sequence[str]) -> np.ndarray:
        """``embed_one`` of every text, bit for bit, as the rows of one float32 matrix:
        the batch's words hashed in one pass, its word pairs mixed in one array
        operation and its buckets counted by one bincount, instead of a handful of
        numpy calls per text (bulk loads)."""
        dim, rows = self._dim, len(texts)
        words: list[bytes] = []
        lengths = np.zeros(rows, dtype=np.intp)
        for row, text in enumerate(texts):
            text_words = _words(text)
            words.extend(text_words)
            lengths[row] = len(text_words)
        unigrams = self._hashes(words)
        owner = np.repeat(np.arange(rows, dtype=np.intp), lengths)
        # A pair joins two adjacent words of one text, never the last word of a text
        # and the first of the next.
        same_text = owner[:-1] == owner[1:]
        pairs = _pair_hashes(unigrams[:-1], unigrams[1:])[same_text]
        features = np.concatenate((unigrams, pairs))
        owners = np.concatenate((owner, owner[:-1][same_text]))
        # Bucket ``hash % dim``, sign from the top bit, as embed_one.
        slots = (features % np.uint64(dim) + (features >> np.uint64(63)) * np.uint64(dim)).astype(np.intp)
        halves = np.bincount(owners * (2 * dim) + slots, minlength=rows * 2 * dim).reshape(rows, 2 * dim)
        counts = (halves[:, dim:] - halves[:, :dim]).astype(np.float32)
        # Integer counts: their squares sum exactly in float32 in any order, so each
        # norm equals embed_one's ``sqrt(counts @ counts)``.
        norms = np.sqrt(np.einsum("ij,ij->i", counts, counts))
        empty = norms == 0.0
        counts[empty, 0] = 1.0  # no words, or every feature cancelled: embed_one's fallback
        norms[empty] = 1.0
        counts /= norms[:, None]
        return counts

    async def embed(self, texts: Sequence[str]) -> list[FloatVector]:
        return [self.embed_one(text) for text in texts]

    async def aclose(self) -> None:
        return None
