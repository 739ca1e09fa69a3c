"""A small scripted AssembleContext server for the observability and client tests (no
stores, no pipeline).

It behaves like the real handler towards the observability layer: once it has
answered, it tells the service's ``AssemblyObserver`` one ``Assembly`` with real stage
timings and the send's span (a rejected request, the ``Rejection`` naming the field). The
request's ``model`` picks a scenario, so one server covers every path. It injects
``MEMORY_TEXT`` (distinctive memory text) into the messages it returns: tests check
that none of it leaks into logs, labels or span attributes.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import cast

import grpc
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb

from ibex_context.models import Degradation, MemoryRecord, ScoredMemory
from ibex_context.observability.calls import CallObserver
from ibex_context.observability.metrics import Metrics
from ibex_context.observability.state import CurrentCallObserver, current_call
from ibex_context.observability.tracing import Tracing
from ibex_context.pipeline.assembly import Assembly, Composition, Rejection
from ibex_context.pipeline.budget import TokenBudget
from ibex_context.pipeline.outcome import (
    Outcome,
    Reason,
    SourceName,
    SourceResult,
    SourceStatus,
    Stage,
    StageSpan,
    Timings,
)
from ibex_context.server.grpc_server import ConnectionPolicy, ServiceServer
from ibex_context.server.rpc import CallError, Context, Method, unary
from ibex_context.tokens.catalogue import resolve_model

ASSEMBLE_CONTEXT = "/ibex.context.v1.ContextAssemblyService/AssembleContext"
MEMORY_TEXT = "Zanzibar-quokka-PAPAYA-7731 prefers dark roast"
DIRECTIVE_TEXT = "Always answer as Captain Nebula-9946"

# model -> behaviour
FULL = "gpt-4o"
COLD_TIMEOUT = "scenario-cold-timeout"
UNKNOWN_REASON = "scenario-unknown-reason"
SLOW = "scenario-slow"  # sleeps SLOW_SECONDS before answering
INVALID = "scenario-invalid"
CRASH = "scenario-crash"
EMPTY = "scenario-empty-response"
SLOW_SECONDS = 1.0


# The stages it times like the pipeline's: every one but the send, timed after.
_PIPELINE_STAGES = tuple(stage for stage in Stage if stage is not Stage.SERIALIZE)
_OBSERVER = CurrentCallObserver()
_MEMORIES = tuple(
    ScoredMemory(
        MemoryRecord(id=f"m{i}", content=MEMORY_TEXT, category="preference"), 0.8, 0.8, 0.5, 0.5, 0.5, 0.0
    )
    for i in (1, 2)
)
_BUDGET = TokenBudget(
    model=resolve_model("gpt-4o", {}),
    encoding="o200k_base",
    exact=True,
    approximation_reason="",
    context_window=128_000,
    messages_tokens=20,
    directive_tokens=10,
    response_reserve=4_096,
    safety_buffer=0,
    memory_budget=1_000,
    is_constrained=False,
)


@dataclass
class ScriptedAssembly:
    """Counts calls; ``delay`` is added to every call (for 'slower than the deadline' tests)."""

    calls: int = 0
    delay: float = 0.0
    # The real handler only tells its observer (once the call is answered); this one
    # also names the request early.
    sets_request_id: bool = True
    seen_metadata: list[dict[str, str]] = field(default_factory=list)
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("tests.scripted_service"))

    def methods(self) -> list[Method]:
        # Looked up on each call, so a test may replace ``assemble``.
        return [unary(ASSEMBLE_CONTEXT, pb.AssembleContextRequest, self._assemble)]

    async def _assemble(self, request: pb.AssembleContextRequest, context: Context) -> bytes:
        return await self.assemble(request, context)

    async def assemble(self, request: pb.AssembleContextRequest, context: Context) -> bytes:
        self.calls += 1
        invocation = context.invocation_metadata() or ()
        self.seen_metadata.append({k: v for k, v in invocation if isinstance(v, str)})
        state = current_call.get()
        request_id = request.request_id or "generated-request-id"
        started_ns = time.perf_counter_ns()
        if state is not None and self.sets_request_id:
            state.request_id = request_id
        # A handler that logs what it works on: the formatter must tag it, and the
        # tests check that only our (content-free) fields reach the output.
        self.log.info("assembling", extra={"messages": len(request.messages)})
        if self.delay:
            await asyncio.sleep(self.delay)
        if request.model == INVALID:
            _OBSERVER.rejected(Rejection(request_id, request.model, "org_id"))
            raise CallError(grpc.StatusCode.INVALID_ARGUMENT, "org_id: must be a UUID")
        if request.model == CRASH:
            raise RuntimeError("handler bug")
        if request.model == SLOW:
            await asyncio.sleep(SLOW_SECONDS)

        stages: list[StageSpan] = []
        for stage in _PIPELINE_STAGES:
            start = time.perf_counter_ns()
            await asyncio.sleep(0)
            stages.append(StageSpan(stage, start, time.perf_counter_ns()))
        sources = [
            SourceResult(SourceName.DIRECTIVE, SourceStatus.OK, 100, 1),
            SourceResult(SourceName.HOT, SourceStatus.OK, 200, 3),
            SourceResult(SourceName.EMBED, SourceStatus.OK, 50, 1),
            SourceResult(SourceName.COLD, SourceStatus.OK, 900, 4),
        ]
        outcome, degradation = Outcome.FULL, Degradation.FULL
        reasons: tuple[Reason, ...] = ()
        if request.model == COLD_TIMEOUT:
            outcome, degradation, reasons = Outcome.DEGRADED, Degradation.HOT_ONLY, (Reason.COLD_TIMEOUT,)
            sources[3] = SourceResult(
                SourceName.COLD, SourceStatus.TIMEOUT, 35_000, 0, "timed out after 35 ms"
            )
        if request.model == UNKNOWN_REASON:
            # A reason this version does not know (one a newer pipeline might report).
            outcome, reasons = Outcome.DEGRADED, (cast(Reason, "martian_interference"),)
        finished_ns = time.perf_counter_ns()

        messages = [pb.Message(role="system", content=f"{DIRECTIVE_TEXT}\nKnown: {MEMORY_TEXT}")]
        if request.model != EMPTY:
            messages.extend(request.messages)
        else:
            messages = []
        metadata = pb.InjectionMetadata(
            directive_injected=True,
            memories_injected=2,
            memories_available=5,
            fallback_reason=reasons[0] if reasons else "",
            degradation_reasons=reasons,
            request_id=request_id,
            profile="default",
        )
        start = time.perf_counter_ns()
        payload = pb.AssembleContextResponse(messages=messages, metadata=metadata).SerializeToString()
        send = StageSpan(Stage.SERIALIZE, start, time.perf_counter_ns())
        # Like the real handler: the observer is told once, after the send.
        _OBSERVER.answered(
            Assembly(
                request_id=request_id,
                model=request.model,
                profile="default",
                composed=Composition(
                    (),
                    directive_injected=True,
                    memories=_MEMORIES,
                    handles=(1, 2),
                    memories_available=5,
                    tokens_injected=260,
                    memory_tokens=250,
                    budget=_BUDGET,
                ),
                degradation=degradation,
                reasons=reasons,
                outcome=outcome,
                sources=tuple(sources),
                candidates_evaluated=7,
                context_window_used=1,
                timings=Timings(started_ns, finished_ns, tuple(stages)),
            ),
            send,
        )
        return payload


def free_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    # proto must be IPPROTO_TCP: asyncio only sets TCP_NODELAY on accepted sockets whose
    # proto says TCP, and with proto 0 Nagle + delayed ACKs add ~40 ms to every call.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    sock = free_socket()
    port = int(sock.getsockname()[1])
    sock.close()
    return port


@dataclass
class RunningServer:
    server: ServiceServer
    service: ScriptedAssembly
    host: str
    port: int

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"


@asynccontextmanager
async def scripted_server(
    *,
    metrics: Metrics | None = None,
    tracing: Tracing | None = None,
    access_log: logging.Logger | None = None,
    service: ScriptedAssembly | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    extra_methods: Sequence[Method] = (),
    connections: ConnectionPolicy | None = None,
) -> AsyncIterator[RunningServer]:
    """A real grpc.aio server (the service's own, ``server/grpc_server.py``) on a real
    socket, observed as the service is when ``metrics`` is given."""
    service = service or ScriptedAssembly()
    observer = None
    if metrics is not None:
        observer = CallObserver(
            metrics=metrics,
            tracing=tracing or Tracing(),
            log=access_log or logging.getLogger("tests.access"),
        )
    server = ServiceServer(
        [*service.methods(), *extra_methods],
        max_request_bytes=4 * 1024 * 1024,
        observer=observer,
        connections=connections,
    )
    bound = await server.start(host, port)
    try:
        yield RunningServer(server, service, host, bound)
    finally:
        await server.stop(0)
