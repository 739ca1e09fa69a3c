from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
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
