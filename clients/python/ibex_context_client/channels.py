"""Where the client's calls go: a grpc.aio channel, and the little grpcio does not do.

grpcio resolves the target itself (``dns:///name:port``, or ``dns://server/name:port``
to ask that DNS server) and, with the ``round_robin`` policy for a ``dns:`` target,
keeps a connection per address of the name (a headless Service: every pod), spreads
calls over the connected ones and skips an address that refuses. TLS and deadlines are
grpcio's too. Two things it lacks are added here, small:

* **Periodic re-resolution.** grpcio asks DNS again only when a connection drops, so
  pods the HPA adds would get no calls. Every ``refresh_seconds`` a fresh channel
  resolves the name again; once it is connected it takes the new calls, and the old
  one is closed after a grace. A fresh channel that does not connect (DNS failing,
  every address gone) is dropped and the old one kept: a blip must not take the
  service away.
* **Replacing a connection that keeps timing out.** A peer that vanished without
  FIN/RST leaves an HTTP/2 connection that never answers (and grpcio gives a connection
  attempt 20 s). After ``timeouts_before_reconnect`` timeouts in a row the next call
  goes over a fresh channel, as it does (at most once a second) after a call failed
  with the channel in TRANSIENT_FAILURE: grpcio would otherwise fail calls fast for its
  whole reconnect backoff (up to two minutes) after the service comes back.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import time
from typing import Any, Self

import grpc

from ibex_context_client.credentials import ClientCredentials, bearer_metadata
from ibex_context_client.target import Target, parse_target
from ibex_context_client.tasks import cancel_and_wait

__all__ = ["TIMEOUTS_BEFORE_RECONNECT", "ChannelClient", "ManagedChannel", "channel_options"]

log = logging.getLogger("ibex_context_client")

# Consecutive timeouts after which the connection is presumed dead and replaced.
TIMEOUTS_BEFORE_RECONNECT = 3
# A channel found in TRANSIENT_FAILURE after a failed call is replaced at most this often.
RECONNECT_INTERVAL_SECONDS = 1.0
# How long a re-resolved channel may take to connect before the old one is kept.
REFRESH_CONNECT_SECONDS = 5.0
# In-flight calls on a replaced channel get this long before it is closed under them.
CLOSE_GRACE_SECONDS = 5.0

_ROUND_ROBIN = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})


def channel_options(target: Target, generation: int = 0) -> list[tuple[str, Any]]:
    """grpcio channel options for ``target``: round robin for a ``dns:`` target, and no
    client-side cap on the size of a reply (the service bounds what it sends).

    grpcio shares connections (subchannels) between channels whose target and options
    are the same: a re-resolving channel (same ``generation``) reuses the connections
    to the addresses it already knows; a replacing one (the next ``generation``) opens
    its own."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", -1),
        ("ibex.connection_generation", generation),
    ]
    if target.round_robin:
        options.append(("grpc.service_config", _ROUND_ROBIN))
    return options


class ManagedChannel:
    """A grpc.aio channel to ``target``, replaced when re-resolving or when it keeps failing."""

    def __init__(
        self,
        target: Target,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        refresh_seconds: float | None = None,
        timeouts_before_reconnect: int = TIMEOUTS_BEFORE_RECONNECT,
    ) -> None:
        self.target = target
        self._credentials = credentials
        self._refresh_seconds = refresh_seconds if target.round_robin else None
        self._timeouts_before_reconnect = timeouts_before_reconnect
        self._channel: grpc.aio.Channel | None = None
        self._generation = 0
        self._methods: dict[str, grpc.aio.UnaryUnaryMultiCallable] = {}
        self._consecutive_timeouts = 0
        self._last_replaced = float("-inf")
        self._refresh_task: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self.replacements = 0

    def _new_channel(self) -> grpc.aio.Channel:
        address, options = self.target.grpc_target, channel_options(self.target, self._generation)
        if self._credentials is not None:
            return grpc.aio.secure_channel(address, self._credentials, options=options)
        return grpc.aio.insecure_channel(address, options=options)

    @property
    def channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            self._channel = self._new_channel()
        return self._channel

    async def start(self) -> None:
        self.channel  # noqa: B018 - creates it
        if self._refresh_seconds is not None and self._refresh_task is None:
            self._refresh_task = asyncio.create_task(
                self._refresh_loop(self._refresh_seconds), name=f"ibex-dns-refresh:{self.target.host}"
            )

    def unary(
        self, path: str, request_type: type[Any], reply_type: type[Any]
    ) -> grpc.aio.UnaryUnaryMultiCallable:
        method = self._methods.get(path)
        if method is None:
            method = self._methods[path] = self.channel.unary_unary(
                path,
                request_serializer=request_type.SerializeToString,
                response_deserializer=reply_type.FromString,
            )
        return method

    async def wait_connected(self, timeout: float) -> bool:
        """Connect now; True once connected, False when the channel fails or ``timeout`` passes."""
        return await _connected(self.channel, timeout)

    def succeeded(self) -> None:
        self._consecutive_timeouts = 0

    def timed_out(self) -> None:
        self._consecutive_timeouts += 1
        if self._consecutive_timeouts >= self._timeouts_before_reconnect:
            log.warning(
                "context service at %s timed out %d times in a row; opening a new connection",
                self.target.grpc_target,
                self._consecutive_timeouts,
            )
            self._generation += 1
            self._replace(self._new_channel())

    def unavailable(self) -> None:
        """A call failed UNAVAILABLE: a fresh channel if this one is backing off."""
        channel = self._channel
        if channel is None or channel.get_state() != grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            return
        if time.monotonic() - self._last_replaced >= RECONNECT_INTERVAL_SECONDS:
            self._generation += 1
            self._replace(self._new_channel())

    async def refresh(self) -> bool:
        """Resolve the name again over a fresh channel; it takes over once connected."""
        fresh = self._new_channel()
        if await _connected(fresh, REFRESH_CONNECT_SECONDS):
            self._replace(fresh, counted=False)
            return True
        log.warning(
            "re-resolving %s gave no connectable address; keeping the current channel",
            self.target.grpc_target,
        )
        await fresh.close()
        return False

    def _replace(self, fresh: grpc.aio.Channel, *, counted: bool = True) -> None:
        old, self._channel, self._methods = self._channel, fresh, {}
        self._consecutive_timeouts = 0
        if counted:
            self._last_replaced = time.monotonic()
            self.replacements += 1
        if old is not None:
            task = asyncio.get_running_loop().create_task(old.close(CLOSE_GRACE_SECONDS))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _refresh_loop(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            try:
                await self.refresh()
            except Exception:
                log.exception("re-resolving %s failed", self.target.grpc_target)

    async def close(self) -> None:
        if self._refresh_task is not None:
            await cancel_and_wait(self._refresh_task)
            self._refresh_task = None
        if self._channel is not None:
            await self._channel.close()
            self._channel, self._methods = None, {}
        # Replaced channels: their grace ends as soon as their last call does.
        await asyncio.gather(*self._closing, return_exceptions=True)


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def _connected(channel: grpc.aio.Channel, timeout: float) -> bool:
    state = channel.get_state(try_to_connect=True)
    try:
        async with asyncio.timeout(timeout):
            while state != grpc.ChannelConnectivity.READY:
                if state in (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN):
                    return False
                await channel.wait_for_state_change(state)
                state = channel.get_state(try_to_connect=True)
    except TimeoutError:
        return False
    return True


class ChannelClient:
    """What ``ContextClient`` and ``MemoryClient`` hold alike: the parsed target, the calls'
    timeout, the bearer metadata and a ``ManagedChannel``. Use ``async with`` or
    ``start()``/``close()``."""

    def __init__(
        self,
        target: str | Target,
        *,
        timeout: float,
        credentials: ClientCredentials | None,
        token: str | None,
        refresh_seconds: float | None = None,
    ) -> None:
        """``credentials``: TLS and the bearer token (docs/security.md); ``token``, when
        given, is sent in place of theirs."""
        credentials = credentials or ClientCredentials()
        self.target = parse_target(target) if isinstance(target, str) else target
        token = token or credentials.token
        if token and not credentials.uses_tls and not _is_loopback(self.target.host):
            # As the Go client (its bearer credential requires transport security): a token
            # sent in clear text is anyone's on the path. Loopback stays open for development.
            raise ValueError(
                f"refusing to send a bearer token in plaintext to {self.target.host}: use TLS "
                "(a CA file, IBEX_TLS_CA or IBEX_TLS=true); plaintext with a token is for loopback only"
            )
        self._auth = tuple(bearer_metadata(token).items())
        self.timeout = timeout
        self._channel = ManagedChannel(
            self.target, credentials=credentials.channel_credentials(), refresh_seconds=refresh_seconds
        )

    async def start(self) -> None:
        await self._channel.start()

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
