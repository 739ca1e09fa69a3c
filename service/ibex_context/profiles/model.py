"""The per-request configuration of an assembly: a resolved Profile.

Profiles come from a file (the ConfigMap the operator renders) and are resolved
per request by agent id, then org id, then the default. Values here are
validated and immutable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from ibex_context.models import Category

Format = Literal["xml", "markdown", "json"]
InjectionMode = Literal["system_first", "merge_system"]

DEFAULT_HALF_LIVES_DAYS: Mapping[str, float] = {
    Category.FACTUAL.value: 180.0,
    Category.PROCEDURAL.value: 120.0,
    Category.PREFERENCE.value: 45.0,
    Category.BEHAVIORAL.value: 30.0,
    Category.EPISODIC.value: 14.0,
}
UNKNOWN_CATEGORY_HALF_LIFE_DAYS = 14.0


@dataclass(frozen=True, slots=True)
class ScoringWeights:
    """How much each signal scales relevance (``pipeline.scoring``): a memory keeps at
    least relevance / sum of its relevance; the rest depends on the others."""

    relevance: float = 0.80
    recency: float = 0.08
    usefulness: float = 0.08
    confidence: float = 0.04
    # Injections counted: self-reinforcing (ADR-0008), so off unless a profile asks.
    frequency: float = 0.0


@dataclass(frozen=True, slots=True)
class Scoring:
    weights: ScoringWeights = field(default_factory=ScoringWeights)
    half_lives_days: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_HALF_LIVES_DAYS))
    relevance_floor: float = 0.15
    # The share of relevance given to the lexical (BM25) match; the rest is semantic.
    lexical_weight: float = 0.5


@dataclass(frozen=True, slots=True)
class Deadlines:
    """Milliseconds. ``assembly_ms`` bounds the whole call; the others one source each."""

    assembly_ms: float = 40.0
    directive_ms: float = 10.0
    hot_ms: float = 15.0
    cold_ms: float = 35.0


@dataclass(frozen=True, slots=True)
class BudgetLimits:
    """Caps on what memories may take. ``None`` means the model's defaults apply."""

    max_memory_tokens: int = 4000
    max_memories: int = 20
    response_reserve_tokens: int | None = None
    safety_buffer_ratio: float | None = None


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A model the budget knows: window, max output and the tiktoken encoding."""

    name: str
    context_window: int
    max_output_tokens: int
    encoding: str
    # False when ``encoding`` only approximates the model's tokenizer (Claude, Llama).
    exact: bool = True


@dataclass(frozen=True, slots=True)
class Profile:
    name: str = "builtin-default"
    scoring: Scoring = field(default_factory=Scoring)
    deadlines: Deadlines = field(default_factory=Deadlines)
    budget: BudgetLimits = field(default_factory=BudgetLimits)
    format: Format = "xml"
    injection_mode: InjectionMode = "system_first"
    # Extra models or overrides of the built-in catalogue, by model name.
    models: Mapping[str, ModelSpec] = field(default_factory=dict)


DEFAULT_PROFILE = Profile()


@dataclass(frozen=True, slots=True)
class ProfileSelector:
    """Which requests a profile applies to: by agent id, by org id, or as the default."""

    agent_ids: tuple[str, ...] = ()
    org_ids: tuple[str, ...] = ()
    default: bool = False


@dataclass(frozen=True, slots=True)
class ProfileBinding:
    """A profile with its selector and the creation time that ranks it in conflicts.

    ``created_at`` is the ContextProfile's RFC 3339 ``creationTimestamp`` (UTC,
    ``Z`` suffix, so it sorts as a string); ``None`` for hand-written files.
    """

    profile: Profile
    selector: ProfileSelector
    created_at: str | None = None
