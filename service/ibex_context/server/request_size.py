"""Refuses an oversized request from its gRPC length prefix, before its body is read.

grpclib reads a whole message into memory before the codec sees it (grpclib#195),
and acknowledges every DATA frame it reads, so a client may send as much as it
likes: three concurrent 300 MB calls took a server to 1.5 GB of RSS. A gRPC
message starts with five bytes (a compressed flag and a big-endian length), and
HTTP/2 flow control lets a client send only one stream window (4 MiB by default)
past what the server has read. Reading those five bytes first and refusing there
caps what one call can make the server buffer to that window; the refusal resets
the stream, which frees it.

Pinned to grpclib 0.4.9's buffer (``protocol.Buffer``): the five bytes are put
back in front of what is buffered, so grpclib's own ``recv_message`` reads the
message as usual (tests/server/test_request_size.py covers both paths).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grpclib.const import Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.protocol import AckedData, Buffer
from grpclib.server import Stream

_PREFIX_BYTES = 5  # compressed flag (1 byte) + message length (4 bytes, big-endian)


def oversized_request_error(length: int, max_bytes: int) -> GRPCError:
    return GRPCError(
        Status.INVALID_ARGUMENT,
        f"request: {length} bytes exceeds the limit of {max_bytes} bytes (IBEX_MAX_REQUEST_BYTES)",
    )


def limit_request_size(mapping: Mapping[str, Handler], max_bytes: int) -> dict[str, Handler]:
    """The same handlers, each refusing a request longer than ``max_bytes`` before
    reading its body."""
    return {path: _limited(handler, max_bytes) for path, handler in mapping.items()}


def _limited(handler: Handler, max_bytes: int) -> Handler:
    serve = handler.func

    async def refuse_oversized_then_serve(stream: Stream[Any, Any]) -> None:
        await check_length_prefix(stream, max_bytes)
        await serve(stream)

    return handler._replace(func=refuse_oversized_then_serve)


async def check_length_prefix(stream: Stream[Any, Any], max_bytes: int) -> None:
    """Reads the first message's length prefix; raises INVALID_ARGUMENT when it
    announces more than ``max_bytes``, else leaves the prefix to be read again."""
    h2_stream = stream._stream
    prefix = await h2_stream.recv_data(_PREFIX_BYTES)
    if len(prefix) < _PREFIX_BYTES:
        _unread(h2_stream.buffer, prefix)  # end of stream: grpclib reports it as usual
        return
    length = int.from_bytes(prefix[1:], "big")
    if length > max_bytes:
        raise oversized_request_error(length, max_bytes)
    _unread(h2_stream.buffer, prefix)


def _unread(buffer: Buffer, data: bytes) -> None:
    # Already acknowledged to the peer (it was read): back in the acknowledged queue.
    if data:
        buffer._acked.appendleft(AckedData(memoryview(data), len(data)))
        buffer._acked_size += len(data)
