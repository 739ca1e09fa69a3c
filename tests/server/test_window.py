"""The model's window and the response reserve are hard limits: the directive is
injected only when it fits beside the client's messages, and the percentage of the
window used is never rounded down below an overflow. Real gRPC, real stores."""

from __future__ import annotations

from ibex_context.models import ChatMessage
from ibex_context.tokens.counting import MessageTokenCounter
from ibex_context.tokens.encodings import EncodingRegistry
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb
from ibex_context_client.proto.ibex.context.v1 import context_pb2_grpc

from tests.conftest import Tenant

from .conftest import request, user

# gpt-4: an 8,192-token window (cl100k_base, exact); the response reserve is 15 %
# (1,229) and the safety buffer 2 % (164): prompts up to 6,799 tokens leave both.
GPT4_WINDOW = 8_192
GPT4_PROMPT_LIMIT = GPT4_WINDOW - 1_229 - 164
PASS_THROUGH = pb.DEGRADATION_LEVEL_PASS_THROUGH


def _message_of(tokens: int, encodings: EncodingRegistry) -> str:
    """A user message whose chat-formatted count (cl100k_base) is exactly ``tokens``."""
    counter, encoding = MessageTokenCounter(encodings, cache_size=0), encodings.get("cl100k_base")
    words = tokens
    for _ in range(10):
        content = "hello" + " hello" * (words - 1)
        counted = counter.count_messages([ChatMessage("user", content)], encoding)
        if counted == tokens:
            return content
        words += tokens - counted
    raise AssertionError(f"no message of exactly {tokens} tokens")


async def _assemble(
    assembly: context_pb2_grpc.ContextAssemblyServiceStub, tenant: Tenant, content: str
) -> pb.AssembleContextResponse:
    return await assembly.AssembleContext(
        request(tenant.org_id, tenant.agent_id, user(content), model="gpt-4"), timeout=10
    )


async def test_the_directive_is_injected_only_when_it_leaves_the_response_reserve(
    assembly: context_pb2_grpc.ContextAssemblyServiceStub,
    memories: context_pb2_grpc.MemoryServiceStub,
    tenant: Tenant,
    encodings: EncodingRegistry,
) -> None:
    await memories.SetDirective(
        pb.SetDirectiveRequest(
            org_id=tenant.org_id, agent_id=tenant.agent_id, content="Answer in French, briefly."
        ),
        timeout=10,
    )
    short = await _assemble(assembly, tenant, "bonjour")
    assert short.metadata.directive_injected
    directive_tokens = short.metadata.total_tokens_injected

    fits = _message_of(GPT4_PROMPT_LIMIT - directive_tokens, encodings)
    reply = await _assemble(assembly, tenant, fits)
    assert reply.metadata.directive_injected
    assert reply.metadata.total_tokens_injected == directive_tokens
    assert reply.metadata.context_window_used == 83  # ceil(100 * 6,799 / 8,192)

    one_too_many = _message_of(GPT4_PROMPT_LIMIT - directive_tokens + 1, encodings)
    reply = await _assemble(assembly, tenant, one_too_many)
    assert not reply.metadata.directive_injected
    assert reply.metadata.total_tokens_injected == 0
    assert reply.metadata.degradation_level == PASS_THROUGH
    assert reply.metadata.fallback_reason == "directive_exceeds_window"
    assert [(m.role, m.content) for m in reply.messages] == [("user", one_too_many)]


async def test_messages_that_fill_the_window_pass_through_with_their_true_share(
    assembly: context_pb2_grpc.ContextAssemblyServiceStub,
    memories: context_pb2_grpc.MemoryServiceStub,
    tenant: Tenant,
    encodings: EncodingRegistry,
) -> None:
    await memories.SetDirective(
        pb.SetDirectiveRequest(org_id=tenant.org_id, agent_id=tenant.agent_id, content="Be exact."),
        timeout=10,
    )
    # The reported case: 8,159 tokens of messages, and a directive on top overflowed
    # the window while the answer said FULL, 100 %.
    reply = await _assemble(assembly, tenant, _message_of(8_159, encodings))
    assert not reply.metadata.directive_injected
    assert reply.metadata.degradation_level == PASS_THROUGH
    assert reply.metadata.fallback_reason == "messages_exceed_window"
    assert reply.metadata.context_window_used == 100  # 99.6 %

    over = await _assemble(assembly, tenant, _message_of(8_200, encodings))
    assert over.metadata.context_window_used == 101, "past the window shows above 100"
    assert over.metadata.fallback_reason == "messages_exceed_window"
