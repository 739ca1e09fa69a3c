"""gRPC health: SERVING only while Redis and PostgreSQL answer and the server is
not shutting down. A separate ``liveness`` service answers SERVING while the
process does, so a store outage makes pods unready but never restarts them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from grpclib.health.check import ServiceCheck, ServiceStatus
from grpclib.health.service import OVERALL, Health

from ibex_context.stores.base import HealthProbe


class _NamedService:
    """A health-check key for a name that is not a real service (e.g. "liveness")."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __mapping__(self) -> dict[str, Any]:
        return {f"/{self._name}/Check": None}


class ServiceHealth:
    def __init__(
        self, probes: Sequence[HealthProbe], *, check_ttl: float = 1.0, check_timeout: float = 0.5
    ) -> None:
        self._probes = list(probes)
        self.accepting = ServiceStatus()
        self.accepting.set(True)
        self.stores = ServiceCheck(self._stores_ok, check_ttl=check_ttl, check_timeout=check_timeout)
        self.last_details: dict[str, str] = {}

    async def stores_ok(self) -> bool:
        return await self._stores_ok()

    async def _stores_ok(self) -> bool:
        results = await asyncio.gather(*(p.check_health() for p in self._probes), return_exceptions=True)
        ok = True
        details: dict[str, str] = {}
        for probe, result in zip(self._probes, results, strict=True):
            name = type(probe).__name__
            if isinstance(result, BaseException):
                ok, details[name] = False, type(result).__name__
            else:
                ok = ok and result.ok
                details[name] = "ok" if result.ok else (result.detail or "failing")
        self.last_details = details
        return ok

    def service(self, services: Sequence[object]) -> Health:
        checks: dict[Any, list[Any]] = {svc: [self.accepting, self.stores] for svc in services}
        checks[OVERALL] = [self.accepting, self.stores]
        checks[_NamedService("liveness")] = []
        return Health(checks)

    def set_not_serving(self) -> None:
        self.accepting.set(False)


StoresCheck = Callable[[], Awaitable[bool]]
