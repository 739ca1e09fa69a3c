"""Token counts of chat messages, as the chat APIs bill them.

OpenAI's chat format wraps every message as
``<|start|>{role}<|message|>{content}<|end|>`` and primes the reply with
``<|start|>assistant<|message|>``. Counting therefore adds, per the
openai-cookbook notebook "How to count tokens with tiktoken"
(``num_tokens_from_messages``) for gpt-3.5-turbo-0613 and every later model:

* ``TOKENS_PER_MESSAGE`` = 3 for each message (start, message and end markers),
* ``REPLY_PRIMING_TOKENS`` = 3 once for the primed reply,
* plus tokens(role) + tokens(content).

(The 2023 gpt-3.5-turbo-0301 used 4 per message; the original design document
copied that figure. It is kept as a keyword for callers that need it.)

A conversation resends the same prefix every turn, so per-message counts are
cached by (encoding, blake2b(role, content)) in a bounded LRU: hashing is ~50x
cheaper than encoding.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

from ibex_context.models import ChatMessage
from ibex_context.tokens.encodings import Encoding, EncodingRegistry

TOKENS_PER_MESSAGE = 3
REPLY_PRIMING_TOKENS = 3
# Texts up to this long key the cache directly; hashing would cost more.
_SHORT_TEXT_CHARS = 256


class MessageTokenCounter:
    """Counts messages with a bounded per-message cache (``cache_size=0`` disables it)."""

    def __init__(
        self, registry: EncodingRegistry, cache_size: int = 50_000, *, block_cache_size: int = 100_000
    ) -> None:
        if cache_size < 0:
            raise ValueError("cache_size must be >= 0")
        if block_cache_size < 0:
            raise ValueError("block_cache_size must be >= 0")
        # Block entries are small (a key and a fingerprint of the memory, ~200 bytes),
        # and one memory may have several (head, body, per format): their own bound.
        self._block_cache_size = 0 if cache_size == 0 else block_cache_size
        self._registry = registry
        self._cache_size = cache_size
        # Keys: (encoding, exact, digest of role+content) for messages; short texts
        # are their own key (a str never equals a digest's bytes).
        self._cache: OrderedDict[tuple[str, bool, str | bytes], int] = OrderedDict()
        # Exact counts of formatted memory blocks, keyed by what shapes the block
        # (encoding, format, nonce, id, variant) and validated against a fingerprint
        # of the text it was computed from: an edited memory is recounted.
        self._blocks: OrderedDict[tuple[object, ...], tuple[object, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def registry(self) -> EncodingRegistry:
        return self._registry

    def count_text(self, text: str, encoding: Encoding) -> int:
        return encoding.count(text)

    def count_messages(
        self,
        messages: Sequence[ChatMessage],
        encoding: Encoding,
        *,
        tokens_per_message: int = TOKENS_PER_MESSAGE,
    ) -> int:
        total = REPLY_PRIMING_TOKENS
        for message in messages:
            total += tokens_per_message + self._cached_body(message, encoding)
        return total

    def count_text_cached(self, text: str, encoding: Encoding) -> int:
        """``count_text`` through the same LRU, for text that recurs across calls
        (memory tag framing: a session's nonce and its memories' ids repeat every turn)."""
        if self._cache_size == 0:
            return encoding.count(text)
        key: str | bytes = text
        if len(text) > _SHORT_TEXT_CHARS:
            key = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        full_key = (encoding.name, encoding.exact, key)
        cached = self._cached(full_key)
        return cached if cached is not None else self._store(full_key, encoding.count(text))

    def count_block(self, key: tuple[object, ...], source: object, compute: Callable[[], int]) -> int:
        """A count cached under ``key`` for as long as it was computed from an equal ``source``.

        The key names what the count depends on besides ``source`` (the
        caller's encoding, format, nonce, memory id); ``source`` is what the
        count was computed from, or a fingerprint of it (kept in the cache, so
        it should be small).
        """
        if self._block_cache_size == 0:
            return compute()
        with self._lock:
            cached = self._blocks.get(key)
            if cached is not None and cached[0] == source:
                self._blocks.move_to_end(key)
                self.hits += 1
                return cached[1]
        count = compute()
        with self._lock:
            self.misses += 1
            self._blocks[key] = (source, count)
            self._blocks.move_to_end(key)
            if len(self._blocks) > self._block_cache_size:
                self._blocks.popitem(last=False)
        return count

    def _cached_body(self, message: ChatMessage, encoding: Encoding) -> int:
        if self._cache_size == 0:
            return encoding.count(message.role) + encoding.count(message.content)
        digest = hashlib.blake2b(digest_size=16)
        digest.update(message.role.encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
        digest.update(message.content.encode("utf-8", "surrogatepass"))
        return self._lookup(
            (encoding.name, encoding.exact, digest.digest()),
            lambda: encoding.count(message.role) + encoding.count(message.content),
        )

    def _lookup(self, key: tuple[str, bool, str | bytes], compute: Callable[[], int]) -> int:
        cached = self._cached(key)
        return cached if cached is not None else self._store(key, compute())

    # A hit is the common case (a call asks ~40 times): no closure is built for it.
    def _cached(self, key: tuple[str, bool, str | bytes]) -> int | None:
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                self.hits += 1
            return cached

    def _store(self, key: tuple[str, bool, str | bytes], count: int) -> int:
        with self._lock:
            self.misses += 1
            self._cache[key] = count
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return count

    def __len__(self) -> int:
        return len(self._cache)
