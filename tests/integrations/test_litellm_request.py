"""What the LiteLLM hook decides before it calls the service: its settings from config.yaml, whose
context a request gets, and which messages it may replace."""

from __future__ import annotations

from typing import Any

import pytest
from ibex_context.models import ChatMessage
from ibex_context_client.litellm.request import (
    HookConfig,
    RequestTenant,
    assemblable_messages,
    outcome_headers,
    resolve_tenant,
)
from ibex_context_client.results import AssembleResult


def test_the_settings_default_to_the_clients_45_ms_and_the_target_from_the_environment() -> None:
    config = HookConfig.from_settings({}, {"IBEX_TARGET": "dns:///ibex-context-headless:50051"})
    assert config.target == "dns:///ibex-context-headless:50051"
    assert config.timeout_seconds == pytest.approx(0.045)
    assert config.trust_headers is False


def test_the_config_section_wins_over_the_environment() -> None:
    section = {
        "target": "ibex:50051",
        "timeout_ms": 30,
        "org_id": "o",
        "agent_id": "a",
        "trust_headers": True,
    }
    config = HookConfig.from_settings(section, {"IBEX_TARGET": "elsewhere:1"})
    assert config == HookConfig("ibex:50051", 0.03, "o", "a", True)


@pytest.mark.parametrize(
    ("section", "named"),
    [
        ({"timout_ms": 45}, "ibex_context.timout_ms"),
        ({"timeout_ms": 0}, "ibex_context.timeout_ms"),
        ({"timeout_ms": "45"}, "ibex_context.timeout_ms"),
        ({"timeout_ms": float("nan")}, "ibex_context.timeout_ms"),
        ({"trust_headers": "yes"}, "ibex_context.trust_headers"),
        ({"target": "ibex:port"}, "ibex_context.target"),
    ],
)
def test_a_setting_the_hook_cannot_use_is_named(section: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=f"^{named}: "):
        HookConfig.from_settings(section, {})


DEFAULTS = HookConfig(org_id="default-org", agent_id="default-agent")
TRUSTING = HookConfig(org_id="default-org", agent_id="default-agent", trust_headers=True)
HEADERS = {"X-Ibex-Org-Id": "header-org", "x-ibex-agent-id": "header-agent", "x-ibex-session-id": "s1"}


def test_the_keys_metadata_names_the_tenant_before_its_team_headers_and_defaults() -> None:
    key = {"ibex_org_id": "key-org", "ibex_agent_id": "key-agent"}
    team = {"ibex_org_id": "team-org", "ibex_agent_id": "team-agent"}
    tenant = resolve_tenant(TRUSTING, key_metadata=key, team_metadata=team, headers=HEADERS)
    assert tenant == RequestTenant("key-org", "key-agent", "s1")


def test_the_team_names_what_the_key_does_not() -> None:
    tenant = resolve_tenant(
        DEFAULTS,
        key_metadata={"ibex_agent_id": "key-agent"},
        team_metadata={"ibex_org_id": "team-org"},
        headers={},
    )
    assert tenant == RequestTenant("team-org", "key-agent")


def test_headers_count_only_when_trusted() -> None:
    untrusted = resolve_tenant(DEFAULTS, key_metadata={}, team_metadata=None, headers=HEADERS)
    trusted = resolve_tenant(TRUSTING, key_metadata={}, team_metadata=None, headers=HEADERS)
    assert untrusted == RequestTenant("default-org", "default-agent", "s1")
    assert trusted == RequestTenant("header-org", "header-agent", "s1")


def test_a_header_never_overrides_the_org_a_key_names() -> None:
    tenant = resolve_tenant(
        TRUSTING, key_metadata={"ibex_org_id": "key-org"}, team_metadata={}, headers=HEADERS
    )
    assert tenant is not None and tenant.org_id == "key-org"


def test_no_org_or_no_agent_means_no_assembly() -> None:
    assert resolve_tenant(HookConfig(org_id="o"), key_metadata={}, team_metadata={}, headers={}) is None
    assert resolve_tenant(HookConfig(), key_metadata={"ibex_org_id": 7}, team_metadata={}, headers={}) is None


def test_plain_text_messages_are_taken_whole() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    assert assemblable_messages(messages) == (
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "Hello"),
    )


@pytest.mark.parametrize(
    "messages",
    [
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "Look"}, {"type": "image_url", "image_url": {}}],
            }
        ],
        [{"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}],
        [{"role": "user", "content": "Hi", "name": "ada"}],
        [{"role": "narrator", "content": "Hi"}],
        [{"role": ["user"], "content": "Hi"}],
        ["Hi"],
        [],
        "Hi",
        None,
    ],
    ids=[
        "image",
        "tool-calls",
        "name",
        "unknown-role",
        "unhashable-role",
        "not-a-mapping",
        "empty",
        "str",
        "none",
    ],
)
def test_messages_carrying_more_than_role_and_text_are_left_alone(messages: object) -> None:
    assert assemblable_messages(messages) is None


def _result(reason: str, from_service: bool) -> AssembleResult:
    return AssembleResult((), None, reason, from_service, elapsed_seconds=0.0123)


@pytest.mark.parametrize(
    ("result", "outcome"),
    [
        (_result("", True), "assembled"),
        (_result("cold_timeout", True), "degraded:cold_timeout"),
        (_result("client_timeout", False), "fallback:client_timeout"),
        (_result("client_error:PERMISSION_DENIED", False), "fallback:client_error:PERMISSION_DENIED"),
    ],
)
def test_the_answer_says_what_became_of_its_context(result: AssembleResult, outcome: str) -> None:
    assert outcome_headers(result) == {"x-ibex-context": outcome, "x-ibex-context-ms": "12.30"}


def test_a_request_no_call_was_made_for_says_skipped() -> None:
    assert outcome_headers(None) == {"x-ibex-context": "skipped"}
