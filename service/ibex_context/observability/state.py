"""The per-call record shared by the server's event listeners, the handler and the log formatter.

The server's method wrapper (``server/rpc.py``) begins and ends the call inside the
request's task, so a ``ContextVar`` set when it begins is visible to the handler and
to the log formatter without passing anything through the handler's signature.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

import grpc
from opentelemetry.context import Context

from ibex_context.pipeline.assembly import Assembly, Rejection
from ibex_context.pipeline.outcome import StageSpan


@dataclass(slots=True, eq=False)
class CallState:
    """What the observability layer knows about one RPC. Mutable: the handler's observer
    (``CurrentCallObserver``) attaches what the call produced, the listeners stamp the end
    and the status.

    Times are ``time.perf_counter_ns()``; ``epoch_offset_ns`` converts them to Unix
    nanoseconds (captured once at call start, so every span of the call shares one clock).
    """

    method: str
    start_ns: int
    epoch_offset_ns: int
    request_id: str = ""
    # The caller's W3C trace context (from the ``traceparent`` metadata), if it sent one.
    parent: Context | None = None
    # The caller's trace id, or one chosen at call start, so logs written during the
    # call and the spans written after it share one trace id.
    trace_id: int = 0
    # None without a caller trace context; else whether the caller sampled its trace.
    parent_sampled: bool | None = None
    # The caller's deadline on the ``time.monotonic()`` clock.
    deadline_at: float | None = None
    # Time the caller gave us, as remaining when the request arrived.
    deadline_ms: float | None = None
    # What the AssembleContext handler produced (``pipeline.assembly``), attached whole:
    # the assembly after the response was sent, with the send's span (None when the
    # send did not finish), or the request's rejection. Both None when the call was cut
    # short (deadline, cancellation, crash) before its assembly was answered.
    assembly: Assembly | None = None
    send: StageSpan | None = None
    rejection: Rejection | None = None
    status: grpc.StatusCode | None = None
    end_ns: int = 0
    ended: bool = False

    def to_epoch_ns(self, perf_ns: int) -> int:
        return perf_ns + self.epoch_offset_ns

    @property
    def duration_seconds(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e9

    @property
    def trace_id_hex(self) -> str:
        return f"{self.trace_id:032x}" if self.trace_id else ""

    @property
    def stages(self) -> tuple[StageSpan, ...]:
        """The assembly's stages and the response's send, in the order they ran."""
        if self.assembly is None:
            return ()
        stages = self.assembly.timings.stages
        return stages if self.send is None else (*stages, self.send)


current_call: ContextVar[CallState | None] = ContextVar("ibex_context_current_call", default=None)


class CurrentCallObserver:
    """The AssembleContext handler's ``AssemblyObserver``: attaches what the call produced to
    the ``CallState`` of the call being served (``current_call``), which the listeners
    read once the call ends."""

    def answered(self, assembly: Assembly, send: StageSpan | None) -> None:
        state = current_call.get()
        if state is not None:
            state.assembly, state.send = assembly, send

    def rejected(self, rejection: Rejection) -> None:
        state = current_call.get()
        if state is not None:
            state.rejection = rejection
