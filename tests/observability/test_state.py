"""The per-call record (``observability/state.py``): the handler's observer attaches what the
call produced to the call being served, and nothing to any other."""

from __future__ import annotations

from ibex_context.observability.state import CallState, CurrentCallObserver, current_call
from ibex_context.pipeline.assembly import Rejection
from ibex_context.pipeline.outcome import StageSpan, Timings

from tests.pipeline.assemblies import an_assembly

ASSEMBLE = "/ibex.context.v1.ContextAssemblyService/AssembleContext"


def test_an_answered_call_gets_its_assembly_and_its_stages_end_with_the_send() -> None:
    state = CallState(ASSEMBLE, start_ns=0, epoch_offset_ns=0)
    token = current_call.set(state)
    try:
        budget = StageSpan("budget", 0, 10)
        assembly = an_assembly(timings=Timings(0, 20, (budget,)))
        send = StageSpan("serialize", 30, 40)
        CurrentCallObserver().answered(assembly, send)
    finally:
        current_call.reset(token)
    assert state.assembly is assembly and state.rejection is None
    assert state.stages == (budget, send)


def test_a_send_that_did_not_finish_adds_no_stage() -> None:
    state = CallState(ASSEMBLE, start_ns=0, epoch_offset_ns=0)
    token = current_call.set(state)
    try:
        CurrentCallObserver().answered(an_assembly(timings=Timings(0, 20, ())), None)
    finally:
        current_call.reset(token)
    assert state.stages == ()


def test_a_rejected_request_gets_its_rejection_and_no_assembly() -> None:
    state = CallState(ASSEMBLE, start_ns=0, epoch_offset_ns=0)
    token = current_call.set(state)
    try:
        CurrentCallObserver().rejected(Rejection("req-1", "gpt-4o", "org_id"))
    finally:
        current_call.reset(token)
    assert state.rejection == Rejection("req-1", "gpt-4o", "org_id") and state.assembly is None
    assert state.stages == ()


def test_outside_a_served_call_the_observer_attaches_nothing() -> None:
    # A handler driven directly (benchmarks, tests) has no call state: nothing to attach, no error.
    token = current_call.set(None)
    try:
        CurrentCallObserver().answered(an_assembly(), None)
        CurrentCallObserver().rejected(Rejection("r", "m", "f"))
    finally:
        current_call.reset(token)
