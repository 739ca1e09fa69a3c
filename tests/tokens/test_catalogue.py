from __future__ import annotations

import pytest
from ibex_context.profiles.model import ModelSpec
from ibex_context.tokens.catalogue import (
    CATALOGUE,
    UNKNOWN_MODEL_MAX_OUTPUT,
    UNKNOWN_MODEL_WINDOW,
    lookup_model,
    resolve_model,
)


@pytest.mark.parametrize(
    ("model", "entry", "window", "max_output", "encoding"),
    [
        ("gpt-4o", "gpt-4o", 128_000, 16_384, "o200k_base"),
        ("gpt-4o-2024-08-06", "gpt-4o", 128_000, 16_384, "o200k_base"),
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini", 128_000, 16_384, "o200k_base"),
        ("gpt-4.1-2025-04-14", "gpt-4.1", 1_047_576, 32_768, "o200k_base"),
        ("gpt-4.1-nano", "gpt-4.1-nano", 1_047_576, 32_768, "o200k_base"),
        ("o1-2024-12-17", "o1", 200_000, 100_000, "o200k_base"),
        ("o3-mini-2025-01-31", "o3-mini", 200_000, 100_000, "o200k_base"),
        ("o4-mini", "o4-mini", 200_000, 100_000, "o200k_base"),
        ("gpt-4-turbo-2024-04-09", "gpt-4-turbo", 128_000, 4_096, "cl100k_base"),
        ("gpt-4-0613", "gpt-4", 8_192, 4_096, "cl100k_base"),
        ("gpt-3.5-turbo", "gpt-3.5-turbo", 16_385, 4_096, "cl100k_base"),
        ("gpt-3.5-turbo-16k", "gpt-3.5-turbo-16k", 16_385, 4_096, "cl100k_base"),
        ("openai/gpt-4o", "gpt-4o", 128_000, 16_384, "o200k_base"),
        ("GPT-4o", "gpt-4o", 128_000, 16_384, "o200k_base"),
    ],
)
def test_openai_models_resolve_to_their_family_exactly(
    model: str, entry: str, window: int, max_output: int, encoding: str
) -> None:
    spec = resolve_model(model, {})
    assert (spec.name, spec.context_window, spec.max_output_tokens, spec.encoding, spec.exact) == (
        entry,
        window,
        max_output,
        encoding,
        True,
    )


@pytest.mark.parametrize(
    ("model", "entry"),
    [
        ("claude-3-5-sonnet-20241022", "claude-3-5-sonnet"),
        ("anthropic/claude-3.5-sonnet", "claude-3-5-sonnet"),
        ("anthropic.claude-3-5-sonnet-20241022-v2:0", "claude-3-5-sonnet"),
        ("claude-3-7-sonnet-latest", "claude-3-7-sonnet"),
        ("claude-sonnet-4-20250514", "claude-sonnet-4"),
        ("claude-opus-4-20250514", "claude-opus-4"),
        ("claude-haiku-4-5", "claude-haiku-4-5"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1"),
        ("llama3.1:8b", "llama-3.1"),
    ],
)
def test_non_openai_models_resolve_but_are_marked_approximate(model: str, entry: str) -> None:
    spec = resolve_model(model, {})
    assert spec.name == CATALOGUE[entry].name
    assert spec.exact is False
    assert spec.encoding == "cl100k_base"


def test_claude_windows_are_200k_with_family_output_limits() -> None:
    assert resolve_model("claude-3-5-sonnet", {}).max_output_tokens == 8_192
    assert resolve_model("claude-sonnet-4", {}).max_output_tokens == 64_000
    assert resolve_model("claude-opus-4", {}).context_window == 200_000
    assert resolve_model("llama-3.1-70b", {}).context_window == 131_072


def test_a_dot_is_not_a_version_boundary() -> None:
    # gpt-4.5 uses another tokenizer than gpt-4; it must not inherit gpt-4's exact cl100k.
    assert lookup_model("gpt-4.7-preview", {}) is None


def test_unknown_model_gets_the_conservative_approximate_default() -> None:
    spec = resolve_model("mystery-model-9", {})
    assert spec.name == "mystery-model-9"
    assert (spec.context_window, spec.max_output_tokens) == (UNKNOWN_MODEL_WINDOW, UNKNOWN_MODEL_MAX_OUTPUT)
    assert (spec.context_window, spec.max_output_tokens) == (8_192, 4_096)
    assert spec.encoding == "cl100k_base"
    assert spec.exact is False
    assert lookup_model("mystery-model-9", {}) is None


def test_profile_overrides_win_over_the_catalogue() -> None:
    custom = ModelSpec(name="gpt-4o", context_window=32_000, max_output_tokens=2_000, encoding="o200k_base")
    assert resolve_model("gpt-4o-2024-08-06", {"gpt-4o": custom}) is custom


def test_an_override_does_not_capture_a_longer_catalogue_name() -> None:
    custom = ModelSpec(name="gpt-4o", context_window=32_000, max_output_tokens=2_000, encoding="o200k_base")
    assert resolve_model("gpt-4o-mini", {"gpt-4o": custom}).name == "gpt-4o-mini"


def test_overrides_can_add_models() -> None:
    mine = ModelSpec(name="acme-7b", context_window=32_768, max_output_tokens=4_096, encoding="cl100k_base")
    assert resolve_model("acme-7b-v2", {"acme-7b": mine}) is mine
