"""What ``assemble`` prints, from the client's result: the response's JSON form and the text view."""

from __future__ import annotations

import json

from google.protobuf import json_format
from ibex_context.cli_render import render_result, result_json
from ibex_context.models import ChatMessage
from ibex_context_client import AssembleResult
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb


def _served() -> AssembleResult:
    metadata = pb.InjectionMetadata(directive_injected=True, memories_injected=1, profile="default")
    metadata.memories.add(handle=1, id="m-1", category="factual", score=0.5)
    return AssembleResult(
        messages=(ChatMessage("system", "Known: rack 7"), ChatMessage("user", "where?")),
        metadata=metadata,
        fallback_reason="",
        from_service=True,
        elapsed_seconds=0.01,
    )


def test_the_json_is_the_responses_own_json_form() -> None:
    result = _served()
    assert result.metadata is not None
    response = pb.AssembleContextResponse(
        messages=[pb.Message(role=m.role, content=m.content) for m in result.messages],
        metadata=result.metadata,
    )
    assert json.loads(result_json(result)) == json.loads(json_format.MessageToJson(response))


def test_a_client_fallback_shows_as_a_pass_through_with_the_clients_reason() -> None:
    result = AssembleResult(
        messages=(ChatMessage("user", "hello"),),
        metadata=None,
        fallback_reason="client_unavailable",
        from_service=False,
        elapsed_seconds=0.01,
    )
    document = json.loads(result_json(result))
    assert document["metadata"]["fallbackReason"] == "client_unavailable"
    assert document["metadata"]["degradationLevel"] == "DEGRADATION_LEVEL_PASS_THROUGH"
    text = render_result(result)
    assert "level=PASS_THROUGH" in text
    assert "fallback_reason=client_unavailable" in text
    assert text.startswith("── user ")


def test_the_text_view_lists_each_injected_memory() -> None:
    text = render_result(_served())
    assert "directive_injected=True memories=1/0" in text
    assert "#1   m-1 factual" in text


def test_the_text_view_times_every_stage_on_the_wire_in_the_pipelines_order() -> None:
    result = _served()
    assert result.metadata is not None
    timings = result.metadata.timings
    timings.total_us, timings.budget_us, timings.lexical_us, timings.format_us = 900, 10, 300, 40
    [line] = [line for line in render_result(result).splitlines() if line.startswith("timings")]
    assert line == (
        "timings µs: total=900 budget=10 directive=0 hot=0 embed=0 cold=0 lexical=300"
        " score=0 pack=0 format=40"
    )
