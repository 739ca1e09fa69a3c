# ruff: noqa: E501  (report templates read better unwrapped)
"""A soak: does a long-lived installation stay as fast as a fresh one?

    loadtest/soak --minutes 60                       # the hour of issue 26, 2-minute windows
    loadtest/soak --minutes 14 --window-minutes 2 --compare-minutes 4
    loadtest/soak --minutes 6 --replica              # the searches on a streaming replica

AssembleContext at ``--rps`` (locust, as ``loadtest/run``) while a writer upserts
``--writes-per-second`` memories a second into the seeded agents and deletes as many
(each memory it wrote ``--keep`` writes ago: the data set's size stays flat while its
rows churn). Every ``--window-minutes`` it reads the server's metrics, the CPU of the
server and of each store, and PostgreSQL's own state (dead tuples, sizes, vacuums), and
at the end compares the first ``--compare-minutes`` with the last: stores CPU per call
and the server's p99 of AssembleContext should stay within ``--tolerance`` (10 %).

The data set is seeded into a directory of the soak's own (``loadtest/out/data/soak-*``,
``--reseed`` starts it again): a soak changes its data, and the other load tests must
not measure a data set a soak has churned. The report goes to
``benchmarks/results/<date>-<label>.md`` (``--label``, default ``soak``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import random
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ibex_context.observability.metrics import GRPC_HANDLING_SECONDS  # noqa: E402

from loadtest import promdelta  # noqa: E402
from loadtest.corpus import churn_words, memory_spec  # noqa: E402
from loadtest.datastores import pin_stores, seed_if_needed, stores, warm_postgres  # noqa: E402
from loadtest.generator import locust_command, locust_summary, wait_for_locust  # noqa: E402
from loadtest.machine import cpu_model, git_commit, versions  # noqa: E402
from loadtest.measure import Reading, read_counters, window_figures  # noqa: E402
from loadtest.options import dataset_key, parse_args  # noqa: E402
from loadtest.server import start_server, wait_ready  # noqa: E402

# PostgreSQL's own view of the churn, summed per table family (partitions included).
_PG_STATE_SQL = """
SELECT regexp_replace(relname, '_p[0-9]+$|_[0-9]+$', '') AS family,
       sum(n_live_tup)::bigint AS live, sum(n_dead_tup)::bigint AS dead,
       sum(autovacuum_count)::bigint AS autovacuums, sum(autoanalyze_count)::bigint AS autoanalyzes,
       sum(pg_total_relation_size(relid))::bigint AS bytes,
       -- PostgreSQL 18: milliseconds the autovacuum workers spent on the table so far.
       sum(total_autovacuum_time + total_autoanalyze_time)::bigint AS vacuum_ms
FROM pg_stat_user_tables GROUP BY 1 ORDER BY bytes DESC
"""
# The server-wide work a window's writes cause besides their statements: checkpoints
# (and the pages they write) and WAL, with the full-page images every page's first
# change after a checkpoint adds.
_PG_SERVER_SQL = """
SELECT c.num_timed + c.num_requested AS checkpoints, c.buffers_written AS checkpoint_buffers,
       w.wal_bytes::bigint AS wal_bytes, w.wal_fpi AS wal_fpi
FROM pg_stat_checkpointer AS c, pg_stat_wal AS w
"""
_PG_STATE_COLUMNS = ("live", "dead", "autovacuums", "autoanalyzes", "bytes", "vacuum_ms")


def tree_cpu_seconds(pid: int | None) -> float:
    """CPU of ``pid``, its live children and the children it has already reaped (a
    postmaster's exited backends and autovacuum workers: ``cpu_seconds`` of the load
    test counts live children only)."""
    if pid is None:
        return 0.0
    import psutil

    try:
        proc = psutil.Process(pid)
        own = proc.cpu_times()
        total = own.user + own.system + own.children_user + own.children_system
        for child in proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                times = child.cpu_times()
                total += times.user + times.system
    except psutil.Error:
        return 0.0
    return total


def pg_state(dsn: str) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """Per table family (``_PG_STATE_SQL``) and server-wide (``_PG_SERVER_SQL``) counters."""
    import asyncpg

    async def read() -> tuple[dict[str, dict[str, int]], dict[str, int]]:
        conn = await asyncpg.connect(dsn)
        try:
            rows = await conn.fetch(_PG_STATE_SQL)
            server = await conn.fetchrow(_PG_SERVER_SQL)
        finally:
            await conn.close()
        tables = {r["family"]: {k: int(r[k] or 0) for k in _PG_STATE_COLUMNS} for r in rows}
        return tables, {k: int(v or 0) for k, v in dict(server or {}).items()}

    return asyncio.run(read())


def rank_correlation(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation of two equally long series (ties share their mean
    rank); None when fewer than three pairs or either series is constant."""
    pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if x == x and y == y]  # drop NaN
    if len(pairs) < 3:
        return None

    def ranks(values: Sequence[float]) -> list[float]:
        order = sorted(range(len(values)), key=values.__getitem__)
        result = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                result[order[k]] = (i + j) / 2
            i = j + 1
        return result

    rx, ry = ranks([x for x, _ in pairs]), ranks([y for _, y in pairs])
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return None if not sxx or not syy else sxy / (sxx * syy) ** 0.5


# What the soak's writer writes (``--write-texts``): memories as the seed makes them (50-400
# tokens, ~110 typical: what an agent stores, and what a server embedding them spends its
# CPU on), or twelve words of a small vocabulary (the stores' churn alone).
WRITE_TEXTS: dict[str, tuple[str, Callable[[random.Random], str]]] = {
    "memories": ("as seeded, 50-400 tokens", lambda rng: memory_spec(rng).content),
    "churn": ("twelve churn words", churn_words),
}


@dataclass
class Writer:
    """Upserts ``rate`` memories a second into random seeded agents and deletes the one
    written ``keep`` writes earlier, over the service's MemoryService. ``vectors``: each
    memory's embedding, sent with it (the API's ``embedding`` field); None: the service
    embeds the content. ``batch``: memories per UpsertMemories (one agent's), and as many
    deleted per DeleteMemories: how a client writing 100 memories a second sends them.
    ``text``: each memory's content before its unique suffix (``WRITE_TEXTS``)."""

    port: int
    agents: Sequence[dict[str, str]]
    rate: float
    keep: int
    seed: int
    vectors: Callable[[], Sequence[float]] | None = None
    batch: int = 1
    text: Callable[[random.Random], str] = churn_words
    upserts: int = 0
    deletes: int = 0
    errors: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._run()), name="soak-writer", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    async def _run(self) -> None:
        import grpc
        from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb
        from ibex_context_client.proto.ibex.context.v1 import context_pb2_grpc

        rng = random.Random(self.seed)
        written: deque[tuple[str, str, str]] = deque()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            stub = context_pb2_grpc.MemoryServiceStub(channel)
            next_at = time.monotonic()
            while not self._stop.is_set():
                agent = rng.choice(self.agents)
                memories = []
                for _ in range(self.batch):
                    content = self.text(rng) + f" #{rng.randrange(10**9)}"
                    memory = pb.MemoryInput(content=content, category="episodic")
                    if self.vectors is not None:
                        memory.embedding.extend(self.vectors())
                    memories.append(memory)
                try:
                    reply = await stub.UpsertMemories(
                        pb.UpsertMemoriesRequest(
                            org_id=agent["org_id"], agent_id=agent["agent_id"], memories=memories
                        ),
                        timeout=5,
                    )
                    written.extend((agent["org_id"], agent["agent_id"], r.id) for r in reply.results)
                    self.upserts += len(reply.results)
                    if len(written) > self.keep:
                        oldest = [written.popleft() for _ in range(min(self.batch, len(written) - self.keep))]
                        for (org_id, agent_id), group in itertools.groupby(oldest, key=lambda w: w[:2]):
                            ids = [memory_id for _, _, memory_id in group]
                            await stub.DeleteMemories(
                                pb.DeleteMemoriesRequest(org_id=org_id, agent_id=agent_id, ids=ids),
                                timeout=5,
                            )
                            self.deletes += len(ids)
                except Exception:  # counted and reported; a soak goes on
                    self.errors += 1
                next_at += self.batch / self.rate
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))


@dataclass
class Mark:
    """Everything read at one window boundary."""

    minute: float
    reading: Reading
    primary_cpu_s: float
    replica_cpu_s: float
    redis_cpu_s: float
    upserts: int
    deletes: int
    pg: dict[str, dict[str, int]]
    pg_server: dict[str, int] = field(default_factory=dict)


def assemble_percentile_ms(before: Reading, after: Reading, q: float) -> float | None:
    """The ``q`` quantile of AssembleContext's server-side latency between two readings (ms),
    from the gRPC histogram the service exports (bucketed); None when no call finished."""
    deltas = promdelta.merge_deltas(
        promdelta.histogram_deltas(b, a, GRPC_HANDLING_SECONDS)
        for b, a in zip(before.scrapes, after.scrapes, strict=True)
    )
    for key, delta in deltas.items():
        if dict(key).get("grpc_method") == "AssembleContext":
            value = delta.quantile(q)
            return None if value is None else value * 1000
    return None


def window_cpus(base: argparse.Namespace) -> tuple[str, str]:
    """The server's CPU and the stores' (the first of each pinned list, "0-1" or "0,1"):
    the CPUs whose stolen time a window reports."""
    first = lambda cpus: str(cpus or "").replace("-", ",").split(",")[0]  # noqa: E731
    return first(base.server_cpus), first(base.stores_cpus or base.locust_cpus)


# The stages whose p99 a window reports beside the call's: where a slow window's time went.
WINDOW_STAGES = ("embed", "cold", "lexical")


def between(a: Mark, b: Mark, cpus: tuple[str, str] = ("0", "1")) -> dict[str, Any]:
    """The figures of the span from mark ``a`` to mark ``b``; ``cpus``: the server's CPU and
    the stores' (their stolen time)."""
    figures = window_figures(a.reading, b.reading)
    calls = sum(row["count"] for row in figures["assembly"].values()) or 0
    full = figures["degradation_server"].get("full", 0.0)
    per_call = lambda s: s / calls * 1000 if calls else float("nan")  # noqa: E731
    server_delta = lambda key: b.pg_server.get(key, 0) - a.pg_server.get(key, 0)  # noqa: E731
    vacuum_ms = sum(s.get("vacuum_ms", 0) for s in b.pg.values()) - sum(
        s.get("vacuum_ms", 0) for s in a.pg.values()
    )
    stolen = figures["stolen_s"]
    stages = {
        f"{stage}_p99_ms": (figures["stages"].get(stage) or {}).get("p99_ms") for stage in WINDOW_STAGES
    }
    return {
        "minutes": f"{a.minute:g}-{b.minute:g}",
        "calls": int(calls),
        "rps": calls / figures["wall_s"] if figures["wall_s"] else 0.0,
        "full_pct": 100 * full / calls if calls else float("nan"),
        "p50_ms": assemble_percentile_ms(a.reading, b.reading, 0.5),
        "p99_ms": assemble_percentile_ms(a.reading, b.reading, 0.99),
        "server_ms": per_call(figures["server_cpu_s"]),
        "primary_ms": per_call(b.primary_cpu_s - a.primary_cpu_s),
        "replica_ms": per_call(b.replica_cpu_s - a.replica_cpu_s),
        "redis_ms": per_call(b.redis_cpu_s - a.redis_cpu_s),
        "stores_ms": per_call(
            (b.primary_cpu_s - a.primary_cpu_s)
            + (b.replica_cpu_s - a.replica_cpu_s)
            + (b.redis_cpu_s - a.redis_cpu_s)
        ),
        "writes": (b.upserts - a.upserts) + (b.deletes - a.deletes),
        "load": figures["load_average"][1],
        **stages,
        "server_wait_pct": 100 * figures["server_runqueue_wait_s"] / figures["wall_s"]
        if figures["wall_s"]
        else float("nan"),
        "steal_server_s": stolen.get(cpus[0], float("nan")),
        "steal_stores_s": stolen.get(cpus[1], float("nan")),
        "checkpoints": server_delta("checkpoints"),
        "wal_mb": server_delta("wal_bytes") / 2**20,
        "wal_fpi": server_delta("wal_fpi"),
        "vacuum_s": vacuum_ms / 1000,
    }


def parse(argv: Sequence[str] | None) -> tuple[argparse.Namespace, argparse.Namespace]:
    p = argparse.ArgumentParser(
        prog="loadtest/soak", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--minutes", type=float, default=60.0, help="measured minutes (after the warm-up)")
    p.add_argument("--window-minutes", type=float, default=2.0)
    p.add_argument("--compare-minutes", type=float, default=10.0, help="first and last span compared")
    p.add_argument("--tolerance", type=float, default=0.10)
    p.add_argument("--rps", type=float, default=50.0)
    p.add_argument(
        "--writes-per-second", type=float, default=10.0, help="upserts a second, and as many deletes"
    )
    p.add_argument("--keep", type=int, default=600, help="a memory written is deleted this many writes later")
    p.add_argument(
        "--write-texts",
        choices=tuple(WRITE_TEXTS),
        default="memories",
        help="what the writer writes: memories as seeded (50-400 tokens; the default) or twelve"
        " churn words (the stores' churn without the embedding's cost, as soaks before 2026-12-07)",
    )
    p.add_argument("--agents", type=int, default=100)
    p.add_argument("--memories", type=int, default=1000)
    p.add_argument(
        "--embedder",
        choices=("hashing", "minilm"),
        default="minilm",
        help="the service's embedder: minilm (default) is the one users run; hashing is a TOY that"
        " leaves the query embedding out, to isolate the stores' drift",
    )
    p.add_argument(
        "--replica", action="store_true", help="start a streaming replica and route the searches to it"
    )
    p.add_argument("--warmup", type=float, default=30.0, help="seconds before the first window")
    p.add_argument("--label", default="soak")
    p.add_argument("--reseed", action="store_true")
    p.add_argument("--results-dir", default=str(ROOT / "benchmarks" / "results"))
    soak = p.parse_args(argv)
    total_s = soak.minutes * 60
    base = parse_args(
        [
            "--scenario", "baseline",
            "--label", soak.label,
            "--rps", str(soak.rps),
            "--duration", str(total_s),
            "--warmup", str(soak.warmup),
            "--agents", str(soak.agents),
            "--memories", str(soak.memories),
            "--embedder", soak.embedder,
            # A soak's gate is its comparison, not locust's p99 over the whole hour.
            "--p99-ms", "1000", "--max-fallback-rate", "1", "--max-failure-rate", "1",
        ]
        + (["--reseed"] if soak.reseed else [])
    )  # fmt: skip
    base.data_dir = ROOT / "loadtest" / "out" / "data" / f"soak-{dataset_key(base)}"
    return soak, base


def log(message: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {message}", flush=True)


def run(soak: argparse.Namespace, base: argparse.Namespace) -> tuple[list[Mark], dict[str, Any], Writer]:
    import os

    from ibex_context.devtools.replica import start_replica

    data_dir: Path = base.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    out_dir = Path(base.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    prefix = out_dir / f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{soak.label}"
    with stores(data_dir, base.pg_shared_buffers) as (dsn, redis_url, redis, postgres):
        agents_file, _ = seed_if_needed(base, dsn, data_dir, log)
        replica = start_replica(postgres, "soak-replica") if soak.replica else None
        try:
            if replica is not None:
                os.environ["IBEX_POSTGRES_READ_DSNS"] = json.dumps([replica.dsn])
            replica_pid = _postmaster_pid(replica.pgdata) if replica is not None else None
            pin_stores([pid for pid in (redis.pid, postgres.pid, replica_pid) if pid], base.stores_cpus)
            warm_postgres(dsn, agents_file, log)
            server = start_server(base, dsn, redis_url, prefix, log)
            try:
                wait_ready(server.grpc_port, server.metrics_ports, server.proc, base.start_timeout)
                load = locust_command(base, server.grpc_port, agents_file, prefix)
                agents = json.loads(agents_file.read_text())["agents"]
                writer = Writer(
                    server.grpc_port,
                    agents,
                    soak.writes_per_second,
                    soak.keep,
                    base.seed,
                    text=WRITE_TEXTS[soak.write_texts][1],
                )
                import subprocess

                with prefix.with_suffix(".locust.log").open("wb") as locust_out:
                    locust = subprocess.Popen(
                        load.argv, stdout=locust_out, stderr=subprocess.STDOUT, cwd=ROOT
                    )
                    writer.start()
                    time.sleep(soak.warmup)

                    def mark(minute: float) -> Mark:
                        tables, server_wide = pg_state(dsn)
                        return Mark(
                            minute,
                            read_counters(server.metrics_ports, server.proc.pid, locust.pid, []),
                            tree_cpu_seconds(postgres.pid),
                            tree_cpu_seconds(replica_pid),
                            tree_cpu_seconds(redis.pid),
                            writer.upserts,
                            writer.deletes,
                            tables,
                            server_wide,
                        )

                    started = time.monotonic()
                    marks = [mark(0.0)]
                    log(f"soak: {soak.minutes:g} min in {soak.window_minutes:g}-min windows")
                    minute = 0.0
                    while minute + 1e-9 < soak.minutes:
                        minute = min(soak.minutes, minute + soak.window_minutes)
                        time.sleep(max(0.0, started + minute * 60 - time.monotonic()))
                        marks.append(mark(minute))
                        row = between(marks[-2], marks[-1], window_cpus(base))
                        log(
                            f"window {row['minutes']} min: p99 {row['p99_ms']} ms, stores {row['stores_ms']:.2f} ms/call, "
                            f"FULL {row['full_pct']:.1f} %, writes {row['writes']}"
                        )
                    writer.stop()
                    rc = wait_for_locust(locust, base)
                summary = locust_summary(prefix, rc, prefix.with_suffix(".locust.log"))
                setup = {
                    "serve_cmd": " ".join(server.command),
                    "locust_cmd": " ".join(load.argv),
                    "users": load.users,
                }
                return marks, {"summary": summary, **setup}, writer
            finally:
                server.stop()
        finally:
            os.environ.pop("IBEX_POSTGRES_READ_DSNS", None)
            if replica is not None:
                replica.remove()


def _postmaster_pid(pgdata: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int((pgdata / "postmaster.pid").read_text().split()[0])
    return None


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def report(
    soak: argparse.Namespace,
    base: argparse.Namespace,
    marks: list[Mark],
    setup: dict[str, Any],
    writer: Writer,
) -> tuple[str, bool]:
    cpus = window_cpus(base)
    windows = [between(a, b, cpus) for a, b in itertools.pairwise(marks)]
    span = max(1, round(soak.compare_minutes / soak.window_minutes))
    first, last = (
        between(marks[0], marks[min(span, len(marks) - 1)], cpus),
        between(marks[max(0, len(marks) - 1 - span)], marks[-1], cpus),
    )

    def change(key: str) -> float | None:
        a, b = first[key], last[key]
        return None if not a or b is None else (b - a) / a

    stores_change, p99_change = change("stores_ms"), change("p99_ms")
    steady = all(c is not None and c <= soak.tolerance for c in (stores_change, p99_change))
    columns = [
        "minutes",
        "calls",
        "rps",
        "full_pct",
        "p50_ms",
        "p99_ms",
        "server_ms",
        "primary_ms",
        "replica_ms",
        "redis_ms",
        "stores_ms",
        "writes",
        "load",
        *(f"{stage}_p99_ms" for stage in WINDOW_STAGES),
        "server_wait_pct",
        "steal_server_s",
        "steal_stores_s",
        "checkpoints",
        "wal_mb",
        "wal_fpi",
        "vacuum_s",
    ]
    lines = [
        f"# Soak `{soak.label}`: {'STEADY' if steady else 'NOT STEADY'} (stores CPU per call and p99, first vs last {soak.compare_minutes:g} min, within {soak.tolerance:.0%})",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {git_commit()}. Command: `loadtest/soak {' '.join(sys.argv[1:])}`",
        "",
        f"- Load: AssembleContext at {soak.rps:g} RPS (locust, {setup['users']} users) for {soak.minutes:g} min after {soak.warmup:g} s of warm-up; "
        f"a writer upserting {soak.writes_per_second:g} memories/s ({soak.write_texts}: {WRITE_TEXTS[soak.write_texts][0]}) into random seeded agents and deleting each {soak.keep} writes later "
        f"(done: {writer.upserts} upserts, {writer.deletes} deletes, {writer.errors} errors).",
        f"- Data: {base.agents} agents x {base.memories} memories ({base.vectors} vectors, {base.seed_embedder} seed embedder), seeded in `{base.data_dir.relative_to(ROOT)}`; "
        f"service embedder `{base.embedder}` (its inference threads at nice {base.worker_nice}: {base.worker_nice_why})"
        f"{'; searches on a streaming replica (IBEX_POSTGRES_READ_DSNS)' if soak.replica else ''}.",
        f"- Machine: {cpu_model()}, {versions()}; server on CPU {base.server_cpus}, stores and locust on CPU {base.locust_cpus}; shared with other engineers' work (load average in the table).",
        "- p50/p99: the server's own `grpc_server_handling_seconds` of AssembleContext (bucketed). CPU per call: user+system over the window / calls, "
        "PostgreSQL including its exited backends and autovacuum workers (reaped children).",
        "",
        "## First vs last",
        "",
        "| span | calls | FULL % | p99 ms | stores CPU ms/call | primary | replica | server CPU ms/call |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in (("first", first), ("last", last)):
        lines.append(
            f"| {name} {row['minutes']} min | {row['calls']} | {_fmt(row['full_pct'], 1)} | {_fmt(row['p99_ms'], 1)} | {_fmt(row['stores_ms'])} | {_fmt(row['primary_ms'])} | {_fmt(row['replica_ms'])} | {_fmt(row['server_ms'])} |"
        )
    lines += [
        "",
        f"Change, last vs first: stores CPU per call {_fmt(None if stores_change is None else stores_change * 100, 1)} %, p99 {_fmt(None if p99_change is None else p99_change * 100, 1)} %.",
        "",
        "## Windows",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for row in windows:
        lines.append(
            "| "
            + " | ".join(
                _fmt(row[c], 1 if c in ("full_pct", "p50_ms", "p99_ms", "rps", "load") else 2)
                for c in columns
            )
            + " |"
        )
    lines += [
        "",
        f"## What moves with the window's p99 and FULL share ({len(windows)} windows)",
        "",
        "Spearman's rank correlation of each window's p99, and of its FULL share, with the"
        " window's other figures (1: the windows where one is high are exactly those where the"
        " other is; |rho| under ~0.5 over 15 windows is indistinguishable from none). The FULL"
        " share says more than the p99 when the p99 sits at the cold stage's timeout.",
        "",
        "| figure | rho with p99 | rho with FULL % |",
        "|---|---|---|",
    ]

    def series(column: str) -> list[float]:
        return [float("nan") if row[column] is None else float(row[column]) for row in windows]

    moves = [
        (
            column,
            rank_correlation(series("p99_ms"), series(column)),
            rank_correlation(series("full_pct"), series(column)),
        )
        for column in columns[columns.index("server_ms") :]
    ]
    for column, with_p99, with_full in sorted(moves, key=lambda m: -max(abs(m[1] or 0.0), abs(m[2] or 0.0))):
        lines.append(f"| {column} | {_fmt(with_p99)} | {_fmt(with_full)} |")
    lines += [
        "",
        "## PostgreSQL at each window boundary (primary)",
        "",
        "| minute | table | live | dead | autovacuums | autoanalyzes | MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in marks:
        for family, s in m.pg.items():
            if s["bytes"] >= 1 << 20 or s["dead"]:
                lines.append(
                    f"| {m.minute:g} | {family} | {s['live']:,} | {s['dead']:,} | {s['autovacuums']} | {s['autoanalyzes']} | {s['bytes'] / 2**20:,.1f} |"
                )
    lines += [
        "",
        "## Setup",
        "",
        f"- server: `{setup['serve_cmd']}`",
        f"- locust: `{setup['locust_cmd']}`",
        f"- locust summary: {json.dumps(setup['summary'])[:600]}",
        "",
    ]
    return "\n".join(lines), steady


def main(argv: Sequence[str] | None = None) -> int:
    soak, base = parse(argv)
    marks, setup, writer = run(soak, base)
    text, steady = report(soak, base, marks, setup, writer)
    print(text)
    results = Path(soak.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{datetime.now(UTC):%Y-%m-%d}-{soak.label}.md"
    path.write_text(text)
    log(f"results: {path}")
    return 0 if steady else 1


if __name__ == "__main__":
    raise SystemExit(main())
