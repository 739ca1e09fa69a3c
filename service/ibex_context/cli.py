"""The ``ibex-context`` command line."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

import click
from google.protobuf import json_format
from ibex_context_client.memory_views import EXPORT_ONLY_FIELDS
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb

from ibex_context.cli_memory import (
    TARGET_OPTION,
    call_memory,
    client_credentials,
    directive_get,
    export,
    memories,
    purge,
)
from ibex_context.cli_support import (
    JSON_OPTION,
    CommandGroup,
    Progress,
    describe_dsn,
    echo_json,
    one_line,
    settings_error_message,
)
from ibex_context.settings import Settings

if TYPE_CHECKING:
    from ibex_context_client import AssembleResult, MemoryClient

T = TypeVar("T")
log = logging.getLogger("ibex_context.cli")


def _run(
    main: Callable[[], Coroutine[Any, Any, T]], *, use_uvloop: bool = False, timed_loop: bool = False
) -> T:
    """``timed_loop``: asyncio's loop with its iterations timed (server/loop_lag.py)."""
    if use_uvloop:
        try:
            import uvloop

            return uvloop.run(main())
        except ImportError:
            pass
    if timed_loop:
        from ibex_context.server.loop_lag import TimedEventLoop

        with asyncio.Runner(loop_factory=TimedEventLoop) as runner:
            return runner.run(main())
    return asyncio.run(main())


def _settings(**overrides: Any) -> Settings:
    from pydantic import ValidationError

    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise click.ClickException(settings_error_message(exc)) from None


def _setup_logging(settings: Settings, *, quiet: bool = False, to_stderr: bool = False) -> None:
    """``quiet`` (the local commands' default): warnings only, unless IBEX_LOG_LEVEL
    is set; their terminal is for what they print, not for every call's log line.
    ``to_stderr``: a command whose stdout is one JSON document logs beside it, not into it."""
    from ibex_context.observability.logging import configure_logging

    level = "WARNING" if quiet and "IBEX_LOG_LEVEL" not in os.environ else settings.log_level
    configure_logging(level, settings.log_format, stream=sys.stderr if to_stderr else None)


_VERBOSE_HELP = "Log at IBEX_LOG_LEVEL (default INFO) instead of warnings only."


_PATH = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.group(cls=CommandGroup)
@click.version_option(package_name="ibex-context")
@click.option(
    "--debug",
    is_flag=True,
    envvar="IBEX_DEBUG",
    help="Show the traceback of an unexpected error (default: one line).",
)
@click.option("--tls", is_flag=True, help="Client commands: TLS, the server verified by the system's CAs.")
@click.option(
    "--tls-ca", type=_PATH, help="Client commands: TLS, the server verified by this CA bundle [IBEX_TLS_CA]."
)
@click.option("--tls-cert", type=_PATH, help="Client certificate for mutual TLS [IBEX_TLS_CERT].")
@click.option("--tls-key", type=_PATH, help="Its private key [IBEX_TLS_KEY].")
@click.option("--token-file", type=_PATH, help="File holding the bearer token [IBEX_TOKEN, IBEX_TOKEN_FILE].")
@click.pass_context
def main(
    ctx: click.Context,
    debug: bool,
    tls: bool,
    tls_ca: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    token_file: Path | None,
) -> None:
    """ibex-context: context assembly for LLM agents.

    The client commands read --target from IBEX_TARGET when it is not given.
    """
    from ibex_context_client.credentials import ClientCredentials

    ctx.meta["ibex.debug"] = debug
    # What the client commands present (docs/security.md); flags before the command.
    ctx.obj = ClientCredentials.from_env().with_overrides(
        ca_file=tls_ca, cert_file=tls_cert, key_file=tls_key, token_file=token_file, tls=tls
    )
    # Small matrix products (query embeddings) are slower with a multi-threaded BLAS
    # competing with the event loop; numpy is imported after this runs.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


@main.command()
@click.option(
    "--workers",
    type=click.IntRange(0, 64),
    default=None,
    help="Server processes sharing the port (SO_REUSEPORT); 0: one per CPU. Default: IBEX_WORKERS (1).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Every line written is a JSON log record (IBEX_LOG_FORMAT=json, whatever the environment says); "
    'ready: the record with "event": "serving" and the ports.',
)
def serve(workers: int | None, as_json: bool) -> None:
    """Serve gRPC with the settings from the environment (IBEX_*)."""
    from ibex_context.server.workers import Supervisor, worker_count

    if as_json:
        # In the environment, so every worker process the supervisor starts logs JSON too.
        os.environ["IBEX_LOG_FORMAT"] = "json"
    settings = _settings()
    count = worker_count(settings.workers if workers is None else workers)
    if count > 1:
        if settings.grpc_port == 0:
            raise click.ClickException("--workers needs a fixed IBEX_GRPC_PORT (0 would give each its own)")
        raise SystemExit(Supervisor.for_serve(count, settings.metrics_port).run())
    _setup_logging(settings)
    from ibex_context.errors import ConfigurationError

    try:
        _run(lambda: _serve(settings), use_uvloop=settings.use_uvloop, timed_loop=True)
    except ConfigurationError as exc:  # e.g. authentication on without a credentials file
        raise click.ClickException(str(exc)) from None


async def _serve(settings: Settings) -> None:
    from ibex_context.server.app import ContextService

    service = ContextService(settings)
    await service.start()
    await service.serve_until_signal()


@main.command()
@JSON_OPTION
@click.pass_context
def migrate(ctx: click.Context, as_json: bool) -> None:
    """Apply the SQL migrations to IBEX_POSTGRES_DSN (idempotent)."""
    from ibex_context.errors import StoreError
    from ibex_context.stores.postgres.migrate import migrate as run_migrations

    settings = _settings()
    try:
        applied = _run(
            lambda: run_migrations(
                settings.postgres_dsn, settings.embedding_dim, ca_file=settings.postgres_ca_file
            )
        )
    except StoreError as exc:
        if ctx.meta.get("ibex.debug"):
            raise
        where = describe_dsn(settings.postgres_dsn)
        # The driver's own words: they say what is wrong (refused, password, TLS).
        raise click.ClickException(
            f"cannot migrate the database at IBEX_POSTGRES_DSN ({where}): {one_line(exc.__cause__ or exc)}"
        ) from None
    if as_json:
        echo_json({"applied": applied})
    else:
        click.echo(f"applied: {', '.join(applied)}" if applied else "schema is up to date")


@main.command()
@click.option("--once", is_flag=True, help="Run the demo call, then stop (no serving).")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None, help="Where the stores keep data.")
@click.option(
    "--verbose", is_flag=True, help="Log at IBEX_LOG_LEVEL (default INFO) instead of warnings only."
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON document once serving (with --once: done): addresses, stores, the demo call; "
    "logs go to stderr.",
)
def dev(once: bool, data_dir: Path | None, verbose: bool, as_json: bool) -> None:
    """Start local Redis and PostgreSQL+pgvector, load demo data, make a sample call, serve."""
    run_dev = _devtools().run_dev
    base = _settings(**_data_dir_override(data_dir))
    _setup_logging(base, quiet=not verbose, to_stderr=as_json)
    _run(lambda: run_dev(base, once=once, as_json=as_json))


@main.command()
@click.option("--data-dir", type=click.Path(path_type=Path), default=None, help="Where the stores keep data.")
@click.option(
    "--redis-port", type=int, default=6380, show_default=True, help="Redis listens on 127.0.0.1:PORT."
)
@click.option(
    "--verbose", is_flag=True, help="Log at IBEX_LOG_LEVEL (default INFO) instead of warnings only."
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON document once the stores are ready: their settings.",
)
def stores(data_dir: Path | None, redis_port: int, verbose: bool, as_json: bool) -> None:
    """Start only the embedded Redis and PostgreSQL+pgvector (migrated), print the
    settings to serve against them, and keep them running until Ctrl-C."""
    run_stores = _devtools().run_stores
    base = _settings(**_data_dir_override(data_dir))
    _setup_logging(base, quiet=not verbose, to_stderr=as_json)
    _run(lambda: run_stores(base, redis_port=redis_port, as_json=as_json))


def _devtools() -> ModuleType:
    """``ibex_context.devtools.dev``, or a plain error where it is left out (the service image)."""
    try:
        import ibex_context.devtools.dev as dev_module
    except ImportError as exc:
        raise click.ClickException(
            f"the dev tools are not installed here ({exc}); they are left out of the service image. "
            "Install ibex-context with the embedded extra: pip install 'ibex-context[embedded]'"
        ) from None
    return dev_module


def _data_dir_override(data_dir: Path | None) -> dict[str, Any]:
    return {} if data_dir is None else {"data_dir": data_dir}


@main.command("import")
@click.argument("source", type=click.File("r", encoding="utf-8"), default="-", metavar="[PATH|-]")
@TARGET_OPTION
@click.option(
    "--org",
    "org_id",
    default="",
    help="The org imported into: lines without an org_id get it, others must match.",
)
@click.option("--agent", "agent_id", default="", help="Default agent id for lines without one.")
@click.option("--batch", type=click.IntRange(1, 10_000), default=200, show_default=True)
@click.option("--progress/--no-progress", default=True, help="Report progress on stderr.")
@JSON_OPTION
def import_memories(
    source: TextIO, target: str, org_id: str, agent_id: str, batch: int, progress: bool, as_json: bool
) -> None:
    """Import memories from JSONL (a file, or - / nothing for stdin): {"content", "category",
    ["org_id", "agent_id", "id", "confidence", "usefulness", "metadata", "occurred_at" (RFC 3339, e.g.
    "2023-05-08T13:56:00Z"), "embedding"]} per line; `ibex-context export` writes this format.

    With --org, every line's org_id must be that org (a line of another org stops the import).
    Streams: at most --batch memories are held at once (any file size). A bad line stops the import
    there; the lines before it are written (the message says how many; lines with an "id" re-import
    idempotently)."""
    name = getattr(source, "name", "<stdin>")
    total_bytes = _file_size(source)
    meter = Progress("imported", total_bytes=total_bytes, enabled=progress)

    async def work(client: MemoryClient) -> int:
        written = 0
        pending: list[pb.MemoryInput] = []
        pending_key: tuple[str, str] = ("", "")

        async def flush() -> None:
            nonlocal written
            if pending:
                written += len(await client.upsert_memories(*pending_key, pending))
                meter.advance(count=len(pending))
                pending.clear()

        for n, line in enumerate(source, 1):
            meter.advance(bytes_done=len(line.encode("utf-8")))
            if not line.strip():
                continue
            key, item = _parse_import_line(line, f"{name}:{n}", org_id, agent_id, written)
            if key != pending_key:
                await flush()
                pending_key = key
            pending.append(item)
            if len(pending) >= batch:
                await flush()
        await flush()
        return written

    try:
        count = call_memory(target, work, timeout=60.0, batch_size=batch)
    finally:
        meter.finish()
    if as_json:
        echo_json({"imported": count})
    else:
        click.echo(f"imported {count} memories")


def _file_size(source: TextIO) -> int | None:
    """Bytes of a regular file (for a percentage); None for a pipe or a terminal."""
    try:
        size = os.fstat(source.fileno()).st_size
    except (OSError, ValueError, AttributeError):
        return None
    import stat

    return size if stat.S_ISREG(os.fstat(source.fileno()).st_mode) and size > 0 else None


def _same_org(given: object, expected: str) -> bool:
    """Whether ``given`` (a line's org_id) names ``expected``, in any spelling of its UUID."""
    if given == expected:
        return True
    try:
        return uuid.UUID(str(given)) == uuid.UUID(expected)
    except ValueError:
        return False


def _parse_import_line(
    line: str, where: str, org_id: str, agent_id: str, written: int
) -> tuple[tuple[str, str], pb.MemoryInput]:
    done = f" ({written} memories before it were imported)" if written else ""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise click.ClickException(f"{where}: not JSON: {exc.msg}{done}") from None
    if not isinstance(row, dict):
        raise click.ClickException(f"{where}: expected a JSON object{done}")
    key = (row.pop("org_id", org_id), row.pop("agent_id", agent_id))
    if org_id and not _same_org(key[0], org_id):
        # --org names the tenant the import is for: a file of another org's memories is
        # refused, not written into that org on this caller's say-so.
        raise click.ClickException(
            f"{where}: org_id is not the --org given (refused: one org per import){done}"
        )
    for field_name in EXPORT_ONLY_FIELDS:  # what an export records but a write cannot set
        row.pop(field_name, None)
    if not all(key):
        raise click.ClickException(f"{where}: no org_id/agent_id (give --org/--agent){done}")
    item = pb.MemoryInput()
    try:
        json_format.ParseDict(row, item)
    except json_format.ParseError as exc:
        raise click.ClickException(f"{where}: {exc}{done}") from None
    return key, item


@main.command()
@TARGET_OPTION
@click.option("--org", "org_id", required=True)
@click.option("--agent", "agent_id", required=True)
@click.option("--session", "session_id", default="")
@click.option("--model", default="gpt-4o", show_default=True)
@click.option("--system", default="", help="A system message to send first.")
@click.option("--timeout", type=float, default=1.0, show_default=True, help="Seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole response as JSON.")
@click.option(
    "--require-full",
    is_flag=True,
    help="Exit 1 unless the assembly was full: not degraded, no fallback (unreachable, refusing).",
)
@click.option(
    "--attempts",
    type=click.IntRange(1, 10),
    default=1,
    show_default=True,
    help="With --require-full: calls to make until one is full (a cold start may degrade the first).",
)
@click.argument("message", nargs=-1, required=True)
def assemble(
    target: str,
    org_id: str,
    agent_id: str,
    session_id: str,
    model: str,
    system: str,
    timeout: float,
    as_json: bool,
    require_full: bool,
    attempts: int,
    message: tuple[str, ...],
) -> None:
    """Make one AssembleContext call and print the enriched messages and the metadata.

    MESSAGE is the user's message (words are joined). Without --require-full the command succeeds on
    a degraded answer or a client fallback, as the proxy would (the metadata says why).
    """
    from ibex_context_client import ContextClient

    from ibex_context.cli_render import render_result, result_json
    from ibex_context.models import ChatMessage

    messages = ([ChatMessage("system", system)] if system else []) + [ChatMessage("user", " ".join(message))]

    async def run() -> AssembleResult:
        # The proxy's own client: on any failure it returns the messages unchanged
        # with a client_* fallback reason instead of raising.
        async with ContextClient(target, timeout=timeout, **client_credentials()) as client:
            return await client.assemble(
                org_id=org_id,
                agent_id=agent_id,
                session_id=session_id,
                model=model,
                request_id=uuid.uuid4().hex,
                messages=messages,
            )

    result = _run(run)
    for attempt in range(2, attempts + 1):
        if not (require_full and result.degraded):
            break
        click.echo(f"attempt {attempt - 1}: fallback_reason={result.fallback_reason}; again", err=True)
        result = _run(run)
    click.echo(result_json(result) if as_json else render_result(result))
    if result.fallback_reason.startswith("client_invalid_argument"):
        raise SystemExit(2)
    if require_full and result.degraded:
        click.echo(f"error: the assembly was not full: fallback_reason={result.fallback_reason}", err=True)
        raise SystemExit(1)


@main.group()
def directive() -> None:
    """Set, clear or get an agent's directive."""


@directive.command("set")
@TARGET_OPTION
@click.option("--org", "org_id", required=True)
@click.option("--agent", "agent_id", required=True)
@click.option(
    "--file", "file", type=click.File("r"), default=None, help="Read the directive from a file (- for stdin)."
)
@JSON_OPTION
@click.argument("text", nargs=-1)
def directive_set(
    target: str, org_id: str, agent_id: str, file: Any, as_json: bool, text: tuple[str, ...]
) -> None:
    content = file.read() if file is not None else " ".join(text)
    version = call_memory(target, lambda c: c.set_directive(org_id, agent_id, content), timeout=10.0)
    if as_json:
        echo_json({"version": version})
    else:
        click.echo(f"directive set (version {version})")


@directive.command("clear")
@TARGET_OPTION
@click.option("--org", "org_id", required=True)
@click.option("--agent", "agent_id", required=True)
@JSON_OPTION
def directive_clear(target: str, org_id: str, agent_id: str, as_json: bool) -> None:
    cleared = call_memory(target, lambda c: c.clear_directive(org_id, agent_id), timeout=10.0)
    if as_json:
        echo_json({"cleared": cleared})
    else:
        click.echo("directive cleared" if cleared else "no directive was set")


@main.command()
@TARGET_OPTION
@click.option("--service", default="", help="Service name to check ('' = overall, 'liveness').")
@click.option("--timeout", type=float, default=2.0, show_default=True)
@JSON_OPTION
def health(target: str, service: str, timeout: float, as_json: bool) -> None:
    """Check gRPC health; exits 0 only when SERVING."""
    from ibex_context_client import ContextClient

    async def run() -> str:
        async with ContextClient(target, **client_credentials()) as client:
            return await client.check_health(service, timeout=timeout)

    import grpc

    try:
        name = _run(run)
    except grpc.aio.AioRpcError as exc:
        raise click.ClickException(f"{target}: {exc.code().name}: {exc.details()}") from None
    except (OSError, TimeoutError) as exc:
        raise click.ClickException(f"{target}: {type(exc).__name__}: {exc}") from None
    if as_json:
        echo_json({"service": service, "status": name})
    else:
        click.echo(name)
    if name != "SERVING":
        raise SystemExit(1)


@main.command("mcp")
@TARGET_OPTION
@click.option(
    "--transport",
    type=click.Choice(["stdio", "http"]),
    default="stdio",
    show_default=True,
    help="stdio: the agent's host starts this process; http: streamable HTTP on --host:--port/mcp.",
)
@click.option("--org", "org_id", default="", envvar="IBEX_ORG_ID", help="Whose memories [IBEX_ORG_ID].")
@click.option("--agent", "agent_id", default="", envvar="IBEX_AGENT_ID", help="[IBEX_AGENT_ID].")
@click.option("--host", default="127.0.0.1", show_default=True, help="HTTP: the address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="HTTP.")
@click.option("--timeout", type=float, default=10.0, show_default=True, help="Seconds per service call.")
@click.option(
    "--json", "as_json", is_flag=True, help="Log JSON records on stderr (stdout is the stdio transport's)."
)
def mcp(
    target: str,
    transport: str,
    org_id: str,
    agent_id: str,
    host: str,
    port: int,
    timeout: float,
    as_json: bool,
) -> None:
    """Serve the memory API as MCP tools (search, get, upsert, delete, set/get directive).

    stdio calls the service with this process's credential (--token-file, IBEX_TOKEN...); HTTP
    forwards each caller's own Authorization header, and X-Ibex-Org-Id / X-Ibex-Agent-Id name
    the org and agent per request. Needs the mcp extra: pip install 'ibex-context[mcp]'.
    """
    try:
        from ibex_context_client.mcp.server import McpConfig, build_server
    except ImportError as exc:
        raise click.ClickException(f"the MCP server needs the mcp extra ({exc.name} is missing)") from None
    from ibex_context.observability.logging import configure_logging

    # stdout is the stdio transport's: logs go to stderr, warnings only.
    configure_logging("WARNING", "json" if as_json else "text", stream=sys.stderr)
    config = McpConfig(
        target=target,
        credentials=client_credentials()["credentials"],
        transport="http" if transport == "http" else "stdio",
        org_id=org_id,
        agent_id=agent_id,
        timeout_seconds=timeout,
    )
    server = build_server(config, host=host, port=port)
    server.run("streamable-http" if transport == "http" else "stdio")


@main.group()
def token() -> None:
    """Bearer tokens for the credentials file (docs/security.md)."""


@token.command("new")
@JSON_OPTION
def token_new(as_json: bool) -> None:
    """Print a new high-entropy token and the SHA-256 the credentials file stores.

    The token goes to the caller (a Secret it mounts); only the digest goes to the server."""
    import secrets

    from ibex_context.server.auth import token_digest

    value = secrets.token_urlsafe(32)
    digest = token_digest(value).hex()
    if as_json:
        echo_json({"token": value, "sha256": digest})
        return
    click.echo(f"token:  {value}")
    click.echo(f"sha256: {digest}")


main.add_command(memories)
main.add_command(export)
main.add_command(purge)
directive.add_command(directive_get)


if __name__ == "__main__":
    main()
