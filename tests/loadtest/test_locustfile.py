"""The locustfile's per-response checks (``loadtest.checks``), on hand-built pb2 responses,
and the promise that the load generator's imports stay free of the asyncio server stack."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb

from loadtest import checks

ROOT = Path(__file__).resolve().parents[2]

SENT = [
    pb.Message(role="system", content="You are terse."),
    pb.Message(role="user", content="What is the SLA for Acme?"),
    pb.Message(role="assistant", content="Four hours."),
    pb.Message(role="user", content="And the escalation contact?"),
]


def response(
    messages: list[pb.Message],
    *,
    ids: tuple[str, ...] = ("m1", "m2"),
    injected: int | None = None,
    directive: bool = True,
    budget: int = 1000,
    used: int = 400,
    fallback: str = "",
) -> pb.AssembleContextResponse:
    resp = pb.AssembleContextResponse()
    resp.messages.extend(messages)
    md = resp.metadata
    md.directive_injected = directive
    md.memories_injected = len(ids) if injected is None else injected
    md.memory_ids.extend(ids)
    for memory_id in ids:
        md.memories.add(id=memory_id, category="factual", tokens=200)
    md.tokens.memory_budget = budget
    md.tokens.memory_tokens_used = used
    md.fallback_reason = fallback
    return resp


def injected_first() -> list[pb.Message]:
    return [pb.Message(role="system", content="Directive and memories"), *SENT]


def test_a_response_with_one_injected_system_message_then_the_clients_messages_passes() -> None:
    assert checks.response_problems(SENT, response(injected_first())) == []


def test_the_clients_system_message_extended_in_place_passes() -> None:
    extended = [pb.Message(role="system", content="You are terse.\n\nDirective and memories"), *SENT[1:]]
    assert checks.response_problems(SENT, response(extended)) == []


def test_messages_returned_unchanged_with_nothing_injected_passes() -> None:
    resp = response(list(SENT), ids=(), directive=False, used=0, fallback="redis_unavailable")
    assert checks.response_problems(SENT, resp) == []


def test_memories_injected_must_equal_the_number_of_ids_and_of_memories() -> None:
    problems = checks.response_problems(SENT, response(injected_first(), injected=3))
    assert [checks.problem_kind(p) for p in problems] == [checks.METADATA_COUNTS]


def test_memory_ids_and_memories_must_list_the_same_ids_in_the_same_order() -> None:
    resp = response(injected_first())
    resp.metadata.memories[0].id = "m2"
    resp.metadata.memories[1].id = "m1"
    assert [checks.problem_kind(p) for p in checks.response_problems(SENT, resp)] == [checks.MEMORY_ORDER]


def test_injected_memory_tokens_over_the_memory_budget_is_a_problem() -> None:
    problems = checks.response_problems(SENT, response(injected_first(), budget=300, used=301))
    assert [checks.problem_kind(p) for p in problems] == [checks.OVER_BUDGET]


def test_memory_tokens_exactly_at_the_budget_pass() -> None:
    assert checks.response_problems(SENT, response(injected_first(), budget=300, used=300)) == []


def test_reordered_client_messages_are_a_problem() -> None:
    reordered = [pb.Message(role="system", content="Directive"), SENT[0], SENT[2], SENT[1], SENT[3]]
    kinds = [checks.problem_kind(p) for p in checks.response_problems(SENT, response(reordered))]
    assert kinds == [checks.MESSAGES_CHANGED]


def test_a_dropped_client_message_is_a_problem() -> None:
    dropped = [pb.Message(role="system", content="Directive"), *SENT[:-1]]
    kinds = [checks.problem_kind(p) for p in checks.response_problems(SENT, response(dropped))]
    assert kinds == [checks.MESSAGES_CHANGED]


def test_an_edited_client_message_is_a_problem() -> None:
    edited = injected_first()
    edited[2] = pb.Message(role="user", content="What is the SLA for Acme? (rewritten)")
    kinds = [checks.problem_kind(p) for p in checks.response_problems(SENT, response(edited))]
    assert kinds == [checks.MESSAGES_CHANGED]


def test_an_extended_system_message_must_keep_the_clients_text() -> None:
    replaced = [pb.Message(role="system", content="Directive only"), *SENT[1:]]
    kinds = [checks.problem_kind(p) for p in checks.response_problems(SENT, response(replaced))]
    assert kinds == [checks.MESSAGES_CHANGED]


def test_an_injected_system_message_with_metadata_saying_nothing_was_injected_is_a_problem() -> None:
    resp = response(injected_first(), ids=(), directive=False, used=0)
    kinds = [checks.problem_kind(p) for p in checks.response_problems(SENT, resp)]
    assert kinds == [checks.UNEXPECTED_INJECTION]


def test_a_new_session_with_one_user_message_gets_a_system_message_first() -> None:
    question = [pb.Message(role="user", content="hi")]
    resp = response([pb.Message(role="system", content="Directive"), *question])
    assert checks.response_problems(question, resp) == []


def test_fallback_reason_is_none_for_a_full_assembly_and_the_reason_otherwise() -> None:
    assert checks.fallback_reason(response(injected_first())) is None
    assert checks.fallback_reason(response(injected_first(), fallback="cold_timeout")) == "cold_timeout"


def test_a_fallback_alone_is_not_a_contract_problem() -> None:
    resp = response(injected_first(), ids=(), used=0, fallback="cold_timeout")
    assert checks.response_problems(SENT, resp) == []


def test_the_load_generators_imports_pull_in_no_asyncio_or_server_code() -> None:
    code = (
        "import sys\n"
        "from ibex_context_client.proto.ibex.context.v1 import context_pb2\n"
        "import loadtest.checks, loadtest.corpus\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('asyncio', 'uvloop', 'h2')"
        " or m.startswith(('ibex_context.server', 'ibex_context.pipeline', 'ibex_context.stores')))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
