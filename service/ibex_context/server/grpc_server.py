"""The gRPC server: grpc.aio (grpcio's asyncio server on gRPC's C core), ADR-0010.

* Request size: ``grpc.max_receive_message_length`` is the core's own limit. The core
  reads a message's 5-byte length prefix and refuses a message announced larger than
  the limit before buffering its body (three concurrent 300 MB requests cost the
  server < 2 MB: tests/server/test_request_size.py), with RESOURCE_EXHAUSTED
  "Received message larger than max (N vs. M)".
* SO_REUSEPORT: the core sets it on every listening socket unless told not to
  (``grpc.so_reuseport``, default on): a single-process server turns it off so that a
  second server on a taken port fails to start instead of sharing it silently.
* Shutdown: ``stop(grace)`` sends every connection a GOAWAY, refuses new calls at
  once and cancels the calls still running after ``grace``. The drain that keeps
  serving while load balancers catch up is the caller's (``server/app.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from ibex_context.observability.calls import CallObserver
from ibex_context.server.rpc import Guard, Method, generic_handlers

__all__ = ["ServiceServer"]


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
    ) -> None:
        """``credentials``: TLS on the port (``server/tls.py``); None serves plaintext."""
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", max_request_bytes),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
        ]
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
