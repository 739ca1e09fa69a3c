"""Observing every gRPC call of the server through grpclib's events.

grpclib has no interceptors; it has events. ``instrument_server`` listens to two:

* ``RecvRequest``: creates the call's ``CallState``, puts it in ``current_call``,
  counts the call in flight and wraps the handler so the in-flight gauge is
  decremented however the handler ends (a lost connection sends no trailers).
* ``SendTrailingMetadata``: stamps the end time and the status, then schedules the
  recording (metrics, spans, access log) with ``loop.call_soon``. The listener runs
  before grpclib writes the trailers, and the caller's call is not finished until
  the trailers arrive, so the recording is deferred until after they are written.

Handlers attach what they did: ``state = current_call.get(); if state: state.report = report``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from grpclib.const import Status
from grpclib.events import RecvRequest, SendTrailingMetadata, listen
from grpclib.server import Server, Stream

from ibex_context.observability.metrics import split_method, unfinished_outcome
from ibex_context.observability.state import CallState, current_call

if TYPE_CHECKING:
    from grpclib._typing import IServerMethodFunc

    from ibex_context.observability.metrics import Metrics
    from ibex_context.observability.tracing import Tracing

__all__ = ["CallObserver", "CallState", "access_log_fields", "current_call", "instrument_server"]

ASSEMBLE_CONTEXT_METHOD = "/ibex.context.v1.ContextAssemblyService/AssembleContext"
# Probes and reflection: counted in the gRPC metrics, but neither traced nor logged.
QUIET_METHOD_PREFIXES: tuple[str, ...] = ("/grpc.health.", "/grpc.reflection.")
_RECORDING_ERROR_LOG_INTERVAL_SECONDS = 60.0


def instrument_server(server: Server, *, metrics: Metrics, tracing: Tracing, log: logging.Logger) -> None:
    """Observe every call of ``server``: call this once, before ``server.start()``."""
    observer = CallObserver(metrics=metrics, tracing=tracing, log=log)
    listen(server, RecvRequest, observer.on_request)
    listen(server, SendTrailingMetadata, observer.on_trailers)


class CallObserver:
    def __init__(self, *, metrics: Metrics, tracing: Tracing, log: logging.Logger) -> None:
        self._metrics = metrics
        self._tracing = tracing
        self._log = log
        self._last_recording_error = 0.0

    async def on_request(self, event: RecvRequest) -> None:
        try:
            self._start(event)
        except Exception:
            # A bug here must cost the call its telemetry, never the call itself.
            self._recording_failed()

    def _start(self, event: RecvRequest) -> None:
        start_ns = time.perf_counter_ns()
        incoming = self._tracing.extract(event.metadata)
        deadline = event.deadline
        state = CallState(
            method=event.method_name,
            start_ns=start_ns,
            epoch_offset_ns=time.time_ns() - start_ns,
            request_id=safe_request_id(event.metadata.get("x-request-id")),
            parent=incoming.context,
            trace_id=incoming.trace_id,
            parent_sampled=incoming.parent_sampled,
            deadline=deadline,
            deadline_ms=deadline.time_remaining() * 1000 if deadline is not None else None,
        )
        event.method_func = self._observed(event.method_func, state)
        current_call.set(state)
        self._metrics.call_started()

    async def on_trailers(self, event: SendTrailingMetadata) -> None:
        state = current_call.get()
        if state is not None and not state.ended:
            self._end(state, event.status)

    def _observed(self, handler: IServerMethodFunc, state: CallState) -> IServerMethodFunc:
        async def observed(stream: Stream[Any, Any]) -> None:
            try:
                await handler(stream)
            except asyncio.CancelledError:
                # The deadline passed or the caller reset the stream. Trailers may
                # never be sent (or carry a racy status), so end the call here.
                if not state.ended:
                    self._end(state, _interrupted_status(state))
                raise
            finally:
                self._metrics.call_ended()

        return observed

    def _end(self, state: CallState, status: Status) -> None:
        state.end_ns = time.perf_counter_ns()
        state.status = status
        state.ended = True
        # Runs in a copy of this task's context: current_call still names this call
        # for the log formatter.
        asyncio.get_running_loop().call_soon(self._record, state)

    def _record(self, state: CallState) -> None:
        assert state.status is not None
        if not state.request_id and state.report is not None:
            # The caller sent no x-request-id; the handler's report knows the id it used.
            state.request_id = safe_request_id(state.report.request_id)
        try:
            self._metrics.record_call(state.method, state.status, state.duration_seconds)
            if state.method.startswith(QUIET_METHOD_PREFIXES):
                return
            trace_id = self._tracing.record(state)
            report = state.report
            if report is not None:
                self._metrics.record_assembly(report, trace_id=trace_id, call_seconds=state.duration_seconds)
            elif state.method == ASSEMBLE_CONTEXT_METHOD and state.status is not Status.OK:
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

    It comes from the caller unchecked (grpclib does not validate header values), and a
    control character in it could forge lines in the text log format.
    """
    if not isinstance(value, str):
        return ""
    value = value[:MAX_REQUEST_ID_CHARS]
    return value if value.isprintable() else "".join(c for c in value if c.isprintable())


def _interrupted_status(state: CallState) -> Status:
    if state.deadline is not None and state.deadline.time_remaining() <= 0:
        return Status.DEADLINE_EXCEEDED
    return Status.CANCELLED


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
    report = state.report
    if report is None:
        if state.method == ASSEMBLE_CONTEXT_METHOD and state.status not in (None, Status.OK):
            outcome, reason = unfinished_outcome(state.status)
            fields.update(outcome=outcome.value, reasons=[reason] if reason else [])
        return fields
    stages_us: dict[str, int] = {}
    for stage in report.stages:
        stages_us[stage.stage] = stages_us.get(stage.stage, 0) + stage.duration_us
    fields.update(
        outcome=report.outcome.value,
        degradation=report.degradation.name.lower(),
        reasons=list(report.reasons),
        model=report.model,
        profile=report.profile,
        assembly_ms=round(report.duration_seconds * 1000, 3),
        directive_injected=report.directive_injected,
        memories_injected=report.memories_injected,
        memories_available=report.memories_available,
        candidates_evaluated=report.candidates_evaluated,
        tokens_injected=report.tokens_injected,
        memory_budget=report.memory_budget,
        budget_utilisation=round(report.budget_utilisation, 4),
        encoding=report.encoding,
        exact_tokens=report.exact_tokens,
        stages_us=stages_us,
        sources={s.source: s.status.name.lower() for s in report.sources},
    )
    if report.invalid_field:
        fields["invalid_field"] = report.invalid_field
    return fields
