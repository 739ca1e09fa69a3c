"""Log configuration: JSON lines tagged with the call's ids, and no content in what the service writes."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from ibex_context.devtools import scripted_service as scripted
from ibex_context.models import ChatMessage
from ibex_context.observability.logging import configure_logging
from ibex_context.observability.state import CallState, current_call
from ibex_context_client import ContextClient

from tests.observability.harness import Observed

USER_TEXT = "my passport number is Wombat-Lantern-5521"


@pytest.fixture
def root_logging() -> Iterator[None]:
    """configure_logging touches the root logger: put it back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    chatty = {name: logging.getLogger(name).level for name in ("h2", "hpack")}
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
    for name, lib_level in chatty.items():
        logging.getLogger(name).setLevel(lib_level)


def a_call(request_id: str = "req-9", trace_id: int = 0xABC) -> CallState:
    return CallState(method="/x.Y/Z", start_ns=0, epoch_offset_ns=0, request_id=request_id, trace_id=trace_id)


@pytest.mark.usefixtures("root_logging")
def test_json_lines_carry_the_current_calls_request_and_trace_ids() -> None:
    out = io.StringIO()
    configure_logging("INFO", "json", stream=out)
    log = logging.getLogger("tests.logging.json")

    token = current_call.set(a_call())
    try:
        log.info("inside", extra={"memories": 3})
    finally:
        current_call.reset(token)
    log.info("outside")

    inside, outside = (json.loads(line) for line in out.getvalue().splitlines())
    assert inside["msg"] == "inside"
    assert inside["level"] == "INFO"
    assert inside["logger"] == "tests.logging.json"
    assert inside["request_id"] == "req-9"
    assert inside["trace_id"] == f"{0xABC:032x}"
    assert inside["memories"] == 3
    assert inside["ts"].endswith("Z")
    assert "request_id" not in outside and "trace_id" not in outside


@pytest.mark.usefixtures("root_logging")
def test_exceptions_are_one_json_line_with_the_traceback() -> None:
    out = io.StringIO()
    configure_logging("INFO", "json", stream=out)
    try:
        raise ValueError("bad thing")
    except ValueError:
        logging.getLogger("tests.logging.exc").exception("failed")

    (line,) = out.getvalue().splitlines()
    entry = json.loads(line)
    assert entry["exc_type"] == "ValueError"
    assert "Traceback" in entry["exc"]


@pytest.mark.usefixtures("root_logging")
def test_text_format_is_one_readable_line_with_ids_and_fields() -> None:
    out = io.StringIO()
    configure_logging("DEBUG", "text", stream=out)
    token = current_call.set(a_call(request_id="req-t"))
    try:
        logging.getLogger("tests.logging.text").warning("slow stage", extra={"stage": "cold", "ms": 12.5})
    finally:
        current_call.reset(token)

    line = out.getvalue().strip()
    assert " WARNING tests.logging.text [req-t " in line
    assert line.endswith("slow stage stage=cold ms=12.5")


@pytest.mark.usefixtures("root_logging")
def test_configuring_twice_replaces_the_handler_and_floors_chatty_libraries() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("DEBUG", "json", stream=first)
    configure_logging("DEBUG", "json", stream=second)
    logging.getLogger("tests.logging.twice").info("once")
    logging.getLogger("hpack").debug("decoded header authorization: Bearer secret")

    assert first.getvalue() == ""
    assert len(second.getvalue().splitlines()) == 1
    assert logging.getLogger("hpack").getEffectiveLevel() >= logging.WARNING


async def test_nothing_logged_during_real_calls_contains_message_memory_or_directive_text(
    observed: Observed, client: ContextClient
) -> None:
    messages = [ChatMessage("user", USER_TEXT)]
    results = [
        await client.assemble(
            org_id="org-7f3a", agent_id="agent-91bc", model=model, messages=messages, request_id=f"r{i}"
        )
        for i, model in enumerate((scripted.FULL, scripted.COLD_TIMEOUT, scripted.INVALID, scripted.CRASH))
    ]
    output = observed.log_output.getvalue()

    assert scripted.MEMORY_TEXT in results[0].messages[0].content  # the text really went by
    assert len(observed.access_lines()) == 4
    for forbidden in ("Wombat", "Lantern", "PAPAYA", "quokka", "Nebula", "org-7f3a", "agent-91bc"):
        assert forbidden not in output
