"""Where the client's calls go: one channel, or one channel per address behind a DNS name.

A gRPC channel is one HTTP/2 connection, and every call of a long-lived client rides
on it: behind a plain ClusterIP Service all of a proxy's calls land on one pod, and
new pods added by the HPA get none of them. ``DnsRoundRobin`` resolves a headless
Service name to every pod address, keeps a channel per address, spreads calls round
robin, re-resolves periodically, and sets aside an address that refuses connections
(or keeps timing out) until the next resolution.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl as ssl_module
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from grpclib.client import Channel, UnaryUnaryMethod
from grpclib.config import Configuration

log = logging.getLogger("ibex_context.client")

Resolver = Callable[[str, int], Awaitable[Sequence[str]]]


@dataclass(eq=False)
class Endpoint:
    """One address and its channel. ``down`` endpoints are skipped until the next resolution."""

    address: str
    port: int
    channel: Channel
    down: bool = False
    consecutive_timeouts: int = 0
    _methods: dict[str, UnaryUnaryMethod[Any, Any]] = field(default_factory=dict)

    def unary(self, path: str, request_type: type[Any], reply_type: type[Any]) -> UnaryUnaryMethod[Any, Any]:
        method = self._methods.get(path)
        if method is None:
            method = self._methods[path] = UnaryUnaryMethod(self.channel, path, request_type, reply_type)
        return method


class Endpoints(Protocol):
    """What a client needs from its channels."""

    async def start(self) -> None: ...

    def pick(self) -> Endpoint | None: ...

    def count(self) -> int: ...

    def connect_failed(self, endpoint: Endpoint) -> None: ...

    def timed_out(self, endpoint: Endpoint) -> None: ...

    def succeeded(self, endpoint: Endpoint) -> None: ...

    async def close(self) -> None: ...


# Consecutive timeouts after which a connection is presumed dead (a peer that vanished
# without a FIN/RST keeps an HTTP/2 connection "open" forever) and is replaced.
TIMEOUTS_BEFORE_RECONNECT = 3


class SingleChannel:
    """One channel to ``host:port`` (a ClusterIP Service, a sidecar, a test server)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ssl: ssl_module.SSLContext | None = None,
        timeouts_before_reconnect: int = TIMEOUTS_BEFORE_RECONNECT,
    ) -> None:
        self._host, self._port, self._ssl = host, port, ssl
        self._timeouts_before_reconnect = timeouts_before_reconnect
        self._endpoint: Endpoint | None = None

    async def start(self) -> None:
        if self._endpoint is None:
            channel = Channel(self._host, self._port, ssl=self._ssl)
            self._endpoint = Endpoint(self._host, self._port, channel)

    def pick(self) -> Endpoint | None:
        return self._endpoint

    def count(self) -> int:
        return 1 if self._endpoint is not None else 0

    def connect_failed(self, endpoint: Endpoint) -> None:
        pass  # nowhere else to go; grpclib reconnects on the next call

    def timed_out(self, endpoint: Endpoint) -> None:
        endpoint.consecutive_timeouts += 1
        if endpoint.consecutive_timeouts >= self._timeouts_before_reconnect:
            _reconnect(endpoint)

    def succeeded(self, endpoint: Endpoint) -> None:
        pass

    async def close(self) -> None:
        if self._endpoint is not None:
            self._endpoint.channel.close()
            self._endpoint = None


def _reconnect(endpoint: Endpoint) -> None:
    """Drop the endpoint's connection; grpclib opens a new one on the next call."""
    endpoint.consecutive_timeouts = 0
    endpoint.channel.close()


async def resolve_all(host: str, port: int) -> list[str]:
    """Every A/AAAA address of ``host``, in resolver order, without duplicates."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class DnsRoundRobin:
    """A channel per address of a DNS name, picked round robin, re-resolved every ``refresh_seconds``."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ssl: ssl_module.SSLContext | None = None,
        refresh_seconds: float = 30.0,
        resolver: Resolver = resolve_all,
        timeouts_before_down: int = TIMEOUTS_BEFORE_RECONNECT,
        retire_after_seconds: float = 60.0,
    ) -> None:
        self._host, self._port, self._ssl = host, port, ssl
        self._refresh_seconds = refresh_seconds
        self._resolver = resolver
        self._timeouts_before_down = timeouts_before_down
        self._retire_after = retire_after_seconds
        self._endpoints: list[Endpoint] = []
        self._next = 0
        self._task: asyncio.Task[None] | None = None
        self._refresh_now = asyncio.Event()
        self._last_refresh = 0.0
        # Channels of addresses that disappeared, closed once their calls are long over.
        self._retiring: list[tuple[float, Endpoint]] = []

    @property
    def addresses(self) -> list[str]:
        return [e.address for e in self._endpoints]

    async def start(self) -> None:
        if self._task is not None:
            return
        await self.refresh()
        self._task = asyncio.create_task(self._refresh_loop(), name=f"ibex-dns-refresh:{self._host}")

    async def refresh(self) -> None:
        """Resolve now; add channels for new addresses, retire vanished ones, clear ``down``."""
        self._last_refresh = time.monotonic()
        try:
            addresses = list(await self._resolver(self._host, self._port))
        except OSError as exc:
            # Keep the last good set: a DNS blip must not take the service away.
            log.warning(
                "resolving %s failed (%s); keeping %d addresses", self._host, exc, len(self._endpoints)
            )
            return
        if not addresses:
            log.warning("%s resolved to no addresses; keeping %d", self._host, len(self._endpoints))
            return
        known = {e.address: e for e in self._endpoints}
        kept: list[Endpoint] = []
        for address in addresses:
            endpoint = known.pop(address, None)
            if endpoint is None:
                # TLS: the certificate names the Service, not each pod's address.
                config = Configuration(ssl_target_name_override=self._host) if self._ssl else None
                channel = Channel(address, self._port, ssl=self._ssl, config=config)
                endpoint = Endpoint(address, self._port, channel)
            endpoint.down = False
            endpoint.consecutive_timeouts = 0
            kept.append(endpoint)
        now = time.monotonic()
        self._retiring.extend((now, e) for e in known.values())
        self._endpoints = kept
        self._close_retired(now)

    def pick(self) -> Endpoint | None:
        endpoints = self._endpoints
        n = len(endpoints)
        if n == 0:
            self._refresh_now.set()
            return None
        for _ in range(n):
            endpoint = endpoints[self._next % n]
            self._next = (self._next + 1) % n
            if not endpoint.down:
                return endpoint
        # Everything is set aside: re-resolve soon, and meanwhile keep trying them all
        # rather than failing calls on our own bookkeeping.
        self._refresh_now.set()
        endpoint = endpoints[self._next % n]
        self._next = (self._next + 1) % n
        return endpoint

    def count(self) -> int:
        return len(self._endpoints)

    def connect_failed(self, endpoint: Endpoint) -> None:
        if not endpoint.down:
            endpoint.down = True
            log.warning(
                "context service at %s:%d refused the connection; skipping it until the next resolution",
                endpoint.address,
                endpoint.port,
            )

    def timed_out(self, endpoint: Endpoint) -> None:
        endpoint.consecutive_timeouts += 1
        if endpoint.consecutive_timeouts >= self._timeouts_before_down and not endpoint.down:
            endpoint.down = True
            log.warning(
                "context service at %s:%d timed out %d times in a row; skipping it until the next resolution",
                endpoint.address,
                endpoint.port,
                endpoint.consecutive_timeouts,
            )
            _reconnect(endpoint)

    def succeeded(self, endpoint: Endpoint) -> None:
        endpoint.consecutive_timeouts = 0

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for endpoint in self._endpoints:
            endpoint.channel.close()
        for _, endpoint in self._retiring:
            endpoint.channel.close()
        self._endpoints, self._retiring = [], []

    async def _refresh_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._refresh_now.wait(), self._refresh_seconds)
            self._refresh_now.clear()
            # An early refresh (everything down) at most once a second.
            wait = 1.0 - (time.monotonic() - self._last_refresh)
            if wait > 0:
                await asyncio.sleep(wait)
            try:
                await self.refresh()
            except Exception:
                log.exception("refreshing the addresses of %s failed", self._host)

    def _close_retired(self, now: float) -> None:
        keep: list[tuple[float, Endpoint]] = []
        for retired_at, endpoint in self._retiring:
            if now - retired_at >= self._retire_after:
                endpoint.channel.close()
            else:
                keep.append((retired_at, endpoint))
        self._retiring = keep
