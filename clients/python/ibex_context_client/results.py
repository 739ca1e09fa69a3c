"""What ``ContextClient.assemble`` returns, and the bounded set of results it reports
(the fallback reasons the client gives, and the labels its metrics count them by)."""

from __future__ import annotations

from dataclasses import dataclass

from ibex_context_client.messages import ChatMessage
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb

__all__ = [
    "CLIENT_ERROR",
    "CLIENT_INVALID_ARGUMENT",
    "CLIENT_RESULTS",
    "CLIENT_TIMEOUT",
    "CLIENT_UNAVAILABLE",
    "AssembleResult",
]

CLIENT_TIMEOUT = "client_timeout"
CLIENT_UNAVAILABLE = "client_unavailable"
CLIENT_INVALID_ARGUMENT = "client_invalid_argument"
CLIENT_ERROR = "client_error"  # with ":<STATUS>" in a fallback reason

# Every value of the client's result label: the service answered in full or degraded, or
# the client fell back for one of its reasons (``client_error`` without its status).
CLIENT_RESULTS = (
    "ok",
    "degraded",
    CLIENT_TIMEOUT,
    CLIENT_UNAVAILABLE,
    CLIENT_INVALID_ARGUMENT,
    CLIENT_ERROR,
)


@dataclass(frozen=True, slots=True)
class AssembleResult:
    """What to send to the model.

    ``from_service`` is False when the client fell back; ``messages`` are then the
    caller's own. ``fallback_reason`` is empty for a full assembly, the service's
    reason when it degraded, or a ``client_*`` reason when the client fell back.
    ``metadata`` is the service's ``InjectionMetadata`` (None on client fallback).
    """

    messages: tuple[ChatMessage, ...]
    metadata: pb.InjectionMetadata | None
    fallback_reason: str
    from_service: bool
    elapsed_seconds: float

    @property
    def degraded(self) -> bool:
        return bool(self.fallback_reason)
