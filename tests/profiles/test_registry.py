"""Resolving a request's profile: agent > org > default > built-in; the oldest claim wins."""

from __future__ import annotations

import itertools
import threading

from ibex_context.profiles.model import DEFAULT_PROFILE, Profile, ProfileBinding, ProfileSelector
from ibex_context.profiles.registry import Conflict, MatchedBy, ProfileRegistry, ProfileStore


def binding(
    name: str,
    *,
    agents: tuple[str, ...] = (),
    orgs: tuple[str, ...] = (),
    default: bool = False,
    created: str | None = "2026-11-01T00:00:00Z",
) -> ProfileBinding:
    return ProfileBinding(Profile(name=name), ProfileSelector(agents, orgs, default), created)


REGISTRY = ProfileRegistry(
    [
        binding("agent-p", agents=("bot",)),
        binding("org-p", orgs=("acme",)),
        binding("default-p", default=True),
    ]
)


def test_an_agent_profile_beats_the_org_and_the_default() -> None:
    resolution = REGISTRY.resolve_with_reason("acme", "bot")
    assert (resolution.profile.name, resolution.matched_by) == ("agent-p", MatchedBy.AGENT)
    assert REGISTRY.resolve("acme", "bot") is resolution.profile


def test_an_org_profile_applies_to_agents_without_their_own() -> None:
    resolution = REGISTRY.resolve_with_reason("acme", "other-bot")
    assert (resolution.profile.name, resolution.matched_by) == ("org-p", MatchedBy.ORG)


def test_the_default_profile_applies_when_nothing_else_matches() -> None:
    resolution = REGISTRY.resolve_with_reason("globex", "other-bot")
    assert (resolution.profile.name, resolution.matched_by) == ("default-p", MatchedBy.DEFAULT)


def test_without_a_default_profile_the_built_in_one_applies() -> None:
    registry = ProfileRegistry([binding("agent-p", agents=("bot",))])
    resolution = registry.resolve_with_reason("globex", "nobody")
    assert resolution.profile is DEFAULT_PROFILE and resolution.matched_by is MatchedBy.BUILTIN
    assert ProfileRegistry().resolve("o", "a") is DEFAULT_PROFILE


def test_an_agent_id_does_not_match_as_an_org_id() -> None:
    assert REGISTRY.resolve("bot", "x").name == "default-p"


def test_the_oldest_claim_wins_then_the_name_and_undated_profiles_rank_last() -> None:
    claims = [
        binding("newer", agents=("bot",), created="2026-11-05T00:00:00Z"),
        binding("older", agents=("bot",), created="2026-11-01T00:00:00Z"),
        binding("b-tie", agents=("x",), created="2026-11-02T00:00:00Z"),
        binding("a-tie", agents=("x",), created="2026-11-02T00:00:00Z"),
        binding("undated", agents=("y",), created=None),
        binding("dated", agents=("y",), created="2030-01-01T00:00:00Z"),
        binding("d1", default=True, created="2026-11-03T00:00:00Z"),
        binding("d0", default=True, created="2026-11-02T00:00:00Z"),
    ]
    for order in itertools.permutations(claims[:4]):
        registry = ProfileRegistry([*order, *claims[4:]])
        assert registry.resolve("o", "bot").name == "older"
        assert registry.resolve("o", "x").name == "a-tie"
        assert registry.resolve("o", "y").name == "dated"
        assert registry.resolve("o", "z").name == "d0"
        assert registry.conflicts == (
            Conflict("agent:bot", "older", ("newer",)),
            Conflict("agent:x", "a-tie", ("b-tie",)),
            Conflict("agent:y", "dated", ("undated",)),
            Conflict("default", "d0", ("d1",)),
        )


def test_a_profile_losing_one_claim_still_serves_its_others() -> None:
    registry = ProfileRegistry(
        [
            binding("old", agents=("a",), created="2026-01-01T00:00:00Z"),
            binding("new", agents=("a", "b"), created="2026-02-01T00:00:00Z"),
        ]
    )
    assert (registry.resolve("o", "a").name, registry.resolve("o", "b").name) == ("old", "new")


def test_profile_names_are_listed_in_precedence_order() -> None:
    registry = ProfileRegistry(
        [
            binding("z", default=True, created="2026-01-01T00:00:00Z"),
            binding("a", default=True, created="2026-02-01T00:00:00Z"),
        ]
    )
    assert registry.profile_names == ("z", "a") and len(registry) == 2


def test_the_store_swaps_the_whole_registry_at_once() -> None:
    store = ProfileStore()
    assert store.resolve("o", "a") is DEFAULT_PROFILE
    store.swap(REGISTRY)
    assert store.current is REGISTRY
    assert store.resolve("acme", "bot").name == "agent-p"


def test_readers_racing_a_swap_see_one_registry_or_the_other_never_a_mix() -> None:
    old = ProfileRegistry([binding("old-agent", agents=("bot",)), binding("old-org", orgs=("acme",))])
    new = ProfileRegistry([binding("new-agent", agents=("bot",)), binding("new-org", orgs=("acme",))])
    store = ProfileStore(old)
    mixed: list[tuple[str, str]] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            registry = store.current  # one read: both lookups from the same set
            pair = (registry.resolve("acme", "bot").name, registry.resolve("acme", "x").name)
            if pair not in (("old-agent", "old-org"), ("new-agent", "new-org")):
                mixed.append(pair)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for i in range(2000):
        store.swap(new if i % 2 else old)
    stop.set()
    for t in threads:
        t.join()
    assert mixed == []
