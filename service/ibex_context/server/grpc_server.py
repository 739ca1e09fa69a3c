"""grpclib's Server, plus a request size limit that acts before a body is read
(server/request_size.py), plus closing idle client connections at shutdown.

grpclib (0.4.9) stops listening on ``close()`` but leaves accepted connections
open, so ``wait_closed()`` waits for every client to hang up (grpclib#107, no
GOAWAY). After draining, ``close_connections`` sends each connection an HTTP/2
GOAWAY (clients then reconnect elsewhere) and closes its transport.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

from grpclib.protocol import H2Protocol
from grpclib.server import Server

from ibex_context.server.request_size import limit_request_size


class ServiceServer(Server):
    def __init__(self, *args: Any, max_request_bytes: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._mapping = limit_request_size(self._mapping, max_request_bytes)
        self._protocols: weakref.WeakSet[H2Protocol] = weakref.WeakSet()

    def _protocol_factory(self) -> H2Protocol:
        protocol = super()._protocol_factory()
        self._protocols.add(protocol)
        return protocol

    def open_connections(self) -> int:
        return sum(
            1
            for protocol in list(self._protocols)
            if (transport := getattr(getattr(protocol, "connection", None), "_transport", None)) is not None
            and not transport.is_closing()
        )

    def close_connections(self) -> int:
        """Send every accepted connection an HTTP/2 GOAWAY (its client reconnects
        elsewhere) and close it. Call it once no call is in flight: h2 sends nothing
        more on a connection after GOAWAY. Returns how many connections were open."""
        count = 0
        for protocol in list(self._protocols):
            connection = getattr(protocol, "connection", None)
            transport = getattr(connection, "_transport", None)
            if connection is None or transport is None or transport.is_closing():
                continue
            count += 1
            h2 = getattr(connection, "_connection", None)
            with contextlib.suppress(Exception):
                if h2 is not None:
                    h2.close_connection()
                    transport.write(h2.data_to_send())
            connection.close()
        return count
