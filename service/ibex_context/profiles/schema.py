"""The ContextProfile schema, written once.

Every field of a profile is declared here with its type, default, bounds and
description; its cross-field rules are declared as data (``Rule``) next to it.
From these models come:

* the loader's validation (``profiles.loader``: files and, through the operator,
  every ContextProfile before it is rendered);
* the runtime values the pipeline reads (``ScoringWeights``, ``Scoring``,
  ``Deadlines``, ``BudgetLimits``, ``ModelSpec`` are these models, frozen);
* the CRD's OpenAPI schema and its CEL rules (``ibex_operator.crd``, generated
  into ``charts/ibex-context/crds/`` by ``scripts/codegen.py``);
* the field table of docs/profiles.md (``scripts/codegen.py`` too).

Keys are camelCase as written in a ContextProfile; Python code constructs the
models by their snake_case names. Files are validated by alias only
(``loader``), so a snake_case key in a file is an unknown field, as in the CRD.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, model_validator
from pydantic.alias_generators import to_camel, to_snake

from ibex_context.models import Category

Format = Literal["xml", "markdown", "json"]
InjectionMode = Literal["system_first", "merge_system"]

CATEGORIES: tuple[str, ...] = tuple(c.value for c in Category)
DEFAULT_HALF_LIVES_DAYS: Mapping[str, float] = {
    Category.FACTUAL.value: 180.0,
    Category.PROCEDURAL.value: 120.0,
    Category.PREFERENCE.value: 45.0,
    Category.BEHAVIORAL.value: 30.0,
    Category.EPISODIC.value: 14.0,
}
UNKNOWN_CATEGORY_HALF_LIFE_DAYS = 14.0
# The LLM proxy gives up at 45 ms; a longer assembly deadline is never useful.
MAX_ASSEMBLY_MS = 45.0
# Requests carry org and agent ids as UUIDs, lower-cased by validation: a selector id
# that is not a UUID can never match, and an upper-case one did not either.
UUID_PATTERN = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_UUID = re.compile(UUID_PATTERN)


# --- cross-field rules: one declaration, checked in Python and emitted as CEL ----------------


@dataclass(frozen=True, slots=True)
class Rule:
    """A rule over several fields of one object: ``cel`` for the API server (over camelCase
    keys, after defaulting), ``holds`` for the loader (over the model), one ``message``."""

    cel: str
    message: str
    holds: Callable[[Any], bool]
    field_path: str | None = None

    def as_cel(self) -> dict[str, str]:
        rule = {"rule": self.cel, "message": self.message}
        if self.field_path:
            rule["fieldPath"] = self.field_path
        return rule


def less_than(left: str, right: str, *, or_equal: bool = False, point_at_left: bool = True) -> Rule:
    a, b = to_snake(left), to_snake(right)
    if or_equal:
        return Rule(
            cel=f"self.{left} <= self.{right}",
            message=f"{left} must be less than or equal to {right}",
            holds=lambda m: bool(getattr(m, a) <= getattr(m, b)),
            field_path=f".{left}" if point_at_left else None,
        )
    return Rule(
        cel=f"self.{left} < self.{right}",
        message=f"{left} must be less than {right}",
        holds=lambda m: bool(getattr(m, a) < getattr(m, b)),
        field_path=f".{left}" if point_at_left else None,
    )


def positive_sum(fields: tuple[str, ...], message: str) -> Rule:
    return Rule(
        # ``0.0``: CEL does not compare a double with the int 0.
        cel=" + ".join(f"self.{f}" for f in fields) + " > 0.0",
        message=message,
        holds=lambda m: sum(getattr(m, to_snake(f)) for f in fields) > 0,
    )


def any_given(lists: tuple[str, ...], flags: tuple[str, ...], message: str) -> Rule:
    """At least one of ``lists`` non-empty or one of ``flags`` true."""
    cel = [f"(has(self.{f}) && size(self.{f}) > 0)" for f in lists]
    cel += [f"(has(self.{f}) && self.{f})" for f in flags]
    return Rule(
        cel=" || ".join(cel),
        message=message,
        holds=lambda m: any(getattr(m, to_snake(f)) for f in (*lists, *flags)),
    )


def _cel_rules(schema: dict[str, Any], cls: type[Any]) -> None:
    rules: tuple[Rule, ...] = getattr(cls, "rules", ())
    if rules:
        schema["x-kubernetes-validations"] = [r.as_cel() for r in rules]


class Section(BaseModel):
    """Base of every part of a profile: camelCase keys, no unknown keys, immutable."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=True,
        extra="forbid",
        frozen=True,
        json_schema_extra=_cel_rules,
    )
    rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _rules_hold(self) -> Self:
        for rule in self.rules:
            if not rule.holds(self):
                raise ValueError(rule.message)
        return self


def section(model: type[Section], description: str = "") -> Any:
    """A nested section that may be left out: its defaults apply (the API server's ``default: {}``)."""
    return Field(default_factory=model, description=description or None, json_schema_extra={"default": {}})


# --- the sections ----------------------------------------------------------------------------


def _selector_id(value: str) -> str:
    if not _UUID.match(value):
        raise ValueError("must be a UUID like 7d0c1e52-5b8a-4f3e-9c61-ed9e00000001 (requests carry UUIDs)")
    return value.lower()


SelectorId = Annotated[
    str,
    AfterValidator(_selector_id),
    WithJsonSchema({"type": "string", "maxLength": 36, "pattern": UUID_PATTERN}),
]


def _id_list(description: str) -> Any:
    return Field(
        default_factory=list,
        max_length=256,
        description=description,
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )


class Selector(Section):
    """Which requests use this profile. Precedence: agentIds > orgIds > default."""

    agent_ids: list[SelectorId] = _id_list("Agent ids this profile applies to.")
    org_ids: list[SelectorId] = _id_list(
        "Org ids this profile applies to (agents without their own profile)."
    )
    default: bool = Field(default=False, description="Use for requests no agent or org profile matches.")

    rules = (
        any_given(
            ("agentIds", "orgIds"),
            ("default",),
            "selector must name at least one agentId or orgId, or set default: true",
        ),
    )


class BudgetLimits(Section):
    """Caps on what memories may take. Unset reserves come from the model's defaults."""

    max_memory_tokens: int = Field(
        default=4000, ge=0, le=1_000_000, description="Most tokens the injected memories may take."
    )
    max_memories: int = Field(default=20, ge=0, le=1000, description="Most memories injected.")
    response_reserve_tokens: int | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description="Tokens kept free for the answer (default: the model's).",
    )
    safety_buffer_ratio: float | None = Field(
        default=None, ge=0.0, le=0.5, description="Share of the window kept free (default: the model's)."
    )


def _ms(default: float, description: str) -> Any:
    return Field(default=default, gt=0, le=MAX_ASSEMBLY_MS, description=description)


class Deadlines(Section):
    """Milliseconds. Each source deadline must be less than assemblyMs."""

    assembly_ms: float = _ms(40.0, "Bound of the whole assembly (the proxy gives up at 45 ms).")
    directive_ms: float = _ms(10.0, "Bound of the directive fetch.")
    hot_ms: float = _ms(15.0, "Bound of the hot-set fetch (Redis).")
    cold_ms: float = _ms(35.0, "Bound of the cold search (PostgreSQL), query embedding included.")

    rules = tuple(less_than(f, "assemblyMs") for f in ("directiveMs", "hotMs", "coldMs"))


def _weight(default: float, description: str) -> Any:
    return Field(default=default, ge=0.0, le=1.0, description=description)


class ScoringWeights(Section):
    """How much each signal scales relevance: a memory keeps at least relevance / sum of its
    relevance; the rest depends on the others."""

    relevance: float = _weight(0.80, "Weight of relevance itself (the part no other signal can take away).")
    recency: float = _weight(0.08, "Weight of recency (per-category half-life of the memory's age).")
    usefulness: float = _weight(0.08, "Weight of usefulness (moved by feedback).")
    confidence: float = _weight(0.04, "Weight of the memory's confidence.")
    # Injections counted: self-reinforcing (ADR-0008), so off unless a profile asks.
    frequency: float = _weight(0.0, "Weight of how often the memory was injected (self-reinforcing: off).")

    rules = (
        positive_sum(
            ("relevance", "recency", "usefulness", "confidence", "frequency"),
            "at least one weight must be greater than 0",
        ),
    )


def _known_category(value: str) -> str:
    if value not in CATEGORIES:
        raise ValueError(f"must be one of {', '.join(CATEGORIES)}")
    return value


CategoryName = Annotated[
    str, AfterValidator(_known_category), WithJsonSchema({"type": "string", "enum": list(CATEGORIES)})
]
HalfLifeDays = Annotated[float, Field(gt=0, le=36500)]


def _over_builtin_half_lives(given: Mapping[str, float]) -> Mapping[str, float]:
    # Naming one category keeps the built-in half-lives of the others.
    return {**DEFAULT_HALF_LIVES_DAYS, **given}


class Scoring(Section):
    """How candidates are ranked (ADR-0008)."""

    weights: ScoringWeights = section(ScoringWeights)
    half_lives_days: Annotated[dict[CategoryName, HalfLifeDays], AfterValidator(_over_builtin_half_lives)] = (
        Field(
            default_factory=lambda: dict(DEFAULT_HALF_LIVES_DAYS),
            alias="halfLifeDays",
            max_length=32,
            description="Recency half-life (days) per memory category, over the built-in ones ("
            + ", ".join(f"{c} {d:g}" for c, d in DEFAULT_HALF_LIVES_DAYS.items())
            + ").",
        )
    )
    relevance_floor: float = Field(
        default=0.15,
        ge=0.0,
        lt=1.0,
        description=(
            "Candidates whose semantic similarity is below this and that share no word"
            " with the query are dropped."
        ),
    )
    lexical_weight: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Share of relevance from the lexical (BM25) match; the rest is semantic.",
    )


class ModelSpec(Section):
    """A model the budget knows: window, max output and the tiktoken encoding."""

    name: str = Field(min_length=1, max_length=128, description="The model name requests carry.")
    context_window: int = Field(ge=1, le=10_000_000, description="Tokens the model reads.")
    max_output_tokens: int = Field(ge=1, le=10_000_000, description="Tokens the model may write.")
    encoding: str = Field(
        min_length=1,
        max_length=64,
        pattern=r"^[a-z0-9_]+$",
        description="tiktoken encoding, e.g. o200k_base.",
    )
    exact: bool = Field(default=True, description="False when the encoding only approximates the tokenizer.")

    rules = (less_than("maxOutputTokens", "contextWindow", point_at_left=False),)


class Autoscaling(Section):
    """Contributes to the service's HPA: max of minReplicas and maxReplicas, min of the targets
    over every profile of the service."""

    # Strict: the operator copies these numbers into the HPA as they are ("2" is not 2 there).
    model_config = ConfigDict(strict=True)

    min_replicas: int = Field(default=2, ge=1, le=100, description="Fewest pods.")
    max_replicas: int = Field(default=10, ge=1, le=1000, description="Most pods.")
    target_inflight_per_pod: int = Field(
        default=16, ge=1, le=10_000, description="Average in-flight calls per pod to aim for."
    )
    target_cpu_utilization_percentage: int = Field(
        default=70,
        ge=1,
        le=100,
        alias="targetCPUUtilizationPercentage",
        description="Average CPU use to aim for.",
    )

    rules = (less_than("minReplicas", "maxReplicas", or_equal=True),)


class Admission(Section):
    """How this org shares a saturated process with other orgs (server/admission.py). Read from
    the org's profile (selector.orgIds, else the default profile): an agent's own profile does
    not change its org's share. Per process: with N replicas an org may make N times the rate."""

    weight: float = Field(
        default=1.0,
        gt=0,
        le=100,
        description="The org's share of IBEX_MAX_CONCURRENT_ASSEMBLIES, relative to the other orgs "
        "calling the process (2: twice an org of weight 1).",
    )
    rate_per_second: float | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description="AssembleContext calls per second the org may make to one process; more are "
        "answered pass-through (org_over_rate). Unset: IBEX_ORG_RATE_LIMIT. 0: no limit.",
    )
    burst: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Calls the org may make at once above its rate (token bucket). Unset: one "
        "second's worth of ratePerSecond (at least 1).",
    )


class ContextProfileSpec(Section):
    """The ``spec`` of a ContextProfile."""

    selector: Selector
    service: str | None = Field(
        default=None,
        max_length=63,
        pattern=DNS_LABEL_PATTERN,
        description="Name of the context-service Deployment this profile configures. "
        "Defaults to the operator's IBEX_OPERATOR_DEFAULT_SERVICE.",
    )
    budget: BudgetLimits = section(BudgetLimits)
    deadlines: Deadlines = section(Deadlines)
    scoring: Scoring = section(Scoring)
    format: Format = Field(default="xml", description="How memories are written into the prompt.")
    injection_mode: InjectionMode = Field(
        default="system_first",
        description="Where the context goes: a system message first, or merged into it.",
    )
    models: list[ModelSpec] = Field(
        default_factory=list,
        max_length=32,
        description="Models added to or overriding the built-in catalogue.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    autoscaling: Autoscaling = section(Autoscaling)
    admission: Admission = section(Admission)

    @model_validator(mode="after")
    def _unique_models(self) -> Self:
        # In the CRD the list-map keyed by name says the same.
        names = [m.name for m in self.models]
        if len(names) != len(set(names)):
            raise ValueError("models: names must be unique")
        return self


class ProfileEntry(ContextProfileSpec):
    """One profile of a profiles file: a ContextProfile's spec with its name and creation time."""

    name: str = Field(min_length=1, max_length=253)
    created_at: str | None = Field(default=None, max_length=64)


# Operator-only parts of a spec: the service never reads them, so they stay out of its file.
OPERATOR_ONLY_FIELDS: tuple[str, ...] = ("service", "autoscaling")
