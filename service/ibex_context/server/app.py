"""Composition root: builds every component from the Settings, serves, shuts down.

The only place that knows concrete classes; everything else receives its
dependencies through its constructor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from grpclib.reflection.service import ServerReflection
from grpclib.server import Server
from prometheus_client import CollectorRegistry

from ibex_context.embedding.base import Embedder
from ibex_context.embedding.cache import CachedEmbedder
from ibex_context.embedding.factory import build_embedder
from ibex_context.errors import ConfigurationError
from ibex_context.memory_writes import STORED_ENCODINGS, MemoryWrites
from ibex_context.observability.calls import current_call, instrument_server
from ibex_context.observability.metrics import Metrics, start_metrics_server
from ibex_context.observability.tracing import Tracing
from ibex_context.pipeline.assembler import Assembler, AssemblerConfig
from ibex_context.pipeline.report import AssemblyReport
from ibex_context.pipeline.retrieval import Retriever
from ibex_context.post_response import InjectionQueue, QueueHooks
from ibex_context.profiles.registry import ProfileStore
from ibex_context.profiles.watcher import ProfileWatcher, ReloadOutcome
from ibex_context.server.codec import LimitedProtoCodec
from ibex_context.server.handlers import ContextAssemblyHandler, DeadlinePolicy, MemoryHandler
from ibex_context.server.health import ServiceHealth
from ibex_context.server.lifecycle import InflightCalls
from ibex_context.server.validation import Limits
from ibex_context.settings import Settings
from ibex_context.stores.migrate import check_embedding_dim_dsn
from ibex_context.stores.postgres import PostgresMemoryStore
from ibex_context.stores.redis import RedisContextCache
from ibex_context.stores.repository import ContextRepository
from ibex_context.tokens.counting import MessageTokenCounter
from ibex_context.tokens.encodings import EncodingRegistry

log = logging.getLogger(__name__)


@dataclass
class ContextService:
    """A running (or ready to run) ibex-context server."""

    settings: Settings
    embedder: Embedder | None = None
    metrics_registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    tracing: Tracing | None = None

    server: Server = field(init=False)
    health: ServiceHealth = field(init=False)
    inflight: InflightCalls = field(init=False)
    profiles: ProfileStore = field(init=False)
    metrics: Metrics = field(init=False)
    port: int = field(init=False, default=0)
    metrics_port: int = field(init=False, default=0)
    _closers: list[Callable[[], object]] = field(init=False, default_factory=list)
    _tasks: list[asyncio.Task[None]] = field(init=False, default_factory=list)
    _stopping: bool = field(init=False, default=False)

    async def start(self) -> None:
        s = self.settings
        self.metrics = Metrics(self.metrics_registry)
        tracing = self.tracing or Tracing.from_settings(s)
        self.tracing = tracing

        encodings = EncodingRegistry(cache_dir=s.tiktoken_cache_dir)
        # First loads take hundreds of milliseconds: never on a request.
        await asyncio.to_thread(encodings.preload, [*STORED_ENCODINGS])

        embedder = self.embedder or build_embedder(s)
        if embedder.dim != s.embedding_dim:
            raise ConfigurationError(
                f"embedder {embedder.name} produces {embedder.dim} dimensions, IBEX_EMBEDDING_DIM is {s.embedding_dim}"
            )
        await check_embedding_dim_dsn(s.postgres_dsn, s.embedding_dim)
        query_embedder = CachedEmbedder(embedder, max_entries=s.embedding_cache_size)

        postgres = PostgresMemoryStore(
            s.postgres_dsn,
            min_size=s.postgres_pool_min,
            max_size=s.postgres_pool_max,
            ef_search=max(s.hnsw_ef_search, s.cold_limit),
        )
        await postgres.open()
        self._closers.append(postgres.close)
        redis = RedisContextCache(
            s.redis_url,
            max_connections=s.redis_max_connections,
            directive_ttl=s.directive_cache_ttl_seconds,
            hot_set_size=s.hot_set_size,
            hot_set_ttl=s.hot_set_ttl_seconds,
        )
        self._closers.append(redis.close)
        repository = ContextRepository(postgres=postgres, cache=redis, hot_set_size=s.hot_set_size)
        self._closers.append(repository.close)

        self.profiles = ProfileStore.from_path(s.profiles_path, defaults_from=s)
        watcher = ProfileWatcher(s.profiles_path, self.profiles, on_reload=self._on_profile_reload)
        if s.profiles_path is not None:
            self._tasks.append(asyncio.create_task(watcher.run(), name="profile-watcher"))

        self.inflight = InflightCalls()
        self._injections = InjectionQueue(
            repository,
            max_size=s.post_response_queue_size,
            batch_size=s.post_response_batch_size,
            flush_interval=s.post_response_flush_ms / 1000,
            hooks=QueueHooks(
                depth=self.metrics.post_response_queue_depth.set,
                dropped=self.metrics.post_response_dropped.inc,
                failed=self.metrics.post_response_failures.inc,
            ),
        )
        self._injections.start()

        limits = Limits(
            max_messages=s.max_messages,
            max_message_chars=s.max_message_chars,
            max_memory_chars=s.max_memory_chars,
            max_directive_chars=s.max_directive_chars,
            max_upsert_batch=s.max_upsert_batch,
            embedding_dim=s.embedding_dim,
        )
        assembler = Assembler(
            retriever=Retriever(
                directives=repository, hot_memories=repository, cold_memories=repository, embedder=query_embedder
            ),
            encodings=encodings,
            message_counter=MessageTokenCounter(encodings, cache_size=s.message_token_cache_size),
            config=AssemblerConfig(
                hot_limit=s.hot_limit,
                cold_limit=s.cold_limit,
                query_max_chars=s.query_max_chars,
                nonce_secret=(s.nonce_secret or secrets.token_hex(32)).encode(),
            ),
        )
        assembly = ContextAssemblyHandler(
            assembler=assembler,
            resolve_profile=lambda org, agent: self.profiles.current.resolve(org, agent),
            limits=limits,
            deadlines=DeadlinePolicy(safety_margin=s.deadline_safety_margin_ms / 1000),
            injections=self._injections,
            inflight=self.inflight,
            report_sink=_attach_report,
        )
        memory = MemoryHandler(
            writes=MemoryWrites(writer=repository, embedder=embedder, encodings=encodings),
            limits=limits,
            inflight=self.inflight,
        )
        self.health = ServiceHealth([postgres, redis])
        services = ServerReflection.extend([assembly, memory, self.health.service([assembly, memory])])
        self.server = Server(services, codec=LimitedProtoCodec(s.max_request_bytes))
        instrument_server(self.server, metrics=self.metrics, tracing=tracing, log=logging.getLogger("ibex_context.access"))
        await self.server.start(s.grpc_host, s.grpc_port, reuse_port=s.grpc_reuse_port)
        sockets = self.server._server.sockets if self.server._server else []  # noqa: SLF001 - grpclib exposes no port
        self.port = sockets[0].getsockname()[1] if sockets else s.grpc_port
        if s.metrics_port or s.metrics_port == 0:
            stop_metrics, self.metrics_port = start_metrics_server(s.metrics_port, self.metrics_registry)
            self._closers.append(stop_metrics)
        log.info("serving", extra={"grpc_port": self.port, "metrics_port": self.metrics_port})

    def _on_profile_reload(self, outcome: ReloadOutcome) -> None:
        self.metrics.record_profile_reload(outcome.ok)

    async def stop(self, grace: float | None = None) -> None:
        """Graceful: NOT_SERVING, let in-flight calls finish (capped), then close."""
        if self._stopping:
            return
        self._stopping = True
        s = self.settings
        grace = s.shutdown_grace_seconds if grace is None else grace
        self.health.set_not_serving()
        if s.shutdown_drain_delay_seconds:
            await asyncio.sleep(s.shutdown_drain_delay_seconds)
        if not await self.inflight.wait_idle(grace):
            log.warning("shutdown grace elapsed with %d calls in flight", self.inflight.count)
        self.server.close()
        # grpclib waits for clients to hang up (no GOAWAY, grpclib#107): bounded wait.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.server.wait_closed(), 1.0)
        for task in self._tasks:
            task.cancel()
        await self._injections.drain(timeout=2.0)
        for close in reversed(self._closers):
            result = close()
            if asyncio.iscoroutine(result):
                with contextlib.suppress(Exception):
                    await result
        if self.tracing is not None:
            self.tracing.shutdown()

    async def serve_until_signal(self) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("signal received; draining")
        await self.stop()


def _attach_report(report: AssemblyReport) -> None:
    state = current_call.get()
    if state is not None:
        state.report = report
