"""How long one org's small write waits for the embedding worker while another org imports.

Run: ``python -m benchmarks.write_fairness [--importers 8] [--seconds 30] [--out FILE]``

The service's MiniLM embedder as built from the settings (``embedding.factory``), texts to
store handed over as the write API hands them (``embedding.base.embed_to_store``: a call's
memories 64 at a time, the worker taking ``max_batch`` of them a turn). Org A imports:
``--importers`` calls in flight at once, each embedding batch after batch of 64 texts
drawn from the load test's corpus, for ``--seconds``. Org B writes one memory every
``--every`` seconds beside it; its wait is the time from hand-over to its vector.

``--one-queue`` puts both orgs' texts in one tenant's queue: the first-come order every
org's writes shared before texts to store took turns by org (the queue within one org is
still first come, first served), so before and after run on the same code and machine.

No stores: this isolates the embedding worker, which is where an import holds other
writes up (PostgreSQL's share of a write is milliseconds; MiniLM's ~9 ms a text here).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ibex_context.embedding.base import Embedder, embed_to_store  # noqa: E402
from ibex_context.embedding.factory import build_embedder  # noqa: E402
from ibex_context.settings import Settings  # noqa: E402

from loadtest import corpus  # noqa: E402

BATCH = 64  # texts a write hands over at once (memory_api.writes)


async def _import(embedder: Embedder, org: str, texts: list[str], until: float, done: list[int]) -> None:
    while time.perf_counter() < until:
        await embed_to_store(embedder, org, texts)
        done[0] += len(texts)


async def _small_writes(
    embedder: Embedder, org: str, texts: list[str], every: float, until: float, waits: list[float]
) -> None:
    i = 0
    while time.perf_counter() < until:
        started = time.perf_counter()
        await embed_to_store(embedder, org, [texts[i % len(texts)]])
        waits.append(time.perf_counter() - started)
        i += 1
        await asyncio.sleep(max(0.0, every - (time.perf_counter() - started)))


async def measure(args: argparse.Namespace) -> dict[str, object]:
    settings = Settings(embedder="minilm")
    embedder = build_embedder(settings)
    rng = random.Random(args.seed)
    texts = [corpus.memory_spec(rng).content for _ in range(BATCH * args.importers + 100)]
    importer, writer = ("shared", "shared") if args.one_queue else ("org-a", "org-b")
    try:
        await embed_to_store(embedder, writer, texts[:8])  # warm-up: sessions, allocations
        until = time.perf_counter() + args.seconds
        imported, waits = [0], list[float]()
        await asyncio.gather(
            *(
                _import(embedder, importer, texts[i * BATCH : (i + 1) * BATCH], until, imported)
                for i in range(args.importers)
            ),
            _small_writes(embedder, writer, texts[-100:], args.every, until, waits),
        )
    finally:
        await embedder.aclose()
    ordered = sorted(waits)

    def rank(q: float) -> float:  # nearest rank: a value that was measured
        return round(1000 * ordered[max(0, math.ceil(q * len(ordered)) - 1)], 1)

    return {
        "queue": "one queue (first come, first served)" if args.one_queue else "per org, in turns",
        "importers": args.importers,
        "seconds": args.seconds,
        "imported_texts_per_second": round(imported[0] / args.seconds, 1),
        "small_writes": len(waits),
        "wait_ms": {"p50": rank(0.5), "p95": rank(0.95), "max": rank(1.0)},
        "machine": {
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--importers", type=int, default=8, help="org A's import calls in flight")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--every", type=float, default=0.5, help="seconds between org B's writes")
    parser.add_argument("--one-queue", action="store_true", help="both orgs in one first-come queue")
    parser.add_argument("--seed", type=int, default=20261207)
    parser.add_argument("--out", type=Path, help="append the figures (JSON lines) to this file")
    args = parser.parse_args()
    figures = asyncio.run(measure(args))
    line = json.dumps(figures)
    print(line)
    if args.out is not None:
        with args.out.open("a") as out:
            out.write(line + "\n")


if __name__ == "__main__":
    main()
