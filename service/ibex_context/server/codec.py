"""A protobuf codec with a request size limit (grpclib has none: issue #195)."""

from __future__ import annotations

from typing import Any

from grpclib.const import Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.exceptions import GRPCError


class LimitedProtoCodec(ProtoCodec):
    """Rejects messages larger than ``max_bytes`` before parsing them.

    grpclib buffers a whole message before decoding it, so the bytes are in memory
    already; the limit keeps them from being parsed, validated and processed.
    """

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes

    def decode(self, data: bytes, message_type: Any) -> Any:
        if len(data) > self._max_bytes:
            raise GRPCError(
                Status.INVALID_ARGUMENT,
                f"request: {len(data)} bytes exceeds the limit of {self._max_bytes} bytes "
                "(IBEX_MAX_REQUEST_BYTES)",
            )
        try:
            return super().decode(data, message_type)
        except Exception:
            raise GRPCError(Status.INVALID_ARGUMENT, "request: not a valid protobuf message") from None
