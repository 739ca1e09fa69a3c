"""gRPC health: readiness means "this process can answer"; store health has names of
its own (ADR-0007, "Readiness").

* ``""`` (overall) and each served service: SERVING while the server accepts calls,
  NOT_SERVING once it drains. A store outage does not change them: calls are still
  answered, degraded (every replica leaving the Service at once over a shared Redis
  outage left the proxy with nothing).
* ``liveness``: SERVING while the process answers at all.
* ``ibex.stores`` (every store), ``ibex.stores.redis``, ``ibex.stores.postgres``:
  SERVING while that store answers a probe within ``check_timeout``.

Store probes are bounded without relying on cancellation (a stopped PostgreSQL holds
a cancelled asyncpg call for seconds): each store has at most one probe running, a
check waits for it at most ``check_timeout`` and then reports it as timed out, and a
later check joins the probe still running instead of starting another. No result is
cached: the first check after a store stops says so.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from grpclib.health.check import CheckBase, ServiceStatus
from grpclib.health.service import OVERALL, Health

from ibex_context.stores.base import HealthProbe, StoreHealth

STORES_SERVICE = "ibex.stores"
# A probe running this long is abandoned (left to finish) and a fresh one started,
# so a probe that never returns cannot pin a store to "timed out" forever.
_ABANDON_PROBE_AFTER_SECONDS = 10.0
# How often a Watch on a store's health name re-probes.
_WATCH_INTERVAL_SECONDS = 1.0

StoreUp = Callable[[str, bool], None]


class _NamedService:
    """A health-check key for a name that is not a real service (e.g. "liveness")."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __mapping__(self) -> dict[str, Any]:
        return {f"/{self._name}/Check": None}


def store_name(probe: HealthProbe) -> str:
    """``PostgresMemoryStore`` -> ``postgres``; ``RedisContextCache`` -> ``redis``."""
    name = type(probe).__name__.lower()
    for known in ("postgres", "redis"):
        if known in name:
            return known
    return name


class _Probe:
    """One store's probe: at most one running, waited for at most ``timeout``."""

    def __init__(self, probe: HealthProbe) -> None:
        self.name = store_name(probe)
        self._probe = probe
        self._running: asyncio.Task[StoreHealth] | None = None
        self._started = 0.0
        self._abandoned: set[asyncio.Task[StoreHealth]] = set()

    def start(self) -> asyncio.Task[StoreHealth]:
        running = self._running
        if running is not None and not running.done():
            if time.monotonic() - self._started < _ABANDON_PROBE_AFTER_SECONDS:
                return running
            self._abandoned.add(running)
            running.add_done_callback(self._forget)
        self._started = time.monotonic()
        self._running = asyncio.get_running_loop().create_task(
            self._probe.check_health(), name=f"ibex-health-{self.name}"
        )
        self._running.add_done_callback(_retrieve)
        return self._running

    def _forget(self, task: asyncio.Task[StoreHealth]) -> None:
        self._abandoned.discard(task)


def _retrieve(task: asyncio.Task[StoreHealth]) -> None:
    # A probe that failed after its check stopped waiting: no "exception was never
    # retrieved" warning (the next check reports the store).
    if not task.cancelled():
        task.exception()


class ServiceHealth:
    def __init__(
        self,
        probes: Sequence[HealthProbe],
        *,
        check_timeout: float = 0.5,
        store_up: StoreUp | None = None,
    ) -> None:
        self._probes = [_Probe(p) for p in probes]
        self._check_timeout = check_timeout
        self._store_up = store_up
        self.accepting = ServiceStatus()
        self.accepting.set(True)
        self.last_details: dict[str, str] = {}

    @property
    def store_names(self) -> list[str]:
        return [p.name for p in self._probes]

    async def check_stores(self) -> dict[str, bool]:
        """Probe every store (or join its running probe); answers within ``check_timeout``."""
        if not self._probes:
            return {}
        tasks = {p.name: p.start() for p in self._probes}
        await asyncio.wait(tasks.values(), timeout=self._check_timeout)
        ok: dict[str, bool] = {}
        for name, task in tasks.items():
            if not task.done():
                ok[name], self.last_details[name] = False, "timed out"
            elif task.cancelled() or task.exception() is not None:
                error = task.exception() if not task.cancelled() else None
                ok[name], self.last_details[name] = False, type(error).__name__ if error else "cancelled"
            else:
                result = task.result()
                ok[name] = result.ok
                self.last_details[name] = "ok" if result.ok else (result.detail or "failing")
            if self._store_up is not None:
                self._store_up(name, ok[name])
        return ok

    async def stores_ok(self) -> bool:
        return all((await self.check_stores()).values())

    def service(self, services: Sequence[object]) -> Health:
        checks: dict[Any, list[CheckBase]] = {svc: [self.accepting] for svc in services}
        checks[OVERALL] = [self.accepting]
        checks[_NamedService("liveness")] = []
        checks[_NamedService(STORES_SERVICE)] = [_StoresCheck(self, None)]
        for name in self.store_names:
            checks[_NamedService(f"{STORES_SERVICE}.{name}")] = [_StoresCheck(self, name)]
        return Health(checks)

    def set_not_serving(self) -> None:
        self.accepting.set(False)


class _StoresCheck(CheckBase):
    """A fresh, bounded store probe on every Check (no cached answer); Watch re-probes
    every second."""

    def __init__(self, health: ServiceHealth, store: str | None) -> None:
        self._health = health
        self._store = store
        self._value: bool | None = None
        self._events: set[asyncio.Event] = set()
        self._poll_task: asyncio.Task[None] | None = None

    def __status__(self) -> bool | None:
        return self._value

    async def __check__(self) -> bool | None:
        ok = await self._health.check_stores()
        value = all(ok.values()) if self._store is None else ok.get(self._store, False)
        if value != self._value:
            self._value = value
            for event in self._events:
                event.set()
        return value

    async def _poll(self) -> None:
        while True:
            await self.__check__()
            await asyncio.sleep(_WATCH_INTERVAL_SECONDS)

    async def __subscribe__(self) -> asyncio.Event:
        if self._poll_task is None:
            self._poll_task = asyncio.get_running_loop().create_task(self._poll())
        event = asyncio.Event()
        self._events.add(event)
        return event

    async def __unsubscribe__(self, event: asyncio.Event) -> None:
        self._events.discard(event)
        if not self._events and self._poll_task is not None:
            task, self._poll_task = self._poll_task, None
            task.cancel()
