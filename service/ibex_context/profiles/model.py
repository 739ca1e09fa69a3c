"""The per-request configuration of an assembly: a resolved Profile.

Profiles come from a file (the ConfigMap the operator renders) and are resolved
per request by agent id, then org id, then the default. Values here are
validated once, when the file loads, and immutable. The fields, defaults and
bounds of each section are declared in ``profiles.schema``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# The sections are the schema's models themselves: one definition (profiles.schema).
from ibex_context.profiles.schema import (
    DEFAULT_HALF_LIVES_DAYS,
    UNKNOWN_CATEGORY_HALF_LIFE_DAYS,
    Admission,
    BudgetLimits,
    ContextProfileSpec,
    Deadlines,
    Format,
    InjectionMode,
    ModelSpec,
    Scoring,
    ScoringWeights,
)

__all__ = [
    "DEFAULT_HALF_LIVES_DAYS",
    "Admission",
    "DEFAULT_PROFILE",
    "UNKNOWN_CATEGORY_HALF_LIFE_DAYS",
    "BudgetLimits",
    "Deadlines",
    "Format",
    "InjectionMode",
    "ModelSpec",
    "Profile",
    "ProfileBinding",
    "ProfileSelector",
    "Scoring",
    "ScoringWeights",
]

_SPEC_FIELDS = ContextProfileSpec.model_fields


@dataclass(frozen=True, slots=True)
class Profile:
    name: str = "builtin-default"
    scoring: Scoring = field(default_factory=Scoring)
    deadlines: Deadlines = field(default_factory=Deadlines)
    budget: BudgetLimits = field(default_factory=BudgetLimits)
    format: Format = _SPEC_FIELDS["format"].default
    injection_mode: InjectionMode = _SPEC_FIELDS["injection_mode"].default
    # Extra models or overrides of the built-in catalogue, by model name.
    models: Mapping[str, ModelSpec] = field(default_factory=dict)
    # Read per org (ProfileRegistry.resolve_org), not per agent.
    admission: Admission = field(default_factory=Admission)


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
