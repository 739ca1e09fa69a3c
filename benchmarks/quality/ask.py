"""Asking the service: each question as the single user message of ``AssembleContext``
through the public client, and reading what was injected from ``metadata.memories``.

By default each question is asked once, cold (the service has never embedded it),
with the proxy's deadline (45 ms, ``SERVED_DEADLINE_SECONDS``) as the call's gRPC
deadline: what a user's LLM request gets, degraded answers and round trips included.

The warm mode (``--warm``) first asks each question of a warm-up agent that has no
memories (nothing is injected, nothing is counted) until the service has its query
embedding cached, then asks the real call with a 2 s deadline: it measures ranking
with every query embedding in hand, NOT what users are served.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from ibex_context.models import ChatMessage
from ibex_context_client.context import ContextClient
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb

from benchmarks.quality.ingest import Tenant

MODEL = "gpt-4o"
# The LLM proxy gives up on the service at 45 ms: a cold question is asked under it.
SERVED_DEADLINE_SECONDS = 0.045
# Warm mode's deadline (and the warm-up calls'): generous, as before the cold mode.
CALL_TIMEOUT_SECONDS = 2.0
WARM_UP_ATTEMPTS = 40
WARM_UP_PAUSE_SECONDS = 0.02
# The injection nonce as the formatter writes it (xml attribute, markdown info string).
_NONCE = re.compile(r'nonce="?([A-Za-z0-9_-]{8,128})')


@dataclass(frozen=True, slots=True)
class ServiceAnswer:
    memory_ids: tuple[str, ...]
    memory_tokens: int  # metadata.tokens.memory_tokens_used
    tokens_injected: int  # metadata.total_tokens_injected (directive included; none here)
    memory_budget: int  # metadata.tokens.memory_budget
    profile: str
    latency_ms: float
    degradation: str  # the DegradationLevel name, or the client's fallback reason
    reasons: tuple[str, ...]
    # The session's injection nonce, read from the injected text (None if not found),
    # so the baselines can pay exactly the framing the service paid.
    nonce: str | None = None

    @property
    def degraded(self) -> bool:
        return self.degradation != "DEGRADATION_LEVEL_FULL" or bool(self.reasons)


def _embedding_ready(metadata: pb.InjectionMetadata | None) -> bool:
    if metadata is None:
        return False
    return any(s.source == "embed" and s.status == pb.SOURCE_STATUS_OK for s in metadata.sources)


async def warm_query_embedding(client: ContextClient, warm_up: Tenant, question: str) -> bool:
    """True once the service has the question's embedding cached (a call of the
    memoryless warm-up agent found it in time)."""
    for _ in range(WARM_UP_ATTEMPTS):
        result = await client.assemble(
            org_id=warm_up.org_id,
            agent_id=warm_up.agent_id,
            model=MODEL,
            messages=[ChatMessage("user", question)],
            timeout=CALL_TIMEOUT_SECONDS,
        )
        if _embedding_ready(result.metadata):
            return True
        await asyncio.sleep(WARM_UP_PAUSE_SECONDS)
    return False


async def open_connection(client: ContextClient, warm_up: Tenant) -> None:
    """One call of the memoryless agent with a fixed text, so the client's HTTP/2 connection
    is up before the first question (a proxy's is long-lived)."""
    await client.assemble(
        org_id=warm_up.org_id,
        agent_id=warm_up.agent_id,
        model=MODEL,
        messages=[ChatMessage("user", "connection check")],
        timeout=CALL_TIMEOUT_SECONDS,
    )


async def ask(
    client: ContextClient, tenant: Tenant, question: str, session_id: str, *, timeout: float
) -> ServiceAnswer:
    result = await client.assemble(
        org_id=tenant.org_id,
        agent_id=tenant.agent_id,
        session_id=session_id,
        model=MODEL,
        messages=[ChatMessage("user", question)],
        timeout=timeout,
    )
    metadata = result.metadata
    latency_ms = result.elapsed_seconds * 1000
    if metadata is None:
        return ServiceAnswer((), 0, 0, 0, "", latency_ms, result.fallback_reason, (result.fallback_reason,))
    return ServiceAnswer(
        memory_ids=tuple(m.id for m in metadata.memories),
        memory_tokens=metadata.tokens.memory_tokens_used,
        tokens_injected=metadata.total_tokens_injected,
        memory_budget=metadata.tokens.memory_budget,
        profile=metadata.profile,
        latency_ms=latency_ms,
        degradation=pb.DegradationLevel.Name(metadata.degradation_level),
        reasons=tuple(metadata.degradation_reasons),
        nonce=_nonce_in(result.messages[0].content) if metadata.memories and result.messages else None,
    )


def _nonce_in(text: str) -> str | None:
    match = _NONCE.search(text)
    return match.group(1) if match else None
