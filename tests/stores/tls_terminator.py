"""A TLS terminator in front of the session's real stores (their embedded builds speak no TLS):
the store's client makes a real TLS handshake with a certificate of a private CA, and the bytes
inside reach the real Redis or PostgreSQL.

PostgreSQL negotiates TLS in its protocol: the client first sends an SSLRequest (8 bytes) and
starts the handshake after the server's "S"; the terminator answers it and forwards the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from ibex_context.devtools.certs import Issued

_SSL_REQUEST = struct.pack("!ii", 8, 80877103)

Upstream = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


def server_context(issued: Issued, directory: Path) -> ssl.SSLContext:
    cert, key = issued.write(directory, "store")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError, asyncio.IncompleteReadError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(Exception):
        writer.close()


@contextlib.asynccontextmanager
async def terminator(
    context: ssl.SSLContext, upstream: Upstream, *, postgres: bool = False
) -> AsyncIterator[int]:
    """Listens on 127.0.0.1 (the port is yielded): TLS outside, ``upstream`` inside."""
    tasks: set[asyncio.Task[None]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if postgres:
                if await reader.readexactly(8) != _SSL_REQUEST:
                    writer.close()
                    return
                writer.write(b"S")
                await writer.drain()
                await writer.start_tls(context)
            inner_reader, inner_writer = await upstream()
        except (ssl.SSLError, ConnectionError, OSError, asyncio.IncompleteReadError):
            writer.close()
            return
        await asyncio.gather(_pipe(reader, inner_writer), _pipe(inner_reader, writer))

    def track(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(serve(reader, writer))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    server = await asyncio.start_server(track, "127.0.0.1", 0, ssl=None if postgres else context)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()
