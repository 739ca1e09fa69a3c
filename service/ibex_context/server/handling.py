"""What every MemoryService method does around its own work, written once: it counts
itself in flight (graceful shutdown waits for it), maps our exceptions to gRPC
statuses under its name, and validates the tenant it is scoped to before the work
runs. The methods themselves (``server/memory_service.py``) are left with what
differs: their own fields, the store call, the response."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import grpc

from ibex_context.errors import InvalidRequest, LimitExceeded, StoreError
from ibex_context.server import validation
from ibex_context.server.lifecycle import InflightCalls
from ibex_context.server.rpc import CallError, Context

# The logger the memory methods have always logged under (log queries name it).
log = logging.getLogger("ibex_context.server.handlers")


class Tracked(Protocol):
    """A handler whose calls count in flight and whose limits' refusals are counted."""

    _inflight: InflightCalls
    _limit_refused: Callable[[str], None]


class AgentScoped(Protocol):
    """A request scoped to one agent of one org."""

    @property
    def org_id(self) -> str: ...
    @property
    def agent_id(self) -> str: ...


HandlerT = TypeVar("HandlerT", bound=Tracked)
RequestT = TypeVar("RequestT")
AgentRequestT = TypeVar("AgentRequestT", bound=AgentScoped)
ResponseT = TypeVar("ResponseT")

Method = Callable[[HandlerT, RequestT, Context], Awaitable[ResponseT]]


def handled(
    body: Callable[[HandlerT, RequestT], Awaitable[ResponseT]],
) -> Method[HandlerT, RequestT, ResponseT]:
    """The gRPC method that runs ``body``, counted in flight, with our errors mapped
    to statuses under the method's (``body``'s) name."""
    name = body.__name__

    @functools.wraps(body)
    async def method(self: HandlerT, message: RequestT, _context: Context) -> ResponseT:
        with self._inflight.track(), errors_to_status(name, self._limit_refused):
            return await body(self, message)

    return method


def agent_scoped(
    body: Callable[[HandlerT, AgentRequestT, str, str], Awaitable[ResponseT]],
) -> Method[HandlerT, AgentRequestT, ResponseT]:
    """``handled``, and ``body`` runs with the request's org and agent ids validated
    (INVALID_ARGUMENT naming the field before any other of the request's fields)."""

    @functools.wraps(body)
    async def scoped(self: HandlerT, message: AgentRequestT) -> ResponseT:
        org_id, agent_id = validation.scope(message.org_id, message.agent_id)
        return await body(self, message, org_id, agent_id)

    return handled(scoped)


class errors_to_status:
    """Maps our exceptions to gRPC statuses for the memory methods."""

    def __init__(self, method: str, limit_refused: Callable[[str], None] = lambda _limit: None) -> None:
        self._method = method
        self._limit_refused = limit_refused

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, InvalidRequest):
            raise CallError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        if isinstance(exc, LimitExceeded):
            self._limit_refused(exc.limit)
            raise CallError(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)) from None
        if isinstance(exc, StoreError):
            log.warning("%s failed: %s", self._method, type(exc).__name__)
            raise CallError(grpc.StatusCode.UNAVAILABLE, f"store unavailable: {type(exc).__name__}") from None
        if isinstance(exc, Exception) and not isinstance(exc, CallError):
            log.error("%s failed", self._method, exc_info=exc)
            raise CallError(
                grpc.StatusCode.INTERNAL, f"{self._method} failed: {type(exc).__name__}"
            ) from None
