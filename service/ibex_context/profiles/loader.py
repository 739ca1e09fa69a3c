"""Parse and validate a profiles file (the ``profiles.json`` the operator renders).

The file is validated as a whole: one bad profile rejects the file, so a reload
never applies half a change. Errors name the profile and the field (camelCase,
as written in the ContextProfile), never the values. The rules are those of ``profiles.schema``, from which
the ContextProfile CRD's schema and CEL rules are generated; the operator runs
``parse_entry`` on every profile before rendering, so a file it writes always
loads here.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ibex_context.errors import ConfigurationError
from ibex_context.profiles.model import Profile, ProfileBinding, ProfileSelector
from ibex_context.profiles.schema import ProfileEntry

API_VERSION = "context.ibex.dev/v1alpha1"
FILE_KIND = "ContextProfileSet"
MAX_PROFILES = 1000


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


def _to_binding(entry: ProfileEntry) -> ProfileBinding:
    # The sections are already the runtime values; only the models list becomes a lookup.
    profile = Profile(
        name=entry.name,
        scoring=entry.scoring,
        deadlines=entry.deadlines,
        budget=entry.budget,
        format=entry.format,
        injection_mode=entry.injection_mode,
        models={m.name: m for m in entry.models},
        admission=entry.admission,
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
        # By alias only: a file spells keys as a ContextProfile does (camelCase).
        entry = ProfileEntry.model_validate(dict(raw), by_alias=True, by_name=False)
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
