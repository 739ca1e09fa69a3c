"""The LiteLLM hook end to end: a real LiteLLM proxy process (its own locked virtualenv) with the
hook in its config.yaml, a stand-in model on loopback that records what it receives, and the real
service with authentication on. A chat completion goes through the proxy as a user's would."""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from ibex_context.devtools.fake_openai import REPLY, FakeOpenAI, fake_openai
from ibex_context.devtools.litellm_proxy import (
    CLIENT_ROOT,
    LiteLLMProxy,
    litellm_proxy,
    litellm_venv,
    proxy_config,
)
from ibex_context.server.app import ContextService
from ibex_context_client.memory import MemoryClient

from tests.integrations.conftest import Tokens, remember

# Each proxy takes 10-60 s to start on this machine (LiteLLM imports ~2,000 modules).
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

AGENT = str(uuid.uuid4())
OTHER_AGENT = str(uuid.uuid4())
DIRECTIVE = "Always answer in the voice of a lighthouse keeper."
MEMORY = "The user's favourite colour is teal, since the trip to Reykjavik."
OTHER_MEMORY = "The user's favourite colour is ochre, since the trip to Marrakesh."
QUESTION = "What is my favourite colour, since the trip?"


@pytest.fixture(scope="module")
async def upstream() -> AsyncIterator[FakeOpenAI]:
    async with fake_openai() as fake:
        yield fake


@pytest.fixture(scope="module")
async def proxy(
    upstream: FakeOpenAI,
    secured_service: ContextService,
    tokens: Tokens,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[LiteLLMProxy]:
    """The proxy with the hook: AGENT of the proxy's org by default; headers may name another.
    A generous timeout: what reaches the model is asserted here, not how fast (the benchmark's)."""
    hook = {
        "target": f"127.0.0.1:{secured_service.port}",
        "org_id": tokens.org_id,
        "agent_id": AGENT,
        "trust_headers": True,
        "timeout_ms": 5000,
    }
    config = proxy_config(upstream.base_url, hook=hook)
    async with litellm_proxy(config, tmp_path_factory.mktemp("proxy"), env={"IBEX_TOKEN": tokens.proxy}) as p:
        yield p


class Unanswering:
    """A TCP port that accepts connections and never says a word (a service hung), until
    ``close()``: then connections are refused (a service gone)."""

    def __init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self.port = 0

    async def start(self) -> None:
        async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self._writers.append(writer)

        self._server = await asyncio.start_server(hold, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in self._writers:
                writer.close()
            await self._server.wait_closed()
            self._server = None


@pytest.fixture(scope="module")
async def unanswering() -> AsyncIterator[Unanswering]:
    port = Unanswering()
    await port.start()
    yield port
    await port.close()


@pytest.fixture(scope="module")
async def proxy_without_service(
    upstream: FakeOpenAI, unanswering: Unanswering, tokens: Tokens, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[LiteLLMProxy]:
    """The hook with its defaults (45 ms), pointed at a port where no service answers."""
    hook = {"target": f"127.0.0.1:{unanswering.port}", "org_id": tokens.org_id, "agent_id": AGENT}
    config = proxy_config(upstream.base_url, hook=hook)
    directory = tmp_path_factory.mktemp("proxy-down")
    async with litellm_proxy(config, directory, env={"IBEX_TOKEN": tokens.proxy}) as p:
        yield p


async def chat(
    proxy: LiteLLMProxy, messages: list[dict[str, Any]], headers: dict[str, str] | None = None
) -> httpx.Response:
    """The proxy's answer, checked to be the model's."""
    async with httpx.AsyncClient(timeout=60.0) as http:
        reply = await http.post(
            f"{proxy.base_url}/v1/chat/completions",
            headers={**proxy.headers, **(headers or {})},
            json={"model": "gpt-4o", "messages": messages},
        )
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == REPLY
    return reply


def sent_to_model(upstream: FakeOpenAI) -> str:
    """Everything the model was sent in the last request, as one text."""
    return "\n".join(str(m.get("content")) for m in upstream.received[-1]["messages"])


async def test_the_model_receives_the_directive_and_the_memory(
    proxy: LiteLLMProxy, upstream: FakeOpenAI, service_target: str, tokens: Tokens
) -> None:
    async with MemoryClient(service_target, token=tokens.agent) as client:
        await client.set_directive(tokens.org_id, AGENT, DIRECTIVE)
    await remember(service_target, tokens.agent, tokens.org_id, AGENT, MEMORY)

    answer = await chat(proxy, [{"role": "user", "content": QUESTION}])

    assert answer.headers["x-ibex-context"] == "assembled"
    assert float(answer.headers["x-ibex-context-ms"]) > 0
    sent = sent_to_model(upstream)
    assert DIRECTIVE in sent
    assert MEMORY in sent
    assert QUESTION in sent
    # The proxy's log holds none of it, nor the proxy's token.
    log = proxy.log_tail(1_000_000)
    assert MEMORY not in log and DIRECTIVE not in log and tokens.proxy not in log


async def test_trusted_headers_name_the_agent_and_a_header_cannot_reach_another_org(
    proxy: LiteLLMProxy, upstream: FakeOpenAI, service_target: str, tokens: Tokens
) -> None:
    await remember(service_target, tokens.agent, tokens.org_id, OTHER_AGENT, OTHER_MEMORY)

    other_agent = await chat(proxy, [{"role": "user", "content": QUESTION}], {"x-ibex-agent-id": OTHER_AGENT})
    assert other_agent.headers["x-ibex-context"] == "assembled"
    assert OTHER_MEMORY in sent_to_model(upstream)
    assert DIRECTIVE not in sent_to_model(upstream)  # AGENT's, not OTHER_AGENT's

    # The proxy's token is bound to its org: the service refuses another, and the request
    # goes to the model as it came.
    other_org = {"x-ibex-org-id": tokens.other_org_id, "x-ibex-agent-id": OTHER_AGENT}
    refused = await chat(proxy, [{"role": "user", "content": QUESTION}], other_org)
    assert refused.headers["x-ibex-context"] == "fallback:client_error:PERMISSION_DENIED"
    assert upstream.received[-1]["messages"] == [{"role": "user", "content": QUESTION}]


async def test_a_request_with_tool_calls_passes_untouched(proxy: LiteLLMProxy, upstream: FakeOpenAI) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup_colour", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "teal"},
    ]

    answer = await chat(proxy, messages)

    assert answer.headers["x-ibex-context"] == "skipped"
    received = upstream.received[-1]["messages"]
    assert [m["role"] for m in received] == ["user", "assistant", "tool"]
    assert received[1]["tool_calls"][0]["function"]["name"] == "lookup_colour"
    assert DIRECTIVE not in sent_to_model(upstream)


async def test_it_still_answers_when_the_service_hangs_and_when_it_is_gone(
    proxy_without_service: LiteLLMProxy, upstream: FakeOpenAI, unanswering: Unanswering
) -> None:
    question = [{"role": "user", "content": QUESTION}]

    hung = await chat(proxy_without_service, question)
    assert hung.headers["x-ibex-context"] == "fallback:client_timeout"
    assert upstream.received[-1]["messages"] == question

    await unanswering.close()
    gone = await chat(proxy_without_service, question)
    assert gone.headers["x-ibex-context"] == "fallback:client_unavailable"
    assert upstream.received[-1]["messages"] == question
    log = proxy_without_service.log_tail(1_000_000)
    assert "context assembly fell back (client_timeout" in log
    assert "context assembly fell back (client_unavailable" in log


def test_the_hook_loads_nothing_of_the_server_in_the_proxy() -> None:
    """It ships in the client distribution: in the proxy's own environment, with only the
    client's source on the path, the hook imports and the server is not even importable."""
    script = (
        "import importlib.util, sys, ibex_context_client.litellm.hook\n"
        "print('server importable:', importlib.util.find_spec('ibex_context') is not None)\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('ibex_context')))"
    )
    loaded = subprocess.run(
        [str(litellm_venv() / "bin" / "python"), "-c", script],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(CLIENT_ROOT)},
        timeout=120,
    )
    first, *modules = loaded.stdout.splitlines()
    assert first == "server importable: False"
    assert "ibex_context_client.litellm.hook" in modules and "ibex_context_client.context" in modules
    assert all(m.split(".")[0] == "ibex_context_client" for m in modules), modules


def test_a_token_it_would_send_in_clear_text_disables_the_hook_once() -> None:
    """Off loopback without TLS the client refuses the token: the hook says so once, at ERROR,
    and every request goes out as it came."""
    script = """
import asyncio, logging, sys
from ibex_context_client.credentials import ClientCredentials
from ibex_context_client.litellm.hook import IbexContextHook
from ibex_context_client.litellm.request import HookConfig

logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(levelname)s %(message)s")

async def main():
    hook = IbexContextHook(HookConfig("ibex.example.com:50051", 0.045, "org", "agent"),
                           ClientCredentials(token="secret-token-never-logged"))
    for n in range(3):
        data = {"messages": [{"role": "user", "content": "Hi"}], "litellm_call_id": f"c{n}"}
        assert await hook.async_pre_call_hook(None, None, data, "acompletion") is data
        assert data["messages"] == [{"role": "user", "content": "Hi"}]
        print(await hook.async_post_call_response_headers_hook(data, None, None))

asyncio.run(main())
"""
    ran = subprocess.run(
        [str(litellm_venv() / "bin" / "python"), "-c", script],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(CLIENT_ROOT)},
        timeout=120,
    )
    lines = ran.stdout.splitlines()
    errors = [line for line in lines if line.startswith("ERROR")]
    assert len(errors) == 1 and "refusing to send a bearer token in plaintext" in errors[0]
    assert lines.count("{'x-ibex-context': 'skipped'}") == 3
    assert "secret-token-never-logged" not in ran.stdout + ran.stderr
