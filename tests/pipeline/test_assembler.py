"""The assembler's contract with its caller: whatever breaks inside, it answers.

The stores here are small in-memory implementations of the narrow interfaces in
``stores.base``; the real ones are exercised end to end in ``tests/server``.
"""

from __future__ import annotations

import numpy as np
from ibex_context.embedding.hashing import HashingEmbedder
from ibex_context.models import ChatMessage, Degradation, Directive, FloatVector, MemoryRecord, Source
from ibex_context.pipeline.assembler import Assembler, AssemblerConfig, AssemblyRequest
from ibex_context.pipeline.retrieval import Retriever
from ibex_context.profiles.model import Profile, Scoring, ScoringWeights
from ibex_context.tokens.counting import MessageTokenCounter
from ibex_context.tokens.encodings import EncodingRegistry

ORG = "0b6f7a4e-8f1c-4b53-9a51-5b1a3c7c2d01"
AGENT = "5d2e9c1a-3b4f-4e6a-8c7d-9f0a1b2c3d11"


class _Directives:
    async def get_directive(self, org_id: str, agent_id: str) -> Directive | None:
        return Directive("Be exact.")


class _Hot:
    def __init__(self, embedding: FloatVector) -> None:
        self._embedding = embedding

    async def get_hot_memories(self, org_id: str, agent_id: str, limit: int) -> list[MemoryRecord]:
        return [
            MemoryRecord(
                id="7c1d2e3f-4a5b-4c6d-8e9f-0a1b2c3d4e02",
                content="The warehouse opens at six.",
                category="factual",
                embedding=self._embedding,
                source=Source.HOT,
            )
        ]


class _Cold:
    async def search(
        self, org_id: str, agent_id: str, embedding: FloatVector, limit: int
    ) -> list[MemoryRecord]:
        return []


async def _assembler() -> Assembler:
    embedder = HashingEmbedder(384)
    (vector,) = await embedder.embed(["The warehouse opens at six."])
    encodings = EncodingRegistry()
    # As the service does at start-up: loading a BPE file takes up to a second.
    encodings.preload(["o200k_base", "cl100k_base"])
    return Assembler(
        retriever=Retriever(
            directives=_Directives(),
            hot_memories=_Hot(np.asarray(vector)),
            cold_memories=_Cold(),
            embedder=embedder,
        ),
        encodings=encodings,
        message_counter=MessageTokenCounter(encodings),
        config=AssemblerConfig(hot_limit=20, cold_limit=50, query_max_chars=2000, nonce_secret=b"s"),
    )


REQUEST = AssemblyRequest(
    org_id=ORG,
    agent_id=AGENT,
    session_id="",
    model="gpt-4o",
    request_id="r",
    messages=(ChatMessage("user", "when does the warehouse open?"),),
)


async def test_a_healthy_assembly_injects_directive_and_memory() -> None:
    assembly = await (await _assembler()).assemble(REQUEST, Profile(), deadline=1.0)
    assert assembly.degradation is Degradation.FULL
    assert assembly.directive_injected and len(assembly.memories) == 1
    assert assembly.messages[-1] == REQUEST.messages[-1]


async def test_an_exception_inside_assembly_degrades_to_the_fetched_directive() -> None:
    # All-zero weights cannot be scored: the kind of bug that must not fail the LLM call.
    broken = Profile(scoring=Scoring(weights=ScoringWeights(0, 0, 0, 0, 0)))
    assembly = await (await _assembler()).assemble(REQUEST, broken, deadline=1.0)
    assert assembly.reasons[0] == "assembly_error"
    assert assembly.degradation is Degradation.DIRECTIVE_ONLY
    assert assembly.directive_injected and not assembly.memories
    assert "Be exact." in assembly.messages[0].content
    assert assembly.messages[-1] == REQUEST.messages[-1]


async def test_no_time_at_all_passes_the_messages_through() -> None:
    assembly = await (await _assembler()).assemble(REQUEST, Profile(), deadline=0.0)
    assert assembly.degradation is Degradation.PASS_THROUGH
    assert assembly.reasons[0] == "deadline_exceeded"
    assert assembly.messages == REQUEST.messages
