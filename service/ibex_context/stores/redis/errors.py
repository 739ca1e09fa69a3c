"""How the driver's errors leave the Redis adapter: as ``errors.CacheError``, named by
the driver's class, chained to it. Cancellation passes through untouched."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Concatenate, ParamSpec, TypeVar

from redis.exceptions import RedisError

from ibex_context.errors import CacheError

# What redis-py and the adapter's own clients raise when Redis fails (OSError covers
# the sockets' errors and TimeoutError).
DRIVER_ERRORS: tuple[type[Exception], ...] = (RedisError, OSError)

_Self = TypeVar("_Self")
_P = ParamSpec("_P")
_R = TypeVar("_R")


def cache_error(exc: Exception) -> CacheError:
    """``exc`` as the adapter's error (a CacheError already is one)."""
    if isinstance(exc, CacheError):
        return exc
    error = CacheError(type(exc).__name__)
    error.__cause__ = exc
    return error


def cache_errors(
    method: Callable[Concatenate[_Self, _P], Awaitable[_R]],
) -> Callable[Concatenate[_Self, _P], Awaitable[_R]]:
    """Turns the driver's errors raised by ``method`` into CacheError."""

    @functools.wraps(method)
    async def wrapper(self: _Self, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return await method(self, *args, **kwargs)
        except DRIVER_ERRORS as exc:
            raise cache_error(exc) from exc

    return wrapper
