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

Watch streams are held open by their callers and cost a task and a probe a second each:
at most ``max_watches`` run at once per process (both ports together); one more is
refused with RESOURCE_EXHAUSTED naming the limit (``IBEX_MAX_HEALTH_WATCHES``).

Served as grpc.aio handlers of our own (``grpc.health.v1.Health``: Check and Watch),
since grpcio-health-checking's servicer knows a fixed status per name, not a store
probe per Check; the messages are that package's ``health_pb2``, which the client
library (``ibex_context_client``) and the tests use too.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import grpc
from grpc_health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

from ibex_context.server.rpc import CallError, Method, unary, unary_stream
from ibex_context.stores.base import HealthProbe, StoreHealth

HEALTH_SERVICE = "grpc.health.v1.Health"
STORES_SERVICE = "ibex.stores"
LIVENESS = "liveness"
# A probe running this long is abandoned (left to finish) and a fresh one started,
# so a probe that never returns cannot pin a store to "timed out" forever.
_ABANDON_PROBE_AFTER_SECONDS = 10.0
# How often a Watch re-evaluates its name (a store probe for the stores' names).
_WATCH_INTERVAL_SECONDS = 1.0

StoreUp = Callable[[str, bool], None]
ServingStatus = Any  # HealthCheckResponse.ServingStatus.ValueType
SERVING: ServingStatus = HealthCheckResponse.SERVING
NOT_SERVING: ServingStatus = HealthCheckResponse.NOT_SERVING


def store_name(probe: HealthProbe) -> str:
    """``PostgresMemoryStore`` -> ``postgres``; ``RedisContextCache`` -> ``redis``;
    ``ReadRouting`` -> ``postgres_replicas``."""
    name = type(probe).__name__.lower()
    if name == "readrouting":
        return "postgres_replicas"
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
        max_watches: int = 100,
    ) -> None:
        self._probes = [_Probe(p) for p in probes]
        self.max_watches = max_watches
        self.watches = 0
        self._check_timeout = check_timeout
        self._store_up = store_up
        self.accepting = True
        self._accepting_changed = asyncio.Event()
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

    @contextlib.contextmanager
    def watch_slot(self) -> Iterator[None]:
        """Holds one of the ``max_watches`` Watch streams for as long as the block runs;
        raises ``CallError`` (RESOURCE_EXHAUSTED) when all are taken."""
        if self.watches >= self.max_watches:
            raise CallError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"health Watch streams: {self.max_watches} are open on this process, the limit "
                "(IBEX_MAX_HEALTH_WATCHES); poll with Check instead",
            )
        self.watches += 1
        try:
            yield
        finally:
            self.watches -= 1

    def set_not_serving(self) -> None:
        self.accepting = False
        self._accepting_changed.set()

    def methods(self, services: Sequence[str]) -> list[Method]:
        """``grpc.health.v1.Health`` (Check, Watch) answering for ``""`` and ``services``
        (SERVING until the drain), ``liveness`` and the stores' names."""
        checks = _Checks(self, services)
        return [
            unary(f"/{HEALTH_SERVICE}/Check", HealthCheckRequest, checks.check),
            unary_stream(f"/{HEALTH_SERVICE}/Watch", HealthCheckRequest, checks.watch),
        ]

    async def wait_for_change(self, accepting_seen: bool, timeout: float) -> None:
        """Returns once ``accepting`` is no longer ``accepting_seen`` (at once if it
        already changed), or after ``timeout`` seconds."""
        if self.accepting != accepting_seen:
            return
        if not self.accepting:  # draining: nothing more will change
            await asyncio.sleep(timeout)
            return
        try:
            async with asyncio.timeout(timeout):
                await self._accepting_changed.wait()
        except TimeoutError:
            pass


class _Checks:
    """What each health name reports: a fresh, bounded store probe on every Check of a
    store's name (no cached answer); Watch re-evaluates every second and on the drain."""

    def __init__(self, health: ServiceHealth, services: Sequence[str]) -> None:
        self._health = health
        self._accepting_names = frozenset(("", *services))
        self._store_names = {STORES_SERVICE: None} | {
            f"{STORES_SERVICE}.{name}": name for name in health.store_names
        }

    def known(self, name: str) -> bool:
        return name in self._accepting_names or name in self._store_names or name == LIVENESS

    async def status(self, name: str) -> ServingStatus:
        if name in self._accepting_names:
            return SERVING if self._health.accepting else NOT_SERVING
        if name in self._store_names:
            store = self._store_names[name]
            ok = await self._health.check_stores()
            up = all(ok.values()) if store is None else ok.get(store, False)
            return SERVING if up else NOT_SERVING
        return SERVING  # liveness: this process answers

    async def check(self, request: HealthCheckRequest, _context: Any) -> HealthCheckResponse:
        if not self.known(request.service):
            raise CallError(grpc.StatusCode.NOT_FOUND, f"unknown service: {request.service[:200]!r}")
        return HealthCheckResponse(status=await self.status(request.service))

    async def watch(self, request: HealthCheckRequest, _context: Any) -> AsyncIterator[HealthCheckResponse]:
        with self._health.watch_slot():
            if not self.known(request.service):
                yield HealthCheckResponse(status=HealthCheckResponse.SERVICE_UNKNOWN)
                await asyncio.Event().wait()  # the name never becomes known: hold until the caller leaves
            last: ServingStatus | None = None
            while True:
                accepting = self._health.accepting
                current = await self.status(request.service)
                if current != last:
                    last = current
                    yield HealthCheckResponse(status=current)
                await self._health.wait_for_change(accepting, _WATCH_INTERVAL_SECONDS)
