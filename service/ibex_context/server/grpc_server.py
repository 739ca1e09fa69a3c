"""The gRPC server: grpc.aio (grpcio's asyncio server on gRPC's C core), ADR-0010.

* Request size: ``grpc.max_receive_message_length`` is the core's own limit. The core
  reads a message's 5-byte length prefix and refuses a message announced larger than
  the limit before buffering its body (three concurrent 300 MB requests cost the
  server < 2 MB: tests/server/test_request_size.py), with RESOURCE_EXHAUSTED
  "Received message larger than max (N vs. M)".
* SO_REUSEPORT: the core sets it on every listening socket unless told not to
  (``grpc.so_reuseport``, default on): a single-process server turns it off so that a
  second server on a taken port fails to start instead of sharing it silently.
* Connections (``ConnectionPolicy``, from the settings): aged after a jittered maximum
  with a grace for the calls running on them, so every client reconnects and re-resolves
  (pods the HPA adds get calls); a cap on the calls in flight per connection; keepalive
  pings accepted no more often than a minimum interval (``too_many_pings`` GOAWAY past the
  strikes).
* Shutdown: ``stop(grace)`` sends every connection a GOAWAY, refuses new calls at
  once and cancels the calls still running after ``grace``. The drain that keeps
  serving while load balancers catch up is the caller's (``server/app.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from ibex_context.observability.calls import CallObserver
from ibex_context.server.rpc import Guard, Method, generic_handlers
from ibex_context.settings import Settings

__all__ = ["ConnectionPolicy", "ServiceServer"]


@dataclass(frozen=True, slots=True)
class ConnectionPolicy:
    """How the server treats client connections (the settings' ``grpc_max_connection_age_*``,
    ``grpc_max_concurrent_streams``, ``grpc_keepalive_min_ping_interval_seconds`` and
    ``grpc_max_ping_strikes``; their defaults are explained there)."""

    max_age_seconds: float
    max_age_grace_seconds: float
    max_concurrent_streams: int
    min_ping_interval_seconds: float
    max_ping_strikes: int

    @classmethod
    def from_settings(cls, s: Settings) -> ConnectionPolicy:
        return cls(
            max_age_seconds=s.grpc_max_connection_age_seconds,
            max_age_grace_seconds=s.grpc_max_connection_age_grace_seconds,
            max_concurrent_streams=s.grpc_max_concurrent_streams,
            min_ping_interval_seconds=s.grpc_keepalive_min_ping_interval_seconds,
            max_ping_strikes=s.grpc_max_ping_strikes,
        )

    def options(self) -> list[tuple[str, Any]]:
        """The C core's channel arguments."""
        return [
            ("grpc.max_connection_age_ms", _ms(self.max_age_seconds)),
            ("grpc.max_connection_age_grace_ms", _ms(self.max_age_grace_seconds)),
            ("grpc.max_concurrent_streams", self.max_concurrent_streams),
            # The core's default also counts streams it has answered but not yet freed, and
            # refuses (REFUSED_STREAM: UNAVAILABLE) a call that a client, having seen an answer,
            # rightly sends: 1-3 of 6 calls in tests/server/test_grpc_server.py. Off, the limit
            # is HTTP/2's own: streams open at once, which clients respect by queuing.
            ("grpc.http.overload_protection", 0),
            # (The C core's name for GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS.)
            ("grpc.http2.min_ping_interval_without_data_ms", _ms(self.min_ping_interval_seconds)),
            ("grpc.http2.max_ping_strikes", self.max_ping_strikes),
            # A ping on a connection without calls is no strike (only a too frequent one is):
            # a proxy's connections idle between bursts, and its keepalive must not cost them.
            ("grpc.keepalive_permit_without_calls", 1),
        ]


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


class ServiceServer:
    def __init__(
        self,
        methods: Sequence[Method],
        *,
        max_request_bytes: int,
        observer: CallObserver | None = None,
        reuse_port: bool = False,
        guard: Guard | None = None,
        credentials: grpc.ServerCredentials | None = None,
        connections: ConnectionPolicy | None = None,
    ) -> None:
        """``credentials``: TLS on the port (``server/tls.py``); None serves plaintext.
        ``connections``: None keeps gRPC's own defaults (no age, no stream cap)."""
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", max_request_bytes),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
        ]
        if connections is not None:
            options += connections.options()
        self._server = grpc.aio.server(options=options)
        self._server.add_generic_rpc_handlers(generic_handlers(methods, observer, guard))
        self._credentials = credentials
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        """Binds ``host:port`` (0: a free port), starts serving; returns the bound port."""
        # The core takes "[::1]:port" for IPv6 literals.
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if self._credentials is None:
            self.port = self._server.add_insecure_port(address)
        else:
            self.port = self._server.add_secure_port(address, self._credentials)
        await self._server.start()
        return self.port

    async def stop(self, grace: float) -> None:
        """GOAWAY to every connection, no new calls; the calls running may take ``grace`` seconds."""
        await self._server.stop(grace)
