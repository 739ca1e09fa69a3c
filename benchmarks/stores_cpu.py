"""Where the stores' CPU per AssembleContext call goes: PostgreSQL and Redis CPU per
call, broken down so that the parts add up to the measured total.

Runs the real handler in process (as ``benchmarks.call_cpu``) against its own
PostgreSQL and Redis started on a COPY of a load-test data dir, with the load test's
request mix, paced at ``--rps`` (open loop: one call started every 1/rps s, calls may
overlap, the post-response queue batches as it does in a load test). Over the
measured window it reads the CPU time (``/proc/<pid>/task/*/schedstat``, ns) of every
store process and attributes it:

* each PostgreSQL backend of the service's pool: every statement is timed from the
  backend's side (asyncpg's statement methods are wrapped: the backend's CPU from
  the start of one statement to the start of the next statement on that connection
  goes to the first one's kind), so the kinds add up to the backends' total;
* the other PostgreSQL processes by their process title (checkpointer, walwriter,
  autovacuum, ...), the postmaster, and processes that exited in the window (the
  postmaster's ``cutime``/``cstime``: it reaps its children);
* with ``--sampler``, the load test's ``pg_stat_activity`` sampler
  (``loadtest.datastores.PgActivitySampler``) runs over the window and its backend
  is reported on its own line;
* Redis: its threads' CPU, and ``INFO commandstats`` (time inside each command; the
  rest is the event loop: reading, parsing, replying).

    nice -n 19 .venv/bin/python -m benchmarks.stores_cpu --data-dir /tmp/copy --calls 1500 [--sampler]

Never point ``--data-dir`` at a data dir somebody else uses: the run writes to it
(injection counters, hot sets).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import functools
import json
import os
import platform
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ibex_context.pipeline.deadlines import CallDeadlines, DeadlinePolicy  # noqa: E402
from ibex_context.profiles.schema import Deadlines  # noqa: E402

from benchmarks.call_cpu import _Context, _requests, in_process_settings  # noqa: E402
from loadtest.datastores import PgActivitySampler, stores, warm_postgres  # noqa: E402
from loadtest.machine import git_commit, process_cpu_ns  # noqa: E402
from loadtest.workload import DEFAULT_WEIGHTS, Workload  # noqa: E402

_TICKS = os.sysconf("SC_CLK_TCK")


def thread_group_cpu_ns(pid: int) -> int:
    """CPU time of all of ``pid``'s threads (ns, from the scheduler: not tick-rounded)."""
    total = 0
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                total += int((task / "schedstat").read_text().split()[0])
    return total


def reaped_children_cpu_s(pid: int) -> float:
    """CPU of ``pid``'s children that have exited and been waited for (cutime + cstime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / _TICKS


def children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                out.extend(int(c) for c in (task / "children").read_text().split())
    return out


def title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return "?"


def process_kind(process_title: str) -> str:
    """'checkpointer', 'walwriter', 'autovacuum worker', ... or 'client backend'."""
    name = process_title.removeprefix("postgres:").strip()
    for known in (
        "checkpointer",
        "background writer",
        "walwriter",
        "autovacuum launcher",
        "autovacuum worker",
        "logical replication launcher",
        "io worker",
        "walsummarizer",
        "archiver",
        "logger",
        "stats collector",
    ):
        if name.startswith(known):
            return known
    return "client backend"


# ---------------------------------------------------------------- statement attribution


@dataclass
class KindCost:
    statements: int = 0
    cpu_ns: int = 0
    wall_ns: int = 0


@dataclass
class StatementMeter:
    """Attributes each pooled backend's CPU to the kind of statement it ran: the CPU
    from one statement's start to the next one's start on that connection (the
    statement, its reply, and whatever the backend does before it goes idle)."""

    classify: Callable[[str], str]
    kinds: dict[str, KindCost] = field(default_factory=dict)
    # backend pid -> (kind of the statement it is on or after, CPU ns at its start)
    _open: dict[int, tuple[str, int]] = field(default_factory=dict)
    backends: set[int] = field(default_factory=set)
    active: bool = False

    def started(self, backend: int, query: str) -> None:
        if not self.active:
            return
        now = process_cpu_ns(backend)
        previous = self._open.get(backend)
        if previous is not None:
            self.kinds.setdefault(previous[0], KindCost()).cpu_ns += now - previous[1]
        kind = self.classify(query)
        self.kinds.setdefault(kind, KindCost()).statements += 1
        self._open[backend] = (kind, now)
        self.backends.add(backend)

    def finished(self, query: str, wall_ns: int) -> None:
        if self.active:
            self.kinds.setdefault(self.classify(query), KindCost()).wall_ns += wall_ns

    def start(self, backends: Iterable[int]) -> None:
        self.active = True
        for pid in backends:
            self._open[pid] = ("(idle before its first statement)", process_cpu_ns(pid))
            self.backends.add(pid)

    def stop(self) -> None:
        for pid, (kind, at) in self._open.items():
            self.kinds.setdefault(kind, KindCost()).cpu_ns += process_cpu_ns(pid) - at
        self._open.clear()
        self.active = False


# Set inside an outermost statement method (asyncpg's methods call each other).
_in_statement: contextvars.ContextVar[bool] = contextvars.ContextVar("in_statement", default=False)


def instrument_asyncpg(meter: StatementMeter) -> None:
    """Wraps asyncpg's statement methods so ``meter`` sees each outermost statement."""
    import asyncpg

    def wrap(method: Any) -> Any:
        @functools.wraps(method)
        async def wrapper(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
            # The sampler's thread runs its own loop and connection: not the service's.
            if _in_statement.get() or threading.current_thread() is not threading.main_thread():
                return await method(self, query, *args, **kwargs)
            token = _in_statement.set(True)
            try:
                meter.started(self.get_server_pid(), query)
                t0 = time.perf_counter_ns()
                try:
                    return await method(self, query, *args, **kwargs)
                finally:
                    meter.finished(query, time.perf_counter_ns() - t0)
            finally:
                _in_statement.reset(token)

        return wrapper

    for name in ("execute", "executemany", "fetch", "fetchrow", "fetchval", "fetchmany"):
        setattr(asyncpg.Connection, name, wrap(getattr(asyncpg.Connection, name)))


def statement_classifier() -> Callable[[str], str]:
    from ibex_context.stores.cold_plan import ColdPlan
    from ibex_context.stores.postgres import reads, searches

    known = {
        **{searches.SEARCH_ARRAYS_SQL[plan]: f"vector search ({plan.value} plan)" for plan in ColdPlan},
        searches.LEXICAL_ARRAYS_SQL: "lexical search (BM25)",
        searches.AGENT_SIZE_SQL: "agent size (memory_stats)",
        reads.DIRECTIVE_SQL: "directive read (cache fill)",
        reads.HOT_SET_SQL: "hot-set rebuild read",
    }

    def classify(query: str) -> str:
        kind = known.get(query)
        if kind is not None:
            return kind
        text = " ".join(query.split()).rstrip(";")
        if text.startswith("INSERT INTO memory_usage"):
            return "injection counters (INSERT ... ON CONFLICT)"
        if text.upper() in ("BEGIN", "COMMIT", "ROLLBACK") or text.upper().startswith(
            ("BEGIN ", "SET LOCAL")
        ):
            return "transaction control / SET LOCAL"
        if "FROM memories AS m" in text and "ANY($3::uuid[])" in text:
            return "fetch memories (hot-set refresh)"
        return "other: " + text[:60]

    return classify


# ---------------------------------------------------------------- process snapshots


@dataclass(frozen=True)
class Snapshot:
    """CPU ns of every store process at one moment, with its PostgreSQL kind."""

    postgres: dict[int, tuple[str, int]]  # pid -> (kind, cpu ns)
    postmaster_ns: int
    reaped_s: float
    redis_ns: int
    commandstats: dict[str, tuple[int, int]]  # command -> (calls, usec)
    redis_cpu_s: float


def _redis_info(url: str) -> tuple[dict[str, tuple[int, int]], float]:
    import redis

    client = redis.Redis.from_url(url)
    try:
        stats = client.info("commandstats")
        cpu = client.info("cpu")
    finally:
        client.close()
    commands = {k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"])) for k, v in stats.items()}
    return commands, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def snapshot(postmaster: int, redis_pid: int, redis_url: str) -> Snapshot:
    pg = {pid: (process_kind(title(pid)), process_cpu_ns(pid)) for pid in children(postmaster)}
    commands, redis_cpu = _redis_info(redis_url)
    return Snapshot(
        postgres=pg,
        postmaster_ns=process_cpu_ns(postmaster),
        reaped_s=reaped_children_cpu_s(postmaster),
        redis_ns=thread_group_cpu_ns(redis_pid),
        commandstats=commands,
        redis_cpu_s=redis_cpu,
    )


# ---------------------------------------------------------------- the run


async def _paced_calls(args: argparse.Namespace, dsn: str, redis_url: str, data_dir: Path) -> dict[str, Any]:
    from ibex_context.server.app import ContextService
    from ibex_context.settings import Settings

    # Every call assembles: none is shed because this (niced, shared) process fell behind.
    os.environ.update(in_process_settings(dsn, redis_url, IBEX_MAX_CONCURRENT_ASSEMBLIES="0"))
    meter = StatementMeter(statement_classifier())
    instrument_asyncpg(meter)
    service = ContextService(Settings())
    await service.start()
    try:
        handler = service.assembly_handler
        levels: dict[str, int] = {}
        observer = handler._observer

        class Counting:
            """The handler's observer, counting each call's degradation level on the way."""

            def answered(self, assembly: Any, send: Any) -> None:
                level = str(assembly.degradation.name).lower()
                levels[level] = levels.get(level, 0) + 1
                observer.answered(assembly, send)

            def rejected(self, rejection: Any) -> None:
                observer.rejected(rejection)

        handler._observer = Counting()
        if args.lift_deadlines:
            handler._deadlines = _LiftedDeadlines()
        workload = Workload(data_dir / "agents.json", args.seed)
        warm = _requests(workload, args.warmup, args.seed + 7)
        calls = _requests(workload, args.calls, args.seed)
        await _pace(handler, warm, args.rps, args.users)
        await asyncio.sleep(1.0)  # the warm-up's last flushes
        levels.clear()
        postmaster, redis_pid = args._pids
        # Only the service's pool is connected now (warm_postgres has closed its connection).
        pool_backends = {
            pid
            for pid, (kind, _) in snapshot(postmaster, redis_pid, redis_url).postgres.items()
            if kind == "client backend"
        }
        sampler = PgActivitySampler(dsn) if args.sampler else None
        before = snapshot(postmaster, redis_pid, redis_url)
        meter.start(pool_backends)
        if sampler is not None:
            sampler.start()
        wall0 = time.monotonic()
        await _pace(handler, calls, args.rps, args.users)
        await asyncio.sleep(0.5)  # let the last batch of injections flush
        wall = time.monotonic() - wall0
        meter.stop()
        # Before the sampler stops, as in the load test (its backend is alive at the reading).
        after = snapshot(postmaster, redis_pid, redis_url)
        if sampler is not None:
            sampler.stop()
        return _breakdown(before, after, meter, len(calls), wall, levels, sampler)
    finally:
        await service.stop(0)


class _LiftedDeadlines(DeadlinePolicy):
    """Deadlines no call reaches: every call does a full call's store work even when this
    niced process on a shared machine is kept off the CPU (a call past its 45 ms would
    cancel its searches and change what the stores do)."""

    def for_call(self, limits: Deadlines, caller_remaining: float | None) -> CallDeadlines:
        lifted = Deadlines.model_construct(
            assembly_ms=10_000.0, directive_ms=5_000.0, hot_ms=5_000.0, cold_ms=5_000.0
        )
        return self.within(10.0, lifted)


async def _pace(handler: Any, calls: list[tuple[str, Any]], rps: float, users: int) -> None:
    """The load test's locust users: ``users`` callers, each at ``rps / users`` calls a second
    (constant throughput: a call that ran late shortens the wait before the next), each
    waiting for its call to finish. A starved process runs fewer calls a second instead
    of piling them up past the pools' sizes."""
    loop = asyncio.get_running_loop()
    interval = users / rps

    async def user(mine: list[tuple[str, Any]], offset: float) -> None:
        next_at = loop.time() + offset
        for _, message in mine:
            delay = next_at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            next_at = max(next_at + interval, loop.time())
            await handler.AssembleContext(message, _Context(10.0))

    await asyncio.gather(*(user(calls[u::users], u * interval / users) for u in range(users)))


def _breakdown(
    before: Snapshot,
    after: Snapshot,
    meter: StatementMeter,
    calls: int,
    wall: float,
    levels: dict[str, int],
    sampler: PgActivitySampler | None,
) -> dict[str, Any]:
    def ms(ns: float) -> float:
        return round(ns / 1e6 / calls, 4)

    rows: list[dict[str, Any]] = []
    service_backends = meter.backends
    pool_ns = 0
    for kind, cost in sorted(meter.kinds.items(), key=lambda kv: -kv[1].cpu_ns):
        pool_ns += cost.cpu_ns
        rows.append(
            {
                "part": f"PostgreSQL, service backends: {kind}",
                "ms_per_call": ms(cost.cpu_ns),
                "statements_per_call": round(cost.statements / calls, 3),
                "cpu_us_per_statement": round(cost.cpu_ns / 1e3 / max(1, cost.statements), 1),
                "wall_us_per_statement": round(cost.wall_ns / 1e3 / max(1, cost.statements), 1),
            }
        )
    # Every other PostgreSQL process, by kind; a process that started in the window counts whole.
    others: dict[str, int] = {}
    service_total = 0
    for pid, (kind, ns) in after.postgres.items():
        delta = ns - before.postgres.get(pid, (kind, 0))[1]
        if pid in service_backends:
            service_total += delta
            continue
        if kind == "client backend":
            kind = "client backend outside the service's pool" + (
                " (the pg_stat_activity sampler)" if sampler else ""
            )
        others[kind] = others.get(kind, 0) + delta
    rows.append(
        {
            "part": "PostgreSQL, service backends: new connections, before their first statement",
            "ms_per_call": ms(service_total - pool_ns),
        }
    )
    gone = [pid for pid in before.postgres if pid not in after.postgres]
    for kind, ns in sorted(others.items(), key=lambda kv: -kv[1]):
        rows.append({"part": f"PostgreSQL, {kind}", "ms_per_call": ms(ns)})
    rows.append(
        {"part": "PostgreSQL, postmaster", "ms_per_call": ms(after.postmaster_ns - before.postmaster_ns)}
    )
    reaped_ns = (after.reaped_s - before.reaped_s) * 1e9
    rows.append(
        {
            "part": "PostgreSQL, processes that exited in the window (postmaster's cutime, 10 ms ticks)",
            "ms_per_call": ms(reaped_ns),
            "exited": len(gone),
        }
    )
    redis_ns = after.redis_ns - before.redis_ns
    inside: dict[str, tuple[int, int]] = {}
    for command, (n, usec) in after.commandstats.items():
        n0, usec0 = before.commandstats.get(command, (0, 0))
        if n - n0:
            inside[command] = (n - n0, usec - usec0)
    # Commands run by a script are counted in the script's own time too: only top-level ones add up.
    top_level = {
        c: v
        for c, v in inside.items()
        if c
        in (
            "get",
            "evalsha",
            "eval",
            "set",
            "info",
            "ping",
            "script|load",
            "unlink",
            "del",
            "exec",
            "multi",
            "ttl",
        )
    }
    inside_ns = sum(usec for _, usec in top_level.values()) * 1000
    for command, (n, usec) in sorted(top_level.items(), key=lambda kv: -kv[1][1]):
        rows.append(
            {
                "part": f"Redis, inside {command.upper()}",
                "ms_per_call": ms(usec * 1000),
                "commands_per_call": round(n / calls, 3),
                "cpu_us_per_command": round(usec / n, 1),
            }
        )
    rows.append(
        {
            "part": "Redis, outside commands (event loop, socket I/O, protocol)",
            "ms_per_call": ms(redis_ns - inside_ns),
        }
    )
    total_pg = sum(ns - before.postgres.get(pid, ("", 0))[1] for pid, (_, ns) in after.postgres.items())
    total_ns = total_pg + (after.postmaster_ns - before.postmaster_ns) + reaped_ns + redis_ns
    return {
        "calls": calls,
        "wall_s": round(wall, 2),
        "achieved_rps": round(calls / wall, 1),
        "levels": levels,
        "rows": rows,
        "sum_of_rows_ms_per_call": round(sum(r["ms_per_call"] for r in rows), 4),
        "measured_total_ms_per_call": ms(total_ns),
        "service_backends_measured_ms_per_call": ms(service_total),
        "service_backends_attributed_ms_per_call": ms(pool_ns),
        "redis_used_cpu_ms_per_call (INFO cpu)": round(
            (after.redis_cpu_s - before.redis_cpu_s) * 1e3 / calls, 4
        ),
        "redis_script_internals": {c: v for c, v in inside.items() if c not in top_level},
        "sampler_samples": sampler.samples if sampler else 0,
        "load_average": os.getloadavg(),
    }


async def _run_sql(dsn: str, sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, required=True, help="a COPY of a loadtest/out/data/<key> dir")
    p.add_argument("--calls", type=int, default=1500)
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--rps", type=float, default=50.0)
    p.add_argument("--users", type=int, default=5, help="callers, as the load test's locust users")
    p.add_argument("--seed", type=int, default=20261122)
    p.add_argument("--sampler", action="store_true", help="run the load test's pg_stat_activity sampler too")
    p.add_argument(
        "--keep-deadlines",
        dest="lift_deadlines",
        action="store_false",
        help="keep the profile's 45 ms deadlines (default: lifted, so every call does a full call's work)",
    )
    p.add_argument(
        "--setup-sql",
        type=Path,
        default=None,
        help="SQL run once the stores are up (e.g. one version of a function, for an A/B comparison)",
    )
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    with stores(args.data_dir) as (dsn, redis_url, redis, postgres):
        if args.setup_sql is not None:
            asyncio.run(_run_sql(dsn, args.setup_sql.read_text()))
        warm_postgres(dsn, args.data_dir / "agents.json", lambda m: print(m, file=sys.stderr))
        args._pids = (postgres.pid, redis.pid)
        result = asyncio.run(_paced_calls(args, dsn, redis_url, args.data_dir))
    result["setup"] = {
        "data": args.data_dir.name,
        "calls": args.calls,
        "rps": args.rps,
        "users": args.users,
        "warmup_calls": args.warmup,
        "sampler": args.sampler,
        "deadlines_lifted": args.lift_deadlines,
        "setup_sql": str(args.setup_sql) if args.setup_sql else None,
        "mix": DEFAULT_WEIGHTS,
        "machine": f"{os.cpu_count()} vCPU {platform.machine()}, shared with other work",
        "commit": git_commit(),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
