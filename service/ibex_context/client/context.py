"""The proxy-side client of AssembleContext. It never fails the LLM request.

``ContextClient.assemble`` returns an ``AssembleResult`` whatever happens: the
service's messages when it answered, else the caller's own messages unchanged with
``fallback_reason`` saying why (``client_timeout``, ``client_unavailable``,
``client_invalid_argument``, ``client_error:<STATUS>``). Runtime failures are never
raised; only cancellation of the caller's own task propagates.

INVALID_ARGUMENT is a bug in the caller (or a contract mismatch), not an outage, so
it is logged at ERROR with the field the service named; the LLM request still goes
out, unassembled, because failing it would turn our bug into the user's outage.
"""

from __future__ import annotations

import asyncio
import logging
import ssl as ssl_module
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from grpclib.const import Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from grpclib.metadata import Deadline
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry, Counter, Histogram

from ibex_context._proto.ibex.context.v1 import context_pb2 as pb
from ibex_context.client.channels import DnsRoundRobin, Endpoint, Endpoints, SingleChannel
from ibex_context.client.credentials import bearer_metadata
from ibex_context.client.target import Target, parse_target
from ibex_context.models import ChatMessage
from ibex_context.observability.metrics import ASSEMBLY_BUCKETS

__all__ = [
    "ASSEMBLE_CONTEXT",
    "CLIENT_INVALID_ARGUMENT",
    "CLIENT_TIMEOUT",
    "CLIENT_UNAVAILABLE",
    "DEFAULT_TIMEOUT_SECONDS",
    "AssembleResult",
    "ContextClient",
]

ASSEMBLE_CONTEXT = "/ibex.context.v1.ContextAssemblyService/AssembleContext"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
DEFAULT_TIMEOUT_SECONDS = 0.045

CLIENT_TIMEOUT = "client_timeout"
CLIENT_UNAVAILABLE = "client_unavailable"
CLIENT_INVALID_ARGUMENT = "client_invalid_argument"
CLIENT_ERROR = "client_error"

# A refused connection means the request never left, so one retry on another address
# is safe; only worth it with this much of the deadline left.
_MIN_SECONDS_FOR_RETRY = 0.005
_LOG_INTERVAL_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class AssembleResult:
    """What to send to the model.

    ``from_service`` is False when the client fell back; ``messages`` are then the
    caller's own. ``fallback_reason`` is empty for a full assembly, the service's
    reason when it degraded, or a ``client_*`` reason when the client fell back.
    ``metadata`` is the service's ``InjectionMetadata`` (None on client fallback).
    """

    messages: tuple[ChatMessage, ...]
    metadata: pb.InjectionMetadata | None
    fallback_reason: str
    from_service: bool
    elapsed_seconds: float

    @property
    def degraded(self) -> bool:
        return bool(self.fallback_reason)


@dataclass(frozen=True, slots=True)
class _Failure:
    reason: str
    kind: Literal["timeout", "connect", "other"] = "other"
    detail: str = ""


def classify_failure(exc: Exception) -> _Failure:
    """Map what grpclib (and the socket layer below it) raises to a bounded fallback reason."""
    if isinstance(exc, TimeoutError):  # grpclib's client deadline raises asyncio.TimeoutError
        return _Failure(CLIENT_TIMEOUT, "timeout")
    if isinstance(exc, GRPCError):
        if exc.status is Status.DEADLINE_EXCEEDED:
            return _Failure(CLIENT_TIMEOUT, "timeout")
        if exc.status is Status.UNAVAILABLE:
            return _Failure(CLIENT_UNAVAILABLE, detail=exc.message or "")
        # RESOURCE_EXHAUSTED: a request over the service's size limit, refused by gRPC's
        # core (ADR-0010): as much a caller bug as a field the service rejects.
        if exc.status in (Status.INVALID_ARGUMENT, Status.RESOURCE_EXHAUSTED):
            return _Failure(CLIENT_INVALID_ARGUMENT, detail=exc.message or "")
        return _Failure(f"{CLIENT_ERROR}:{exc.status.name}", detail=exc.message or "")
    if isinstance(exc, StreamTerminatedError):
        return _Failure(CLIENT_UNAVAILABLE, detail=str(exc))
    if isinstance(exc, (ConnectionResetError, BrokenPipeError)):
        return _Failure(CLIENT_UNAVAILABLE, detail=type(exc).__name__)
    if isinstance(exc, OSError):  # refused, unreachable, name resolution
        return _Failure(CLIENT_UNAVAILABLE, "connect", detail=type(exc).__name__)
    if isinstance(exc, ProtocolError):
        return _Failure(f"{CLIENT_ERROR}:protocol", detail=str(exc))
    return _Failure(f"{CLIENT_ERROR}:unexpected", detail=type(exc).__name__)


_CLIENT_RESULTS = (
    "ok",
    "degraded",
    CLIENT_TIMEOUT,
    CLIENT_UNAVAILABLE,
    CLIENT_INVALID_ARGUMENT,
    CLIENT_ERROR,
)


class _ClientMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.results = Counter(
            "ibex_context_client_requests",
            "AssembleContext calls by result: ok, degraded (by the service) or the client fallback.",
            ["result"],
            registry=registry,
        )
        self.duration = Histogram(
            "ibex_context_client_duration_seconds",
            "Client-side wall time of AssembleContext, fallbacks included.",
            buckets=ASSEMBLY_BUCKETS,
            registry=registry,
        )
        for result in (
            "ok",
            "degraded",
            CLIENT_TIMEOUT,
            CLIENT_UNAVAILABLE,
            CLIENT_INVALID_ARGUMENT,
            CLIENT_ERROR,
        ):
            self.results.labels(result)

    def record(self, result: AssembleResult) -> None:
        if result.from_service:
            label = "degraded" if result.fallback_reason else "ok"
        else:
            label = result.fallback_reason.partition(":")[0]
        self.results.labels(label).inc()
        self.duration.observe(result.elapsed_seconds)


class _RateLimitedLog:
    """At most one line per reason per interval, with how many were left out."""

    def __init__(self, logger: logging.Logger, interval: float) -> None:
        self._log, self._interval = logger, interval
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def __call__(self, level: int, reason: str, msg: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last.get(reason, -self._interval) < self._interval:
            self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
            return
        self._last[reason] = now
        suppressed = self._suppressed.pop(reason, 0)
        self._log.log(level, msg, *args, extra={"fallback_reason": reason, "suppressed": suppressed})


class ContextClient:
    """AssembleContext over long-lived grpclib channels. Use ``async with`` or ``start()``/``close()``.

    ``target`` is ``host:port`` (one channel) or ``dns:///name:port`` (a channel per
    address of ``name``, round robin: point it at a headless Service).
    """

    def __init__(
        self,
        target: str | Target,
        *,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        ssl: ssl_module.SSLContext | None = None,
        endpoints: Endpoints | None = None,
        registry: CollectorRegistry | None = None,
        tracer: trace.Tracer | None = None,
        logger: logging.Logger | None = None,
        refresh_seconds: float = 30.0,
        token: str | None = None,
    ) -> None:
        """``ssl``: TLS (``client.credentials.ClientCredentials.ssl_context``); ``token``:
        the bearer token sent on every call (docs/security.md)."""
        self._auth = bearer_metadata(token)
        self.target = parse_target(target) if isinstance(target, str) else target
        self.timeout = timeout
        if endpoints is not None:
            self._endpoints: Endpoints = endpoints
        elif self.target.round_robin:
            self._endpoints = DnsRoundRobin(
                self.target.host, self.target.port, ssl=ssl, refresh_seconds=refresh_seconds
            )
        else:
            self._endpoints = SingleChannel(self.target.host, self.target.port, ssl=ssl)
        self._metrics = _ClientMetrics(registry) if registry is not None else None
        self._tracer = tracer
        self._log = logger or logging.getLogger("ibex_context.client")
        self._log_limited = _RateLimitedLog(self._log, _LOG_INTERVAL_SECONDS)
        self._started = False

    async def start(self) -> None:
        if not self._started:
            await self._endpoints.start()
            self._started = True

    async def warm_up(self, timeout: float = 1.0) -> bool:  # noqa: ASYNC109, RUF100 - per-connection cap
        """Open the connection(s) now so the first real call does not pay for the handshake."""
        await self.start()
        endpoint = self._endpoints.pick()
        seen: set[int] = set()
        ok = False
        while endpoint is not None and id(endpoint) not in seen:
            seen.add(id(endpoint))
            try:
                await asyncio.wait_for(endpoint.channel.__connect__(), timeout)
                ok = True
            except (OSError, TimeoutError):
                self._endpoints.connect_failed(endpoint)
            endpoint = self._endpoints.pick()
        return ok

    async def close(self) -> None:
        await self._endpoints.close()
        self._started = False

    async def check_health(self, service: str = "", *, timeout: float = 2.0) -> str:  # noqa: ASYNC109, RUF100
        """The gRPC health status of ``service`` ('' = overall) by name, e.g. ``SERVING``.

        Unlike ``assemble`` this raises (``GRPCError``, ``OSError``, ``TimeoutError``):
        a probe that cannot reach the service must say so, not fall back.
        """
        await self.start()
        endpoint = self._endpoints.pick()
        if endpoint is None:
            raise OSError(f"no address for {self.target.host}")
        method = endpoint.unary(HEALTH_CHECK, HealthCheckRequest, HealthCheckResponse)
        reply: HealthCheckResponse = await method(HealthCheckRequest(service=service), timeout=timeout)
        return HealthCheckResponse.ServingStatus.Name(reply.status)

    async def __aenter__(self) -> ContextClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def assemble(
        self,
        *,
        org_id: str,
        agent_id: str,
        model: str,
        messages: Sequence[ChatMessage],
        session_id: str = "",
        request_id: str = "",
        timeout: float | None = None,  # noqa: ASYNC109, RUF100 - becomes the gRPC deadline
    ) -> AssembleResult:
        """The messages to send to the model. Never raises for a runtime failure (see module doc)."""
        started = time.perf_counter()
        original = tuple(messages)
        if self._tracer is None:
            result = await self._assemble(
                org_id, agent_id, model, original, session_id, request_id, timeout, started
            )
        else:
            with self._tracer.start_as_current_span(
                ASSEMBLE_CONTEXT.lstrip("/"),
                kind=SpanKind.CLIENT,
                attributes={
                    "rpc.system": "grpc",
                    "rpc.service": "ibex.context.v1.ContextAssemblyService",
                    "rpc.method": "AssembleContext",
                },
            ) as span:
                result = await self._assemble(
                    org_id, agent_id, model, original, session_id, request_id, timeout, started
                )
                span.set_attribute("ibex.from_service", result.from_service)
                if result.fallback_reason:
                    span.set_attribute("ibex.fallback_reason", result.fallback_reason)
                if not result.from_service:
                    span.set_status(StatusCode.ERROR, result.fallback_reason)
        if self._metrics is not None:
            self._metrics.record(result)
        return result

    async def _assemble(
        self,
        org_id: str,
        agent_id: str,
        model: str,
        original: tuple[ChatMessage, ...],
        session_id: str,
        request_id: str,
        timeout: float | None,  # noqa: ASYNC109, RUF100
        started: float,
    ) -> AssembleResult:
        # The caller's budget covers the whole call: encoding, connecting, waiting.
        deadline = Deadline.from_timeout(self.timeout if timeout is None else timeout)
        try:
            request = pb.AssembleContextRequest(
                org_id=org_id,
                agent_id=agent_id,
                session_id=session_id,
                model=model,
                request_id=request_id,
                messages=[pb.Message(role=m.role, content=m.content) for m in original],
            )
        except (TypeError, ValueError) as exc:
            # e.g. a message whose content is not a string: the caller's bug.
            failure = _Failure(f"{CLIENT_ERROR}:bad_request", detail=type(exc).__name__)
            return self._fallback(original, failure, started, request_id)
        metadata: dict[str, str] = dict(self._auth)
        if request_id:
            metadata["x-request-id"] = request_id
        # The caller's current span (or ours) as W3C traceparent; a no-op without OTel.
        propagate.inject(metadata)
        if not self._started:
            # First use without start(): resolving a DNS name may take long, but not longer
            # than this call's budget.
            try:
                await asyncio.wait_for(self.start(), max(0.0, deadline.time_remaining()))
            except TimeoutError:
                return self._fallback(
                    original, _Failure(CLIENT_TIMEOUT, "timeout", "starting"), started, request_id
                )

        attempts = 2 if self._endpoints.count() > 1 else 1
        failure = _Failure(CLIENT_UNAVAILABLE, "connect", detail="no address")
        for _ in range(attempts):
            endpoint = self._endpoints.pick()
            if endpoint is None:
                break
            try:
                reply = await self._call(endpoint, request, deadline, metadata)
            except Exception as exc:
                failure = classify_failure(exc)
                self._note_failure(endpoint, failure)
                if failure.kind == "connect" and deadline.time_remaining() > _MIN_SECONDS_FOR_RETRY:
                    continue
                break
            self._endpoints.succeeded(endpoint)
            if not reply.messages and original:
                failure = _Failure(f"{CLIENT_ERROR}:empty_response")
                break
            return AssembleResult(
                messages=tuple(ChatMessage(m.role, m.content) for m in reply.messages),
                metadata=reply.metadata,
                fallback_reason=reply.metadata.fallback_reason,
                from_service=True,
                elapsed_seconds=time.perf_counter() - started,
            )
        return self._fallback(original, failure, started, request_id)

    @staticmethod
    async def _call(
        endpoint: Endpoint,
        request: pb.AssembleContextRequest,
        deadline: Deadline,
        metadata: dict[str, str],
    ) -> pb.AssembleContextResponse:
        method = endpoint.unary(ASSEMBLE_CONTEXT, pb.AssembleContextRequest, pb.AssembleContextResponse)
        # One deadline across the retry: the caller's budget is spent once.
        reply: pb.AssembleContextResponse = await method(
            request, timeout=max(0.0, deadline.time_remaining()), metadata=metadata
        )
        return reply

    def _note_failure(self, endpoint: Endpoint, failure: _Failure) -> None:
        if failure.kind == "connect":
            self._endpoints.connect_failed(endpoint)
        elif failure.kind == "timeout":
            self._endpoints.timed_out(endpoint)

    def _fallback(
        self, original: tuple[ChatMessage, ...], failure: _Failure, started: float, request_id: str
    ) -> AssembleResult:
        if failure.reason == CLIENT_INVALID_ARGUMENT or failure.reason.endswith(":bad_request"):
            self._log_limited(
                logging.ERROR,
                failure.reason,
                "context service rejected the request (%s); sending the messages unassembled. "
                "This is a bug in the caller. request_id=%s",
                failure.detail,
                request_id,
            )
        else:
            self._log_limited(
                logging.WARNING,
                failure.reason,
                "context assembly fell back (%s%s); sending the messages unassembled",
                failure.reason,
                f": {failure.detail}" if failure.detail else "",
            )
        return AssembleResult(
            messages=original,
            metadata=None,
            fallback_reason=failure.reason,
            from_service=False,
            elapsed_seconds=time.perf_counter() - started,
        )
