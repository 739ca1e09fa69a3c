"""Clients of ibex-context: ``ContextClient`` for the LLM proxy (never fails the LLM request)
and ``MemoryClient`` for the write side (raises ``MemoryClientError``)."""

from ibex_context.client.context import (
    CLIENT_INVALID_ARGUMENT,
    CLIENT_TIMEOUT,
    CLIENT_UNAVAILABLE,
    DEFAULT_TIMEOUT_SECONDS,
    AssembleResult,
    ContextClient,
)
from ibex_context.client.credentials import ClientCredentials
from ibex_context.client.memory import (
    FeedbackKind,
    MemoryClient,
    MemoryClientError,
    MemoryRequestInvalid,
    ScoreUpdate,
    UpsertResult,
)
from ibex_context.client.target import Target, parse_target

__all__ = [
    "CLIENT_INVALID_ARGUMENT",
    "CLIENT_TIMEOUT",
    "CLIENT_UNAVAILABLE",
    "DEFAULT_TIMEOUT_SECONDS",
    "AssembleResult",
    "ClientCredentials",
    "ContextClient",
    "FeedbackKind",
    "MemoryClient",
    "MemoryClientError",
    "MemoryRequestInvalid",
    "ScoreUpdate",
    "Target",
    "UpsertResult",
    "parse_target",
]
