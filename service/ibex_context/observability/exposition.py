"""The HTTP side port: ``/metrics`` for Prometheus and ``/healthz`` for probes.

It runs on the service's event loop (asyncio streams, no thread, no extra
dependency) so the health hook can await the stores. Rendering the registry takes
about a millisecond of loop time per scrape (see benchmarks/observability_overhead.py);
a scrape every 15 s is noise next to the request traffic.

The server speaks just enough HTTP/1.1 for a scraper or a kubelet probe: one request
per connection, GET or HEAD, ``Connection: close``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

log = logging.getLogger(__name__)

_MAX_HEADER_BYTES = 16 * 1024
_READ_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class HealthStatus:
    """What a health hook reports; ``detail`` is merged into the ``/healthz`` JSON."""

    ok: bool
    detail: Mapping[str, object] = field(default_factory=dict)


HealthCheck = Callable[[], Awaitable[HealthStatus]]


@dataclass(frozen=True, slots=True)
class _Response:
    status: int
    reason: str
    content_type: str
    body: bytes


class MetricsServer:
    """Serves ``registry`` on ``/metrics`` and ``health`` on ``/healthz``. Stop with ``close()``."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        health: HealthCheck | None = None,
        health_timeout_seconds: float = 2.0,
    ) -> None:
        self._registry = registry
        self._health = health
        self._health_timeout = health_timeout_seconds
        self._socket: socket.socket | None = None
        self._starting: asyncio.Task[asyncio.Server] | None = None

    def start(self, host: str, port: int) -> None:
        """Bind now (a taken port fails here, synchronously) and serve from the running loop."""
        self._socket = _listening_socket(host, port)
        self._starting = asyncio.get_running_loop().create_task(
            asyncio.start_server(self._serve, sock=self._socket, limit=_MAX_HEADER_BYTES),
            name="ibex-metrics-server",
        )

    @property
    def host(self) -> str:
        """The bound address."""
        if self._socket is None:
            raise RuntimeError("metrics server is not running")
        return str(self._socket.getsockname()[0])

    @property
    def port(self) -> int:
        """The bound port (useful when started on port 0)."""
        if self._socket is None:
            raise RuntimeError("metrics server is not running")
        return int(self._socket.getsockname()[1])

    async def close(self) -> None:
        if self._starting is not None:
            try:
                server = await self._starting
            except OSError:
                server = None
            if server is not None:
                server.close()
                await server.wait_closed()
            self._starting = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT_SECONDS)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
                return
            method, path, headers = _parse_head(head)
            if method not in ("GET", "HEAD"):
                response = _text(405, "Method Not Allowed", "method not allowed\n")
            elif path == "/metrics":
                response = self._metrics(headers.get("accept", ""))
            elif path in ("/healthz", "/health"):
                response = await self._healthz()
            else:
                response = _text(404, "Not Found", "not found; try /metrics or /healthz\n")
            writer.write(_encode(response, include_body=method != "HEAD"))
            await writer.drain()
        except (ConnectionError, OSError):
            pass  # the scraper went away; nothing to tell it
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    def _metrics(self, accept: str) -> _Response:
        # OpenMetrics (when the scraper asks for it) carries the trace-id exemplars.
        encoder, content_type = choose_encoder(accept)
        return _Response(200, "OK", content_type, encoder(self._registry))

    async def _healthz(self) -> _Response:
        if self._health is None:
            return _json(200, "OK", {"status": "ok"})
        # Not wait_for: it waits for the cancelled hook to finish, and a hook stuck in a
        # store client (a stopped PostgreSQL) takes seconds to. The answer must not.
        check: asyncio.Future[HealthStatus] = asyncio.ensure_future(self._health())
        await asyncio.wait({check}, timeout=self._health_timeout)
        if not check.done():
            check.cancel()
            return _json(
                503, "Service Unavailable", {"status": "unhealthy", "error": "health check timed out"}
            )
        try:
            status = check.result()
        except Exception as exc:
            log.warning("health check failed: %s", type(exc).__name__, exc_info=True)
            return _json(503, "Service Unavailable", {"status": "unhealthy", "error": type(exc).__name__})
        body = {"status": "ok" if status.ok else "unhealthy", **status.detail}
        return _json(200, "OK", body) if status.ok else _json(503, "Service Unavailable", body)


def start_metrics_server(
    port: int,
    registry: CollectorRegistry,
    *,
    host: str = "0.0.0.0",
    health: HealthCheck | None = None,
) -> MetricsServer:
    """Serve ``/metrics`` and ``/healthz`` on ``port`` (0: any free port, see ``.port``).

    Call from inside the running loop; ``await server.close()`` stops it.
    """
    server = MetricsServer(registry, health=health)
    server.start(host, port)
    return server


def _listening_socket(host: str, port: int) -> socket.socket:
    # Built from getaddrinfo so proto is IPPROTO_TCP: asyncio only sets TCP_NODELAY on
    # accepted sockets whose proto says TCP (socket.create_server leaves it 0).
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    method = parts[0] if parts else ""
    target = parts[1] if len(parts) > 1 else ""
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return method, target.split("?", 1)[0], headers


def _text(status: int, reason: str, body: str) -> _Response:
    return _Response(status, reason, "text/plain; charset=utf-8", body.encode())


def _json(status: int, reason: str, body: Mapping[str, object]) -> _Response:
    return _Response(status, reason, "application/json", json.dumps(body, default=str).encode())


def _encode(response: _Response, *, include_body: bool) -> bytes:
    head = (
        f"HTTP/1.1 {response.status} {response.reason}\r\n"
        f"Content-Type: {response.content_type}\r\n"
        f"Content-Length: {len(response.body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode("latin-1")
    return head + response.body if include_body else head
