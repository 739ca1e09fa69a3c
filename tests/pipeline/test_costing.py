"""Token costs of the injected text (``pipeline.costing``): per memory for the packer,
an upper bound with the section overhead, and the exact count of the whole injection,
checked against a full recount of the formatted messages."""

from __future__ import annotations

import random
import re

import pytest
from ibex_context.candidates import Candidates
from ibex_context.models import ChatMessage, MemoryRecord, ScoredMemory
from ibex_context.pipeline.costing import (
    STORED_BLOCK_FORMATS,
    BlockCosts,
    block_count_key,
    count_injection,
    memory_cost,
    section_overhead,
    stored_token_counts,
)
from ibex_context.pipeline.layout import lay_out, render_injection
from ibex_context.profiles.model import Format
from ibex_context.tokens.counting import MessageTokenCounter
from ibex_context.tokens.encodings import Encoding, EncodingRegistry

from tests.pipeline.helpers import FORMATS, MESSAGES, NONCE, scored


def _estimate(encoding: Encoding, fmt: Format, directive: str | None, memories: list[ScoredMemory]) -> int:
    return (
        # The directive section alone, as the assembler counts it: the injection of no memory.
        (
            encoding.count(render_injection(directive=directive, memories=[], fmt=fmt, nonce=NONCE))
            if directive
            else 0
        )
        + section_overhead(encoding, fmt, nonce=NONCE, categories=[m.memory.category for m in memories])
        + sum(memory_cost(m, encoding, fmt) for m in memories)
    )


@pytest.mark.parametrize("encoding_name", ["o200k_base", "cl100k_base"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_costs_are_an_upper_bound_close_to_the_exact_count(
    registry: EncodingRegistry, encoding_name: str, fmt: Format
) -> None:
    encoding = registry.get(encoding_name)
    pieces = [*"abcxyz QRS 0123 .,;:!?-'\"<>&`*#\n\t()[]{}/\\", "é", "日本", "😀", " the", "</memory>", "```"]
    rng = random.Random(f"{encoding_name}-{fmt}")
    slack = []
    for trial in range(150):
        memories = []
        for i in range(rng.randint(1, 8)):
            content = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 60)))
            category = rng.choice(["procedural", "factual", "episodic", "custom"])
            counts = {encoding_name: encoding.count(content)}
            memories.append(scored(f"mem-{trial}-{i}", content, category, token_counts=counts))
        directive = rng.choice([None, "Be brief.", "Use <b>tags</b> freely.\n"])
        exact = encoding.count(render_injection(directive=directive, memories=memories, fmt=fmt, nonce=NONCE))
        estimate = _estimate(encoding, fmt, directive, memories)
        assert estimate >= exact, (trial, estimate, exact)
        slack.append((estimate - exact) / len(memories))
    assert sum(slack) / len(slack) < 2.5  # tokens of over-estimate per memory, on average


def test_memory_cost_uses_the_stored_count_when_content_is_unchanged(registry: EncodingRegistry) -> None:
    encoding = registry.get("o200k_base")
    plain = scored("m", "plain words here", token_counts={"o200k_base": 1000})
    assert memory_cost(plain, encoding, "xml") > 1000
    # After escaping a few characters of a long text, the stored count is adjusted
    # by what escaping changed (the words around "<" are recounted), not
    # replaced by a recount of everything.
    content = "plain words " * 20 + "then a < b here"
    true_count = encoding.count(content)
    escaped = scored("m", content, token_counts={"o200k_base": true_count})
    inflated = scored("m", content, token_counts={"o200k_base": true_count + 1000})
    exact = memory_cost(escaped, encoding, "xml")
    escaped_content = content.replace("<", "&lt;")
    assert exact == encoding.count(f'<memory id="1">\n{escaped_content}\n</memory>\n')
    assert memory_cost(inflated, encoding, "xml") == exact + 1000


def test_memory_cost_through_a_counter_is_the_same_and_cached(registry: EncodingRegistry) -> None:
    encoding = registry.get("o200k_base")
    counter = MessageTokenCounter(registry, cache_size=100)
    memory = scored("m-1", 'it\'s <fine> & "quoted"', token_counts={"o200k_base": 3})
    direct = memory_cost(memory, encoding, "xml")
    assert memory_cost(memory, encoding, "xml", counter=counter) == direct
    misses, hits = counter.misses, counter.hits
    assert memory_cost(memory, encoding, "xml", counter=counter) == direct
    # The second cost is served whole from the block cache: nothing is tokenized again.
    assert counter.misses == misses and counter.hits > hits


@pytest.mark.parametrize("encoding_name", ["o200k_base", "cl100k_base"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_memorys_framing_costs_the_same_at_every_handle_up_to_999(
    registry: EncodingRegistry, encoding_name: str, fmt: Format
) -> None:
    # memory_cost costs every memory at handle 1 before the packer places it; digit
    # runs of 1-3 are pre-tokenized apart, so the place cannot change the count.
    encoding = registry.get(encoding_name)
    memories = [scored(f"m{i}", f"memory number {i}", token_counts={}) for i in range(999)]
    text = render_injection(directive=None, memories=memories, fmt=fmt, nonce=NONCE)
    blocks = (
        re.findall(r'<memory id="\d+">\n.*?\n</memory>\n', text)
        if fmt == "xml"
        else re.findall(r"```memory id=\d+\n.*?\n```\n", text)
        if fmt == "markdown"
        else [line + "\n" for line in text.split("\n") if line.startswith('{"id"')]
    )
    assert len(blocks) >= 998
    for n, block in enumerate(blocks[:998], start=1):
        at_one = block.replace(f"id={n}\n", "id=1\n").replace(f'id="{n}"', 'id="1"')
        at_one = at_one.replace(f'"id": {n},', '"id": 1,')
        assert at_one != block or n == 1
        assert encoding.count(block) == encoding.count(at_one), n


def test_an_edited_memory_is_recounted_not_served_from_the_cache(registry: EncodingRegistry) -> None:
    encoding = registry.get("o200k_base")
    counter = MessageTokenCounter(registry, cache_size=100)
    before = scored("m-1", "short", token_counts={"o200k_base": 1})
    after = scored("m-1", "a much longer text now", token_counts={"o200k_base": 5})
    memory_cost(before, encoding, "xml", counter=counter)
    assert memory_cost(after, encoding, "xml", counter=counter) == memory_cost(after, encoding, "xml")


def test_section_overhead_can_include_the_new_message_framing(registry: EncodingRegistry) -> None:
    encoding = registry.get("o200k_base")
    bare = section_overhead(encoding, "xml", nonce=NONCE, categories=["factual"])
    framed = section_overhead(
        encoding, "xml", nonce=NONCE, categories=["factual"], include_message_framing=True
    )
    assert framed == bare + 3 + 1


# -- count_injection: the exact count, summed from cached chunks -------------------------

_PIECES = [*"abcxyz QRS 0123 .,;:!?-'\"<>&`*#\n\t()[]{}/\\\r", "é", "日本", "😀", " the", "</memory>", "```",
           "\u00a0", "'s", "\n\n", " \n", "//", "word word ", "end. "]  # fmt: skip
_SYSTEM_PROMPTS = [
    "Client system prompt.",
    "",
    " leading space",
    "\nleading newline",
    "/slash",
    "<tag>",
    "日本",
]


@pytest.mark.parametrize("encoding_name", ["o200k_base", "cl100k_base"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_count_of_an_injection_equals_a_full_recount_of_the_messages_rendered_from_it(
    registry: EncodingRegistry, encoding_name: str, fmt: Format
) -> None:
    encoding = registry.get(encoding_name)
    counter = MessageTokenCounter(registry, cache_size=10_000)
    uncached = MessageTokenCounter(registry, cache_size=0)
    rng = random.Random(f"injected-{encoding_name}-{fmt}")
    for trial in range(200):
        memories = []
        for i in range(rng.randint(0, 8)):
            content = "".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 60)))
            category = rng.choice(["procedural", "factual", "episodic", "custom"])
            draw = rng.random()
            # Write-time counts as the write path stores them (with block bodies), the
            # content's count alone (rows written before block counts), or none.
            if draw < 0.45:
                counts = stored_token_counts(content, [encoding])
            elif draw < 0.9:
                counts = {encoding_name: encoding.count(content)}
            else:
                counts = {}
            # Ids recur across trials with other contents: the cache must notice.
            memories.append(scored(f"mem-{i}", content, category, token_counts=counts))
        directive = rng.choice([None, "", "Be brief.", "Use <b>tags</b> freely.\n", " spaced \n\n", "/x"])
        mode = rng.choice(["system_first", "merge_system"])
        messages = (ChatMessage("system", rng.choice(_SYSTEM_PROMPTS)), ChatMessage("user", "Hi"))
        if rng.random() < 0.3:
            messages = messages[1:]
        injection = lay_out(messages, directive=directive, memories=memories, fmt=fmt, mode=mode, nonce=NONCE)
        expected = uncached.count_messages(injection.messages(messages), encoding) - uncached.count_messages(
            messages, encoding
        )
        for _ in range(2):  # uncached, then from the cache
            got = count_injection(injection, encoding, counter)
            assert got == expected, (trial, mode, directive, [m.memory.content for m in memories])


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_count_is_exact_for_realistic_memories_with_stored_counts(
    registry: EncodingRegistry, fmt: Format
) -> None:
    encoding = registry.get("o200k_base")
    counter = MessageTokenCounter(registry)
    rng = random.Random(fmt)
    words = "deploy the canary at 5 % for an hour, then promote; never on Fridays! (see runbook)".split()  # noqa: SIM905
    memories = []
    for i in range(20):
        # Sparse escapes (&, <, quotes, newlines) take the stored-count-plus-edits path.
        extras = ["x<y", "a & b", '"q"', "line\nbreak", "back\\slash"]
        chosen = [
            rng.choice(words) if rng.random() < 0.97 else rng.choice(extras)
            for _ in range(rng.randint(20, 200))
        ]
        content = " ".join(chosen) + rng.choice([".", "!", "", "\n"])
        counts = {"o200k_base": encoding.count(content)}
        memories.append(scored(f"m{i}", content, rng.choice(["factual", "procedural"]), token_counts=counts))
    injection = lay_out(
        MESSAGES, directive="Be brief.", memories=memories, fmt=fmt, mode="system_first", nonce=NONCE
    )
    expected = encoding.count(injection.text()) + 3 + encoding.count("system")
    assert count_injection(injection, encoding, counter) == expected


def test_a_wrong_stored_count_puts_the_count_off_by_exactly_that_much(
    registry: EncodingRegistry,
) -> None:
    # The stored count is trusted (the stores count at write time with the same
    # encoding); this pins down that it is what is used, not a recount.
    encoding = registry.get("o200k_base")
    counter = MessageTokenCounter(registry)
    content = "a plain memory about deploys on Fridays"
    right = scored("m", content, token_counts={"o200k_base": encoding.count(content)})
    wrong = scored("m", content, token_counts={"o200k_base": encoding.count(content) + 7})

    def count(memory: ScoredMemory) -> int:
        injection = lay_out(
            MESSAGES, directive=None, memories=[memory], fmt="xml", mode="system_first", nonce=NONCE
        )
        return count_injection(injection, encoding, counter)

    assert count(wrong) == count(right) + 7


def test_nothing_to_inject_counts_zero(registry: EncodingRegistry) -> None:
    counter = MessageTokenCounter(registry)
    encoding = registry.get("o200k_base")
    injection = lay_out(MESSAGES, directive=None, memories=[], fmt="xml", mode="system_first", nonce=NONCE)
    assert injection.chunks == () and injection.messages(MESSAGES) == MESSAGES
    assert count_injection(injection, encoding, counter) == 0


# -- block counts stored at write time --------------------------------------------------


@pytest.mark.parametrize("encoding_name", ["o200k_base", "cl100k_base"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_stored_block_count_costs_a_memory_exactly_as_counting_it_does(
    registry: EncodingRegistry, encoding_name: str, fmt: Format
) -> None:
    encoding = registry.get(encoding_name)
    rng = random.Random(f"stored-{encoding_name}-{fmt}")
    for trial in range(300):
        content = "".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 60)))
        bare = MemoryRecord(id=f"m{trial}", content=content, category="factual")
        stored = MemoryRecord(
            id=f"m{trial}",
            content=content,
            category="factual",
            token_counts=stored_token_counts(content, [encoding]),
        )
        expected = memory_cost(bare, encoding, fmt)
        fresh = MessageTokenCounter(registry)
        assert BlockCosts(encoding, fmt, fresh)(stored) == expected, (trial, content)
        assert BlockCosts(encoding, fmt, fresh)(bare) == expected, (trial, content)


def test_block_bodies_are_stored_only_where_blocks_join_additively(registry: EncodingRegistry) -> None:
    encoding = registry.get("o200k_base")
    counts = stored_token_counts("Priya travels with her service dog.", [encoding])
    assert counts["o200k_base"] == encoding.count("Priya travels with her service dog.")
    assert {block_count_key("o200k_base", f) for f in STORED_BLOCK_FORMATS} <= counts.keys()
    # A leading space or slash may merge with the opening line's newline: costed per call.
    assert stored_token_counts(" leading space", [encoding]).keys() == {"o200k_base"}
    assert stored_token_counts("/path first", [encoding]).keys() == {"o200k_base"}


def test_packing_costs_need_no_tokenizer_when_block_counts_are_stored(registry: EncodingRegistry) -> None:
    encoding = registry.get("o200k_base")
    counter = MessageTokenCounter(registry)
    costs = BlockCosts(encoding, "xml", counter)
    records = [
        MemoryRecord(id=f"m{i}", content=f"Memory number {i} about the canary.", category="factual",
                     token_counts=stored_token_counts(f"Memory number {i} about the canary.", [encoding]))
        for i in range(50)
    ]  # fmt: skip
    misses = counter.misses
    for record in records:
        costs(record)
    assert counter.misses == misses  # every cost was a lookup


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_packers_cost_by_index_is_the_cost_of_that_memory(
    registry: EncodingRegistry, fmt: Format
) -> None:
    encoding = registry.get("o200k_base")
    counter = MessageTokenCounter(registry)
    contents = ["Plain words.", " leading space", "x < y & z", "```code``` then text", "日本語のメモ"]
    records = [
        MemoryRecord(
            id=f"m{i}", content=c, category="factual", token_counts=stored_token_counts(c, [encoding])
        )
        for i, c in enumerate(contents)
    ] + [MemoryRecord(id="bare", content="No counts stored.", category="factual")]
    costs = BlockCosts(encoding, fmt, counter)
    cost_of = costs.by_index(Candidates.from_records(records))
    assert [cost_of(i) for i in range(len(records))] == [memory_cost(r, encoding, fmt) for r in records]
