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

import importlib.util
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import grpc

from ibex_context_client.channels import ChannelClient
from ibex_context_client.credentials import ClientCredentials
from ibex_context_client.health import (
    HEALTH_CHECK,
    HealthCheckRequest,
    HealthCheckResponse,
    check_request,
    serving_status,
)
from ibex_context_client.messages import ChatMessage
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb
from ibex_context_client.results import (
    CLIENT_ERROR,
    CLIENT_INVALID_ARGUMENT,
    CLIENT_TIMEOUT,
    CLIENT_UNAVAILABLE,
    AssembleResult,
)
from ibex_context_client.target import Target

if TYPE_CHECKING:
    # Both optional: metrics with the ``prometheus`` extra, tracing with ``otel``.
    from opentelemetry import trace
    from prometheus_client import CollectorRegistry

    from ibex_context_client.metrics import ClientMetrics

# The result's names stay importable from here, where callers found them first.
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
DEFAULT_TIMEOUT_SECONDS = 0.045

_LOG_INTERVAL_SECONDS = 10.0


def _has_otel_api() -> bool:
    """Whether the OpenTelemetry API (the ``otel`` extra) is installed: without it there is no
    trace context to pass on."""
    try:
        return importlib.util.find_spec("opentelemetry.propagate") is not None
    except ModuleNotFoundError:  # not even the ``opentelemetry`` namespace
        return False


_OTEL_API = _has_otel_api()


@dataclass(frozen=True, slots=True)
class _Failure:
    reason: str
    kind: Literal["timeout", "unavailable", "other"] = "other"
    detail: str = ""


def classify_failure(exc: Exception) -> _Failure:
    """Map what grpc.aio raises to a bounded fallback reason. A refused connection, a
    connection lost and a service draining are all UNAVAILABLE; grpcio has already
    retried transparently what never reached the service."""
    if isinstance(exc, grpc.aio.AioRpcError):
        code, details = exc.code(), exc.details() or ""
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return _Failure(CLIENT_TIMEOUT, "timeout")
        if code is grpc.StatusCode.UNAVAILABLE:
            return _Failure(CLIENT_UNAVAILABLE, "unavailable", detail=details)
        # RESOURCE_EXHAUSTED: a request over the service's size limit, refused by gRPC's
        # core (ADR-0010): as much a caller bug as a field the service rejects.
        if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED):
            return _Failure(CLIENT_INVALID_ARGUMENT, detail=details)
        return _Failure(f"{CLIENT_ERROR}:{code.name}", detail=details)
    if isinstance(exc, TimeoutError):
        return _Failure(CLIENT_TIMEOUT, "timeout")
    if isinstance(exc, OSError):  # e.g. a TLS file that cannot be read
        return _Failure(CLIENT_UNAVAILABLE, detail=type(exc).__name__)
    return _Failure(f"{CLIENT_ERROR}:unexpected", detail=type(exc).__name__)


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


class ContextClient(ChannelClient):
    """AssembleContext over a long-lived grpc.aio channel. Use ``async with`` or ``start()``/``close()``.

    ``target`` is ``host:port`` (one connection) or ``dns:///name:port`` (a connection per
    address of ``name``, round robin, re-resolved every ``refresh_seconds``: point it at a
    headless Service).
    """

    def __init__(
        self,
        target: str | Target,
        *,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        credentials: ClientCredentials | None = None,
        registry: CollectorRegistry | None = None,
        tracer: trace.Tracer | None = None,
        logger: logging.Logger | None = None,
        refresh_seconds: float = 30.0,
        token: str | None = None,
    ) -> None:
        """``credentials``: TLS and the bearer token (docs/security.md); ``token``, when
        given, is sent in place of theirs."""
        super().__init__(
            target, timeout=timeout, credentials=credentials, token=token, refresh_seconds=refresh_seconds
        )
        self._metrics: ClientMetrics | None = None
        if registry is not None:
            from ibex_context_client.metrics import ClientMetrics  # the ``prometheus`` extra

            self._metrics = ClientMetrics(registry)
        self._tracer = tracer
        self._log = logger or logging.getLogger("ibex_context_client")
        self._log_limited = _RateLimitedLog(self._log, _LOG_INTERVAL_SECONDS)
        self._started = False

    async def start(self) -> None:
        if not self._started:
            await super().start()
            self._started = True

    async def warm_up(self, timeout: float = 1.0) -> bool:  # noqa: ASYNC109, RUF100 - a cap on connecting
        """Connect now so the first real call does not pay for resolving and the handshake.
        True once connected (to at least one address of a ``dns:`` name)."""
        await self.start()
        return await self._channel.wait_connected(timeout)

    async def close(self) -> None:
        await super().close()
        self._started = False

    async def check_health(self, service: str = "", *, timeout: float = 2.0) -> str:  # noqa: ASYNC109, RUF100
        """The gRPC health status of ``service`` ('' = overall) by name, e.g. ``SERVING``.

        Unlike ``assemble`` this raises (``grpc.aio.AioRpcError``: UNAVAILABLE when nothing
        answers): a probe that cannot reach the service must say so, not fall back.
        """
        await self.start()
        method = self._channel.unary(HEALTH_CHECK, HealthCheckRequest, HealthCheckResponse)
        reply = await method(check_request(service), timeout=timeout, metadata=self._auth)
        return serving_status(reply)

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
            from opentelemetry.trace import SpanKind, StatusCode

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
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
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
        carrier: dict[str, str] = {}
        if request_id:
            carrier["x-request-id"] = request_id
        # The caller's current span (or ours) as W3C traceparent; a no-op without OTel.
        if _OTEL_API:
            from opentelemetry import propagate

            propagate.inject(carrier)
        metadata = (*self._auth, *carrier.items())
        channel = self._channel
        try:
            if not self._started:
                await self.start()
            method = channel.unary(ASSEMBLE_CONTEXT, pb.AssembleContextRequest, pb.AssembleContextResponse)
            reply: pb.AssembleContextResponse = await method(
                request, timeout=max(0.0, deadline - time.monotonic()), metadata=metadata
            )
        except Exception as exc:
            failure = classify_failure(exc)
            if failure.kind == "timeout":
                channel.timed_out()
            elif failure.kind == "unavailable":
                channel.unavailable()
            return self._fallback(original, failure, started, request_id)
        channel.succeeded()
        if not reply.messages and original:
            return self._fallback(original, _Failure(f"{CLIENT_ERROR}:empty_response"), started, request_id)
        return AssembleResult(
            messages=tuple(ChatMessage(m.role, m.content) for m in reply.messages),
            metadata=reply.metadata,
            fallback_reason=reply.metadata.fallback_reason,
            from_service=True,
            elapsed_seconds=time.perf_counter() - started,
        )

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
