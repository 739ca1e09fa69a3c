"""Clients of ibex-context: ``ContextClient`` for the LLM proxy (never fails the LLM request)
and ``MemoryClient`` for the write side (raises ``MemoryClientError``).

The distribution ``ibex-context-client`` needs grpcio and protobuf only; extras add
OpenTelemetry (``otel``), Prometheus metrics (``prometheus``), the LiteLLM hook
(``litellm``) and the MCP server (``mcp``). It is released with the service, at its version.
"""

from ibex_context_client.context import (
    CLIENT_INVALID_ARGUMENT,
    CLIENT_TIMEOUT,
    CLIENT_UNAVAILABLE,
    DEFAULT_TIMEOUT_SECONDS,
    AssembleResult,
    ContextClient,
)
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
from ibex_context_client.target import Target, parse_target

# The service's version (tests/client/test_distribution.py holds the two together).
__version__ = "0.1.0"

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
