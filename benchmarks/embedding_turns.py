"""How long a query waits for its vector when queued queries share an inference (turns of
several) or run one a turn, on one core beside an event loop that works between them.

Run: ``.venv/bin/python -m benchmarks.embedding_turns [--turns 4,1] [--rate 35] [--out FILE]``

The server's query embedding in miniature, in one process pinned to one core (as a pod's
own cgroup holds it): the real MiniLM embedder (int8 queries, its worker threads at the
chart's nice value), an event loop (uvloop) to which calls arrive as a Poisson process at
``--rate`` a second. Each call hands its question to the embedder, then works on the loop
for ``--loop-ms`` in slices of ``--slice-ms`` (what the server does for a call besides the
inference: receiving, the stores' replies, ranking, packing, the answer), then awaits its
vector. A call's wait is from its submission to the vector's arrival on the loop, as the
server's embed stage counts it. The questions are made as the load test makes them (a span
of a seeded memory's words after an opener, tagged with three words to make it unique:
22 word pieces on average).

Each round draws its arrivals and questions from its own seed and runs them through every
turn size, the order alternated round by round, so a drift of the machine falls on all
alike. Reported per turn size: the waits' percentiles over all rounds and the worker's CPU
time a query (``time.thread_time`` around each inference, from the embedder's turn timings).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ibex_context.embedding.batching import EmbeddingTurn  # noqa: E402
from ibex_context.embedding.minilm import MiniLMEmbedder  # noqa: E402

from loadtest import corpus  # noqa: E402
from loadtest.options import chart_worker_nice  # noqa: E402
from loadtest.workload import unique_question  # noqa: E402


def question(rng: random.Random) -> str:
    """A question as the load test asks it: about a seeded memory, tagged to make it unique."""
    memory = corpus.memory_text(rng, rng.choice(corpus.CATEGORIES), corpus.target_tokens(rng))
    return unique_question(rng, corpus.query_from_memory(rng, memory))


def arrivals(rng: random.Random, rate: float, seconds: float) -> list[tuple[float, str]]:
    """(offset in seconds, question) of a Poisson process at ``rate`` over ``seconds``."""
    calls: list[tuple[float, str]] = []
    at = rng.expovariate(rate)
    while at < seconds:
        calls.append((at, question(rng)))
        at += rng.expovariate(rate)
    return calls


def work(milliseconds: float) -> None:
    """Holds the loop's thread on the core for ``milliseconds`` (as a call's own work does)."""
    end = time.perf_counter() + milliseconds / 1000
    while time.perf_counter() < end:
        pass


@dataclass(eq=False, slots=True)
class TurnLog:
    """A worker's turn reports, recorded from its thread. The worker reports a turn just
    after handing its vectors over, so a caller can have its vector before its turn is
    counted: ``wait_for`` waits for the count."""

    turns: list[EmbeddingTurn] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def record(self, turn: EmbeddingTurn) -> None:
        with self.changed:
            self.turns.append(turn)
            self.changed.notify_all()

    def wait_for(self, texts: int, timeout: float = 5.0) -> None:
        """Blocks until the turns of ``texts`` queries are recorded, or ``timeout`` seconds."""
        with self.changed:
            self.changed.wait_for(lambda: sum(t.texts for t in self.turns) >= texts, timeout)


@dataclass(slots=True)
class Arm:
    """One turn size's embedder and what its calls waited."""

    queries_per_turn: int
    embedder: MiniLMEmbedder
    log: TurnLog
    waits_ms: list[float] = field(default_factory=list)

    @property
    def turns(self) -> list[EmbeddingTurn]:
        return self.log.turns

    @property
    def cpu_ms_a_query(self) -> float:
        return 1000 * sum(t.on_cpu for t in self.turns) / max(1, sum(t.texts for t in self.turns))


async def call(arm: Arm, text: str, loop_ms: float, slice_ms: float) -> None:
    submitted = time.perf_counter()
    vector = asyncio.wrap_future(arm.embedder.submit_queries([text], tenant="org"))
    for _ in range(max(1, round(loop_ms / slice_ms))):
        work(slice_ms)
        await asyncio.sleep(0)  # the loop's other callbacks run between a call's slices
    await vector
    arm.waits_ms.append((time.perf_counter() - submitted) * 1000)


async def run_round(arm: Arm, calls: list[tuple[float, str]], loop_ms: float, slice_ms: float) -> None:
    start = time.perf_counter()
    tasks = []
    for at, text in calls:
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(call(arm, text, loop_ms, slice_ms)))
    await asyncio.gather(*tasks)


async def measure(args: argparse.Namespace) -> list[Arm]:
    arms: list[Arm] = []
    for n in args.turns:
        log = TurnLog()
        embedder = MiniLMEmbedder.load(worker_nice=args.nice, observe=log.record, queries_per_turn=n)
        arms.append(Arm(n, embedder, log))
    warm_up = 5  # the first inferences allocate
    for arm in arms:
        for i in range(warm_up):
            await asyncio.wrap_future(arm.embedder.submit_queries([question(random.Random(i))]))
        await asyncio.to_thread(arm.log.wait_for, warm_up)
        arm.turns.clear()
    try:
        asked = 0
        for round_ in range(args.rounds):
            calls = arrivals(random.Random(args.seed + round_), args.rate, args.seconds)
            asked += len(calls)
            for arm in arms if round_ % 2 == 0 else list(reversed(arms)):
                await run_round(arm, calls, args.loop_ms, args.slice_ms)
        for arm in arms:
            await asyncio.to_thread(arm.log.wait_for, asked)
    finally:
        for arm in arms:
            await arm.embedder.aclose()
    return arms


def report(arms: list[Arm], args: argparse.Namespace, command: str) -> str:
    load = os.getloadavg()
    lines = [
        f"# Query waits by queries a turn ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"Command: `{command}`",
        "",
        f"Setup: {platform.machine()}, pinned to CPU {args.cpu} of {os.cpu_count()} (load average"
        f" {load[0]:.1f} at the end), Python {platform.python_version()}, all-MiniLM-L6-v2 on ONNX"
        f" Runtime (int8 queries, one intra-op thread), query workers at nice {args.nice}; calls at"
        f" {args.rate:g} a second (Poisson), each working {args.loop_ms:g} ms on the loop in"
        f" {args.slice_ms:g} ms slices; {args.rounds} rounds of {args.seconds:g} s, the same calls for"
        " every turn size, the order alternated.",
        "",
        "| queries a turn | calls | wait p50 ms | p90 | p95 | p99 | worker CPU ms a query | inferences |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arm in arms:
        w = arm.waits_ms
        lines.append(
            f"| {arm.queries_per_turn} | {len(w):,} | {np.percentile(w, 50):.1f} | {np.percentile(w, 90):.1f}"
            f" | {np.percentile(w, 95):.1f} | {np.percentile(w, 99):.1f} | {arm.cpu_ms_a_query:.2f}"
            f" | {len(arm.turns):,} |"
        )
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", default="4,1", help="queries a turn to compare, comma-separated")
    parser.add_argument("--rate", type=float, default=35.0, help="calls a second")
    parser.add_argument("--loop-ms", type=float, default=5.0, help="a call's own work on the loop")
    parser.add_argument("--slice-ms", type=float, default=0.5)
    parser.add_argument("--seconds", type=float, default=20.0, help="a round's length")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--nice", type=int, default=None, help="the query workers' nice value (default: the chart's)"
    )
    parser.add_argument("--cpu", type=int, default=0, help="the core the process is pinned to")
    parser.add_argument("--seed", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    args.turns = [int(n) for n in args.turns.split(",")]
    if args.nice is None:
        args.nice = chart_worker_nice()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})
    import uvloop

    arms = uvloop.run(measure(args))
    given = sys.argv[1:] if argv is None else argv
    text = report(arms, args, " ".join([".venv/bin/python -m benchmarks.embedding_turns", *given]))
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
