"""The memory tools over MCP, called with the SDK's own client: over stdio (the process's
credential) and streamable HTTP (each caller's own), against the real service with
authentication on."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from ibex_context.devtools.litellm_proxy import CLIENT_ROOT, SOURCE_ROOT
from ibex_context_client.memory import MemoryClient
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

from tests.integrations.conftest import Tokens

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOOLS = {
    "search_memories",
    "get_memories",
    "upsert_memories",
    "delete_memories",
    "set_directive",
    "get_directive",
}
ENV = {
    "PYTHONPATH": os.pathsep.join((str(CLIENT_ROOT), str(SOURCE_ROOT))),
    "GRPC_ENABLE_FORK_SUPPORT": "false",
}


@asynccontextmanager
async def over_stdio(
    target: str, org_id: str, agent_id: str, token: str, errlog: Path
) -> AsyncIterator[ClientSession]:
    """A session with ``ibex-context mcp`` started over stdio, as an agent's host starts it."""
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "ibex_context", "mcp", "--target", target, "--org", org_id, "--agent", agent_id],
        env={**ENV, "IBEX_TOKEN": token},
    )
    with errlog.open("w") as stderr:
        async with (
            stdio_client(server, errlog=stderr) as (read, write),
            ClientSession(read, write) as session,
        ):
            await asyncio.wait_for(session.initialize(), 60)
            yield session


@asynccontextmanager
async def over_http(url: str, headers: dict[str, str]) -> AsyncIterator[ClientSession]:
    async with (
        httpx.AsyncClient(headers=headers, timeout=30.0) as http,
        streamable_http_client(url, http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await asyncio.wait_for(session.initialize(), 30)
        yield session


def payload(result: CallToolResult) -> Any:
    assert not result.isError, error_text(result)
    structured = result.structuredContent
    assert structured is not None
    return structured.get("result", structured)


def error_text(result: CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, TextContent))


async def test_an_agent_keeps_finds_gets_and_forgets_a_memory_over_stdio(
    service_target: str, tokens: Tokens, tmp_path: Path
) -> None:
    agent_id = str(uuid.uuid4())
    errlog = tmp_path / "mcp.stderr"
    async with over_stdio(service_target, tokens.org_id, agent_id, tokens.agent, errlog) as session:
        assert {t.name for t in (await session.list_tools()).tools} == TOOLS

        written = payload(
            await session.call_tool(
                "upsert_memories",
                {
                    "memories": [
                        {"content": "The deploy window is Tuesday 14:00 UTC.", "category": "procedural"}
                    ]
                },
            )
        )
        assert [w["outcome"] for w in written] == ["created"]
        memory_id = written[0]["id"]

        hits = payload(await session.call_tool("search_memories", {"query": "when is the deploy window"}))
        assert hits[0]["id"] == memory_id and hits[0]["category"] == "procedural"
        got = payload(await session.call_tool("get_memories", {"ids": [memory_id, str(uuid.uuid4())]}))
        assert [m["content"] for m in got] == ["The deploy window is Tuesday 14:00 UTC."]

        version = payload(await session.call_tool("set_directive", {"content": "Answer in French."}))[
            "version"
        ]
        directive = payload(await session.call_tool("get_directive", {}))
        assert directive == {"exists": True, "content": "Answer in French.", "version": version}

        # Stored for the org and agent the server was started for, as the service sees it.
        async with MemoryClient(service_target, token=tokens.admin) as admin:
            stored = await admin.get_memories(tokens.org_id, agent_id, [memory_id])
            assert [m.content for m in stored] == ["The deploy window is Tuesday 14:00 UTC."]
            assert (await admin.get_directive(tokens.org_id, agent_id)).content == "Answer in French."

        assert payload(await session.call_tool("delete_memories", {"ids": [memory_id]})) == {"deleted": 1}
        assert payload(await session.call_tool("get_memories", {"ids": [memory_id]})) == []
    assert tokens.agent not in errlog.read_text()


async def test_a_rejected_call_is_the_tools_error_naming_the_field(
    service_target: str, tokens: Tokens, tmp_path: Path
) -> None:
    async with over_stdio(
        service_target, tokens.org_id, str(uuid.uuid4()), tokens.agent, tmp_path / "err"
    ) as session:
        result = await session.call_tool("upsert_memories", {"memories": [{"content": "   "}]})
        assert result.isError
        assert "memories[0].content" in error_text(result)


async def test_over_stdio_the_processs_credential_reaches_its_own_org_only(
    service_target: str, tokens: Tokens, tmp_path: Path
) -> None:
    async with over_stdio(
        service_target, tokens.org_id, str(uuid.uuid4()), tokens.other_org_agent, tmp_path / "err"
    ) as session:
        result = await session.call_tool("search_memories", {"query": "anything"})
        assert result.isError
        assert "PERMISSION_DENIED" in error_text(result)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
async def http_server(secured_service: Any, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """``ibex-context mcp --transport http`` with no credential of its own; its /mcp URL."""
    port = _free_port()
    log = tmp_path_factory.mktemp("mcp-http") / "server.log"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("IBEX_")}
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "ibex_context", "mcp", "--transport", "http", "--port", str(port)),
            *("--target", f"127.0.0.1:{secured_service.port}"),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            env={**environment, **ENV},
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.returncode is None, log.read_text()
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"not listening after 60 s: {log.read_text()}"
                await asyncio.sleep(0.2)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()


async def test_over_http_each_caller_presents_its_own_credential(http_server: str, tokens: Tokens) -> None:
    agent_id = str(uuid.uuid4())
    tenant = {"X-Ibex-Org-Id": tokens.org_id, "X-Ibex-Agent-Id": agent_id}

    async with over_http(http_server, {**tenant, "Authorization": f"Bearer {tokens.agent}"}) as session:
        assert {t.name for t in (await session.list_tools()).tools} == TOOLS
        written = payload(
            await session.call_tool("upsert_memories", {"memories": [{"content": "Prefers metric units."}]})
        )
        hits = payload(await session.call_tool("search_memories", {"query": "metric units", "top_k": 3}))
        assert hits[0]["id"] == written[0]["id"]

    async with over_http(
        http_server, {**tenant, "Authorization": f"Bearer {tokens.other_org_agent}"}
    ) as session:
        refused = await session.call_tool("get_memories", {"ids": [written[0]["id"]]})
        assert refused.isError and "PERMISSION_DENIED" in error_text(refused)

    async with over_http(http_server, tenant) as session:
        anonymous = await session.call_tool("search_memories", {"query": "metric units"})
        assert anonymous.isError and "UNAUTHENTICATED" in error_text(anonymous)

    async with over_http(http_server, {"Authorization": f"Bearer {tokens.agent}"}) as session:
        nobody = await session.call_tool("search_memories", {"query": "metric units"})
        assert nobody.isError and "x-ibex-org-id" in error_text(nobody)
