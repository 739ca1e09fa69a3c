"""gRPC transport cost on the server: grpclib (pure-Python HTTP/2) vs grpcio's asyncio
server (``grpc.aio``, C core), for this service's real AssembleContext message shapes.

Each transport serves the same handler in a server process pinned to one CPU: parse
the AssembleContextRequest (the load test's request mix: new sessions of 1-2
messages, conversations of 20-50 messages), build an AssembleContextResponse (one
injected system message of ~20 memories of the load-test corpus, the client's
messages after it, full metadata with 20 InjectedMemory entries, timings, token
accounting, source outcomes) and serialize it. No assembly runs: what differs
between the two is the transport and the asyncio plumbing around it, which is what
this measures. The message work is identical (upb in both).

A load generator on another CPU (grpc.aio client, C core, open loop: calls are
started on a fixed schedule whatever the server's latency, over 5 channels like
locust's 5 users) offers each rate for a measured window after a warm-up; then a
closed loop (32 calls in flight) finds the saturated throughput. Server CPU per
call is the server process's user+system CPU (every thread) over the window
divided by the calls answered in it; latency is the client's round trip.

Transports alternate rate by rate (grpclib, grpc.aio, grpclib, grpc.aio, ...) so
both see the same machine.

    PYTHONPATH=service:. .venv/bin/python -m benchmarks.transport \\
        --agents-file loadtest/out/data/<data set>/agents.json \\
        --out benchmarks/results/transport-<date>.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

from ibex_context._proto.ibex.context.v1 import context_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent
METHOD = "/ibex.context.v1.ContextAssemblyService/AssembleContext"
TRANSPORTS = ("grpclib", "grpcio-aio")
CHANNELS = 5
DEADLINE_S = 0.045


# --- the handler's work: identical for both transports ---------------------------------


def _canned_injections(count: int, seed: int) -> list[tuple[pb.Message, pb.InjectionMetadata]]:
    """``count`` different (system message, metadata) pairs of a full 20-memory answer."""
    from loadtest import corpus

    rng = random.Random(seed)
    out: list[tuple[pb.Message, pb.InjectionMetadata]] = []
    for _ in range(count):
        blocks = [corpus.directive_text(rng)]
        metadata = pb.InjectionMetadata(
            directive_injected=True,
            memories_injected=20,
            memories_available=70,
            degradation_level=pb.DEGRADATION_LEVEL_FULL,
            profile="default",
            request_id=f"lt-{rng.getrandbits(64):016x}",
        )
        for handle in range(1, 21):
            spec = corpus.memory_spec(rng)
            blocks.append(f"[{handle}] ({spec.category}) {spec.content}")
            memory_id = f"{rng.getrandbits(128):032x}"
            metadata.memory_ids.append(memory_id)
            metadata.memories.add(
                id=memory_id,
                category=spec.category,
                tokens=len(spec.content) // 4,
                score=rng.random(),
                relevance=rng.random(),
                recency=rng.random(),
                usefulness=rng.random(),
                confidence=rng.random(),
                source=pb.MEMORY_SOURCE_COLD,
                semantic=rng.random(),
                lexical=rng.random(),
                handle=handle,
            )
        metadata.total_tokens_injected = 2200
        metadata.context_window_used = 3100
        metadata.timings.CopyFrom(
            pb.StageTimings(
                budget_us=190,
                directive_us=4900,
                hot_us=7500,
                embed_us=1900,
                cold_us=9200,
                score_us=770,
                pack_us=420,
                format_us=230,
                total_us=19000,
                retrieval_us=12000,
                lexical_us=12000,
            )
        )
        metadata.tokens.CopyFrom(
            pb.TokenAccounting(
                encoding="o200k_base",
                exact=True,
                context_window=128000,
                messages_tokens=900,
                directive_tokens=120,
                response_reserve=4096,
                safety_buffer=256,
                memory_budget=4000,
                memory_tokens_used=2080,
            )
        )
        for source in ("directive", "hot", "cold", "lexical"):
            metadata.sources.add(source=source, status=pb.SOURCE_STATUS_OK, duration_us=5000, count=20)
        out.append((pb.Message(role="system", content="\n".join(blocks)), metadata))
    return out


class Responder:
    def __init__(self, seed: int) -> None:
        self._canned = _canned_injections(16, seed)
        self._next = 0

    def __call__(self, request: pb.AssembleContextRequest) -> pb.AssembleContextResponse:
        system, metadata = self._canned[self._next % len(self._canned)]
        self._next += 1
        response = pb.AssembleContextResponse()
        response.messages.append(system)
        response.messages.extend(request.messages)
        response.metadata.CopyFrom(metadata)
        return response


# --- the two servers ----------------------------------------------------------------------


async def _serve_grpclib(port: int, responder: Responder) -> None:
    from grpclib.server import Server, Stream
    from ibex_context._proto.ibex.context.v1 import context_grpc

    class Service(context_grpc.ContextAssemblyServiceBase):
        async def AssembleContext(
            self, stream: Stream[pb.AssembleContextRequest, pb.AssembleContextResponse]
        ) -> None:
            request = await stream.recv_message()
            assert request is not None
            await stream.send_message(responder(request))

    server = Server([Service()])
    await server.start("127.0.0.1", port)
    print("ready", flush=True)
    await server.wait_closed()


async def _serve_grpcio(port: int, responder: Responder) -> None:
    import grpc

    async def assemble(request: pb.AssembleContextRequest, context: Any) -> pb.AssembleContextResponse:
        return responder(request)

    handler = grpc.method_handlers_generic_handler(
        "ibex.context.v1.ContextAssemblyService",
        {
            "AssembleContext": grpc.unary_unary_rpc_method_handler(
                assemble,
                request_deserializer=pb.AssembleContextRequest.FromString,
                response_serializer=pb.AssembleContextResponse.SerializeToString,
            )
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


def serve(transport: str, port: int) -> None:
    responder = Responder(seed=20261125)
    if transport == "grpclib":
        asyncio.run(_serve_grpclib(port, responder))
    else:
        asyncio.run(_serve_grpcio(port, responder))


# --- load generator -----------------------------------------------------------------------


def _requests(agents_file: Path, count: int, seed: int) -> list[bytes]:
    from loadtest.workload import DEFAULT_WEIGHTS, Caller, Workload, build_request, parse_weights

    workload = Workload(agents_file, seed)
    weights = parse_weights(DEFAULT_WEIGHTS)
    rng = random.Random(seed)
    caller = Caller(session_id="6f1c2a8e-0d3b-4c5e-9f7a-1b2c3d4e5f60")
    scenarios = list(weights)
    out = []
    for _ in range(count):
        scenario = rng.choices(scenarios, [weights[s] for s in scenarios])[0]
        out.append(build_request(workload, caller, rng, scenario).SerializeToString())
    return out


@dataclass
class Window:
    calls: int
    errors: int
    seconds: float
    latencies_ms: list[float]


async def _drive(port: int, requests: list[bytes], rps: float, warmup_s: float, measure_s: float) -> Window:
    """Open loop at ``rps`` (``rps`` 0: closed loop, 32 in flight)."""
    import grpc

    channels = [
        grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(CHANNELS)
    ]
    calls = [
        ch.unary_unary(
            METHOD, request_serializer=None, response_deserializer=pb.AssembleContextResponse.FromString
        )
        for ch in channels
    ]
    for call in calls:
        await call(requests[0], timeout=5)
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    errors = 0
    measuring = False
    i = 0

    async def one(index: int) -> None:
        nonlocal errors
        start = time.perf_counter()
        try:
            await calls[index % CHANNELS](requests[index % len(requests)], timeout=DEADLINE_S)
        except grpc.aio.AioRpcError:
            if measuring:
                errors += 1
            return
        if measuring:
            latencies.append((time.perf_counter() - start) * 1000)

    pending: set[asyncio.Task[None]] = set()
    start = loop.time()
    phase_end = start + warmup_s
    window_start = 0.0
    print("warmup", flush=True)
    if rps > 0:
        interval = 1 / rps
        next_at = start
        while True:
            now = loop.time()
            if now >= phase_end:
                if measuring:
                    break
                measuring = True
                window_start = now
                phase_end = now + measure_s
                print("measure", flush=True)
            if now < next_at:
                await asyncio.sleep(next_at - now)
                continue
            task = loop.create_task(one(i))
            pending.add(task)
            task.add_done_callback(pending.discard)
            i += 1
            next_at += interval
    else:
        stop = False

        async def worker(offset: int) -> None:
            nonlocal i
            while not stop:
                i += 1
                await one(i + offset)

        workers = [loop.create_task(worker(w)) for w in range(32)]
        await asyncio.sleep(warmup_s)
        measuring = True
        window_start = loop.time()
        print("measure", flush=True)
        await asyncio.sleep(measure_s)
        stop = True
        pending.update(workers)
    measured_s = loop.time() - window_start
    print("done", flush=True)
    measuring = False
    await asyncio.gather(*pending, return_exceptions=True)
    for ch in channels:
        await ch.close()
    return Window(calls=len(latencies), errors=errors, seconds=measured_s, latencies_ms=latencies)


def drive(port: int, agents_file: Path, rps: float, warmup_s: float, measure_s: float) -> None:
    requests = _requests(agents_file, 500, seed=20261122)
    window = asyncio.run(_drive(port, requests, rps, warmup_s, measure_s))
    print(json.dumps(window.__dict__), flush=True)


# --- orchestration ------------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime: every thread


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT / "service"), str(ROOT)])
    return dict(os.environ, PYTHONPATH=path, OPENBLAS_NUM_THREADS="1")


@dataclass
class Run:
    transport: str
    rps: float
    calls: int
    errors: int
    achieved_rps: float
    cpu_ms_per_call: float
    cpu_share: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    load_average: float


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_one(args: argparse.Namespace, transport: str, rps: float) -> Run:
    port = _free_port()
    server = subprocess.Popen(
        [
            "taskset",
            "-c",
            args.server_cpu,
            sys.executable,
            "-m",
            "benchmarks.transport",
            "serve",
            transport,
            str(port),
        ],
        env=_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{transport} server did not start")
        client = subprocess.Popen(
            [
                "taskset",
                "-c",
                args.client_cpu,
                sys.executable,
                "-m",
                "benchmarks.transport",
                "drive",
                str(port),
                str(args.agents_file),
                str(rps),
                str(args.warmup),
                str(args.seconds),
            ],
            env=_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert client.stdout is not None
        cpu_start = cpu_end = 0.0
        result: dict[str, Any] = {}
        for line in client.stdout:
            line = line.strip()
            if line == "measure":
                cpu_start = _cpu_seconds(server.pid)
            elif line == "done":
                cpu_end = _cpu_seconds(server.pid)
            elif line.startswith("{"):
                result = json.loads(line)
        if client.wait() != 0 or not result:
            raise RuntimeError(f"load generator failed against {transport}")
    finally:
        server.terminate()
        server.wait(10)
    calls = int(result["calls"])
    seconds = float(result["seconds"])
    latencies = [float(v) for v in result["latencies_ms"]]
    cpu = cpu_end - cpu_start
    return Run(
        transport=transport,
        rps=rps,
        calls=calls,
        errors=int(result["errors"]),
        achieved_rps=calls / seconds,
        cpu_ms_per_call=cpu / max(calls, 1) * 1000,
        cpu_share=cpu / seconds,
        p50_ms=_percentile(latencies, 0.50),
        p90_ms=_percentile(latencies, 0.90),
        p99_ms=_percentile(latencies, 0.99),
        max_ms=max(latencies, default=float("nan")),
        load_average=os.getloadavg()[0],
    )


def _table(runs: list[Run]) -> list[str]:
    lines = [
        "| transport | offered RPS | round | calls | errors | achieved RPS | server CPU ms/call "
        "| server CPU % of a core | p50 ms | p90 ms | p99 ms | max ms | load avg |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rounds: dict[tuple[str, float], int] = {}
    for r in runs:
        n = rounds[(r.transport, r.rps)] = rounds.get((r.transport, r.rps), 0) + 1
        offered = "closed loop (32)" if r.rps == 0 else f"{r.rps:g}"
        lines.append(
            f"| {r.transport} | {offered} | {n} | {r.calls:,} | {r.errors} | {r.achieved_rps:.0f} | "
            f"{r.cpu_ms_per_call:.3f} | {r.cpu_share * 100:.0f} | {r.p50_ms:.2f} | {r.p90_ms:.2f} | "
            f"{r.p99_ms:.2f} | {r.max_ms:.1f} | {r.load_average:.2f} |"
        )
    return lines


def _summary(runs: list[Run]) -> list[str]:
    lines = [
        "| offered RPS | grpclib CPU ms/call | grpc.aio CPU ms/call | grpclib p50 / p99 ms "
        "| grpc.aio p50 / p99 ms | grpclib RPS | grpc.aio RPS |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rps in sorted({r.rps for r in runs}, key=lambda v: (v == 0, v)):
        cells = []
        by = {t: [r for r in runs if r.rps == rps and r.transport == t] for t in TRANSPORTS}
        for metric in ("cpu", "lat", "rps"):
            for t in TRANSPORTS:
                rs = by[t]
                if metric == "cpu":
                    cells.append(f"{statistics.median(r.cpu_ms_per_call for r in rs):.3f}")
                elif metric == "lat":
                    p50 = statistics.median(r.p50_ms for r in rs)
                    p99 = statistics.median(r.p99_ms for r in rs)
                    cells.append(f"{p50:.2f} / {p99:.2f}")
                else:
                    cells.append(f"{statistics.median(r.achieved_rps for r in rs):.0f}")
        offered = "closed loop (32 in flight)" if rps == 0 else f"{rps:g}"
        lines.append(f"| {offered} | " + " | ".join(cells) + " |")
    return lines


def main_run(args: argparse.Namespace) -> None:
    runs: list[Run] = []
    rates = [float(r) for r in args.rates.split(",")]
    started = datetime.now(UTC)
    load_start = os.getloadavg()
    for round_ in range(args.rounds):
        for rps in rates:
            order = TRANSPORTS if round_ % 2 == 0 else tuple(reversed(TRANSPORTS))
            for transport in order:
                run = run_one(args, transport, rps)
                print(
                    f"{transport:11} rps={rps:g} calls={run.calls} cpu/call={run.cpu_ms_per_call:.3f} ms "
                    f"p50={run.p50_ms:.2f} p99={run.p99_ms:.2f} achieved={run.achieved_rps:.0f}",
                    flush=True,
                )
                runs.append(run)
    versions = ", ".join(f"{p} {version(p)}" for p in ("grpclib", "h2", "grpcio", "protobuf"))
    text = [
        "# gRPC transport: grpclib vs grpc.aio (AssembleContext shapes)",
        "",
        f"{started:%Y-%m-%d %H:%M} UTC, `python -m benchmarks.transport` ({args.rounds} rounds, "
        f"{args.warmup:g} s warm-up + {args.seconds:g} s measured per run, transports alternated).",
        "",
        "## Medians over the rounds",
        "",
        *_summary(runs),
        "",
        "## Every run",
        "",
        *_table(runs),
        "",
        "## Setup",
        "",
        f"- Machine: {os.cpu_count()} vCPU ({platform.processor() or platform.machine()}), shared; "
        f"load average {load_start[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end.",
        f"- Server: one process pinned to CPU {args.server_cpu}, default asyncio loop, the handler parses "
        "the "
        "request and returns one injected system message (directive + 20 load-test-corpus memories, "
        "~9 kB) + the client's messages + full metadata (20 InjectedMemory); no assembly, no stores.",
        f"- Client: grpc.aio (C core) pinned to CPU {args.client_cpu}, {CHANNELS} channels, open loop at the "
        f"offered rate (closed loop: 32 calls in flight), {DEADLINE_S * 1000:.0f} ms deadline per call, "
        f"requests of the load test's scenario mix from `{args.agents_file.name}`'s agents.",
        "- Server CPU: user+system of the whole server process (every thread) from /proc over the "
        "measured window, divided by the calls answered in it.",
        f"- Versions: python {platform.python_version()}, {versions}.",
    ]
    args.out.write_text("\n".join(text) + "\n")
    print(f"wrote {args.out}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "drive":
        drive(int(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--agents-file", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--rates", default="50,200,400,0", help="offered RPS, comma-separated; 0 = closed loop"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--server-cpu", default="0")
    parser.add_argument("--client-cpu", default="1")
    main_run(parser.parse_args())


if __name__ == "__main__":
    main()
