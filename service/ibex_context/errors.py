"""Exceptions of ibex-context.

IbexError
├── InvalidRequest            bad input; becomes gRPC INVALID_ARGUMENT naming the field
├── LimitExceeded             a tenant limit reached; becomes RESOURCE_EXHAUSTED naming the limit
├── ConfigurationError        bad settings or profiles, found at start-up or reload
├── StoreError                Redis or PostgreSQL failed
│   ├── StoreUnavailable      the store cannot be reached at all
│   └── CacheError            Redis failed (the callers degrade around it: it is no truth)
└── EmbeddingError            the embedder failed

An oversized request never becomes an exception here: gRPC's core refuses it from its
length prefix, before its body is read, with RESOURCE_EXHAUSTED (server/grpc_server.py).
"""

from __future__ import annotations


class IbexError(Exception):
    """Base of every error raised by ibex-context."""


class InvalidRequest(IbexError):
    """A request field is invalid. ``field`` is its path, e.g. ``messages[3].role``."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class LimitExceeded(IbexError):
    """A request or its org is past one of the service's limits. ``limit`` names it (the
    setting, e.g. ``max_org_memories``): the status message, the metrics' label."""

    def __init__(self, limit: str, problem: str) -> None:
        super().__init__(f"{limit}: {problem}")
        self.limit = limit
        self.problem = problem


class ConfigurationError(IbexError):
    """Settings or profiles are invalid."""


class StoreError(IbexError):
    """A store operation failed."""


class StoreUnavailable(StoreError):
    """A store could not be reached."""


class CacheError(StoreError):
    """Redis failed. ``driver_error`` names the driver's exception class: what logs and
    status messages say (``failure_name``), as they did before the adapter mapped it."""

    def __init__(self, driver_error: str) -> None:
        super().__init__(f"redis: {driver_error}")
        self.driver_error = driver_error


def failure_name(exc: BaseException) -> str:
    """The failure's name for a log line: the driver's error class for a cache error."""
    return exc.driver_error if isinstance(exc, CacheError) else type(exc).__name__


class EmbeddingError(IbexError):
    """The embedder failed or returned a vector of the wrong shape."""


class QueryExpired(EmbeddingError):
    """A query waited longer than its callers do and was not computed."""
