from __future__ import annotations

import hashlib
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ibex_context.tokens.encodings import OFFLINE_ENCODINGS, EncodingRegistry


def test_o200k_counts_hello_world_as_two_tokens(registry: EncodingRegistry) -> None:
    encoding = registry.get("o200k_base")
    assert encoding.exact
    assert encoding.approximation_reason == ""
    assert encoding.count("Hello world") == 2


def test_cl100k_loads_offline_and_matches_known_ids(registry: EncodingRegistry) -> None:
    encoding = registry.get("cl100k_base")
    assert encoding.exact
    # Well-known cl100k ids for "Hello world".
    assert encoding.encode("Hello world") == [9906, 1917]


def test_special_token_text_is_counted_as_text_not_rejected(registry: EncodingRegistry) -> None:
    encoding = registry.get("o200k_base")
    # tiktoken's encode() raises on "<|endoftext|>"; user text must just be counted.
    assert encoding.count("a <|endoftext|> b") > 3


def test_get_returns_the_same_loaded_encoding(registry: EncodingRegistry) -> None:
    assert registry.get("o200k_base") is registry.get("o200k_base")


def test_staged_files_are_named_as_tiktoken_expects_and_hash_checked(registry: EncodingRegistry) -> None:
    for name in ("cl100k_base", "o200k_base"):
        bpe = OFFLINE_ENCODINGS[name]
        staged = registry.cache_dir / hashlib.sha1(bpe.url.encode()).hexdigest()
        assert staged.is_file()
        assert hashlib.sha256(staged.read_bytes()).hexdigest() == bpe.sha256
    assert OFFLINE_ENCODINGS["o200k_base"].cache_name == "fb374d419588a4632f3f557e76b4b70aebbca790"
    assert OFFLINE_ENCODINGS["cl100k_base"].cache_name == "9b5ad71b2ce5302211f9c61530b329a4922fc6a4"


def test_unknown_encoding_is_approximated_with_a_stated_reason(registry: EncodingRegistry) -> None:
    encoding = registry.get("p50k_base")
    assert not encoding.exact
    assert "p50k_base" in encoding.approximation_reason
    assert "cl100k_base" in encoding.approximation_reason
    assert encoding.count("Hello world") == 2  # cl100k as the proxy


def test_missing_data_files_fall_back_to_a_labelled_byte_estimate(tmp_path: Path) -> None:
    registry = EncodingRegistry(tmp_path, locate=lambda package, relative: None)
    encoding = registry.get("o200k_base")
    assert not encoding.exact
    assert "not installed" in encoding.approximation_reason
    assert "UTF-8 bytes / 3" in encoding.approximation_reason
    assert encoding.count("abcdefg") == 3  # ceil(7 / 3)
    assert encoding.count("日本") == 2  # 6 bytes
    with pytest.raises(LookupError):
        encoding.encode("x")


def test_corrupt_data_file_is_rejected_not_loaded(tmp_path: Path) -> None:
    corrupt = tmp_path / "cl100k_base.tiktoken"
    corrupt.write_bytes(b"aGVsbG8= 0\n")
    registry = EncodingRegistry(tmp_path / "cache", locate=lambda package, relative: corrupt)
    encoding = registry.get("cl100k_base")
    assert not encoding.exact
    assert "wrong sha256" in encoding.approximation_reason
    assert not (tmp_path / "cache" / OFFLINE_ENCODINGS["cl100k_base"].cache_name).exists()


def test_loading_never_touches_the_network_or_the_process_environment(tmp_path: Path) -> None:
    # A fresh interpreter (tiktoken keeps no state from this one) with sockets disabled.
    script = textwrap.dedent(
        f"""
        import os, socket, sys

        def refuse(*args, **kwargs):
            raise OSError("network disabled in this test")

        socket.socket.connect = refuse
        socket.create_connection = refuse
        socket.getaddrinfo = refuse
        from pathlib import Path
        from ibex_context.tokens.encodings import EncodingRegistry

        registry = EncodingRegistry(Path({str(tmp_path)!r}))
        o200k = registry.get("o200k_base")
        cl100k = registry.get("cl100k_base")
        assert o200k.exact and cl100k.exact, (o200k, cl100k)
        assert o200k.count("Hello world") == 2
        assert "TIKTOKEN_CACHE_DIR" not in os.environ
        assert "bpe_openai" not in sys.modules, "the 74 MB extension must not be imported"
        print("ok")
        """
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


# -- the join rules Injection.tokens relies on ------------------------------------------

# Characters chosen to stress the pre-tokenizer at a join: newlines and other
# whitespace (incl. Unicode and \r), "/", quotes and contractions, tag and fence
# punctuation, digits, case changes, combining marks, CJK, emoji.
_JOIN_PIECES = [
    *"aZ0 9\n\r\t/.'\"<>&`#{}:;-_!?*\\",
    "\u00a0", "\u2028", "\u3000", "\u0301", "é", "日本", "😀", "'s", "'LL", " the", "\n\n", " \n", "\r\n",
    "</memory>", "```", "12345", "ÉCOLE", "camelCase", "//", " /", "\n/", "\n ",
]  # fmt: skip
_ADDITIVE = ["o200k_base", "cl100k_base"]


def _adversarial(rng: random.Random, low: int, high: int) -> str:
    return "".join(rng.choice(_JOIN_PIECES) for _ in range(rng.randint(low, high)))


@pytest.mark.parametrize("name", _ADDITIVE)
def test_counts_add_up_across_a_newline_followed_by_a_safe_character(
    registry: EncodingRegistry, name: str
) -> None:
    encoding = registry.get(name)
    assert encoding.splits_after_newline
    rng = random.Random(name)
    checked = 0
    for _ in range(3000):
        left = _adversarial(rng, 0, 30) + "\n"
        right = _adversarial(rng, 1, 30)
        if right[0].isspace() or right[0] == "/":
            continue
        checked += 1
        assert encoding.count(left + right) == encoding.count(left) + encoding.count(right), (left, right)
    assert checked > 1500


@pytest.mark.parametrize("name", _ADDITIVE)
def test_counts_do_not_add_up_when_the_right_side_starts_with_whitespace_or_a_slash(
    registry: EncodingRegistry, name: str
) -> None:
    # Why the rule excludes them: these joins merge.
    encoding = registry.get(name)
    assert encoding.count(".\n\n") < encoding.count(".\n") + encoding.count("\n")
    if name == "o200k_base":
        assert encoding.count(".\n//") < encoding.count(".\n") + encoding.count("//")


@settings(max_examples=300, deadline=None)
@given(
    left=st.lists(st.sampled_from(_JOIN_PIECES), max_size=25).map("".join),
    right=st.lists(st.sampled_from(_JOIN_PIECES), min_size=1, max_size=25).map("".join),
)
def test_counts_add_up_across_safe_joins_for_generated_text(
    registry: EncodingRegistry, left: str, right: str
) -> None:
    left += "\n"
    if right[0].isspace() or right[0] == "/":
        right = "<" + right
    for name in _ADDITIVE:
        encoding = registry.get(name)
        assert encoding.count(left + right) == encoding.count(left) + encoding.count(right)


@pytest.mark.parametrize("name", _ADDITIVE)
def test_count_wrapped_equals_a_full_recount(registry: EncodingRegistry, name: str) -> None:
    encoding = registry.get(name)
    rng = random.Random(f"wrapped-{name}")
    words = ["alpha", "Beta", "42", "x1", "it's", "don't", "ÉCOLE", "naïve", "日本語", "😀", "a.b", "--x"]
    for trial in range(1500):
        parts: list[str] = []
        for _ in range(rng.randint(0, 40)):
            parts.append(rng.choice(words) if rng.random() < 0.6 else _adversarial(rng, 1, 3))
            parts.append(rng.choice([" ", " ", "  ", "\n", "", ". ", "\t"]))
        text = "".join(parts)
        prefix = rng.choice(["", '<memory id="m" nonce="n">\n', '{"content": "', "x", "\n", "'"])
        suffix = rng.choice(["", "\n</memory>\n", "\n```", '"}\n', "'s", "\n\n", "s", "/"])
        expected = encoding.count(prefix + text + suffix)
        assert encoding.count_wrapped(prefix, text, encoding.count(text), suffix) == expected, (
            trial, prefix, text, suffix,
        )  # fmt: skip


def test_count_wrapped_trusts_the_given_count_of_the_middle(registry: EncodingRegistry) -> None:
    # The point of it: the middle of a long text is not tokenized again.
    encoding = registry.get("o200k_base")
    text = "start here " + "word " * 200 + "end here"
    assert encoding.count_wrapped("<", text, 1000, ">") == 1000 + (
        encoding.count("<" + text + ">") - encoding.count(text)
    )


def _xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@pytest.mark.parametrize("name", _ADDITIVE)
def test_count_edited_equals_a_full_recount_of_the_escaped_text(
    registry: EncodingRegistry, name: str
) -> None:
    encoding = registry.get(name)
    rng = random.Random(f"edited-{name}")
    words = ["alpha", "Beta", "42", "x<y", "a&b", "<tag>", "&amp;", ">>", "it's", "日本", "😀", "<", "&", ">"]
    for trial in range(1500):
        parts: list[str] = []
        for _ in range(rng.randint(0, 30)):
            parts.append(rng.choice(words) if rng.random() < 0.6 else _adversarial(rng, 1, 3))
            parts.append(rng.choice([" ", " ", "  ", "\n", "", ". "]))
        text = "".join(parts)
        positions = [i for i, c in enumerate(text) if c in "&<>"]
        expected = encoding.count(_xml_escape(text))
        got = encoding.count_edited(text, encoding.count(text), _xml_escape, positions)
        assert got == expected, (trial, text)


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_short_counts_are_memoised_and_equal_to_counting(registry: EncodingRegistry, name: str) -> None:
    encoding = registry.get(name)
    for text in ["", " deploy.", "x" * 48, "y" * 49, "日本語のテキスト", "\n</memory>\n"]:
        assert encoding.count_short(text) == encoding.count(text)
        assert encoding.count_short(text) == encoding.count(text)
