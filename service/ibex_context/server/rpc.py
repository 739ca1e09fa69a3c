"""The service's methods as grpc.aio handlers: parsing, error statuses and observation.

Each method is a coroutine ``(request, context) -> response`` (or an async iterator of
responses for a server stream). The wrapper here, one per method, does what every
method needs and none should repeat:

* parses the request itself (the handler is registered without a deserializer): a
  message that is not valid protobuf is INVALID_ARGUMENT, not grpc.aio's UNKNOWN;
* maps ``CallError`` to its status with ``set_code``/``set_details`` (cheaper than
  ``context.abort``, which raises through grpc.aio's own handling), and anything else
  a handler raises to UNKNOWN, logged;
* observes the call (``observability.calls.CallObserver``: metrics, spans, access log),
  including calls cut by their deadline or their caller (the task is cancelled);
* for the services' own methods, asks the ``Guard`` (``server/guard.py``) whether the
  caller may make the call: its credential and role before the body is parsed (an
  unauthenticated caller's body costs no parsing), its org after parsing (the org check
  needs the request's org_id) and before the handler: a refused call reads and writes
  nothing. Health and reflection are not guarded (probes and tools reach them without
  credentials).

A handler may return already-serialized bytes (AssembleContext times its own
serialization for the report); anything else is serialized here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message

from ibex_context.observability.calls import CallObserver, CallState, interrupted_status

log = logging.getLogger(__name__)

__all__ = [
    "CallError",
    "Guard",
    "Method",
    "generic_handlers",
    "service_methods",
    "stream_stream",
    "unary",
    "unary_stream",
]


class CallError(Exception):
    """Ends a call with ``code`` and ``message`` (the message reaches the caller)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class MessageType(Protocol):
    @classmethod
    def FromString(cls, data: bytes) -> Any: ...


class Context(Protocol):
    """What the service uses of ``grpc.aio.ServicerContext``."""

    def invocation_metadata(self) -> Sequence[tuple[str, str | bytes]] | None: ...
    def time_remaining(self) -> float | None: ...
    def set_code(self, code: grpc.StatusCode) -> None: ...
    def set_details(self, details: str) -> None: ...
    def peer_identities(self) -> Sequence[bytes] | None: ...


class Guard(Protocol):
    """Decides whether the caller may make a call (``server/guard.py``)."""

    def guards(self, path: str) -> bool: ...
    def admit(self, path: str, context: Context) -> Any:
        """The caller if its credential may call ``path`` (from the metadata alone, before
        the body is parsed); raises ``CallError`` if not."""
        ...

    def check_org(self, path: str, principal: Any, request: Any) -> None:
        """Returns if the admitted caller may make this call; raises ``CallError`` if not."""
        ...


UnaryBehaviour = Callable[[Any, Context], Awaitable[Any]]
UnaryStreamBehaviour = Callable[[Any, Context], AsyncIterator[Any]]
StreamStreamBehaviour = Callable[[AsyncIterator[Any], Context], AsyncIterator[Any]]

INVALID_MESSAGE = "request: not a valid protobuf message"


@dataclass(frozen=True)
class Method:
    """One served method: its full path (``/package.Service/Method``) and its grpc.aio handler."""

    path: str
    build: Callable[[CallObserver | None, Guard | None], grpc.RpcMethodHandler[Any, Any]]

    @property
    def service(self) -> str:
        return self.path.split("/")[1]

    @property
    def name(self) -> str:
        return self.path.split("/")[2]


def _serialize(message: Message | bytes) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()


def _parse(request_type: MessageType, data: bytes) -> Any:
    try:
        return request_type.FromString(data)
    except DecodeError:
        raise CallError(grpc.StatusCode.INVALID_ARGUMENT, INVALID_MESSAGE) from None


def _fail(context: Context, path: str, exc: Exception) -> grpc.StatusCode:
    """Sets the call's status for what its handler raised; returns it."""
    if isinstance(exc, CallError):
        context.set_code(exc.code)
        context.set_details(exc.message)
        return exc.code
    log.error("%s failed", path, exc_info=exc)
    context.set_code(grpc.StatusCode.UNKNOWN)
    context.set_details(f"{path.rsplit('/', 1)[-1]} failed: {type(exc).__name__}")
    return grpc.StatusCode.UNKNOWN


def unary(path: str, request_type: MessageType, behaviour: UnaryBehaviour) -> Method:
    def build(observer: CallObserver | None, guard: Guard | None) -> grpc.RpcMethodHandler[Any, Any]:
        checked = guard if guard is not None and guard.guards(path) else None

        async def serve(data: bytes, context: Context) -> Any:
            state = _begin(observer, path, context)
            status = grpc.StatusCode.OK
            try:
                if checked is not None:
                    principal = checked.admit(path, context)
                    request = _parse(request_type, data)
                    checked.check_org(path, principal, request)
                else:
                    request = _parse(request_type, data)
                return await behaviour(request, context)
            except asyncio.CancelledError:
                status = interrupted_status(state)
                raise
            except Exception as exc:
                status = _fail(context, path, exc)
                return None
            finally:
                if observer is not None:
                    observer.end(state, status)

        return grpc.unary_unary_rpc_method_handler(serve, response_serializer=_serialize)

    return Method(path, build)


def unary_stream(path: str, request_type: MessageType, behaviour: UnaryStreamBehaviour) -> Method:
    """A server-streaming method (health's Watch): never guarded."""

    def build(observer: CallObserver | None, _guard: Guard | None) -> grpc.RpcMethodHandler[Any, Any]:
        async def serve(data: bytes, context: Context) -> AsyncIterator[Any]:
            def responses() -> AsyncIterator[Any]:
                return behaviour(_parse(request_type, data), context)

            async with contextlib.aclosing(_observed(observer, path, context, responses)) as observed:
                async for response in observed:
                    yield response

        return grpc.unary_stream_rpc_method_handler(serve, response_serializer=_serialize)

    return Method(path, build)


def stream_stream(path: str, request_type: MessageType, behaviour: StreamStreamBehaviour) -> Method:
    """A bidirectional method (reflection): never guarded."""

    def build(observer: CallObserver | None, _guard: Guard | None) -> grpc.RpcMethodHandler[Any, Any]:
        async def serve(requests: AsyncIterator[bytes], context: Context) -> AsyncIterator[Any]:
            async def parsed() -> AsyncIterator[Any]:
                async for data in requests:
                    yield _parse(request_type, data)

            def responses() -> AsyncIterator[Any]:
                return behaviour(parsed(), context)

            async with contextlib.aclosing(_observed(observer, path, context, responses)) as observed:
                async for response in observed:
                    yield response

        return grpc.stream_stream_rpc_method_handler(serve, response_serializer=_serialize)

    return Method(path, build)


def _begin(observer: CallObserver | None, path: str, context: Context) -> CallState | None:
    """The observer's state for a call that starts now (None: not observed)."""
    if observer is None:
        return None
    return observer.begin(path, context.invocation_metadata() or (), context.time_remaining())


async def _observed(
    observer: CallObserver | None,
    path: str,
    context: Context,
    responses: Callable[[], AsyncIterator[Any]],
) -> AsyncGenerator[Any, None]:
    """A streaming call's responses, observed from its start to how it ended: one body
    for the unary-stream and stream-stream methods (``responses`` is called inside, so a
    request that does not parse ends the call like any other failure)."""
    state = _begin(observer, path, context)
    status = grpc.StatusCode.OK
    try:
        async for response in responses():
            yield response
    except (asyncio.CancelledError, GeneratorExit):
        status = interrupted_status(state)
        raise
    except Exception as exc:
        status = _fail(context, path, exc)
    finally:
        if observer is not None:
            observer.end(state, status)


def service_methods(service: ServiceDescriptor, messages: ModuleType, implementation: object) -> list[Method]:
    """The unary methods of ``service`` (from its proto descriptor), each served by the
    same-named coroutine of ``implementation``; request classes from ``messages``."""
    methods = []
    for method in service.methods:
        if method.client_streaming or method.server_streaming:
            raise TypeError(f"{method.full_name}: only unary methods are served this way")
        path = f"/{service.full_name}/{method.name}"
        methods.append(
            unary(path, getattr(messages, method.input_type.name), getattr(implementation, method.name))
        )
    return methods


def generic_handlers(
    methods: Sequence[Method], observer: CallObserver | None, guard: Guard | None = None
) -> list[grpc.GenericRpcHandler]:
    """One generic handler per service, every method wrapped for ``observer`` and, where
    ``guard`` guards it, checked by ``guard`` (None: every caller may call everything)."""
    by_service: dict[str, dict[str, grpc.RpcMethodHandler[Any, Any]]] = {}
    for method in methods:
        by_service.setdefault(method.service, {})[method.name] = method.build(observer, guard)
    return [grpc.method_handlers_generic_handler(service, table) for service, table in by_service.items()]


def service_names(methods: Sequence[Method]) -> list[str]:
    """The services of ``methods``, in order, each once."""
    return list(dict.fromkeys(method.service for method in methods))
