"""Parsing and validating the profiles file: all or nothing, errors name profile and field."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from ibex_context.errors import ConfigurationError
from ibex_context.profiles.loader import load_profiles_file, parse_entry, parse_profiles
from ibex_context.profiles.model import DEFAULT_HALF_LIVES_DAYS, DEFAULT_PROFILE, ModelSpec
from ibex_context.profiles.registry import ProfileRegistry

BOT_1 = "b0000000-0000-4000-8000-000000000001"
BOT_2 = "b0000000-0000-4000-8000-000000000002"
ACME = "ac000000-0000-4000-8000-000000000000"
EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))


def document(*profiles: dict[str, Any]) -> str:
    return json.dumps(
        {
            "apiVersion": "context.ibex.dev/v1alpha1",
            "kind": "ContextProfileSet",
            "service": "ibex-context",
            "profiles": list(profiles),
        }
    )


FULL = {
    "name": "support",
    "createdAt": "2026-11-01T10:00:00Z",
    "selector": {"agentIds": [BOT_2, BOT_1, BOT_1.upper()], "orgIds": [ACME], "default": False},
    "budget": {
        "maxMemoryTokens": 900,
        "maxMemories": 7,
        "responseReserveTokens": 512,
        "safetyBufferRatio": 0.1,
    },
    "deadlines": {"assemblyMs": 30, "directiveMs": 5, "hotMs": 6, "coldMs": 25},
    "scoring": {
        "weights": {
            "relevance": 0.5,
            "recency": 0.2,
            "usefulness": 0.2,
            "confidence": 0.05,
            "frequency": 0.05,
        },
        "halfLifeDays": {"episodic": 3},
        "relevanceFloor": 0.25,
    },
    "format": "markdown",
    "injectionMode": "merge_system",
    "models": [
        {
            "name": "tiny",
            "contextWindow": 8192,
            "maxOutputTokens": 1024,
            "encoding": "cl100k_base",
            "exact": False,
        }
    ],
}


def test_a_full_entry_becomes_the_frozen_profile_values() -> None:
    (binding,) = parse_profiles(document(FULL)).bindings
    p = binding.profile
    assert p.name == "support"
    assert (p.budget.max_memory_tokens, p.budget.max_memories) == (900, 7)
    assert (p.budget.response_reserve_tokens, p.budget.safety_buffer_ratio) == (512, 0.1)
    assert (p.deadlines.assembly_ms, p.deadlines.directive_ms, p.deadlines.hot_ms, p.deadlines.cold_ms) == (
        30,
        5,
        6,
        25,
    )
    assert p.scoring.weights.relevance == 0.5 and p.scoring.relevance_floor == 0.25
    assert (p.format, p.injection_mode) == ("markdown", "merge_system")
    assert p.models == {
        "tiny": ModelSpec(
            name="tiny", context_window=8192, max_output_tokens=1024, encoding="cl100k_base", exact=False
        )
    }
    assert binding.selector.agent_ids == (BOT_1, BOT_2)  # sorted, deduplicated
    assert binding.selector.org_ids == (ACME,)
    assert binding.created_at == "2026-11-01T10:00:00Z"


def test_selector_ids_are_lower_cased_so_an_upper_case_uuid_matches_requests() -> None:
    upper = "7D0C1E52-5B8A-4F3E-9C61-ED9E00000001"
    (binding,) = parse_profiles(
        document({"name": "shouting", "selector": {"agentIds": [upper], "orgIds": [ACME.upper()]}})
    ).bindings
    assert binding.selector.agent_ids == (upper.lower(),)
    assert binding.selector.org_ids == (ACME,)
    # Requests are lower-cased by validation (server/assembly_service.py): they now match.
    registry = ProfileRegistry([binding])
    assert registry.resolve("00000000-0000-4000-8000-000000000000", upper.lower()).name == "shouting"
    assert registry.resolve(ACME, "00000000-0000-4000-8000-000000000000").name == "shouting"


@pytest.mark.parametrize("field", ["agentIds", "orgIds"])
@pytest.mark.parametrize("value", ["edge-summarizer", "acme", "7d0c1e525b8a4f3e9c61ed9e00000001", ""])
def test_a_selector_id_no_request_can_carry_is_rejected(field: str, value: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"'p': selector\.{field}\.0: Value error, must be a UUID"):
        parse_profiles(document({"name": "p", "selector": {field: [value]}}))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_contextprofile_loads(path: Path) -> None:
    resource = yaml.safe_load(path.read_text())
    parse_entry({"name": resource["metadata"]["name"], **resource["spec"]})


def test_half_lives_merge_over_the_built_in_ones() -> None:
    (binding,) = parse_profiles(document(FULL)).bindings
    assert binding.profile.scoring.half_lives_days == {**DEFAULT_HALF_LIVES_DAYS, "episodic": 3}


def test_a_minimal_entry_takes_every_default() -> None:
    (binding,) = parse_profiles(document({"name": "d", "selector": {"default": True}})).bindings
    assert binding.profile == DEFAULT_PROFILE.__class__(name="d")
    assert binding.selector.default and binding.created_at is None


def test_the_checksum_is_the_sha256_of_the_file_bytes() -> None:
    raw = document(FULL).encode()
    assert parse_profiles(raw).checksum == hashlib.sha256(raw).hexdigest()


def test_an_empty_profile_list_is_valid() -> None:
    assert parse_profiles(document()).bindings == ()


def test_a_pasted_contextprofile_spec_loads_with_its_operator_only_parts_ignored() -> None:
    entry = {**FULL, "service": "ibex-context", "autoscaling": {"minReplicas": 2}}
    assert parse_profiles(document(entry)).bindings[0].profile.name == "support"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"selector": {}}, "selector: Value error, selector must name at least one"),
        (
            {
                "scoring": {
                    "weights": {
                        "relevance": 0,
                        "recency": 0,
                        "usefulness": 0,
                        "confidence": 0,
                        "frequency": 0,
                    }
                }
            },
            "scoring.weights: Value error, at least one weight",
        ),
        ({"scoring": {"weights": {"relevance": 1.5}}}, "scoring.weights.relevance"),
        ({"scoring": {"halfLifeDays": {"episodic": 0}}}, "scoring.halfLifeDays.episodic"),
        ({"scoring": {"halfLifeDays": {"gossip": 3}}}, "scoring.halfLifeDays.gossip"),
        ({"scoring": {"relevanceFloor": 1.0}}, "scoring.relevanceFloor"),
        ({"scoring": {"relevanceFloor": -0.1}}, "scoring.relevanceFloor"),
        ({"deadlines": {"assemblyMs": 20}}, "deadlines: Value error, coldMs must be less than assemblyMs"),
        ({"deadlines": {"assemblyMs": 46}}, "deadlines.assemblyMs"),
        ({"budget": {"safetyBufferRatio": 0.9}}, "budget.safetyBufferRatio"),
        ({"format": "yaml"}, "format"),
        (
            {
                "models": [
                    {"name": "m", "contextWindow": 100, "maxOutputTokens": 100, "encoding": "o200k_base"}
                ]
            },
            "models.0: Value error, maxOutputTokens must be less than contextWindow",
        ),
        (
            {"models": [{"name": "m", "contextWindow": 100, "maxOutputTokens": 10, "encoding": "x"}] * 2},
            "models: names must be unique",
        ),
        ({"tokenBudget": 10}, "tokenBudget: Extra inputs are not permitted"),
    ],
)
def test_an_invalid_entry_is_rejected_naming_the_profile_and_the_field(
    change: dict[str, Any], expected: str
) -> None:
    bad = {"name": "broken", "selector": {"agentIds": ["aaaaaaaa-0000-4000-8000-000000000000"]}, **change}
    with pytest.raises(ConfigurationError) as caught:
        parse_profiles(document(FULL, bad))
    assert str(caught.value).startswith("profiles[1] 'broken': ")
    assert expected in str(caught.value)


def test_error_messages_never_echo_the_values() -> None:
    secret = "s3cr3t-looking-agent-id" * 20
    with pytest.raises(ConfigurationError) as caught:
        parse_profiles(document({"name": "x", "selector": {"agentIds": [secret]}}))
    assert "selector.agentIds.0" in str(caught.value)
    assert "s3cr3t" not in str(caught.value)


def test_duplicate_profile_names_are_rejected() -> None:
    with pytest.raises(ConfigurationError, match=r"profiles\[1\] 'support': name: duplicate"):
        parse_profiles(document(FULL, FULL))


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "must be a JSON object"),
        (json.dumps({"profiles": {}}), "profiles file: profiles"),
        (json.dumps({"apiVersion": "v2", "profiles": []}), "profiles file: apiVersion"),
        (json.dumps({"profiles": [], "extra": 1}), "profiles file: extra"),
        (json.dumps({"profiles": [42]}), "profiles file: profiles.0: Input should be a valid dictionary"),
    ],
)
def test_a_malformed_file_is_rejected(raw: str, expected: str) -> None:
    with pytest.raises(ConfigurationError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        parse_profiles(raw)


def test_parse_entry_labels_errors_with_the_callers_label() -> None:
    with pytest.raises(ConfigurationError, match=r"^spec 'x': selector"):
        parse_entry({"name": "x", "selector": {}}, label="spec")


def test_load_profiles_file_reads_the_path_and_lets_a_missing_file_through(tmp_path: Path) -> None:
    path = tmp_path / "profiles.json"
    with pytest.raises(FileNotFoundError):
        load_profiles_file(path)
    path.write_text(document(FULL))
    assert load_profiles_file(path).bindings[0].profile.name == "support"
