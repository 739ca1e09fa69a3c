"""The query-embedding cache's hit rate on the agent-loop workload, keyed by text (one
cache for every org) and by org and text (the service's keys), replayed offline.

Run: ``python -m benchmarks.embedding_cache [--requests 9000] [--out FILE]``

The replay sends nothing: it draws the requests ``loadtest/run --scenario agent-loop``
sends (``loadtest.workload.RequestMix``, ``agent_loop=1``: a question, then 0-8 tool
calls repeating it) for that scenario's shape (100 agents over the seeder's 4 orgs, 30
callers, 150 RPS for 60 s: 9,000 requests), takes each request's query as the assembler
does (the last user message's last ``IBEX_QUERY_MAX_CHARS``, whitespace normalised) and
looks it up in an LRU of ``IBEX_EMBEDDING_CACHE_SIZE`` entries under both keyings.
Agents' sample questions are drawn from the load test's corpus as the seeder draws them
(a span of one of the agent's memories). Run twice: with every question unique (the
load test's default, ``--unique-queries 1``) and with questions repeating across the
agents (``--unique-queries 0``), where orgs do send the same texts.

The replay ignores concurrency (a repeat that arrives while its embedding is in flight
shares it, counted as a hit here) and MiniLM's token tail (it bounds the text embedded
to its last word pieces: the same under both keyings).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import tempfile
from collections import OrderedDict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ibex_context.embedding.cache import normalise_query  # noqa: E402
from ibex_context.settings import Settings  # noqa: E402

from loadtest import corpus  # noqa: E402
from loadtest.seed import SeedPlan, plan_agents  # noqa: E402
from loadtest.workload import Caller, RequestMix, Workload  # noqa: E402

AGENTS, CALLERS, QUERIES_PER_AGENT = 100, 30, 8


def _agents_file(directory: Path, seed: int) -> Path:
    rng = random.Random(seed)
    agents = []
    for agent in plan_agents(SeedPlan(agents=AGENTS, memories=1000)):
        memories = [corpus.memory_spec(rng).content for _ in range(QUERIES_PER_AGENT)]
        queries = [corpus.query_from_memory(rng, text) for text in memories]
        agents.append(
            {"org_id": agent.org_id, "agent_id": agent.agent_id, "memories": 1000, "queries": queries}
        )
    path = directory / "agents.json"
    path.write_text(json.dumps({"agents": agents}))
    return path


class _Lru:
    def __init__(self, size: int) -> None:
        self._size, self._entries = size, OrderedDict[object, None]()
        self.hits = self.lookups = 0

    def lookup(self, key: object) -> None:
        self.lookups += 1
        if key in self._entries:
            self.hits += 1
            self._entries.move_to_end(key)
            return
        if self._size > 0:
            self._entries[key] = None
            if len(self._entries) > self._size:
                self._entries.popitem(last=False)

    @property
    def rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0


def replay(requests: int, *, unique: bool, seed: int) -> dict[str, float]:
    settings = Settings()
    with tempfile.TemporaryDirectory() as directory:
        workload = Workload(_agents_file(Path(directory), seed), seed)
    rng = random.Random(seed)
    mixes = [
        RequestMix(
            workload,
            Caller(session_id=f"caller-{i}", unique_questions=unique),
            random.Random(f"{seed}:{i}"),
            {"agent_loop": 1},
        )
        for i in range(CALLERS)
    ]
    by_text, by_org = _Lru(settings.embedding_cache_size), _Lru(settings.embedding_cache_size)
    for _ in range(requests):
        _, request = rng.choice(mixes).next()
        query = next(m.content for m in reversed(request.messages) if m.role == "user")
        query = normalise_query(query[-settings.query_max_chars :])
        by_text.lookup(query)
        by_org.lookup((request.org_id, query))
    return {"by_text": by_text.rate, "by_org": by_org.rate, "lookups": float(by_text.lookups)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=9000)
    parser.add_argument("--seed", type=int, default=20261206)
    parser.add_argument("--out", type=Path, default=None, help="also write the figures (markdown) here")
    args = parser.parse_args()
    rows = []
    for unique in (True, False):
        figures = replay(args.requests, unique=unique, seed=args.seed)
        rows.append(
            f"| {'unique' if unique else 'repeating'} | {int(figures['lookups']):,} | "
            f"{100 * figures['by_text']:.1f} % | {100 * figures['by_org']:.1f} % |"
        )
    text = "\n".join(
        [
            f"Command: `python -m benchmarks.embedding_cache --requests {args.requests} --seed {args.seed}`",
            "",
            f"Setup: offline replay (no server), Python {platform.python_version()}; the agent-loop "
            "scenario's "
            f"shape ({AGENTS} agents over 4 orgs, {CALLERS} callers), LRU of "
            f"{Settings().embedding_cache_size:,} entries.",
            "",
            "| questions | lookups | hit rate, keyed by text | hit rate, keyed by org and text |",
            "|---|---:|---:|---:|",
            *rows,
        ]
    )
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
