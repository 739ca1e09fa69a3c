"""Observing every gRPC call of the server: metrics, spans and the access log.

The server (``server/rpc.py``) wraps every method it serves: ``CallObserver.begin``
when the request arrives (creates the call's ``CallState``, puts it in
``current_call``, counts the call in flight) and ``CallObserver.end`` with the
status the call ends with, whichever way it ends (answered, refused, cut by the
deadline or the caller). ``end`` schedules the recording (metrics, spans, access
log) with ``loop.call_soon``: the call is not finished for its caller until the
response and the status are written, and grpc.aio writes them after the method
returns, so the recording waits until after that step.

The AssembleContext handler tells its observer (``state.CurrentCallObserver``) what the
call produced; the observer attaches it to the call's ``CallState``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

import grpc

from ibex_context.observability.metrics import split_method, unfinished_outcome
from ibex_context.observability.state import CallState, current_call

if TYPE_CHECKING:
    from ibex_context.observability.metrics import Metrics
    from ibex_context.observability.tracing import Tracing

__all__ = ["CallObserver", "CallState", "access_log_fields", "current_call"]

ASSEMBLE_CONTEXT_METHOD = "/ibex.context.v1.ContextAssemblyService/AssembleContext"
# Probes and reflection: counted in the gRPC metrics, but neither traced nor logged.
QUIET_METHOD_PREFIXES: tuple[str, ...] = ("/grpc.health.", "/grpc.reflection.")
_RECORDING_ERROR_LOG_INTERVAL_SECONDS = 60.0
# The only metadata the observer reads.
_OBSERVED_METADATA = frozenset(("traceparent", "tracestate", "x-request-id"))


class CallObserver:
    def __init__(self, *, metrics: Metrics, tracing: Tracing, log: logging.Logger) -> None:
        self._metrics = metrics
        self._tracing = tracing
        self._log = log
        self._last_recording_error = 0.0

    def begin(
        self, method: str, metadata: Iterable[tuple[str, str | bytes]], time_remaining: float | None
    ) -> CallState | None:
        """A call of ``method`` arrived: its state, set as ``current_call`` of the calling
        task's context, and counted in flight. Call ``end`` exactly once after it."""
        self._metrics.call_started()
        try:
            return self._begin(method, metadata, time_remaining)
        except Exception:
            # A bug here must cost the call its telemetry, never the call itself.
            self._recording_failed()
            return None

    def _begin(
        self, method: str, metadata: Iterable[tuple[str, str | bytes]], time_remaining: float | None
    ) -> CallState:
        start_ns = time.perf_counter_ns()
        observed = {key: value for key, value in metadata if key in _OBSERVED_METADATA}
        incoming = self._tracing.extract(observed)
        state = CallState(
            method=method,
            start_ns=start_ns,
            epoch_offset_ns=time.time_ns() - start_ns,
            request_id=safe_request_id(observed.get("x-request-id")),
            parent=incoming.context,
            trace_id=incoming.trace_id,
            parent_sampled=incoming.parent_sampled,
            deadline_at=time.monotonic() + time_remaining if time_remaining is not None else None,
            deadline_ms=time_remaining * 1000 if time_remaining is not None else None,
        )
        current_call.set(state)
        return state

    def end(self, state: CallState | None, status: grpc.StatusCode) -> None:
        """The call ended with ``status``: no longer in flight; recorded once its status is sent."""
        self._metrics.call_ended()
        if state is None or state.ended:
            return
        state.end_ns = time.perf_counter_ns()
        state.status = status
        state.ended = True
        # Runs in a copy of this task's context: current_call still names this call
        # for the log formatter.
        asyncio.get_running_loop().call_soon(self._record, state)

    def _record(self, state: CallState) -> None:
        assert state.status is not None
        produced = state.assembly or state.rejection
        if not state.request_id and produced is not None:
            # The caller sent no x-request-id; the handler knows the id it used.
            state.request_id = safe_request_id(produced.request_id)
        try:
            self._metrics.record_call(state.method, state.status, state.duration_seconds)
            if state.method.startswith(QUIET_METHOD_PREFIXES):
                return
            trace_id = self._tracing.record(state)
            if state.assembly is not None:
                self._metrics.record_assembly(state.assembly, state.stages, trace_id=trace_id)
            elif state.rejection is not None:
                self._metrics.record_rejection(state.duration_seconds, trace_id=trace_id)
            elif state.method == ASSEMBLE_CONTEXT_METHOD and state.status is not grpc.StatusCode.OK:
                self._metrics.record_unfinished_assembly(state.status, state.duration_seconds)
            if self._log.isEnabledFor(logging.INFO):
                self._log.info("rpc", extra=access_log_fields(state, traced=trace_id is not None))
        except Exception:
            self._recording_failed()

    def _recording_failed(self) -> None:
        # Observability must never take the service down; but say so, now and then.
        now = time.monotonic()
        if now - self._last_recording_error >= _RECORDING_ERROR_LOG_INTERVAL_SECONDS:
            self._last_recording_error = now
            logging.getLogger(__name__).exception("observing a call failed")


MAX_REQUEST_ID_CHARS = 128


def safe_request_id(value: str | bytes | None) -> str:
    """The caller's id as it may go into a log line or a span: bounded, printable only.

    It comes from the caller unchecked (metadata values are any printable ASCII, and a
    binary ``-bin`` key arrives as bytes), and a control character in it could forge
    lines in the text log format.
    """
    if not isinstance(value, str):
        return ""
    value = value[:MAX_REQUEST_ID_CHARS]
    return value if value.isprintable() else "".join(c for c in value if c.isprintable())


def interrupted_status(state: CallState | None) -> grpc.StatusCode:
    """The status of a call whose task was cancelled: the deadline passed, or the caller
    reset the stream."""
    if state is not None and state.deadline_at is not None and time.monotonic() >= state.deadline_at:
        return grpc.StatusCode.DEADLINE_EXCEEDED
    return grpc.StatusCode.CANCELLED


def access_log_fields(state: CallState, *, traced: bool) -> dict[str, object]:
    """The access log line: counts, timings, outcome, reasons, model and profile. Never text or tenant ids."""
    service, method = split_method(state.method)
    fields: dict[str, object] = {
        "rpc_service": service,
        "rpc_method": method,
        "grpc_code": state.status.name if state.status is not None else "",
        "duration_ms": round(state.duration_seconds * 1000, 3),
        "traced": traced,
    }
    if state.deadline_ms is not None:
        fields["deadline_ms"] = round(state.deadline_ms, 3)
    rejection = state.rejection
    if rejection is not None:
        fields.update(outcome=rejection.outcome.value, model=rejection.model, invalid_field=rejection.field)
        return fields
    assembly = state.assembly
    if assembly is None:
        if state.method == ASSEMBLE_CONTEXT_METHOD and state.status not in (None, grpc.StatusCode.OK):
            outcome, reason = unfinished_outcome(state.status)
            fields.update(outcome=outcome.value, reasons=[reason] if reason else [])
        return fields
    stages_us: dict[str, int] = {}
    for stage in state.stages:
        stages_us[stage.stage] = stages_us.get(stage.stage, 0) + stage.duration_us
    composed = assembly.composed
    fields.update(
        outcome=assembly.outcome.value,
        degradation=assembly.degradation.name.lower(),
        reasons=list(assembly.reasons),
        model=assembly.model,
        profile=assembly.profile,
        assembly_ms=round(assembly.duration_seconds * 1000, 3),
        directive_injected=composed.directive_injected,
        memories_injected=assembly.memories_injected,
        memories_available=composed.memories_available,
        candidates_evaluated=assembly.candidates_evaluated,
        tokens_injected=composed.tokens_injected,
        memory_budget=assembly.memory_budget,
        budget_utilisation=round(assembly.budget_utilisation, 4),
        encoding=assembly.encoding,
        exact_tokens=assembly.exact_tokens,
        stages_us=stages_us,
        sources={s.source: s.status.name.lower() for s in assembly.sources},
    )
    return fields
