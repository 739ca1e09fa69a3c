"""Clients of ibex-context: ``ContextClient`` for the LLM proxy (never fails the LLM request)
and ``MemoryClient`` for the write side (raises ``MemoryClientError``).

The distribution ``ibex-context-client`` needs grpcio and protobuf only; extras add
OpenTelemetry (``otel``), Prometheus metrics (``prometheus``), the LiteLLM hook
(``litellm``) and the MCP server (``mcp``). It is released with the service, at its version.

The names below are imported on first use: importing the generated messages alone
(``ibex_context_client.proto...``, as the gevent-based load generator does) loads neither the
clients nor asyncio.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ibex_context_client.context import DEFAULT_TIMEOUT_SECONDS, ContextClient
    from ibex_context_client.credentials import ClientCredentials
    from ibex_context_client.errors import ClientError
    from ibex_context_client.memory import (
        FeedbackKind,
        MemoryClient,
        MemoryClientError,
        MemoryRequestInvalid,
        ScoreUpdate,
        UpsertResult,
    )
    from ibex_context_client.messages import Category, ChatMessage, NewMemory
    from ibex_context_client.results import (
        CLIENT_INVALID_ARGUMENT,
        CLIENT_TIMEOUT,
        CLIENT_UNAVAILABLE,
        AssembleResult,
    )
    from ibex_context_client.target import Target, parse_target

# The service's version (tests/client/test_distribution.py holds the two together).
__version__ = "0.1.0"

_MODULES = {
    "context": ("DEFAULT_TIMEOUT_SECONDS", "ContextClient"),
    "credentials": ("ClientCredentials",),
    "errors": ("ClientError",),
    "memory": (
        "FeedbackKind",
        "MemoryClient",
        "MemoryClientError",
        "MemoryRequestInvalid",
        "ScoreUpdate",
        "UpsertResult",
    ),
    "messages": ("Category", "ChatMessage", "NewMemory"),
    "results": ("CLIENT_INVALID_ARGUMENT", "CLIENT_TIMEOUT", "CLIENT_UNAVAILABLE", "AssembleResult"),
    "target": ("Target", "parse_target"),
}
_MODULE_OF = {name: module for module, names in _MODULES.items() for name in names}

__all__ = [
    "CLIENT_INVALID_ARGUMENT",
    "CLIENT_TIMEOUT",
    "CLIENT_UNAVAILABLE",
    "DEFAULT_TIMEOUT_SECONDS",
    "AssembleResult",
    "Category",
    "ChatMessage",
    "ClientCredentials",
    "ClientError",
    "ContextClient",
    "FeedbackKind",
    "MemoryClient",
    "MemoryClientError",
    "MemoryRequestInvalid",
    "NewMemory",
    "ScoreUpdate",
    "Target",
    "UpsertResult",
    "parse_target",
]


def __getattr__(name: str) -> object:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # once: later lookups find it without this hook
    return value
