"""CLI commands of the memory API's read side, export and purge (issue 16).

Registered on the ``ibex-context`` group by ``cli``. Each prints JSON (one object
per line where there can be many) so its output pipes into ``jq`` or a file;
``export`` writes exactly what ``import`` reads.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from datetime import datetime
from typing import Any, TypeVar

import click
from ibex_context_client.credentials import ClientCredentials
from ibex_context_client.memory import MemoryClient, MemoryClientError
from ibex_context_client.memory_views import ORDERS, export_line
from ibex_context_client.target import parse_target

from ibex_context.cli_support import Progress, echo_json

T = TypeVar("T")


def _check_target(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    # The clients' own parser: whatever they accept (host:port, [v6]:port, dns:///name:port).
    try:
        parse_target(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


TARGET_OPTION = click.option(
    "--target",
    default="127.0.0.1:50051",
    show_default=True,
    envvar="IBEX_TARGET",
    show_envvar=True,
    callback=_check_target,
    help="The service: host:port, [v6]:port or dns:///name:port.",
)
# These commands print JSON already; --json is accepted so scripts can pass it to every command.
_JSON_ALREADY = click.option(
    "--json", "as_json", is_flag=True, help="JSON output (this command's only format)."
)
_ORG = click.option("--org", "org_id", required=True)
_AGENT = click.option("--agent", "agent_id", required=True)


def client_credentials() -> dict[str, Any]:
    """The ``credentials`` argument of a client (TLS, token), from the top-level flags and env."""
    ctx = click.get_current_context(silent=True)
    found = ctx.find_object(ClientCredentials) if ctx is not None else None
    return {"credentials": found or ClientCredentials.from_env()}


def call_memory(
    target: str,
    work: Callable[[MemoryClient], Awaitable[T]],
    *,
    timeout: float = 60.0,
    batch_size: int = 500,
) -> T:
    """Run ``work`` with a ``MemoryClient``; its failure becomes the command's error message."""

    async def run() -> T:
        async with MemoryClient(
            target, timeout=timeout, batch_size=batch_size, **client_credentials()
        ) as client:
            return await work(client)

    try:
        return asyncio.run(run())
    except MemoryClientError as exc:
        raise click.ClickException(str(exc)) from None


def _time(value: str | None, option: str) -> datetime | None:
    if value is None:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"expected an ISO 8601 time, got {value!r}", param_hint=option) from None


@click.group("memories")
def memories() -> None:
    """Read an agent's memories: get, list, search."""


@memories.command("get")
@TARGET_OPTION
@_ORG
@_AGENT
@click.option("--embedding", is_flag=True, help="Include the embeddings.")
@_JSON_ALREADY
@click.argument("ids", nargs=-1, required=True)
def memories_get(
    target: str, org_id: str, agent_id: str, embedding: bool, as_json: bool, ids: tuple[str, ...]
) -> None:
    """Print the memories with these IDS (one JSON object per line)."""
    found = call_memory(target, lambda c: c.get_memories(org_id, agent_id, ids, include_embedding=embedding))
    for memory in found:
        echo_json(asdict(memory))


@memories.command("list")
@TARGET_OPTION
@_ORG
@_AGENT
@click.option("--category", "categories", multiple=True, help="Only this category (repeatable).")
@click.option("--order", type=click.Choice(sorted(ORDERS)), default="created_desc", show_default=True)
@click.option("--created-after", default=None, help="ISO 8601, inclusive.")
@click.option("--created-before", default=None, help="ISO 8601, exclusive.")
@click.option("--occurred-after", default=None, help="ISO 8601, inclusive.")
@click.option("--occurred-before", default=None, help="ISO 8601, exclusive.")
@click.option("--page-size", default=100, show_default=True)
@click.option("--page-token", default="", help="Continue from a previous page.")
@click.option("--all", "every_page", is_flag=True, help="Follow the pages to the end.")
@_JSON_ALREADY
def memories_list(
    target: str,
    org_id: str,
    agent_id: str,
    categories: tuple[str, ...],
    order: str,
    created_after: str | None,
    created_before: str | None,
    occurred_after: str | None,
    occurred_before: str | None,
    page_size: int,
    page_token: str,
    every_page: bool,
    as_json: bool,
) -> None:
    """Print a page of the agent's memories (JSON lines); the next page's token goes to stderr."""
    created = (_time(created_after, "--created-after"), _time(created_before, "--created-before"))
    occurred = (_time(occurred_after, "--occurred-after"), _time(occurred_before, "--occurred-before"))

    async def work(client: MemoryClient) -> str:
        token = page_token
        while True:
            page = await client.list_memories(
                org_id,
                agent_id,
                page_size=page_size,
                page_token=token,
                categories=categories,
                order=order,
                created_after=created[0],
                created_before=created[1],
                occurred_after=occurred[0],
                occurred_before=occurred[1],
            )
            for memory in page.memories:
                echo_json(asdict(memory))
            token = page.next_page_token
            if not every_page or not token:
                return token

    next_token = call_memory(target, work)
    if next_token:
        click.echo(f"next page: --page-token {next_token}", err=True)


@memories.command("search")
@TARGET_OPTION
@_ORG
@_AGENT
@click.option("--top-k", default=10, show_default=True)
@_JSON_ALREADY
@click.argument("query", nargs=-1, required=True)
def memories_search(
    target: str, org_id: str, agent_id: str, top_k: int, as_json: bool, query: tuple[str, ...]
) -> None:
    """Print what the cold retrieval finds for QUERY, best first, with its relevance components."""
    hits = call_memory(target, lambda c: c.search_memories(org_id, agent_id, " ".join(query), top_k=top_k))
    for hit in hits:
        echo_json(
            {
                "id": hit.memory.id,
                "similarity": round(hit.similarity, 4),
                "lexical_score": round(hit.lexical_score, 4),
                "relevance": round(hit.relevance, 4),
                "category": hit.memory.category,
                "content": hit.memory.content,
            }
        )


@click.command("get")
@TARGET_OPTION
@_ORG
@_AGENT
@_JSON_ALREADY
def directive_get(target: str, org_id: str, agent_id: str, as_json: bool) -> None:
    """Print the agent's directive with its version (JSON)."""
    echo_json(asdict(call_memory(target, lambda c: c.get_directive(org_id, agent_id))))


@click.command("export")
@TARGET_OPTION
@_ORG
@click.option("--agent", "agent_id", default="", help="Only this agent (default: every agent of the org).")
@click.option("--embeddings", is_flag=True, help="Include the embeddings (import then skips embedding).")
@click.option("--page-size", default=500, show_default=True)
@click.option("--progress/--no-progress", default=True, help="Report progress on stderr.")
@_JSON_ALREADY
def export(
    target: str, org_id: str, agent_id: str, embeddings: bool, page_size: int, progress: bool, as_json: bool
) -> None:
    """Write the org's (or one agent's) memories as JSONL to stdout, for `ibex-context import`;
    progress and the count go to stderr."""
    meter = Progress("exported", enabled=progress)

    async def work(client: MemoryClient) -> int:
        count = 0
        async for page in client.export_pages(
            org_id, agent_id, include_embedding=embeddings, page_size=page_size
        ):
            sys.stdout.write(
                "".join(json.dumps(export_line(org_id, m), ensure_ascii=False) + "\n" for m in page)
            )
            count += len(page)
            meter.advance(count=len(page))
        sys.stdout.flush()
        return count

    try:
        count = call_memory(target, work)
    finally:
        meter.finish()
    click.echo(f"exported {count} memories", err=True)


@click.command("purge")
@TARGET_OPTION
@_ORG
@click.option("--agent", "agent_id", default="", help="Only this agent (default: the whole org).")
@click.option("--yes", is_flag=True, help="Do it (without it, nothing is deleted).")
@_JSON_ALREADY
def purge(target: str, org_id: str, agent_id: str, yes: bool, as_json: bool) -> None:
    """Delete every memory, directive, counter and cache entry of an agent or a whole org."""
    if not yes:
        scope = f"agent {agent_id} of org {org_id}" if agent_id else f"every agent of org {org_id}"
        raise click.ClickException(f"this deletes everything of {scope}; add --yes to do it")

    async def work(client: MemoryClient) -> Any:
        if agent_id:
            return await client.purge_agent(org_id, agent_id)
        return await client.purge_org(org_id)

    echo_json(asdict(call_memory(target, work, timeout=120.0)))
