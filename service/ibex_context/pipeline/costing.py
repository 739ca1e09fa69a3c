"""Token costs of the injected text: per memory for the packer, exactly for the whole.

Costs: ``memory_cost`` is what one memory adds to the injected text (costed with
handle ``COSTING_HANDLE``: a handle of 1-999 is one token in cl100k and o200k,
where digit runs are pre-tokenized apart), ``section_overhead`` the fixed text
around the memories (the assembler counts the directive section exactly, as the
injection of no memory); together an upper bound (see ``JOIN_ALLOWANCE_TOKENS``).

Exact count: ``count_injection`` is what the injection adds to the prompt,
exactly (``count_messages`` of the formatted messages minus that of the
client's). The text is laid out as chunks (``formatting.lay_out``, once per
call, the same chunks the messages are rendered from) where every chunk but
the last ends with "\n" and every chunk but the first starts with ``<``, ``#``,
a backtick, ``{`` or ``R``; with cl100k/o200k no BPE piece spans such a join
(``Encoding.splits_after_newline``), so the count is the sum of the chunks'
counts, each cached: a memory block by (encoding, format, handle, id) and
validated against its content, the fixed pieces through the counter's LRU. A
memory block is counted from its stored ``token_counts`` plus the few words
around its joins (``Encoding.count_wrapped``), so even an uncached block costs
a few short tokenizer calls, not its whole content.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

from ibex_context.candidates import Candidates
from ibex_context.models import MemoryRecord, ScoredMemory
from ibex_context.pipeline.layout import (
    BLOCK_AS_IS,
    SECTION_SEPARATOR,
    Injection,
    block_end,
    category_order,
    check_nonce,
    json_text,
    memory_parts,
    notice,
    opening_line,
    record_of,
    section_close,
    section_open,
    xml_opening,
    xml_text,
)
from ibex_context.profiles.model import Format
from ibex_context.tokens.counting import TOKENS_PER_MESSAGE, MessageTokenCounter
from ibex_context.tokens.encodings import Encoding

# Tokens added to each memory's (and section's) cost for BPE merges across the
# joins. Counting the pieces separately has over-counted the joined text in
# every case tried (2,400 adversarial mixes of tags, quotes, backticks, CJK,
# emoji; tests/pipeline/test_formatting.py keeps a seeded sample), so 0 keeps
# costs tight; the assembler's exact recount is the backstop.
JOIN_ALLOWANCE_TOKENS = 0
# What appending SECTION_SEPARATOR to a piece counted without it may add: the
# separator is one token, and merging it into the piece's last one saves it.
SEPARATOR_ALLOWANCE_TOKENS = 1
# The handle memories are costed with before the packer knows their places.
COSTING_HANDLE = 1
# Characters json.dumps (ensure_ascii=False) escapes with one added backslash; it
# also escapes other control characters, each as six characters (\\u00XX).
# Recounting the stretch around one edit costs about as much as counting this
# many characters of the whole text (two short tokenizer calls against one long one).
_CHARS_PER_EDIT_WORTH_RECOUNTING = 150
_JSON_SHORT_ESCAPES = '"\\\n\t\r\b\f'


def _starts_safely(text: str) -> bool:
    """Whether a chunk ending in "\\n" may precede ``text`` with additive counts."""
    return bool(text) and not text[0].isspace() and text[0] != "/"


def _escaped_positions(content: str, characters: str) -> list[int]:
    # str.find per character is a memchr; far cheaper than a regex scan.
    positions: list[int] = []
    for character in characters:
        at = content.find(character)
        while at >= 0:
            positions.append(at)
            at = content.find(character, at + 1)
    return positions


def _stored_escaped_count(record: MemoryRecord, encoding: Encoding, fmt: Format, escaped: str) -> int | None:
    """Exact tokens of the escaped content from the write-time count; None without one."""
    stored = record.token_counts.get(encoding.name) if encoding.exact else None
    if stored is None or escaped == record.content:
        return stored
    # Escaping replaced a few characters: recount only the words around them.
    if fmt == "json":
        positions = _escaped_positions(record.content, _JSON_SHORT_ESCAPES)
        # Another control character (escaped as \\u00XX) is rare: count it all.
        exotic = len(escaped) - len(record.content) != len(positions)
        edit = json_text
    else:
        positions = _escaped_positions(record.content, "&<>")
        exotic = False
        edit = xml_text
    if exotic or len(positions) * _CHARS_PER_EDIT_WORTH_RECOUNTING > len(record.content):
        # Dense edits (a multi-line memory in json: every newline): one count of
        # the whole is cheaper than two per edited stretch.
        return encoding.count(escaped)
    return encoding.count_edited(record.content, stored, edit, positions)


def _escaped_tokens(record: MemoryRecord, encoding: Encoding, fmt: Format) -> int:
    """Exact tokens of the escaped content alone; it depends on no handle."""
    escaped = memory_parts(record, fmt, COSTING_HANDLE)[1]
    stored = _stored_escaped_count(record, encoding, fmt, escaped)
    return encoding.count(escaped) if stored is None else stored


def _count_block(record: MemoryRecord, encoding: Encoding, fmt: Format, handle: int, variant: int) -> int:
    """Exact tokens of one memory block as it appears in the text."""
    opening, escaped, closing = memory_parts(record, fmt, handle)
    closing = block_end(closing, variant)
    if not encoding.splits_after_newline:
        return encoding.count(opening + escaped + closing)
    return encoding.count_wrapped(opening, escaped, _escaped_tokens(record, encoding, fmt), closing)


def _count_body(record: MemoryRecord, encoding: Encoding, fmt: Format, variant: int) -> int:
    """Exact tokens of a block after its opening line (which ends with "\\n");
    only for content that ``_starts_safely``."""
    _, escaped, closing = memory_parts(record, fmt, COSTING_HANDLE)
    closing = block_end(closing, variant)
    stored = _stored_escaped_count(record, encoding, fmt, escaped)
    if stored is None:
        return encoding.count(escaped + closing)
    return encoding.count_wrapped("", escaped, stored, closing)


def _memory_tokens(
    record: MemoryRecord,
    encoding: Encoding,
    fmt: Format,
    handle: int,
    variant: int,
    counter: MessageTokenCounter | None,
) -> int:
    """Exact tokens of one memory block, through the counter's caches when given."""
    if fmt != "json" and encoding.splits_after_newline and _starts_safely(record.content):
        # The opening line ends with "\n" and the content starts safely, so the block
        # is opening + body. The body depends on no handle: its count is shared by
        # every call that recalls the memory, wherever it stands.
        stored = (
            record.token_counts.get(block_count_key(encoding.name, fmt))
            if variant == BLOCK_AS_IS and encoding.exact
            else None
        )
        if stored is not None:
            return encoding.count_short(opening_line(record, fmt, handle)) + stored
        if counter is None:
            return encoding.count(opening_line(record, fmt, handle)) + _count_body(
                record, encoding, fmt, variant
            )
        body = counter.count_block(
            (encoding.name, encoding.exact, fmt, record.id, variant),
            _fingerprint(record, encoding),
            partial(_count_body, record, encoding, fmt, variant),
        )
        return counter.count_text_cached(opening_line(record, fmt, handle), encoding) + body
    if counter is None:
        return _count_block(record, encoding, fmt, handle, variant)
    # The block depends on the handle (key) and on content, category and the
    # stored count (the source the cached count is checked against).
    source = _fingerprint(record, encoding)
    return counter.count_block(
        (encoding.name, encoding.exact, fmt, handle, record.id, variant),
        source,
        partial(_count_block_in_parts, record, encoding, fmt, handle, variant, counter, source),
    )


def _fingerprint(record: MemoryRecord, encoding: Encoding) -> int:
    """What a cached block count is validated against, kept in the cache instead of
    the text: a hash of the content's length and hash, the category and the stored
    count. An edited memory gets a new fingerprint (a stale hit needs a 64-bit
    collision)."""
    content = record.content
    return hash((len(content), hash(content), record.category, record.token_counts.get(encoding.name)))


def _count_block_in_parts(
    record: MemoryRecord,
    encoding: Encoding,
    fmt: Format,
    handle: int,
    variant: int,
    counter: MessageTokenCounter,
    source: object,
) -> int:
    """A block as opening + head | middle | tail + closing, cut at word gaps (no
    piece spans them). Only the first part depends on the handle: another place
    tokenizes just it (the opening and the content's first word or two)."""
    opening, escaped, closing = memory_parts(record, fmt, handle)
    gaps = encoding.word_gaps(escaped)
    if gaps is None:
        return _count_block(record, encoding, fmt, handle, variant)
    head, tail = escaped[: gaps[0]], escaped[gaps[1] :]
    middle = counter.count_block(
        (encoding.name, encoding.exact, fmt, record.id, "middle"),
        source,
        lambda: _escaped_tokens(record, encoding, fmt) - encoding.count(head) - encoding.count(tail),
    )
    end = block_end(closing, variant)
    tail_tokens = counter.count_block(
        (encoding.name, encoding.exact, fmt, record.id, "tail", variant),
        source,
        lambda: encoding.count(tail + end),
    )
    return encoding.count(opening + head) + middle + tail_tokens


def count_injection(injection: Injection, encoding: Encoding, counter: MessageTokenCounter) -> int:
    """Tokens ``injection`` adds to the prompt, exactly: ``counter.count_messages`` of
    ``injection.messages(client)`` minus that of ``client``.

    Summed from cached chunk counts (see the module docstring) when the
    encoding allows it; otherwise the rendered text is counted whole.
    """
    if not injection.chunks:
        return 0
    merge_into, fmt = injection.merge_into, injection.fmt
    framing = TOKENS_PER_MESSAGE + counter.count_text_cached("system", encoding) if merge_into is None else 0
    if not encoding.splits_after_newline or (merge_into and not _starts_safely(merge_into)):
        text = injection.text()
        if merge_into is None:
            return framing + counter.count_text_cached(text, encoding)
        # The text ends with the separator before the client's prompt.
        return counter.count_text_cached(text + merge_into, encoding) - (
            counter.count_text_cached(merge_into, encoding)
        )
    # The client's own system prompt (merge) starts safely, so it adds its own
    # count on both sides of the difference: only the chunks remain.
    total = framing
    # A block whose body was counted at write time costs its opening line (the one
    # part that depends on the handle) plus that count: looked up once per block here.
    stored_key = block_count_key(encoding.name, fmt) if fmt != "json" and encoding.exact else None
    for chunk in injection.chunks:
        if isinstance(chunk, str):
            total += counter.count_text_cached(chunk, encoding)
            continue
        record, variant, handle = chunk
        stored = (
            record.token_counts.get(stored_key)
            if stored_key is not None and variant == BLOCK_AS_IS and _starts_safely(record.content)
            else None
        )
        if stored is not None:
            total += encoding.count_short(opening_line(record, fmt, handle)) + stored
        else:
            total += _memory_tokens(record, encoding, fmt, handle, variant, counter)
    return total


def memory_cost(
    memory: ScoredMemory | MemoryRecord,
    encoding: Encoding,
    fmt: Format,
    *,
    counter: MessageTokenCounter | None = None,
) -> int:
    """Tokens one memory adds to the injected text, its framing included, at handle
    ``COSTING_HANDLE``.

    With a cl100k/o200k encoding this is the exact count of the block as
    ``count_injection`` sums it at any handle of 1-999 (``section_overhead`` covers
    the newline a section's last block may gain or lose), from the write-time
    ``token_counts`` when escaping left the content unchanged, and cached in
    ``counter``. Otherwise the pieces are counted apart, erring high.
    """
    record = record_of(memory)
    if encoding.splits_after_newline:
        return (
            _memory_tokens(record, encoding, fmt, COSTING_HANDLE, BLOCK_AS_IS, counter)
            + JOIN_ALLOWANCE_TOKENS
        )
    opening, escaped, closing = memory_parts(record, fmt, COSTING_HANDLE)
    count = encoding.count if counter is None else partial(counter.count_text_cached, encoding=encoding)
    stored = record.token_counts.get(encoding.name) if encoding.exact else None
    unchanged = stored is not None and escaped == record.content
    content_tokens = stored if stored is not None and unchanged else count(escaped)
    return count(opening) + count(closing) + content_tokens + JOIN_ALLOWANCE_TOKENS


# The formats whose block bodies are counted at write time (json's block opens on the
# content's own line, so its count depends on the handle and category: costed per call).
STORED_BLOCK_FORMATS: tuple[Format, ...] = ("xml", "markdown")


def block_count_key(encoding_name: str, fmt: str) -> str:
    """The ``token_counts`` key of a memory's block body in ``fmt``: everything after
    the opening line, as laid out with more text after it."""
    return f"{encoding_name}/{fmt}"


def stored_token_counts(content: str, encodings: Iterable[Encoding]) -> dict[str, int]:
    """What the write path stores as a memory's ``token_counts``: the content's count
    per exact encoding and, where blocks join additively (the content starts
    safely, a ``splits_after_newline`` encoding), its block body's count per
    ``STORED_BLOCK_FORMATS``, so that costing a memory on the request path is a
    lookup, not a tokenizer call (issue #14)."""
    counts: dict[str, int] = {}
    for encoding in encodings:
        if not encoding.exact:
            continue
        tokens = encoding.count(content)
        counts[encoding.name] = tokens
        if encoding.splits_after_newline and _starts_safely(content):
            record = MemoryRecord(id="", content=content, category="", token_counts={encoding.name: tokens})
            for fmt in STORED_BLOCK_FORMATS:
                counts[block_count_key(encoding.name, fmt)] = _count_body(record, encoding, fmt, BLOCK_AS_IS)
    return counts


class BlockCosts:
    """``memory_cost`` for one call's encoding and format: one dict lookup for a memory
    whose block body was counted when it was written, the counter's caches otherwise."""

    def __init__(self, encoding: Encoding, fmt: Format, counter: MessageTokenCounter) -> None:
        self._encoding, self._fmt, self._counter = encoding, fmt, counter
        stored = encoding.exact and encoding.splits_after_newline and fmt in STORED_BLOCK_FORMATS
        self._key = block_count_key(encoding.name, fmt) if stored else None
        # xml's opening line is the same for every memory (the costing handle).
        self._xml_opening = encoding.count_short(xml_opening(COSTING_HANDLE))

    def __call__(self, memory: ScoredMemory | MemoryRecord) -> int:
        return memory_cost(memory, self._encoding, self._fmt, counter=self._counter)

    def by_index(self, candidates: Candidates) -> Callable[[int], int]:
        """The packer's ``cost_of``: the cost of candidate ``i``. In xml (the default) a
        memory with a stored block count costs one dict lookup and builds nothing;
        otherwise the candidate is costed as a record (built for the ones reached)."""
        key, fixed = self._key, self._xml_opening + JOIN_ALLOWANCE_TOKENS
        if key is None or self._fmt != "xml":
            return lambda i: self(candidates.record(i))
        counts = candidates.token_counts

        def cost_of(i: int) -> int:
            body = counts[i].get(key)
            return fixed + body if body is not None else self(candidates.record(i))

        return cost_of


def section_overhead(
    encoding: Encoding,
    fmt: Format,
    *,
    nonce: str,
    categories: Iterable[str],
    include_message_framing: bool = False,
    counter: MessageTokenCounter | None = None,
) -> int:
    """Tokens of the fixed text around the memories: notice, category sections, separators.

    Pass the categories of all candidates: the result is then an upper bound for
    whichever of them the packer keeps. ``include_message_framing`` adds the
    chat framing of a new system message (when there is no directive, the
    memories alone create it). Pieces are counted as ``count_injection`` joins
    them; ``SEPARATOR_ALLOWANCE_TOKENS`` covers a separator appended to a piece
    counted without it (after the directive, after a markdown/json section's
    last block).
    """
    check_nonce(nonce)
    count = encoding.count if counter is None else partial(counter.count_text_cached, encoding=encoding)
    # The notice with the separator before the first section; one allowance for
    # the separator the directive section gains.
    total = count(notice(fmt, nonce) + SECTION_SEPARATOR) + SEPARATOR_ALLOWANCE_TOKENS
    for category in category_order(categories):
        opening = section_open(category, fmt, nonce)
        total += count(opening) if opening else 0
        if fmt == "xml":
            total += count(section_close(fmt) + SECTION_SEPARATOR)
        else:
            total += SEPARATOR_ALLOWANCE_TOKENS
        total += JOIN_ALLOWANCE_TOKENS
    if include_message_framing:
        total += TOKENS_PER_MESSAGE + count("system")
    return total
