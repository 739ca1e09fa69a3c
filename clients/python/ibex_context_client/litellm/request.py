"""What the LiteLLM hook decides from a proxy request, as pure functions: its configuration, whose
context the request is (org, agent, session), and whether its messages can be assembled.

Kept apart from ``hook`` (which subclasses LiteLLM's ``CustomLogger``) so these rules are
tested without LiteLLM installed.

Whose request: the LiteLLM virtual key's metadata (``ibex_org_id``, ``ibex_agent_id``), else its
team's metadata, else, only when the configuration trusts them, the request's ``x-ibex-org-id`` /
``x-ibex-agent-id`` headers, else the configured defaults. A key or team that names an org is never
overridden by a header: the header is the caller's word, the key is the proxy admin's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ibex_context_client.context import DEFAULT_TIMEOUT_SECONDS
from ibex_context_client.messages import ROLES, ChatMessage
from ibex_context_client.results import AssembleResult
from ibex_context_client.target import parse_target

__all__ = [
    "CONFIG_SECTION",
    "ELAPSED_HEADER",
    "HEADER_AGENT",
    "HEADER_ORG",
    "HEADER_SESSION",
    "KEY_AGENT",
    "KEY_ORG",
    "OUTCOME_HEADER",
    "HookConfig",
    "RequestTenant",
    "assemblable_messages",
    "outcome_headers",
    "resolve_tenant",
]

# config.yaml: callback_settings: {ibex_context: {...}} (LiteLLM keeps that section as it is).
CONFIG_SECTION = "ibex_context"
KEY_ORG = "ibex_org_id"
KEY_AGENT = "ibex_agent_id"
HEADER_ORG = "x-ibex-org-id"
HEADER_AGENT = "x-ibex-agent-id"
HEADER_SESSION = "x-ibex-session-id"
# On the proxy's answer: what became of the request's context, and the call's wall time.
OUTCOME_HEADER = "x-ibex-context"
ELAPSED_HEADER = "x-ibex-context-ms"

DEFAULT_TARGET = "127.0.0.1:50051"
# LiteLLM's call types of a chat completion (sync and async); the other endpoints pass untouched.
CHAT_CALL_TYPES = frozenset({"completion", "acompletion"})
# A message the hook may hand over and take back whole: nothing is lost when the service's
# messages replace the request's.
_PLAIN_MESSAGE_KEYS = frozenset({"role", "content"})


@dataclass(frozen=True, slots=True)
class HookConfig:
    """The hook's settings, from ``callback_settings.ibex_context`` in LiteLLM's config.yaml.

    The credential (bearer token, TLS files) is not here: it comes from ``IBEX_TOKEN`` /
    ``IBEX_TOKEN_FILE`` / ``IBEX_TLS_*`` in the proxy's environment, never from a config file.
    """

    target: str = DEFAULT_TARGET
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    org_id: str = ""
    agent_id: str = ""
    trust_headers: bool = False

    @classmethod
    def from_settings(cls, section: Mapping[str, Any], env: Mapping[str, str]) -> HookConfig:
        """``section``: the config's ``ibex_context`` mapping; ``target`` falls back to ``IBEX_TARGET``.

        Raises ValueError naming the key for a value the hook cannot use: a proxy that starts
        with a typo would otherwise pass every request through unassembled, silently.
        """
        unknown = sorted(set(section) - {"target", "timeout_ms", "org_id", "agent_id", "trust_headers"})
        if unknown:
            raise ValueError(f"{CONFIG_SECTION}.{unknown[0]}: unknown setting")
        target = str(section.get("target") or env.get("IBEX_TARGET") or DEFAULT_TARGET)
        try:
            parse_target(target)
        except ValueError as exc:
            raise ValueError(f"{CONFIG_SECTION}.target: {exc}") from None
        timeout_ms = section.get("timeout_ms", DEFAULT_TIMEOUT_SECONDS * 1000)
        if (
            isinstance(timeout_ms, bool)
            or not isinstance(timeout_ms, int | float)
            or not math.isfinite(timeout_ms)
            or not 0 < timeout_ms <= 10_000
        ):
            raise ValueError(f"{CONFIG_SECTION}.timeout_ms: a number of milliseconds in (0, 10000]")
        trust_headers = section.get("trust_headers", False)
        if not isinstance(trust_headers, bool):
            raise ValueError(f"{CONFIG_SECTION}.trust_headers: true or false")
        return cls(
            target=target,
            timeout_seconds=float(timeout_ms) / 1000,
            org_id=str(section.get("org_id") or ""),
            agent_id=str(section.get("agent_id") or ""),
            trust_headers=trust_headers,
        )


@dataclass(frozen=True, slots=True)
class RequestTenant:
    org_id: str
    agent_id: str
    session_id: str = ""


def _text(mapping: Mapping[str, Any] | None, key: str) -> str:
    value = mapping.get(key) if mapping else None
    return value.strip() if isinstance(value, str) else ""


def resolve_tenant(
    config: HookConfig,
    *,
    key_metadata: Mapping[str, Any] | None,
    team_metadata: Mapping[str, Any] | None,
    headers: Mapping[str, Any] | None,
) -> RequestTenant | None:
    """Whose context the request gets (see the module doc); None when no org or agent is known."""
    lowered = {str(k).lower(): v for k, v in (headers or {}).items()}
    trusted = lowered if config.trust_headers else {}

    def pick(key_name: str, header_name: str, default: str) -> str:
        return (
            _text(key_metadata, key_name)
            or _text(team_metadata, key_name)
            or _text(trusted, header_name)
            or default
        )

    org_id = pick(KEY_ORG, HEADER_ORG, config.org_id)
    agent_id = pick(KEY_AGENT, HEADER_AGENT, config.agent_id)
    if not org_id or not agent_id:
        return None
    return RequestTenant(org_id, agent_id, _text(lowered, HEADER_SESSION))


def assemblable_messages(messages: object) -> tuple[ChatMessage, ...] | None:
    """The request's messages as the service takes them, or None when a message carries more
    than a known role and its text (tool calls, images, names): replacing such messages with
    the service's would drop what the model needs, so those requests pass untouched."""
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        return None
    converted: list[ChatMessage] = []
    for message in messages:
        if not isinstance(message, Mapping) or not set(message) <= _PLAIN_MESSAGE_KEYS:
            return None
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or role not in ROLES or not isinstance(content, str):
            return None
        converted.append(ChatMessage(role, content))
    return tuple(converted)


def outcome_headers(result: AssembleResult | None) -> dict[str, str]:
    """The answer's headers: ``assembled``, ``degraded:<reason>`` (the service's messages, as far
    as it got), ``fallback:<reason>`` (the request's own messages) or ``skipped`` (no call made);
    reasons are the client's bounded labels, never content or ids."""
    if result is None:
        return {OUTCOME_HEADER: "skipped"}
    if result.from_service:
        outcome = f"degraded:{result.fallback_reason}" if result.fallback_reason else "assembled"
    else:
        outcome = f"fallback:{result.fallback_reason}"
    return {OUTCOME_HEADER: outcome, ELAPSED_HEADER: f"{result.elapsed_seconds * 1000:.2f}"}
