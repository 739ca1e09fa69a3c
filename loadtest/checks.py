"""What every AssembleContext response must satisfy, checked by the load generator.

Pure functions over the upb ``_pb2`` messages: no locust, gevent or grpc import, so
they are unit-tested directly (``tests/loadtest/test_locustfile.py``) and reused by
anything that wants to validate a response.

A *problem* is a broken contract (counted as a failed request). A *fallback* is the
service saying it degraded (``metadata.fallback_reason``): the call succeeded, so it
is counted separately, by reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Problem kinds; stable strings so they can name locust failures.
METADATA_COUNTS = "metadata_counts_mismatch"
MEMORY_ORDER = "memory_ids_order_mismatch"
OVER_BUDGET = "memory_tokens_over_budget"
MESSAGES_CHANGED = "client_messages_not_preserved"
UNEXPECTED_INJECTION = "injection_without_metadata"


def _pairs(messages: Sequence[Any]) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in messages]


def metadata_problems(metadata: Any) -> list[str]:
    """memories_injected == len(memory_ids) == len(memories), same ids in the same order."""
    problems: list[str] = []
    ids = list(metadata.memory_ids)
    if not (metadata.memories_injected == len(ids) == len(metadata.memories)):
        problems.append(
            f"{METADATA_COUNTS}: memories_injected={metadata.memories_injected} "
            f"memory_ids={len(ids)} memories={len(metadata.memories)}"
        )
    elif [m.id for m in metadata.memories] != ids:
        problems.append(f"{MEMORY_ORDER}: memories[].id differ from memory_ids")
    return problems


def budget_problems(metadata: Any) -> list[str]:
    """The injected memories fit the memory budget the service itself computed."""
    tokens = metadata.tokens
    if tokens.memory_tokens_used > tokens.memory_budget:
        return [f"{OVER_BUDGET}: used {tokens.memory_tokens_used} > budget {tokens.memory_budget}"]
    return []


def message_problems(request_messages: Sequence[Any], response: Any) -> list[str]:
    """The client's messages come back unchanged and in order after the injection.

    Allowed shapes (the proto's contract): one injected system message first, then the
    client's messages; or the client's first system message extended in place (its
    original text kept), then the rest; or the client's messages unchanged.
    """
    sent = _pairs(request_messages)
    got = _pairs(response.messages)
    md = response.metadata
    injected = md.directive_injected or md.memories_injected > 0
    if got == sent:
        return []
    if len(got) == len(sent) + 1 and got[0][0] == "system" and got[1:] == sent:
        return (
            [] if injected else [f"{UNEXPECTED_INJECTION}: a system message was added but metadata says none"]
        )
    if (
        sent
        and len(got) == len(sent)
        and sent[0][0] == "system"
        and got[0][0] == "system"
        and sent[0][1] in got[0][1]
        and got[1:] == sent[1:]
    ):
        return (
            [] if injected else [f"{UNEXPECTED_INJECTION}: the system message changed but metadata says none"]
        )
    return [f"{MESSAGES_CHANGED}: sent {len(sent)} messages, got {len(got)} back, not in the allowed shapes"]


def response_problems(request_messages: Sequence[Any], response: Any) -> list[str]:
    """Every broken contract in one response (empty when it is correct)."""
    md = response.metadata
    return [*metadata_problems(md), *budget_problems(md), *message_problems(request_messages, response)]


def fallback_reason(response: Any) -> str | None:
    """The service's degradation reason, or None for a full assembly."""
    reason: str = response.metadata.fallback_reason
    return reason or None


def problem_kind(problem: str) -> str:
    """The stable part of a problem string (before the colon), for grouping."""
    return problem.split(":", 1)[0]
