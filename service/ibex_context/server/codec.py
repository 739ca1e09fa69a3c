"""A protobuf codec that turns a message it cannot parse into INVALID_ARGUMENT."""

from __future__ import annotations

from typing import Any

from grpclib.const import Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.exceptions import GRPCError

from ibex_context.server.request_size import oversized_request_error


class LimitedProtoCodec(ProtoCodec):
    """Rejects messages larger than ``max_bytes`` before parsing them.

    The server refuses an oversized request from its length prefix, before the
    body is read (server/request_size.py); this check is the second line, for a
    codec used without that server.
    """

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes

    def decode(self, data: bytes, message_type: Any) -> Any:
        if len(data) > self._max_bytes:
            raise oversized_request_error(len(data), self._max_bytes)
        try:
            return super().decode(data, message_type)
        except Exception:
            raise GRPCError(Status.INVALID_ARGUMENT, "request: not a valid protobuf message") from None
