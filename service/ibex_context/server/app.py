"""Composition root: builds every component from the Settings, serves, shuts down.

The only place that knows concrete classes; everything else receives its
dependencies through its constructor.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from ibex_context.embedding.base import Embedder
from ibex_context.embedding.cache import CachedEmbedder
from ibex_context.embedding.factory import build_embedder
from ibex_context.embedding.minilm import MiniLMEmbedder
from ibex_context.errors import ConfigurationError, StoreError, failure_name
from ibex_context.memory_api.purge import TenantPurge
from ibex_context.memory_api.reads import MemoryReadApi, hybrid_search
from ibex_context.memory_api.throttle import RowRateLimit
from ibex_context.memory_api.writes import STORED_ENCODINGS, MemoryWriteApi
from ibex_context.models import AssemblyRequest, ChatMessage
from ibex_context.observability.calls import CallObserver
from ibex_context.observability.exposition import HealthStatus, start_metrics_server
from ibex_context.observability.metrics import Metrics
from ibex_context.observability.state import CurrentCallObserver
from ibex_context.observability.tracing import Tracing
from ibex_context.pipeline.assembler import Assembler, AssemblerConfig
from ibex_context.pipeline.deadlines import DeadlinePolicy
from ibex_context.pipeline.post_response import InjectionQueue, QueueHooks
from ibex_context.pipeline.retrieval import Retriever, StandIn
from ibex_context.profiles.model import DEFAULT_PROFILE
from ibex_context.profiles.registry import ProfileStore
from ibex_context.profiles.watcher import ProfileWatcher, ReloadOutcome
from ibex_context.server.admission import FairAdmission
from ibex_context.server.assembly_service import ContextAssemblyHandler
from ibex_context.server.cpu import CpuMeter, available_cpus
from ibex_context.server.grpc_server import ConnectionPolicy, ServiceServer
from ibex_context.server.guard import CallGuard, CredentialsFile
from ibex_context.server.health import ServiceHealth
from ibex_context.server.heap import GcPauses, freeze_startup_heap
from ibex_context.server.lifecycle import InflightCalls, stop_signal
from ibex_context.server.loop_lag import LoopLagProbe
from ibex_context.server.memory_service import MemoryServiceHandler
from ibex_context.server.reflection import reflection_methods
from ibex_context.server.rpc import service_names
from ibex_context.server.tls import ServerTls, TlsFiles
from ibex_context.server.validation import Limits
from ibex_context.settings import Settings
from ibex_context.stores.postgres import PostgresMemoryStore, postgres_tls, unverified_tls_warning
from ibex_context.stores.postgres.migrate import check_database
from ibex_context.stores.postgres.read_routing import build_read_routing
from ibex_context.stores.postgres.tenant_data import TenantData
from ibex_context.stores.redis import RedisContextCache, RedisTopology, WriteMarks
from ibex_context.stores.repository import ContextRepository
from ibex_context.tokens.counting import MessageTokenCounter
from ibex_context.tokens.encodings import EncodingRegistry

log = logging.getLogger(__name__)

# No call started for this long: the clients have stopped sending to this replica.
_QUIET_SECONDS = 0.2
# ... unless calls kept arriving after the drain began: clients are still sending on
# their open connections (a loaded client can leave gaps longer than the short quiet),
# and stopping sends them a GOAWAY that cuts the calls already on the way.
_QUIET_WHILE_CLIENTS_SEND_SECONDS = 1.0


@dataclass
class ContextService:
    """A running (or ready to run) ibex-context server."""

    settings: Settings
    embedder: Embedder | None = None
    # Built (and its encodings preloaded) from settings when not given; several
    # services in one process can share one: it is read-only once loaded.
    encodings: EncodingRegistry | None = None
    metrics_registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    tracing: Tracing | None = None

    server: ServiceServer = field(init=False)
    health: ServiceHealth = field(init=False)
    inflight: InflightCalls = field(init=False)
    assembly_handler: ContextAssemblyHandler = field(init=False)
    profiles: ProfileStore = field(init=False)
    metrics: Metrics = field(init=False)
    port: int = field(init=False, default=0)
    health_port: int | None = field(init=False, default=None)
    health_server: ServiceServer | None = field(init=False, default=None)
    metrics_port: int = field(init=False, default=0)
    metrics_host: str = field(init=False, default="")
    _closers: list[Callable[[], object]] = field(init=False, default_factory=list)
    watcher: ProfileWatcher | None = field(init=False, default=None)
    credentials: CredentialsFile | None = field(init=False, default=None)
    tls: ServerTls | None = field(init=False, default=None)
    _injections: InjectionQueue = field(init=False)
    _stopping: bool = field(init=False, default=False)
    _gc_pauses: GcPauses | None = field(init=False, default=None)

    async def start(self) -> None:
        """Opens everything and serves; on a failure, closes what it had opened and raises."""
        try:
            await self._start()
        except BaseException:
            await self._abandon_start()
            raise

    async def _abandon_start(self) -> None:
        """Closes what a failed start had opened (nothing was served: no drain)."""
        for server in (self.health_server, getattr(self, "server", None)):
            if server is not None:
                await server.stop(0)
        if self.watcher is not None:
            await self.watcher.stop()
        injections: InjectionQueue | None = getattr(self, "_injections", None)
        if injections is not None:
            await injections.drain(timeout=0.5)
        await self._close_opened()

    async def _start(self) -> None:
        s = self.settings
        # Refused before anything is opened: a misconfigured security setting must not serve.
        self.tls = _server_tls(s)
        self.metrics = Metrics(self.metrics_registry)
        self.credentials = _credentials_file(s, self.metrics.credentials_loaded.set)
        for dsn in (s.postgres_dsn, *s.postgres_read_dsns):
            if (warning := unverified_tls_warning(dsn, s.postgres_ca_file)) is not None:
                log.warning("%s", warning)
        # As are Redis settings that cannot work (Sentinel without a master name, ...), before
        # the embedder and PostgreSQL take their seconds.
        RedisTopology.from_settings(s)
        self._gc_pauses = GcPauses(self.metrics.record_gc_pause)
        self._gc_pauses.install()
        self._closers.append(self._gc_pauses.uninstall)
        loop_lag = LoopLagProbe(self.metrics.record_loop_lag, self.metrics.record_longest_iteration)
        loop_lag.start()
        self._closers.append(loop_lag.stop)
        tracing = self.tracing or Tracing.from_settings(s)
        self.tracing = tracing

        encodings = self.encodings or EncodingRegistry(cache_dir=s.tiktoken_cache_dir)
        self.encodings = encodings
        # First loads take hundreds of milliseconds: never on a request.
        await asyncio.to_thread(encodings.preload, [*STORED_ENCODINGS])

        # In a thread: a first start of the minilm embedder builds its graph (seconds).
        embedder = self.embedder
        if embedder is None:
            embedder = await asyncio.to_thread(build_embedder, s, observe=self.metrics.record_embedding_turn)
        if embedder.dim != s.embedding_dim:
            raise ConfigurationError(
                f"embedding_dim: embedder {embedder.name} produces {embedder.dim} dimensions, "
                f"IBEX_EMBEDDING_DIM is {s.embedding_dim}"
            )
        self._closers.append(embedder.aclose)
        await check_database(s.postgres_dsn, s.embedding_dim, tls=postgres_tls(s.postgres_ca_file))
        query_embedder = CachedEmbedder(
            embedder, max_entries=s.embedding_cache_size, query_max_tokens=s.embedding_query_max_tokens
        )
        self.metrics.track_query_embedding_cache(query_embedder.counts)

        postgres = await PostgresMemoryStore.from_settings(
            s, observe_graph_build=self.metrics.record_graph_build
        )
        self._closers.append(postgres.aclose)
        self.metrics.track_graph_builds_queued(lambda: postgres.graph_builds_queued)
        try:
            # Agents that grew past the exact scan's limit without a graph of their own get
            # it now, not at their next write (the builds run in the background).
            queued = await postgres.queue_grown()
        except StoreError as exc:
            queued = 0
            log.warning("finding agents without their own graph failed: %s", failure_name(exc))
        if queued:
            log.info("queued the graph builds of %d agents past the exact scan's limit", queued)
        redis = RedisContextCache.from_settings(s)
        self._closers.append(redis.aclose)
        read_routing = build_read_routing(
            s, postgres, functools.partial(WriteMarks.from_settings, s), self.metrics.record_postgres_read
        )
        if read_routing is not None:
            read_routing.start()
            self._closers.append(read_routing.aclose)
            self.metrics.track_replicas(read_routing.statuses, [r.name for r in read_routing.statuses()])
        repository = ContextRepository(postgres, redis, read_routing=read_routing)
        self._closers.append(repository.aclose)
        # Lua scripts loaded on the pooled connections (PostgreSQL's prepare themselves as
        # they open: ``prepare_request_path``); Redis down now is reported by health, not fatal.
        try:
            await redis.warm_up()
        except Exception as exc:
            log.warning("warming up %s failed: %s", type(redis).__name__, failure_name(exc))

        self.profiles = ProfileStore()
        if s.profiles_path is not None:
            self.watcher = ProfileWatcher(
                s.profiles_path,
                self.profiles,
                on_reload=self._on_profile_reload,
                interval_s=s.profiles_poll_seconds,
            )
            self.watcher.load_initial()
            self.watcher.start()

        self.inflight = InflightCalls()
        self._injections = InjectionQueue(
            repository,
            max_size=s.post_response_queue_size,
            batch_size=s.post_response_batch_size,
            flush_interval=s.post_response_flush_ms / 1000,
            hooks=QueueHooks(
                dropped=self.metrics.post_response_dropped_items, failed=self.metrics.post_response_failed
            ),
        )
        self.metrics.track_post_response_queue(lambda: self._injections.depth)
        self._injections.start()

        limits = Limits(
            max_messages=s.max_messages,
            max_message_chars=s.max_message_chars,
            max_memory_chars=s.max_memory_chars,
            max_directive_chars=s.max_directive_chars,
            max_upsert_batch=s.max_upsert_batch,
            embedding_dim=s.embedding_dim,
            max_delete_ids=s.max_delete_ids,
            max_feedback_items=s.max_feedback_items,
        )
        # One thread: large requests' token counts use one core at most, queued beyond it.
        counting = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ibex-token-count")
        self._closers.append(lambda: counting.shutdown(wait=False, cancel_futures=True))
        assembler = Assembler(
            counting_executor=counting,
            retriever=Retriever(
                directives=repository,
                hot_memories=repository,
                cold_memories=repository,
                embedder=query_embedder,
                stand_in=_stand_in(embedder, s),
                rewalk=s.hnsw_ef_search_rewalk > 0,
            ),
            encodings=encodings,
            message_counter=MessageTokenCounter(
                encodings,
                cache_size=s.message_token_cache_size,
                block_cache_size=s.memory_token_cache_size,
            ),
            config=AssemblerConfig(
                hot_limit=s.hot_limit,
                cold_limit=s.cold_limit,
                lexical_limit=s.lexical_limit,
                query_max_chars=s.query_max_chars,
                inline_count_chars=s.inline_count_chars,
                nonce_secret=(s.nonce_secret or secrets.token_hex(32)).encode(),
            ),
        )
        deadlines = DeadlinePolicy(safety_margin=s.deadline_safety_margin_ms / 1000)
        admission = FairAdmission(
            s.max_concurrent_assemblies,
            active_seconds=s.org_active_seconds,
            default_rate=s.org_rate_limit,
            cpu=CpuMeter(available_cpus()),
            cpu_busy=s.admission_cpu_busy,
            on_shed=self.metrics.record_admission_shed,
        )
        self.metrics.track_admission(lambda: admission.active_orgs)
        self.assembly_handler = assembly = ContextAssemblyHandler(
            assembler=assembler,
            resolve_profile=self.profiles.resolve,
            limits=limits,
            deadlines=deadlines,
            injections=self._injections,
            inflight=self.inflight,
            observer=CurrentCallObserver(),
            admission=admission,
            resolve_admission=lambda org_id: self.profiles.resolve_org(org_id).admission,
        )
        tenant_data = TenantData(postgres.pool)
        memory = MemoryServiceHandler(
            writes=MemoryWriteApi(writer=repository, embedder=embedder, encodings=encodings),
            reads=MemoryReadApi(
                data=tenant_data,
                search=hybrid_search(repository),
                embedder=query_embedder,
                export_limit=RowRateLimit(s.export_rows_per_second),
            ),
            purge=TenantPurge(
                data=tenant_data,
                cache=redis,
                call_seconds=s.purge_call_seconds,
                purged=read_routing.note_write if read_routing is not None else None,
            ),
            limits=limits,
            inflight=self.inflight,
            limit_refused=self.metrics.record_limit_refusal,
        )
        await _warm_up(assembler, deadlines)
        self.health = ServiceHealth(
            [postgres, redis, *([read_routing] if read_routing is not None else [])],
            store_up=self.metrics.record_store_up,
            max_watches=s.max_health_watches,
        )
        served = [*assembly.methods(), *memory.methods()]
        methods = [*served, *self.health.methods(service_names(served))]
        methods += reflection_methods(service_names(methods))
        self.server = ServiceServer(
            methods,
            max_request_bytes=s.max_request_bytes,
            observer=CallObserver(
                metrics=self.metrics, tracing=tracing, log=logging.getLogger("ibex_context.access")
            ),
            reuse_port=s.grpc_reuse_port,
            guard=self._guard(),
            credentials=self.tls.credentials() if self.tls is not None else None,
            connections=ConnectionPolicy.from_settings(s),
        )
        if s.gc_freeze:
            # Everything built so far lives as long as the process (see server/heap.py).
            self.metrics.gc_frozen_objects.set(freeze_startup_heap())
        self.port = await self.server.start(s.grpc_host, s.grpc_port)
        if s.health_port is not None:
            # Probes only: the same health state, no service method, no TLS.
            self.health_server = ServiceServer(
                self.health.methods(service_names(served)),
                max_request_bytes=s.max_request_bytes,
                reuse_port=s.grpc_reuse_port,
            )
            self.health_port = await self.health_server.start(s.grpc_host, s.health_port)
        metrics_server = start_metrics_server(
            s.metrics_port, self.metrics_registry, host=s.metrics_host, health=self._health_detail
        )
        self.metrics_port, self.metrics_host = metrics_server.port, metrics_server.host
        self._closers.append(metrics_server.close)
        # Keeps ibex_context_store_up current between probes and scrapes (alerts use it).
        store_monitor = asyncio.get_running_loop().create_task(
            _monitor_stores(self.health), name="ibex-store-monitor"
        )
        self._closers.append(store_monitor.cancel)
        transport = (
            "mutual TLS" if self.tls is not None and self.tls.mutual else "TLS" if self.tls else "plaintext"
        )
        log.info(
            "serving gRPC on port %d (%s, %s), metrics on %s port %d",
            self.port,
            transport,
            "authentication required" if self.credentials is not None else "NO authentication",
            self.metrics_host,
            self.metrics_port,
            # The same facts as fields (`serve --json`: a script waits for this record).
            extra={
                "event": "serving",
                "grpc_port": self.port,
                "metrics_port": self.metrics_port,
                "health_port": self.health_port,
                "transport": transport,
                "authentication": self.credentials is not None,
            },
        )

    def _guard(self) -> CallGuard | None:
        credentials = self.credentials
        if credentials is None:
            return None
        watch = asyncio.get_running_loop().create_task(credentials.run(), name="ibex-credentials-watch")
        self._closers.append(watch.cancel)
        return CallGuard(lambda: credentials.current, on_refused=self.metrics.record_auth_refusal)

    async def _health_detail(self) -> HealthStatus:
        # Ready while this process can answer (degraded answers count: ADR-0007); the
        # stores are reported, each probe bounded by the health check timeout.
        stores = await self.health.check_stores()
        detail: dict[str, object] = {
            "stores": dict(self.health.last_details),
            "stores_ok": all(stores.values()),
            "inflight": self.inflight.count,
        }
        if self.watcher is not None:
            status = self.watcher.status
            detail["profiles"] = {
                "source": status.source,
                "last_ok": status.last_ok,
                "last_outcome": str(status.last_outcome) if status.last_outcome else None,
                "last_error": status.last_error,
                "loaded_at": status.loaded_at,
                "count": status.profile_count,
                "checksum": status.checksum,
            }
        return HealthStatus(ok=not self._stopping, detail=detail)

    def _on_profile_reload(self, outcome: ReloadOutcome) -> None:
        ok = outcome is ReloadOutcome.OK
        count = self.watcher.status.profile_count if self.watcher is not None else None
        self.metrics.record_profile_reload(ok, profiles=count)

    async def stop(self, grace: float | None = None) -> None:
        """Graceful: NOT_SERVING, let in-flight calls finish (capped), then close."""
        if self._stopping:
            return
        self._stopping = True
        s = self.settings
        grace = s.shutdown_grace_seconds if grace is None else grace
        draining_since = time.monotonic()
        self.health.set_not_serving()
        if s.shutdown_drain_delay_seconds:
            await asyncio.sleep(s.shutdown_drain_delay_seconds)
        # Clients may still be sending (the load balancer has not noticed yet, or a
        # burst is in the pipe): keep serving until a quiet moment, not just zero. grpc.aio
        # refuses new calls from the moment it is stopped, so it is stopped only then.
        loop = asyncio.get_running_loop()
        ends = loop.time() + grace
        if not await self.inflight.wait_quiet(_QUIET_SECONDS, grace):
            log.warning("shutdown grace elapsed with %d calls in flight", self.inflight.count)
        elif self.inflight.last_started > draining_since:
            await self.inflight.wait_quiet(_QUIET_WHILE_CLIENTS_SEND_SECONDS, max(0.0, ends - loop.time()))
        # GOAWAY on every connection (clients reconnect elsewhere); the calls still
        # running may finish within what is left of the grace, then are cancelled.
        await self.server.stop(max(0.0, ends - loop.time()))
        if self.health_server is not None:
            await self.health_server.stop(0)
        if self.watcher is not None:
            await self.watcher.stop()
        await self._injections.drain(timeout=2.0)
        await self._close_opened()

    async def _close_opened(self) -> None:
        for close in reversed(self._closers):
            result = close()
            if asyncio.iscoroutine(result):
                try:
                    await asyncio.wait_for(result, 5.0)
                except Exception:
                    log.warning("closing %s failed", getattr(close, "__qualname__", close), exc_info=True)
        self._closers.clear()
        if self.tracing is not None:
            self.tracing.shutdown()

    async def serve_until_signal(self) -> None:
        await stop_signal()
        log.info("signal received; draining")
        await self.stop()


_STORE_MONITOR_INTERVAL_SECONDS = 5.0


def _server_tls(s: Settings) -> ServerTls | None:
    if s.tls_cert_file is None and s.tls_key_file is None:
        if s.tls_client_ca_file is not None:
            raise ConfigurationError("tls_client_ca_file: mutual TLS needs tls_cert_file and tls_key_file")
        return None
    if s.tls_cert_file is None or s.tls_key_file is None:
        raise ConfigurationError("tls_cert_file, tls_key_file: set both (TLS) or neither (plaintext)")
    return ServerTls(TlsFiles(s.tls_cert_file, s.tls_key_file, s.tls_client_ca_file))


def _credentials_file(s: Settings, on_load: Callable[[bool], None]) -> CredentialsFile | None:
    if not s.auth_enabled:
        log.warning("authentication is off (IBEX_AUTH_ENABLED=false): every caller may call every method")
        return None
    if s.auth_credentials_file is None:
        raise ConfigurationError(
            "auth_credentials_file: required while authentication is on (IBEX_AUTH_CREDENTIALS_FILE); "
            "set IBEX_AUTH_ENABLED=false to serve without (docs/security.md)"
        )
    if s.tls_cert_file is None:
        log.warning("authentication without TLS: bearer tokens cross the network in clear text")
    return CredentialsFile(s.auth_credentials_file, poll_seconds=s.auth_reload_seconds, on_load=on_load)


async def _monitor_stores(health: ServiceHealth) -> None:
    while True:
        await health.check_stores()
        await asyncio.sleep(_STORE_MONITOR_INTERVAL_SECONDS)


async def _warm_up(assembler: Assembler, deadlines: DeadlinePolicy) -> None:
    """One assembly for a tenant nobody has, before accepting calls: opens the pools,
    loads the Redis scripts, prepares the statements and warms the embedder, so the
    first real call is not the slow one. Failures are fine (stores may be down)."""
    nil = "00000000-0000-0000-0000-000000000000"
    request = AssemblyRequest(
        org_id=nil,
        agent_id=nil,
        session_id="",
        model="gpt-4o",
        request_id="warm-up",
        messages=(ChatMessage("user", "warm up"),),
    )
    try:
        # Two seconds for the whole call (first connections, script loads); the
        # profile's own source timeouts still apply.
        await assembler.assemble(request, DEFAULT_PROFILE, deadlines.within(2.0, DEFAULT_PROFILE.deadlines))
    except Exception:
        log.warning("warm-up assembly failed", exc_info=True)


def _stand_in(embedder: Embedder, settings: Settings) -> StandIn | None:
    """MiniLM's static table beside its queries: searched with first (the static-first
    query model), or standing in for late query vectors (IBEX_EMBEDDING_STAND_IN_MS)."""
    table = embedder.stand_in if isinstance(embedder, MiniLMEmbedder) else None
    if table is None:
        return None
    first = settings.embedding_query_model == "static-first"
    if not first and settings.embedding_stand_in_ms <= 0:
        return None
    # First, without a bound: MiniLM's vector is waited for until the cold deadline.
    after = settings.embedding_stand_in_ms / 1000 if settings.embedding_stand_in_ms > 0 else math.inf
    return StandIn(table.embed, after, first=first)
