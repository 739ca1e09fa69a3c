"""The models the budget knows: context window, max output and tokenizer.

Figures are the providers' published limits. OpenAI models are counted exactly
with their tiktoken encoding. Other families (Claude, Gemini, Llama) have
tokenizers tiktoken does not ship; they are counted with ``cl100k_base`` and
marked ``exact=False`` so the budget keeps the larger safety buffer.

Resolution (``resolve_model``): the name is lower-cased and a provider prefix
(``openai/gpt-4o``, ``meta-llama/Llama-3.1-8B-Instruct``, ``anthropic.claude-...``)
is dropped; then the exact name, then the longest catalogue name that is a
prefix ending at a ``-``, ``:`` or ``@`` boundary, so dated variants resolve to
their family (``gpt-4o-mini-2024-07-18`` -> ``gpt-4o-mini``, not ``gpt-4o``).
A dot is not a boundary: ``gpt-4.5`` must not fall back to ``gpt-4`` (a
different tokenizer). Profile overrides are looked up before the catalogue at
every candidate name. An unknown model gets ``UNKNOWN_MODEL``'s conservative
limits.
"""

from __future__ import annotations

from collections.abc import Mapping

from ibex_context.profiles.model import ModelSpec

_O200K = "o200k_base"
_CL100K = "cl100k_base"
_BOUNDARIES = "-:@"


def _spec(name: str, window: int, max_output: int, encoding: str, *, exact: bool = True) -> ModelSpec:
    # Published facts, not profile input: the profile schema's rules (e.g. output < window) are for
    # models a profile declares, and some real models may fill their whole window with output.
    return ModelSpec.model_construct(
        name=name, context_window=window, max_output_tokens=max_output, encoding=encoding, exact=exact
    )


def _approx(name: str, window: int, max_output: int) -> ModelSpec:
    return _spec(name, window, max_output, _CL100K, exact=False)


_MODELS: tuple[ModelSpec, ...] = (
    # --- OpenAI, o200k_base -------------------------------------------------------------
    _spec("gpt-4o", 128_000, 16_384, _O200K),
    _spec("gpt-4o-mini", 128_000, 16_384, _O200K),
    _spec("chatgpt-4o-latest", 128_000, 16_384, _O200K),
    _spec("gpt-4.1", 1_047_576, 32_768, _O200K),
    _spec("gpt-4.1-mini", 1_047_576, 32_768, _O200K),
    _spec("gpt-4.1-nano", 1_047_576, 32_768, _O200K),
    _spec("gpt-4.5-preview", 128_000, 16_384, _O200K),
    _spec("gpt-5", 400_000, 128_000, _O200K),
    _spec("gpt-5-mini", 400_000, 128_000, _O200K),
    _spec("gpt-5-nano", 400_000, 128_000, _O200K),
    _spec("o1", 200_000, 100_000, _O200K),
    _spec("o1-preview", 128_000, 32_768, _O200K),
    _spec("o1-mini", 128_000, 65_536, _O200K),
    _spec("o1-pro", 200_000, 100_000, _O200K),
    _spec("o3", 200_000, 100_000, _O200K),
    _spec("o3-mini", 200_000, 100_000, _O200K),
    _spec("o3-pro", 200_000, 100_000, _O200K),
    _spec("o4-mini", 200_000, 100_000, _O200K),
    # --- OpenAI, cl100k_base ------------------------------------------------------------
    _spec("gpt-4-turbo", 128_000, 4_096, _CL100K),
    _spec("gpt-4-turbo-preview", 128_000, 4_096, _CL100K),
    _spec("gpt-4-1106-preview", 128_000, 4_096, _CL100K),
    _spec("gpt-4-0125-preview", 128_000, 4_096, _CL100K),
    # gpt-4 accepts outputs up to its window; reserving 4096 of 8192 keeps room for input.
    _spec("gpt-4", 8_192, 4_096, _CL100K),
    _spec("gpt-4-32k", 32_768, 4_096, _CL100K),
    _spec("gpt-3.5-turbo", 16_385, 4_096, _CL100K),
    _spec("gpt-3.5-turbo-16k", 16_385, 4_096, _CL100K),
    # The 2023 snapshots had a 4k window; the prefix rule would give them 16k.
    _spec("gpt-3.5-turbo-0301", 4_096, 4_096, _CL100K),
    _spec("gpt-3.5-turbo-0613", 4_096, 4_096, _CL100K),
    # --- Anthropic (tokenizer not public: approximate) -----------------------------------
    _approx("claude-3-haiku", 200_000, 4_096),
    _approx("claude-3-sonnet", 200_000, 4_096),
    _approx("claude-3-opus", 200_000, 4_096),
    _approx("claude-3-5-haiku", 200_000, 8_192),
    _approx("claude-3-5-sonnet", 200_000, 8_192),
    _approx("claude-3-7-sonnet", 200_000, 64_000),
    _approx("claude-sonnet-4", 200_000, 64_000),
    _approx("claude-sonnet-4-5", 200_000, 64_000),
    _approx("claude-opus-4", 200_000, 32_000),
    _approx("claude-opus-4-1", 200_000, 32_000),
    _approx("claude-opus-4-5", 200_000, 64_000),
    _approx("claude-haiku-4-5", 200_000, 64_000),
    # --- Google (SentencePiece: approximate) ---------------------------------------------
    _approx("gemini-1.5-pro", 2_097_152, 8_192),
    _approx("gemini-1.5-flash", 1_048_576, 8_192),
    _approx("gemini-2.0-flash", 1_048_576, 8_192),
    _approx("gemini-2.5-pro", 1_048_576, 65_536),
    _approx("gemini-2.5-flash", 1_048_576, 65_536),
    # --- Meta Llama (tiktoken-derived 128k vocabulary, not cl100k: approximate) -------------
    _approx("llama-3", 8_192, 4_096),
    _approx("llama-3.1", 131_072, 8_192),
    _approx("llama-3.2", 131_072, 8_192),
    _approx("llama-3.3", 131_072, 8_192),
)

# Other spellings of the same models (OpenRouter dots, Ollama tags).
_ALIASES: Mapping[str, str] = {
    "claude-3.5-sonnet": "claude-3-5-sonnet",
    "claude-3.5-haiku": "claude-3-5-haiku",
    "claude-3.7-sonnet": "claude-3-7-sonnet",
    "claude-sonnet-4.5": "claude-sonnet-4-5",
    "claude-opus-4.1": "claude-opus-4-1",
    "claude-opus-4.5": "claude-opus-4-5",
    "claude-haiku-4.5": "claude-haiku-4-5",
    "llama3": "llama-3",
    "llama3.1": "llama-3.1",
    "llama3.2": "llama-3.2",
    "llama3.3": "llama-3.3",
    "meta-llama-3": "llama-3",
    "meta-llama-3.1": "llama-3.1",
}

CATALOGUE: Mapping[str, ModelSpec] = {
    **{spec.name: spec for spec in _MODELS},
    **{alias: next(s for s in _MODELS if s.name == target) for alias, target in _ALIASES.items()},
}

# Unknown models: the smallest window still in use (gpt-4's 8192), half of it
# kept for the answer, counted with cl100k_base but marked approximate so the
# 10 % safety buffer applies. Over-reserving costs memories; under-reserving
# overflows the window and fails the LLM request.
UNKNOWN_MODEL_WINDOW = 8_192
UNKNOWN_MODEL_MAX_OUTPUT = 4_096
UNKNOWN_MODEL_ENCODING = _CL100K

# Bedrock-style vendor prefixes ("anthropic.claude-3-5-sonnet-20241022-v2:0").
_VENDOR_DOT_PREFIXES = ("anthropic.", "meta.", "openai.", "us.anthropic.", "eu.anthropic.")


def normalise_model_name(model: str) -> str:
    name = model.strip().lower()
    name = name.rsplit("/", 1)[-1]
    for prefix in _VENDOR_DOT_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    return name


def _candidate_names(name: str) -> list[str]:
    """``name`` and its prefixes that end at a boundary, longest first."""
    candidates = [name]
    for index in range(len(name) - 1, 0, -1):
        if name[index] in _BOUNDARIES:
            candidates.append(name[:index])
    return candidates


def lookup_model(model: str, overrides: Mapping[str, ModelSpec]) -> ModelSpec | None:
    """The override or catalogue entry for ``model``; None when nothing matches."""
    normalised_overrides = {normalise_model_name(k): v for k, v in overrides.items()} if overrides else {}
    for candidate in _candidate_names(normalise_model_name(model)):
        spec = normalised_overrides.get(candidate) or CATALOGUE.get(candidate)
        if spec is not None:
            return spec
    return None


def unknown_model(model: str) -> ModelSpec:
    # Per request, from the request's model name: built without the profile schema's validation.
    return ModelSpec.model_construct(
        name=model,
        context_window=UNKNOWN_MODEL_WINDOW,
        max_output_tokens=UNKNOWN_MODEL_MAX_OUTPUT,
        encoding=UNKNOWN_MODEL_ENCODING,
        exact=False,
    )


def resolve_model(model: str, overrides: Mapping[str, ModelSpec]) -> ModelSpec:
    """The spec to budget ``model`` with; never raises (unknown -> ``unknown_model``)."""
    spec = lookup_model(model, overrides)
    return spec if spec is not None else unknown_model(model)
