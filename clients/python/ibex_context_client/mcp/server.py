"""The memory API as MCP tools, for agents that remember or look something up on purpose.

``ibex-context mcp`` serves them over stdio (the agent's host starts the process) or streamable
HTTP. Each tool call is one MemoryService call through ``MemoryClient``, as the caller:

* stdio: the process's credential, ``IBEX_TOKEN`` / ``IBEX_TOKEN_FILE`` / ``--token-file``
  (and ``IBEX_TLS_*``), as for every client command;
* HTTP: the ``Authorization: Bearer`` header of the MCP request, forwarded as it came; the
  server's own token is never lent to an HTTP caller. No header: the service answers
  UNAUTHENTICATED (unless it runs without authentication).

Whose memories: the org and agent the server was started for (``--org``, ``--agent``); over HTTP
the ``X-Ibex-Org-Id`` / ``X-Ibex-Agent-Id`` headers name them per request instead. The service
decides what the credential may touch (an org-bound token reaches its own org only), so a header
cannot widen it.

A refused or failed call is the tool's error result, with the service's reason (the field it
named for a bad argument); nothing is retried behind the agent's back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from mcp.server.fastmcp import Context, FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from pydantic import BaseModel, Field

from ibex_context_client.credentials import ClientCredentials
from ibex_context_client.memory import MemoryClient, MemoryClientError
from ibex_context_client.memory_views import StoredMemory
from ibex_context_client.messages import DEFAULT_CONFIDENCE, Category, NewMemory

__all__ = ["HEADER_AGENT", "HEADER_ORG", "McpConfig", "MemoryToWrite", "build_server"]

T = TypeVar("T")
Transport = Literal["stdio", "http"]

HEADER_ORG = "x-ibex-org-id"
HEADER_AGENT = "x-ibex-agent-id"

INSTRUCTIONS = (
    "Long-term memory of this agent. search_memories before answering from what you may have learnt "
    "earlier; upsert_memories to keep a fact, preference or procedure for later conversations; "
    "get_memories and delete_memories by id; set_directive replaces the agent's standing instructions."
)


@dataclass(frozen=True, slots=True)
class McpConfig:
    target: str
    credentials: ClientCredentials
    transport: Transport = "stdio"
    org_id: str = ""
    agent_id: str = ""
    timeout_seconds: float = 10.0


class MemoryToWrite(BaseModel):
    """One memory for upsert_memories."""

    content: Annotated[str, Field(description="The memory itself, a self-contained statement.")]
    category: Annotated[
        Category,
        Field(description="procedural, factual, preference, behavioral or episodic."),
    ] = Category.FACTUAL
    id: Annotated[str | None, Field(description="Set to update that memory; empty for a new one.")] = None
    confidence: Annotated[float, Field(ge=0.0, le=1.0, description="How sure, 0..1.")] = DEFAULT_CONFIDENCE
    metadata: Annotated[dict[str, Any], Field(description="Any JSON object kept with it.")] = {}


def memory_view(memory: StoredMemory) -> dict[str, Any]:
    """A stored memory as a tool returns it (no embedding: numbers the agent cannot use)."""
    return {
        "id": memory.id,
        "content": memory.content,
        "category": memory.category,
        "confidence": memory.confidence,
        "usefulness": memory.usefulness,
        "metadata": memory.metadata,
        "occurred_at": memory.occurred_at,
        "updated_at": memory.updated_at,
    }


def _headers(ctx: Context[Any, Any, Any]) -> Mapping[str, str]:
    request = ctx.request_context.request
    headers = getattr(request, "headers", None)
    return headers if headers is not None else {}


class _Calls:
    """Opens a ``MemoryClient`` per tool call as the caller, and turns its failure into the
    tool's error. A connection per call: tool calls are few, and each caller's credential is
    its own."""

    def __init__(self, config: McpConfig) -> None:
        self._config = config
        self._transport_credentials = ClientCredentials(
            ca_file=config.credentials.ca_file,
            cert_file=config.credentials.cert_file,
            key_file=config.credentials.key_file,
            tls=config.credentials.tls,
        )

    def tenant(self, ctx: Context[Any, Any, Any]) -> tuple[str, str]:
        headers = _headers(ctx) if self._config.transport == "http" else {}
        org_id = headers.get(HEADER_ORG, "").strip() or self._config.org_id
        agent_id = headers.get(HEADER_AGENT, "").strip() or self._config.agent_id
        if not org_id or not agent_id:
            raise ToolError(
                "no org or agent: start the server with --org and --agent, or send the "
                f"{HEADER_ORG} and {HEADER_AGENT} headers"
            )
        return org_id, agent_id

    def _token(self, ctx: Context[Any, Any, Any]) -> str | None:
        if self._config.transport == "stdio":
            return self._config.credentials.token
        scheme, _, token = _headers(ctx).get("authorization", "").partition(" ")
        return token.strip() if scheme.lower() == "bearer" and token.strip() else None

    async def __call__(self, ctx: Context[Any, Any, Any], work: Callable[[MemoryClient], Awaitable[T]]) -> T:
        try:
            # Refuses (ValueError) a token it would send in clear text off loopback.
            client = MemoryClient(
                self._config.target,
                timeout=self._config.timeout_seconds,
                credentials=self._transport_credentials,
                token=self._token(ctx),
            )
            async with client:
                return await work(client)
        except (MemoryClientError, ValueError) as exc:
            raise ToolError(str(exc)) from None


def build_server(config: McpConfig, *, host: str = "127.0.0.1", port: int = 8000) -> FastMCP:
    """The MCP server with the memory tools (``host``/``port``: the HTTP transport's)."""
    server = FastMCP(
        "ibex-context",
        instructions=INSTRUCTIONS,
        host=host,
        port=port,
        log_level="WARNING",
        stateless_http=True,
    )
    call = _Calls(config)

    @server.tool()
    async def search_memories(
        ctx: Context[Any, Any, Any],
        query: Annotated[str, Field(description="What to look for, in words.")],
        top_k: Annotated[int, Field(ge=1, le=100, description="At most this many, best first.")] = 10,
    ) -> list[dict[str, Any]]:
        """Search this agent's long-term memories by meaning and words; best match first."""
        org_id, agent_id = call.tenant(ctx)
        hits = await call(ctx, lambda c: c.search_memories(org_id, agent_id, query, top_k=top_k))
        return [{**memory_view(h.memory), "relevance": h.relevance} for h in hits]

    @server.tool()
    async def get_memories(
        ctx: Context[Any, Any, Any],
        ids: Annotated[list[str], Field(description="Memory ids (at most 1000).")],
    ) -> list[dict[str, Any]]:
        """This agent's memories with these ids, in that order; unknown ids are left out."""
        org_id, agent_id = call.tenant(ctx)
        found = await call(ctx, lambda c: c.get_memories(org_id, agent_id, ids))
        return [memory_view(m) for m in found]

    @server.tool()
    async def upsert_memories(
        ctx: Context[Any, Any, Any],
        memories: Annotated[list[MemoryToWrite], Field(description="The memories to keep.")],
    ) -> list[dict[str, str]]:
        """Keep memories for later conversations (an id updates that memory). Returns each one's
        id and whether it was created, updated or unchanged."""
        org_id, agent_id = call.tenant(ctx)
        batch = [
            NewMemory(
                content=m.content,
                category=m.category.value,
                confidence=m.confidence,
                id=m.id or None,
                metadata=m.metadata,
            )
            for m in memories
        ]
        results = await call(ctx, lambda c: c.upsert_memories(org_id, agent_id, batch))
        return [{"id": r.id, "outcome": r.outcome} for r in results]

    @server.tool()
    async def delete_memories(
        ctx: Context[Any, Any, Any],
        ids: Annotated[list[str], Field(description="Memory ids to delete.")],
    ) -> dict[str, int]:
        """Delete this agent's memories with these ids; returns how many there were."""
        org_id, agent_id = call.tenant(ctx)
        deleted = await call(ctx, lambda c: c.delete_memories(org_id, agent_id, ids))
        return {"deleted": deleted}

    @server.tool()
    async def set_directive(
        ctx: Context[Any, Any, Any],
        content: Annotated[str, Field(description="The agent's standing instructions, whole.")],
    ) -> dict[str, int]:
        """Replace the agent's directive (sent with every request); returns its new version."""
        org_id, agent_id = call.tenant(ctx)
        version = await call(ctx, lambda c: c.set_directive(org_id, agent_id, content))
        return {"version": version}

    @server.tool()
    async def get_directive(ctx: Context[Any, Any, Any]) -> dict[str, Any]:
        """The agent's current directive and its version."""
        org_id, agent_id = call.tenant(ctx)
        directive = await call(ctx, lambda c: c.get_directive(org_id, agent_id))
        return {"exists": directive.exists, "content": directive.content, "version": directive.version}

    return server
