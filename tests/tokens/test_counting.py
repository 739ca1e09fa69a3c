from __future__ import annotations

from ibex_context.models import ChatMessage
from ibex_context.tokens.counting import REPLY_PRIMING_TOKENS, TOKENS_PER_MESSAGE, MessageTokenCounter
from ibex_context.tokens.encodings import EncodingRegistry


def test_messages_are_counted_in_openai_chat_format(registry: EncodingRegistry) -> None:
    encoding = registry.get("o200k_base")
    counter = MessageTokenCounter(registry, cache_size=100)
    messages = [ChatMessage("system", "You are helpful."), ChatMessage("user", "Hello world")]
    expected = REPLY_PRIMING_TOKENS + sum(
        TOKENS_PER_MESSAGE + encoding.count(m.role) + encoding.count(m.content) for m in messages
    )
    assert counter.count_messages(messages, encoding) == expected
    # 3 priming + (3 + 1 "system" + 4) + (3 + 1 "user" + 2): the figure OpenAI's API reports.
    assert expected == 3 + (3 + 1 + 4) + (3 + 1 + 2)


def test_no_messages_cost_only_the_reply_priming(registry: EncodingRegistry) -> None:
    counter = MessageTokenCounter(registry)
    assert counter.count_messages([], registry.get("o200k_base")) == REPLY_PRIMING_TOKENS


def test_a_resent_prefix_is_served_from_the_cache(registry: EncodingRegistry) -> None:
    encoding = registry.get("o200k_base")
    counter = MessageTokenCounter(registry, cache_size=100)
    turn1 = [ChatMessage("user", "What is the capital of France?")]
    turn2 = [*turn1, ChatMessage("assistant", "Paris."), ChatMessage("user", "And of Spain?")]
    first = counter.count_messages(turn1, encoding)
    assert (counter.hits, counter.misses) == (0, 1)
    second = counter.count_messages(turn2, encoding)
    assert (counter.hits, counter.misses) == (1, 3)
    assert second > first


def test_cache_is_keyed_by_encoding(registry: EncodingRegistry) -> None:
    counter = MessageTokenCounter(registry, cache_size=100)
    text = [ChatMessage("user", "naïve café 日本語 tokenization")]
    o200k = counter.count_messages(text, registry.get("o200k_base"))
    cl100k = counter.count_messages(text, registry.get("cl100k_base"))
    assert counter.misses == 2
    assert o200k != cl100k


def test_cache_is_bounded_lru(registry: EncodingRegistry) -> None:
    encoding = registry.get("o200k_base")
    counter = MessageTokenCounter(registry, cache_size=2)
    a, b, c = (ChatMessage("user", t) for t in ("alpha", "beta", "gamma"))
    counter.count_messages([a, b], encoding)
    counter.count_messages([a], encoding)  # a is now most recent
    counter.count_messages([c], encoding)  # evicts b
    assert len(counter) == 2
    hits = counter.hits
    counter.count_messages([a], encoding)
    assert counter.hits == hits + 1
    misses = counter.misses
    counter.count_messages([b], encoding)
    assert counter.misses == misses + 1


def test_cache_size_zero_disables_caching(registry: EncodingRegistry) -> None:
    counter = MessageTokenCounter(registry, cache_size=0)
    encoding = registry.get("o200k_base")
    counter.count_messages([ChatMessage("user", "x")], encoding)
    assert len(counter) == 0


def test_count_text_is_the_plain_token_count(registry: EncodingRegistry) -> None:
    counter = MessageTokenCounter(registry)
    assert counter.count_text("Hello world", registry.get("o200k_base")) == 2


def test_a_block_count_is_reused_only_while_its_source_is_unchanged(registry: EncodingRegistry) -> None:
    counter = MessageTokenCounter(registry, cache_size=100)
    computed: list[str] = []

    def count(text: str) -> int:
        computed.append(text)
        return len(text)

    key = ("o200k_base", True, "xml", "memory-1")
    assert counter.count_block(key, "first content", lambda: count("first content")) == 13
    assert counter.count_block(key, "first content", lambda: count("first content")) == 13
    # The memory was edited: same key, other source, counted again (never served stale).
    assert counter.count_block(key, "edited", lambda: count("edited")) == 6
    assert computed == ["first content", "edited"]


def test_the_block_cache_is_bounded(registry: EncodingRegistry) -> None:
    counter = MessageTokenCounter(registry, cache_size=100, block_cache_size=2)
    calls = 0

    def compute() -> int:
        nonlocal calls
        calls += 1
        return 1

    for key in ("a", "b", "c", "a"):
        counter.count_block((key,), "source", compute)
    assert calls == 4  # "a" was evicted by "c"
