"""The asyncpg pool the stores' statements run on, and how driver errors leave them.

Connections are set up once (``codecs.init_connection``, then the caller's ``prepare``:
the store plans the request path's statements there, so no connection serves a request
before it is warm, whether it was opened at start, to grow the pool, or to replace one
that broke) with session settings:

* ``hnsw.ef_search``: HNSW returns at most ef_search rows, so a smaller value
  silently truncates the top K. The service's graph searches do not read it: each
  passes its own width (``stores.cold_plan.GraphSearchWidth``) to its function, which
  sets it for that search alone (migration 0020); the session value serves statements
  run by hand and the benchmarks' row statements.
* ``hnsw.iterative_scan = relaxed_order``: with a filter applied after the index scan
  (a statement by hand on a graph shared by several agents; an agent's own graph holds
  only its rows), the scan continues until LIMIT rows pass the filter. Rows may come
  back slightly out of order; the vector search re-sorts them by distance.
* ``plan_cache_mode = force_custom_plan``: asyncpg prepares statements and PG would
  switch to a generic plan after five runs. The two searches do not depend on it:
  each is one call of a SQL function whose settings fix its plans, generic, made once
  per connection (migrations 0008, 0012, 0015); only the bare call is planned per call.
  Other statements keep custom plans unless they set their own for a transaction
  (``counters``).
* ``statement_timeout``: a server-side backstop. The request deadline is enforced
  by cancelling the awaiting task, which makes asyncpg send a cancel request, so
  the query stops on the server too (tested).
"""

from __future__ import annotations

import functools
import os
import ssl as ssl_module
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

import asyncpg

from ibex_context.errors import StoreError, StoreUnavailable
from ibex_context.stores.postgres.codecs import init_connection

_Self = TypeVar("_Self")
_P = ParamSpec("_P")
_R = TypeVar("_R")


def store_errors(
    method: Callable[Concatenate[_Self, _P], Awaitable[_R]],
) -> Callable[Concatenate[_Self, _P], Awaitable[_R]]:
    """Turns driver errors into StoreError / StoreUnavailable without their messages.

    asyncpg messages can quote query arguments (memory content); these errors reach
    logs, so only the error class and SQLSTATE are kept, and the chain is cut.
    Cancellation passes through untouched.
    """

    @functools.wraps(method)
    async def wrapper(self: _Self, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return await method(self, *args, **kwargs)
        except (OSError, asyncpg.InterfaceError, asyncpg.exceptions.PostgresConnectionError) as exc:
            raise StoreUnavailable(f"postgres: {type(exc).__name__}") from None
        except asyncpg.PostgresError as exc:
            raise StoreError(f"postgres: {type(exc).__name__} (SQLSTATE {exc.sqlstate})") from None

    return wrapper


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool reset on release, after asyncpg's own rollback of an open transaction.

    asyncpg's default reset sends ``pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *;
    RESET ALL`` on every release: one more round trip per query on the hot path.
    The stores leave no session state behind: settings are per connection (set at
    connect) or ``SET LOCAL``, advisory locks are transaction-scoped, and they open
    no cursors outside transactions and listen to nothing.
    """


def postgres_tls(ca_file: Path | None) -> ssl_module.SSLContext | None:
    """libpq's ``sslmode=verify-full`` with ``sslrootcert=ca_file``: TLS required, the server's
    certificate verified against ``ca_file`` and its host name checked. None: the DSN decides."""
    if ca_file is None:
        return None
    return ssl_module.create_default_context(cafile=ca_file)


def unverified_tls_warning(
    dsn: str, ca_file: Path | None, environ: Mapping[str, str] | None = None
) -> str | None:
    """What to warn at start when the connection to ``dsn`` is not TLS verified with its
    host name (None: it is, or it does not leave the host: a Unix socket).

    Without ``ca_file`` the DSN's ``sslmode`` decides, ``PGSSLMODE`` else, and asyncpg's
    default is ``prefer``: TLS when the server offers it, its certificate not verified
    (anyone on the path can answer), plaintext when it does not. Never echoes the DSN."""
    if ca_file is not None:
        return None
    host, mode = _dsn_host_and_sslmode(dsn)
    if not host or all(h.startswith("/") for h in host.split(",")):
        return None
    mode = mode or (environ if environ is not None else os.environ).get("PGSSLMODE") or "prefer"
    if mode == "verify-full":
        return None
    return (
        f"PostgreSQL TLS is not verified (sslmode={mode}"
        + (", the host name not checked" if mode == "verify-ca" else "")
        + "): set IBEX_POSTGRES_CA_FILE to require TLS verified against that CA with the host name "
        "checked (verify-full)"
    )


def _dsn_host_and_sslmode(dsn: str) -> tuple[str, str]:
    """The host(s) and sslmode a libpq DSN names (URL or key=value form); "" when not named."""
    if dsn.startswith(("postgres://", "postgresql://")):
        parts = urlsplit(dsn)
        query = parse_qs(parts.query)
        netloc = parts.netloc.rpartition("@")[2]
        named = netloc[1:].partition("]")[0] if netloc.startswith("[") else netloc.partition(":")[0]
        host = query.get("host", [unquote(named)])[0]
        return host, query.get("sslmode", [""])[0]
    pairs = dict(part.split("=", 1) for part in dsn.split() if "=" in part)
    return pairs.get("host", "") or pairs.get("hostaddr", ""), pairs.get("sslmode", "")


async def create_pool(
    dsn: str,
    *,
    min_size: int,
    max_size: int,
    ef_search: int,
    statement_timeout_ms: int = 30_000,
    server_settings: Mapping[str, str] | None = None,
    ssl: ssl_module.SSLContext | None = None,
    prepare: Callable[[asyncpg.Connection], Awaitable[None]] | None = None,
) -> asyncpg.Pool:
    """An asyncpg pool whose connections are ready for the stores' statements.

    ``server_settings`` adds or overrides session settings (e.g. ``work_mem``).
    ``prepare`` runs on each new connection after its codecs, before it is first used.
    Idle connections are kept (no inactivity timeout): a reopened one pays its
    preparation again.
    """

    async def init(conn: asyncpg.Connection) -> None:
        await init_connection(conn)
        if prepare is not None:
            await prepare(conn)

    try:
        pool: asyncpg.Pool = await asyncpg.create_pool(
            dsn,
            **({"ssl": ssl} if ssl is not None else {}),
            min_size=min(min_size, max_size),
            max_size=max_size,
            init=init,
            reset=_keep_session,
            max_inactive_connection_lifetime=0,
            server_settings={
                "application_name": "ibex-context",
                "hnsw.ef_search": str(ef_search),
                "hnsw.iterative_scan": "relaxed_order",
                # Every statement is one tenant's: parallel workers only compete with the
                # other calls for the stores' cores (the first 50 RPS run after the
                # partitioned layout spent 0.8 backends on parallel workers of the exact
                # scan and answered 2 % of calls in full).
                "max_parallel_workers_per_gather": "0",
                "plan_cache_mode": "force_custom_plan",
                "statement_timeout": str(statement_timeout_ms),
                **(server_settings or {}),
            },
        )
    except (OSError, asyncpg.PostgresError) as exc:
        raise StoreUnavailable(f"cannot connect to PostgreSQL: {type(exc).__name__}") from exc
    return pool


# The graph builds' pool: its connections run CREATE INDEX CONCURRENTLY and nothing else.
GRAPH_BUILD_APPLICATION = "ibex-context-graphs"


async def create_graph_pool(
    dsn: str, *, ef_search: int, parallel_workers: int = 0, ssl: ssl_module.SSLContext | None = None
) -> asyncpg.Pool:
    """The pool large agents' graphs are built on (``graphs.AgentGraphs``): one connection,
    opened at the first build, so a process builds one graph at a time and no build
    ever waits for, or holds, a request connection. No statement timeout: a build of a
    large agent takes minutes. Named apart in ``pg_stat_activity``. ``parallel_workers``:
    the workers PostgreSQL may add to a build (``max_parallel_maintenance_workers``); with
    none a build competes with the request searches as one backend, not as several."""
    return await create_pool(
        dsn,
        min_size=0,
        max_size=1,
        ef_search=ef_search,
        statement_timeout_ms=0,
        server_settings={
            "application_name": GRAPH_BUILD_APPLICATION,
            "max_parallel_maintenance_workers": str(parallel_workers),
        },
        ssl=ssl,
    )
