"""Resolve the profile of a request, and hold the current set for hot reload.

Precedence: a profile naming the agent id, then one naming the org id, then the
profile marked ``default``, then the built-in ``DEFAULT_PROFILE``. When several
profiles claim the same agent id, org id or the default, the oldest wins
(``created_at``, then name; bindings without ``created_at`` rank last). The
operator applies the same rule and marks the losers with a Conflict condition,
so what ``kubectl get cprof`` shows is what the service does.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ibex_context.profiles.model import DEFAULT_PROFILE, Profile, ProfileBinding


class MatchedBy(enum.StrEnum):
    AGENT = "agent"
    ORG = "org"
    DEFAULT = "default"
    BUILTIN = "builtin"


@dataclass(frozen=True, slots=True)
class Resolution:
    profile: Profile
    matched_by: MatchedBy


@dataclass(frozen=True, slots=True)
class Conflict:
    """Several profiles claimed ``key`` (``agent:<id>``, ``org:<id>`` or ``default``)."""

    key: str
    winner: str
    losers: tuple[str, ...]


def precedence_key(binding: ProfileBinding) -> tuple[bool, str, str]:
    """Sort key of the conflict rule: oldest first, then by name; undated last."""
    return (binding.created_at is None, binding.created_at or "", binding.profile.name)


def _claims(binding: ProfileBinding) -> Iterable[str]:
    yield from (f"agent:{a}" for a in binding.selector.agent_ids)
    yield from (f"org:{o}" for o in binding.selector.org_ids)
    if binding.selector.default:
        yield "default"


class ProfileRegistry:
    """Immutable lookup tables; ``resolve`` is two dict lookups at most."""

    __slots__ = ("_by_agent", "_by_org", "_conflicts", "_default", "_fallback", "_names")

    def __init__(
        self, bindings: Iterable[ProfileBinding] = (), *, fallback: Profile = DEFAULT_PROFILE
    ) -> None:
        ordered = sorted(bindings, key=precedence_key)
        winners: dict[str, str] = {}
        losers: dict[str, list[str]] = {}
        by_agent: dict[str, Profile] = {}
        by_org: dict[str, Profile] = {}
        default: Profile | None = None
        for binding in ordered:
            for key in _claims(binding):
                if key in winners:
                    losers.setdefault(key, []).append(binding.profile.name)
                    continue
                winners[key] = binding.profile.name
                kind, _, ident = key.partition(":")
                if kind == "agent":
                    by_agent[ident] = binding.profile
                elif kind == "org":
                    by_org[ident] = binding.profile
                else:
                    default = binding.profile
        self._by_agent: Mapping[str, Profile] = MappingProxyType(by_agent)
        self._by_org: Mapping[str, Profile] = MappingProxyType(by_org)
        self._default = default
        self._fallback = fallback
        self._names = tuple(b.profile.name for b in ordered)
        self._conflicts = tuple(
            Conflict(key=key, winner=winners[key], losers=tuple(names))
            for key, names in sorted(losers.items())
        )

    def resolve(self, org_id: str, agent_id: str) -> Profile:
        return self.resolve_with_reason(org_id, agent_id).profile

    def resolve_with_reason(self, org_id: str, agent_id: str) -> Resolution:
        profile = self._by_agent.get(agent_id)
        if profile is not None:
            return Resolution(profile, MatchedBy.AGENT)
        profile = self._by_org.get(org_id)
        if profile is not None:
            return Resolution(profile, MatchedBy.ORG)
        if self._default is not None:
            return Resolution(self._default, MatchedBy.DEFAULT)
        return Resolution(self._fallback, MatchedBy.BUILTIN)

    def resolve_org(self, org_id: str) -> Profile:
        """The profile of the org itself (its org profile, else the default): what holds for
        every agent of the org, such as its admission share."""
        profile = self._by_org.get(org_id)
        if profile is not None:
            return profile
        return self._default if self._default is not None else self._fallback

    @property
    def profile_names(self) -> tuple[str, ...]:
        """Profile names in precedence order."""
        return self._names

    @property
    def conflicts(self) -> tuple[Conflict, ...]:
        return self._conflicts

    def __len__(self) -> int:
        return len(self._names)


class ProfileStore:
    """The registry in use. ``swap`` is one attribute assignment: readers never see a mix."""

    __slots__ = ("_current",)

    def __init__(self, registry: ProfileRegistry | None = None) -> None:
        self._current = registry if registry is not None else ProfileRegistry()

    @property
    def current(self) -> ProfileRegistry:
        return self._current

    def swap(self, registry: ProfileRegistry) -> None:
        self._current = registry

    def resolve(self, org_id: str, agent_id: str) -> Profile:
        return self._current.resolve(org_id, agent_id)

    def resolve_org(self, org_id: str) -> Profile:
        return self._current.resolve_org(org_id)
