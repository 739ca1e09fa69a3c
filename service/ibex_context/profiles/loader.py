"""Parse and validate a profiles file (the ``profiles.json`` the operator renders).

The file is validated as a whole: one bad profile rejects the file, so a reload
never applies half a change. Errors name the profile and the field (camelCase,
as written in the ContextProfile), never the values. The rules mirror the
ContextProfile CRD's schema and CEL rules; the operator runs ``parse_entry``
on every profile before rendering, so a file it writes always loads here.

File format (``kind`` and ``service`` are informational)::

    {"apiVersion": "context.ibex.dev/v1alpha1", "kind": "ContextProfileSet",
     "service": "ibex-context",
     "profiles": [{"name": "support-bot", "createdAt": "2026-11-01T10:00:00Z",
                   "selector": {"agentIds": ["support-bot"]},
                   "scoring": {"weights": {"relevance": 0.6}}, ...}]}
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from ibex_context.errors import ConfigurationError
from ibex_context.profiles.model import (
    DEFAULT_HALF_LIVES_DAYS,
    BudgetLimits,
    Deadlines,
    ModelSpec,
    Profile,
    ProfileBinding,
    ProfileSelector,
    Scoring,
    ScoringWeights,
)

API_VERSION = "context.ibex.dev/v1alpha1"
FILE_KIND = "ContextProfileSet"
MAX_PROFILES = 1000
# The LLM proxy gives up at 45 ms; a longer assembly deadline is never useful.
MAX_ASSEMBLY_MS = 45.0

_DEFAULT_WEIGHTS = ScoringWeights()
_DEFAULT_SCORING = Scoring()
_DEFAULT_DEADLINES = Deadlines()
_DEFAULT_BUDGET = BudgetLimits()

Identifier = Annotated[str, Field(min_length=1, max_length=253)]
# Requests carry org and agent ids as UUIDs, lower-cased by validation: a selector id
# that is not a UUID can never match, and an upper-case one did not either. The same
# pattern is in the CRD (ibex_operator.crd.UUID_PATTERN); matched lower-cased.
UUID_PATTERN = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
_UUID = re.compile(UUID_PATTERN)


def _selector_id(value: str) -> str:
    if not _UUID.match(value):
        raise ValueError("must be a UUID like 7d0c1e52-5b8a-4f3e-9c61-ed9e00000001 (requests carry UUIDs)")
    return value.lower()


SelectorId = Annotated[str, AfterValidator(_selector_id)]
Weight = Annotated[float, Field(ge=0.0, le=1.0)]


class _Spec(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", frozen=True, populate_by_name=False)


class _Selector(_Spec):
    agent_ids: list[SelectorId] = Field(default_factory=list, max_length=256)
    org_ids: list[SelectorId] = Field(default_factory=list, max_length=256)
    default: bool = False

    @model_validator(mode="after")
    def _not_empty(self) -> _Selector:
        if not (self.agent_ids or self.org_ids or self.default):
            raise ValueError("selector must name at least one agentId or orgId, or set default: true")
        return self


class _Budget(_Spec):
    max_memory_tokens: int = Field(_DEFAULT_BUDGET.max_memory_tokens, ge=0, le=1_000_000)
    max_memories: int = Field(_DEFAULT_BUDGET.max_memories, ge=0, le=1000)
    response_reserve_tokens: int | None = Field(None, ge=0, le=1_000_000)
    safety_buffer_ratio: float | None = Field(None, ge=0.0, le=0.5)


class _Deadlines(_Spec):
    assembly_ms: float = Field(_DEFAULT_DEADLINES.assembly_ms, gt=0, le=MAX_ASSEMBLY_MS)
    directive_ms: float = Field(_DEFAULT_DEADLINES.directive_ms, gt=0, le=MAX_ASSEMBLY_MS)
    hot_ms: float = Field(_DEFAULT_DEADLINES.hot_ms, gt=0, le=MAX_ASSEMBLY_MS)
    cold_ms: float = Field(_DEFAULT_DEADLINES.cold_ms, gt=0, le=MAX_ASSEMBLY_MS)

    @model_validator(mode="after")
    def _sources_inside_assembly(self) -> _Deadlines:
        for name, value in (
            ("directiveMs", self.directive_ms),
            ("hotMs", self.hot_ms),
            ("coldMs", self.cold_ms),
        ):
            if value >= self.assembly_ms:
                raise ValueError(f"{name} must be less than assemblyMs")
        return self


class _Weights(_Spec):
    relevance: Weight = _DEFAULT_WEIGHTS.relevance
    recency: Weight = _DEFAULT_WEIGHTS.recency
    usefulness: Weight = _DEFAULT_WEIGHTS.usefulness
    confidence: Weight = _DEFAULT_WEIGHTS.confidence
    frequency: Weight = _DEFAULT_WEIGHTS.frequency

    @model_validator(mode="after")
    def _not_all_zero(self) -> _Weights:
        if self.relevance + self.recency + self.usefulness + self.confidence + self.frequency <= 0:
            raise ValueError("at least one weight must be greater than 0")
        return self


CategoryName = Literal["procedural", "factual", "preference", "behavioral", "episodic"]


class _Scoring(_Spec):
    weights: _Weights = Field(default_factory=lambda: _Weights.model_validate({}))
    # Merged over the built-in half-lives: naming one category keeps the others.
    half_life_days: dict[CategoryName, Annotated[float, Field(gt=0, le=36500)]] = Field(
        default_factory=dict, max_length=32
    )
    relevance_floor: float = Field(_DEFAULT_SCORING.relevance_floor, ge=0.0, lt=1.0)
    lexical_weight: float = Field(_DEFAULT_SCORING.lexical_weight, ge=0.0, le=1.0)


class _Model(_Spec):
    name: Annotated[str, Field(min_length=1, max_length=128)]
    context_window: int = Field(ge=1, le=10_000_000)
    max_output_tokens: int = Field(ge=1, le=10_000_000)
    encoding: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9_]+$")]
    exact: bool = True

    @model_validator(mode="after")
    def _output_fits(self) -> _Model:
        if self.max_output_tokens >= self.context_window:
            raise ValueError("maxOutputTokens must be less than contextWindow")
        return self


class _Entry(_Spec):
    name: Identifier
    created_at: str | None = Field(None, max_length=64)
    selector: _Selector
    budget: _Budget = Field(default_factory=lambda: _Budget.model_validate({}))
    deadlines: _Deadlines = Field(default_factory=lambda: _Deadlines.model_validate({}))
    scoring: _Scoring = Field(default_factory=lambda: _Scoring.model_validate({}))
    format: Literal["xml", "markdown", "json"] = "xml"
    injection_mode: Literal["system_first", "merge_system"] = "system_first"
    models: list[_Model] = Field(default_factory=list, max_length=32)
    # Operator-only parts of a ContextProfile spec; accepted so a pasted spec loads, ignored here.
    service: str | None = Field(None, max_length=63)
    autoscaling: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _unique_models(self) -> _Entry:
        names = [m.name for m in self.models]
        if len(names) != len(set(names)):
            raise ValueError("models: names must be unique")
        return self


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    apiVersion: Literal["context.ibex.dev/v1alpha1"] = "context.ibex.dev/v1alpha1"
    kind: Literal["ContextProfileSet"] = "ContextProfileSet"
    service: str | None = Field(None, max_length=63)
    profiles: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_PROFILES)


@dataclass(frozen=True, slots=True)
class ProfileSet:
    """A validated profiles file: its bindings in file order and the file's SHA-256."""

    bindings: tuple[ProfileBinding, ...]
    checksum: str
    service: str | None = None


def _describe(error: ValidationError) -> str:
    # Field paths and messages only: pydantic's default text would echo the input values.
    parts = []
    for item in error.errors(include_url=False, include_input=False):
        location = ".".join(str(p) for p in item["loc"]) or "(root)"
        parts.append(f"{location}: {item['msg']}")
    return "; ".join(parts)


def _to_binding(entry: _Entry) -> ProfileBinding:
    half_lives: dict[str, float] = dict(DEFAULT_HALF_LIVES_DAYS)
    half_lives.update({str(k): v for k, v in entry.scoring.half_life_days.items()})
    w = entry.scoring.weights
    profile = Profile(
        name=entry.name,
        scoring=Scoring(
            weights=ScoringWeights(
                relevance=w.relevance,
                recency=w.recency,
                usefulness=w.usefulness,
                confidence=w.confidence,
                frequency=w.frequency,
            ),
            half_lives_days=half_lives,
            relevance_floor=entry.scoring.relevance_floor,
            lexical_weight=entry.scoring.lexical_weight,
        ),
        deadlines=Deadlines(
            assembly_ms=entry.deadlines.assembly_ms,
            directive_ms=entry.deadlines.directive_ms,
            hot_ms=entry.deadlines.hot_ms,
            cold_ms=entry.deadlines.cold_ms,
        ),
        budget=BudgetLimits(
            max_memory_tokens=entry.budget.max_memory_tokens,
            max_memories=entry.budget.max_memories,
            response_reserve_tokens=entry.budget.response_reserve_tokens,
            safety_buffer_ratio=entry.budget.safety_buffer_ratio,
        ),
        format=entry.format,
        injection_mode=entry.injection_mode,
        models={
            m.name: ModelSpec(
                name=m.name,
                context_window=m.context_window,
                max_output_tokens=m.max_output_tokens,
                encoding=m.encoding,
                exact=m.exact,
            )
            for m in entry.models
        },
    )
    selector = ProfileSelector(
        agent_ids=tuple(sorted(set(entry.selector.agent_ids))),
        org_ids=tuple(sorted(set(entry.selector.org_ids))),
        default=entry.selector.default,
    )
    return ProfileBinding(profile=profile, selector=selector, created_at=entry.created_at)


def parse_entry(raw: Mapping[str, Any], *, label: str = "profile") -> ProfileBinding:
    """Validate one profile entry (camelCase keys). ``label`` prefixes error messages."""
    if not isinstance(raw, Mapping):
        raise ConfigurationError(f"{label}: must be an object")
    name = raw.get("name")
    where = f"{label} {name!r}" if isinstance(name, str) else label
    try:
        entry = _Entry.model_validate(dict(raw))
    except ValidationError as exc:
        raise ConfigurationError(f"{where}: {_describe(exc)}") from None
    return _to_binding(entry)


def parse_profiles(raw: bytes | str) -> ProfileSet:
    """Validate a whole profiles file; raise ConfigurationError naming the profile and field."""
    data = raw.encode() if isinstance(raw, str) else raw
    checksum = hashlib.sha256(data).hexdigest()
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigurationError(
            f"profiles file is not valid JSON (line {getattr(exc, 'lineno', '?')})"
        ) from None
    if not isinstance(document, dict):
        raise ConfigurationError("profiles file: must be a JSON object with a 'profiles' list")
    try:
        envelope = _File.model_validate(document)
    except ValidationError as exc:
        raise ConfigurationError(f"profiles file: {_describe(exc)}") from None
    bindings = tuple(
        parse_entry(item, label=f"profiles[{index}]") for index, item in enumerate(envelope.profiles)
    )
    _check_unique_names(bindings)
    return ProfileSet(bindings=bindings, checksum=checksum, service=envelope.service)


def _check_unique_names(bindings: Sequence[ProfileBinding]) -> None:
    seen: set[str] = set()
    for index, binding in enumerate(bindings):
        if binding.profile.name in seen:
            raise ConfigurationError(
                f"profiles[{index}] {binding.profile.name!r}: name: duplicate profile name"
            )
        seen.add(binding.profile.name)


def load_profiles_file(path: Path) -> ProfileSet:
    """Read and validate ``path``. FileNotFoundError passes through: the caller decides."""
    return parse_profiles(path.read_bytes())
