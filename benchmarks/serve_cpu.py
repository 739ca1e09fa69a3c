"""Server CPU per AssembleContext call of the real service over a real socket: two
source trees of ``ibex-context serve`` (e.g. the server before a change and after it),
same stores, same data, same driver, back to back.

Starts its own Redis and PostgreSQL (embedded, throwaway), migrates, seeds
``--agents`` agents of ``--memories`` memories each through MemoryService (hashing
embedder), then for each round and each tree: starts ``python -m ibex_context serve``
with that tree's ``clients/python/`` and ``service/`` first on ``PYTHONPATH``, waits for
SERVING, offers AssembleContext at a fixed rate (open loop, grpc.aio client in this process, over
``CHANNELS`` channels) for a warm-up and a measured window. Server CPU per call is
the server process's user+system time (every thread, from ``/proc/<pid>/stat``) over
the window divided by the calls answered in it; the per-thread split (main thread =
the event loop, the rest) comes from ``/proc/<pid>/task``. Latency is the client's
and shares the machine with everything else: read it as context, not as the result.
The "degraded" column counts answers with a degradation reason: a degraded call costs
less CPU, so compare trees at similar degradation.

    PYTHONPATH=clients/python:service:. .venv/bin/python -m benchmarks.serve_cpu \\
        --tree before=/tmp/baseline --tree after=. --out benchmarks/results/serve_cpu.md
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

import grpc
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent
ASSEMBLE = "/ibex.context.v1.ContextAssemblyService/AssembleContext"
UPSERT = "/ibex.context.v1.MemoryService/UpsertMemories"
HEALTH = "/grpc.health.v1.Health/Check"
CHANNELS = 5
DEADLINE_S = 0.045
DIM = 384
# The most time the profile schema allows each source (like the tests' generous profile): on a
# loaded shared machine the product defaults would degrade calls, and a degraded call costs less
# CPU than a full one, which would make the trees' figures differ by the machine's load.
PROFILES = Path(tempfile.gettempdir()) / "serve-cpu-profiles.json"
PROFILES_JSON = (
    '{"apiVersion": "context.ibex.dev/v1alpha1", "kind": "ContextProfileSet", "profiles": [{"name": '
    '"bench/generous", "selector": {"default": true}, "deadlines": {"assemblyMs": 45, "directiveMs": 40, '
    '"hotMs": 40, "coldMs": 44}}]}'
)
TOPICS = ("coffee", "travel", "music", "work", "family", "garden", "books", "sport", "cooking", "health")


@dataclass
class Run:
    label: str
    round: int
    calls: int
    errors: int
    seconds: float
    cpu_s: float
    thread_cpu_s: dict[str, float]
    latencies_ms: list[float] = field(repr=False)
    load: tuple[float, float, float]
    degraded: int = 0

    @property
    def cpu_ms_per_call(self) -> float:
        return self.cpu_s / self.calls * 1000 if self.calls else float("nan")


def _cpu_seconds(pid: int, task: int | None = None) -> float:
    path = f"/proc/{pid}/task/{task}/stat" if task is not None else f"/proc/{pid}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _threads(pid: int) -> dict[str, float]:
    """CPU seconds of each thread, keyed "main" or "<comm> #<n>" (threads of one name are summed)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = "main (event loop)" if int(task.name) == pid else (task / "comm").read_text().strip()
            out[name] = out.get(name, 0.0) + _cpu_seconds(pid, int(task.name))
        except (OSError, ValueError):
            continue
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _memory_text(rng: random.Random, topic: str, i: int) -> str:
    words = [rng.choice(TOPICS) for _ in range(12)]
    option = rng.randint(1, 99)
    return f"fact {i} about {topic}: the user mentioned {' '.join(words)} and prefers option {option}"


def _requests(agents: list[tuple[str, str]], count: int, seed: int) -> list[bytes]:
    """New sessions (1-2 messages) and conversations (10-30 messages), like the load test's mix."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        org, agent = rng.choice(agents)
        turns = rng.choice((1, 2, 2, 10, 20, 30))
        messages = [
            pb.Message(
                role="user" if t % 2 == 0 else "assistant", content=_memory_text(rng, rng.choice(TOPICS), t)
            )
            for t in range(turns)
        ]
        if messages[-1].role != "user":
            messages.append(pb.Message(role="user", content=f"what about {rng.choice(TOPICS)}?"))
        out.append(
            pb.AssembleContextRequest(
                org_id=org, agent_id=agent, model="gpt-4o", request_id=f"bench-{i}", messages=messages
            ).SerializeToString()
        )
    return out


def _env(tree: Path, port: int, redis_url: str, dsn: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        # The tree's client distribution too (clients/python; a tree from before the split has none).
        PYTHONPATH=os.pathsep.join(
            str(tree / d) for d in ("clients/python", "service") if (tree / d).is_dir()
        ),
        IBEX_REDIS_URL=redis_url,
        IBEX_POSTGRES_DSN=dsn,
        IBEX_GRPC_HOST="127.0.0.1",
        IBEX_GRPC_PORT=str(port),
        IBEX_METRICS_PORT="0",
        IBEX_EMBEDDER="hashing",
        IBEX_EMBEDDING_DIM=str(DIM),
        IBEX_LOG_LEVEL="WARNING",
        IBEX_TRACING_EXPORTER="none",
        IBEX_NONCE_SECRET="bench",
        IBEX_PROFILES_PATH=str(PROFILES),
        IBEX_AUTH_ENABLED="false",
    )
    return env


async def _wait_serving(port: int, timeout: float = 60.0) -> None:
    from grpc_health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                check = channel.unary_unary(
                    HEALTH,
                    request_serializer=HealthCheckRequest.SerializeToString,
                    response_deserializer=HealthCheckResponse.FromString,
                )
                if (await check(HealthCheckRequest(), timeout=1)).status == HealthCheckResponse.SERVING:
                    return
        except grpc.aio.AioRpcError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError("server did not become SERVING")


async def _seed(port: int, agents: list[tuple[str, str]], memories: int) -> None:
    rng = random.Random(7)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        upsert = channel.unary_unary(UPSERT, request_serializer=None, response_deserializer=None)
        for org, agent in agents:
            for start in range(0, memories, 100):
                batch = [
                    pb.MemoryInput(content=_memory_text(rng, rng.choice(TOPICS), i), category="factual")
                    for i in range(start, min(memories, start + 100))
                ]
                request = pb.UpsertMemoriesRequest(org_id=org, agent_id=agent, memories=batch)
                await upsert(request.SerializeToString(), timeout=60)


async def _drive(
    port: int, requests: list[bytes], rps: float, warmup_s: float, measure_s: float, pid: int
) -> tuple[int, int, float, float, dict[str, float], list[float]]:
    channels = [
        grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(CHANNELS)
    ]
    calls = [
        ch.unary_unary(
            ASSEMBLE, request_serializer=None, response_deserializer=pb.AssembleContextResponse.FromString
        )
        for ch in channels
    ]
    for call in calls:
        await call(requests[0], timeout=5)
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    errors = degraded = 0
    measuring = False

    async def one(index: int) -> None:
        nonlocal errors, degraded
        started = time.perf_counter()
        try:
            reply = await calls[index % CHANNELS](requests[index % len(requests)], timeout=DEADLINE_S * 4)
        except grpc.aio.AioRpcError:
            if measuring:
                errors += 1
            return
        if measuring:
            latencies.append((time.perf_counter() - started) * 1000)
            degraded += bool(reply.metadata.degradation_reasons)

    pending: set[asyncio.Task[None]] = set()
    interval = 1 / rps
    begin = loop.time()
    next_at = begin
    phase_end = begin + warmup_s
    cpu0 = 0.0
    threads0: dict[str, float] = {}
    window_start = 0.0
    i = 0
    while True:
        now = loop.time()
        if now >= phase_end:
            if measuring:
                break
            measuring = True
            window_start = now
            phase_end = now + measure_s
            cpu0, threads0 = _cpu_seconds(pid), _threads(pid)
        if now < next_at:
            await asyncio.sleep(next_at - now)
            continue
        task = loop.create_task(one(i))
        pending.add(task)
        task.add_done_callback(pending.discard)
        i += 1
        next_at += interval
    measuring = False
    await asyncio.gather(*pending, return_exceptions=True)
    seconds = loop.time() - window_start
    cpu = _cpu_seconds(pid) - cpu0
    threads1 = _threads(pid)
    threads = {k: v - threads0.get(k, 0.0) for k, v in threads1.items()}
    for ch in channels:
        await ch.close()
    return len(latencies), errors, degraded, seconds, cpu, threads, latencies


async def _run_one(
    label: str,
    tree: Path,
    round_: int,
    args: argparse.Namespace,
    stores: tuple[str, str],
    requests: list[bytes],
) -> Run:
    port = _free_port()
    proc = _serve(tree, port, stores, args.server_cpus)
    try:
        await _wait_serving(port)
        calls, errors, degraded, seconds, cpu, threads, latencies = await _drive(
            port, requests, args.rps, args.warmup, args.seconds, proc.pid
        )
        return Run(label, round_, calls, errors, seconds, cpu, threads, latencies, os.getloadavg(), degraded)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _serve(tree: Path, port: int, stores: tuple[str, str], cpus: str = "") -> subprocess.Popen[bytes]:
    pin = ["taskset", "-c", cpus] if cpus else []
    return subprocess.Popen(
        [*pin, sys.executable, "-m", "ibex_context", "serve"],
        env=_env(tree, port, *stores),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _report(runs: list[Run], args: argparse.Namespace, trees: dict[str, Path], started: datetime) -> str:
    pinned = f"pinned to CPU {args.server_cpus}" if args.server_cpus else "not pinned"
    lines = [
        "# Server CPU per AssembleContext call: real service over a socket, two trees back to back",
        "",
        f"Generated {datetime.now(UTC):%Y-%m-%d %H:%M UTC} (started {started:%H:%M}) by "
        f"`python -m benchmarks.serve_cpu`; Python {platform.python_version()}, grpcio {version('grpcio')}, "
        f"protobuf {version('protobuf')}.",
        "",
        f"Setup: throwaway embedded Redis and PostgreSQL on this machine, {args.agents} agents x "
        f"{args.memories} memories (hashing embedder, {DIM} dims), a default profile with the most time "
        "the schema allows each source (fewer calls degraded by the machine's load; "
        "degraded calls cost less); "
        f"`ibex-context serve` (one worker, {pinned}) per tree; open loop at {args.rps:g} RPS over "
        f"{CHANNELS} grpc.aio channels from the driver process, {args.warmup:g} s warm-up then "
        f"{args.seconds:g} s measured; trees alternate run by run, {args.rounds} rounds. "
        "Server CPU = user+system of the whole server process (every thread) over the window / calls "
        "answered. 2-vCPU VM shared with other sessions (load average per run below): latency "
        "depends on the load, and CPU time per call does too (caches, fewer events per loop "
        "iteration), if less: compare runs of similar load.",
        "",
        "Trees: " + ", ".join(f"`{k}` = {v}" for k, v in trees.items()),
        "",
        "| run | tree | calls | errors | degraded | CPU ms/call | p50 / p99 ms | load avg (1 min) "
        "| CPU by thread, ms/call |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in runs:
        split = ", ".join(
            f"{name} {cpu / r.calls * 1000:.2f}"
            for name, cpu in sorted(r.thread_cpu_s.items(), key=lambda kv: -kv[1])
            if cpu > 0
        )
        lines.append(
            f"| {r.round} | {r.label} | {r.calls:,} | {r.errors} | {r.degraded} "
            f"| {r.cpu_ms_per_call:.2f} | "
            f"{_pct(r.latencies_ms, 0.5):.1f} / {_pct(r.latencies_ms, 0.99):.1f} "
            f"| {r.load[0]:.2f} | {split} |"
        )
    lines += ["", "| tree | median CPU ms/call over rounds | min | max |", "|---|---:|---:|---:|"]
    for label in trees:
        values = [r.cpu_ms_per_call for r in runs if r.label == label]
        lines.append(f"| {label} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |")
    return "\n".join(lines) + "\n"


async def _main(args: argparse.Namespace, tree_paths: dict[str, Path]) -> str:
    from ibex_context.devtools.embedded import embedded_stores
    from ibex_context.stores.postgres.migrate import migrate

    started = datetime.now(UTC)
    rng = random.Random(11)
    agents = [
        (
            str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        )
        for _ in range(args.agents)
    ]
    requests = _requests(agents, 400, seed=3)
    with (
        tempfile.TemporaryDirectory(prefix="serve-cpu-") as data,
        embedded_stores(Path(data), remove_on_stop=True) as stores,
    ):
        await migrate(stores.postgres.dsn, DIM)
        store_urls = (stores.redis.url, stores.postgres.dsn)
        seed_tree = list(tree_paths.values())[-1]
        port = _free_port()
        proc = _serve(seed_tree, port, store_urls)
        try:
            await _wait_serving(port)
            await _seed(port, agents, args.memories)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        runs = []
        for round_ in range(1, args.rounds + 1):
            for label, tree in tree_paths.items():
                run = await _run_one(label, tree, round_, args, store_urls, requests)
                print(
                    f"round {round_} {label}: {run.cpu_ms_per_call:.2f} ms/call, {run.calls} calls, "
                    f"{run.errors} errors, {run.degraded} degraded, load {run.load[0]:.2f}",
                    flush=True,
                )
                runs.append(run)
    return _report(runs, args, tree_paths, started)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tree", action="append", required=True, help="label=path of a source tree (repeat)")
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--memories", type=int, default=300)
    parser.add_argument("--rps", type=float, default=50.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--server-cpus", default="", help="taskset CPU list for the measured servers")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/serve_cpu.md"))
    args = parser.parse_args()
    PROFILES.write_text(PROFILES_JSON)
    trees = {label: Path(path).resolve() for label, path in (t.split("=", 1) for t in args.tree)}
    report = asyncio.run(_main(args, trees))
    Path(args.out).write_text(report)
    print(report)


if __name__ == "__main__":
    main()
