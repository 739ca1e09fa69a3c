"""What the LiteLLM hook adds to a chat completion at the proxy, p50 and p99.

Three real LiteLLM proxies (``.venv-litellm``, scripts/bootstrap.sh ``ensure_litellm_venv``) in
front of one stand-in model on loopback that answers at once: without the hook, with the hook and
the service up (``ibex-context serve`` on embedded Redis and PostgreSQL, the hashing embedder, the
agent holding a directive and ``--memories`` memories), and with the hook and the service gone
(the port refuses). Requests go one at a time, the three proxies in turn in blocks of ``--block``,
so the machine's noise falls on all three alike. Latency is the client's: the request sent to the
proxy until its answer is read.

    .venv/bin/python -m benchmarks.litellm_hook --requests 400 [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime as dt
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadtest.machine import git_commit  # noqa: E402

ORG = str(uuid.uuid4())
AGENT = str(uuid.uuid4())
DIRECTIVE = "Answer as the support desk of a bicycle shop."
QUESTION = "Which tyre pressure did we settle on for the gravel bike?"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@contextlib.asynccontextmanager
async def _service(work: Path) -> AsyncIterator[str]:
    """``ibex-context serve`` as its own process on embedded stores; its target."""
    from ibex_context.devtools.embedded import embedded_stores
    from ibex_context.stores.postgres.migrate import migrate
    from ibex_context_client import ContextClient

    with embedded_stores(work / "stores") as stores:
        await migrate(stores.postgres.dsn, 384)
        port = _free_port()
        env = {
            **os.environ,
            "IBEX_POSTGRES_DSN": stores.postgres.dsn,
            "IBEX_REDIS_URL": stores.redis.url,
            "IBEX_GRPC_HOST": "127.0.0.1",
            "IBEX_GRPC_PORT": str(port),
            "IBEX_METRICS_PORT": "0",
            "IBEX_EMBEDDER": "hashing",
            "IBEX_EMBEDDING_DIM": "384",
            "IBEX_LOG_LEVEL": "WARNING",
            "IBEX_TRACING_EXPORTER": "none",
            "IBEX_AUTH_ENABLED": "false",
        }
        with (work / "service.log").open("wb") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "ibex_context", "serve", env=env, stdout=log, stderr=log
            )
        target = f"127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            async with ContextClient(target) as probe:
                while True:
                    with contextlib.suppress(Exception):
                        if await probe.check_health(timeout=1.0) == "SERVING":
                            break
                    if process.returncode is not None or time.monotonic() > deadline:
                        raise RuntimeError((work / "service.log").read_text()[-3000:])
                    await asyncio.sleep(0.5)
            yield target
        finally:
            process.terminate()
            await process.wait()


async def _seed(target: str, memories: int) -> None:
    from ibex_context_client import MemoryClient, NewMemory

    async with MemoryClient(target) as client:
        await client.set_directive(ORG, AGENT, DIRECTIVE)
        await client.upsert_memories(
            ORG,
            AGENT,
            [
                NewMemory(
                    content=f"Gravel bike note {i}: tyre pressure {30 + i % 20} psi on trail {i}.",
                    category="factual",
                    confidence=0.9,
                )
                for i in range(memories)
            ],
        )


async def _measure(args: argparse.Namespace) -> str:
    from ibex_context.devtools.fake_openai import fake_openai
    from ibex_context.devtools.litellm_proxy import litellm_proxy, litellm_venv, proxy_config

    hook = {"org_id": ORG, "agent_id": AGENT}
    with tempfile.TemporaryDirectory(prefix="ibex-litellm-bench-") as temp:
        work = Path(temp)
        async with (
            fake_openai(keep=10) as upstream,
            _service(work) as target,
        ):
            await _seed(target, args.memories)
            configs = {
                "no hook": proxy_config(upstream.base_url),
                "hook, service up": proxy_config(upstream.base_url, hook={**hook, "target": target}),
                "hook, service gone": proxy_config(
                    upstream.base_url, hook={**hook, "target": f"127.0.0.1:{_free_port()}"}
                ),
            }
            async with contextlib.AsyncExitStack() as stack:
                proxies = {
                    name: await stack.enter_async_context(litellm_proxy(config, work / f"proxy-{i}"))
                    for i, (name, config) in enumerate(configs.items())
                }
                load_before = os.getloadavg()
                timings: dict[str, list[float]] = {name: [] for name in proxies}
                # The hook's own call as it measured it (x-ibex-context-ms), and its outcomes.
                hook_ms: dict[str, list[float]] = {name: [] for name in proxies}
                outcomes: dict[str, collections.Counter[str]] = {n: collections.Counter() for n in proxies}
                assembled = 0
                body = {"model": "gpt-4o", "messages": [{"role": "user", "content": QUESTION}]}
                async with httpx.AsyncClient(timeout=30.0) as http:
                    for proxy in proxies.values():  # warm-up: connections, the hook's channel
                        for _ in range(args.warmup):
                            await http.post(
                                f"{proxy.base_url}/v1/chat/completions", headers=proxy.headers, json=body
                            )
                    while min(len(t) for t in timings.values()) < args.requests:
                        for name, proxy in proxies.items():
                            for _ in range(args.block):
                                started = time.perf_counter()
                                reply = await http.post(
                                    f"{proxy.base_url}/v1/chat/completions", headers=proxy.headers, json=body
                                )
                                timings[name].append((time.perf_counter() - started) * 1000)
                                reply.raise_for_status()
                                if "x-ibex-context" in reply.headers:
                                    outcomes[name][reply.headers["x-ibex-context"]] += 1
                                if "x-ibex-context-ms" in reply.headers:
                                    hook_ms[name].append(float(reply.headers["x-ibex-context-ms"]))
                                if name == "hook, service up":
                                    sent = str(upstream.received[-1]["messages"])
                                    assembled += DIRECTIVE in sent
                load_after = os.getloadavg()
    litellm_version = (litellm_venv() / "lib").glob("python3*/site-packages/litellm-*.dist-info")
    version = next(iter(litellm_version), Path("litellm-unknown.dist-info")).name.removesuffix(".dist-info")
    base = timings["no hook"]
    rows = []
    for name, values in timings.items():
        p50, p99 = statistics.median(values), _percentile(values, 0.99)
        added = (
            ""
            if name == "no hook"
            else f"{p50 - statistics.median(base):+.2f} / {p99 - _percentile(base, 0.99):+.2f}"
        )
        rows.append(f"| {name} | {len(values)} | {p50:.2f} | {p99:.2f} | {max(values):.2f} | {added} |")
    up = len(timings["hook, service up"])
    hook_rows = [
        f"| {name} | {statistics.median(values):.2f} | {_percentile(values, 0.99):.2f} | {max(values):.2f}"
        f" | {', '.join(f'{k} {v}' for k, v in outcomes[name].most_common())} |"
        for name, values in hook_ms.items()
        if values
    ]
    return "\n".join(
        [
            f"# The LiteLLM hook's added latency at the proxy ({dt.date.today().isoformat()})",
            "",
            f"Command: `python -m benchmarks.litellm_hook --requests {args.requests} --block {args.block}"
            f" --memories {args.memories}`; commit {git_commit()}.",
            "",
            f"Setup: {version.replace('-', ' ')} proxy (one worker) per variant, each in front of the same"
            " stand-in OpenAI model on loopback (answers at once, so the figures are the proxy's own);"
            " `ibex-context serve` as its own process on embedded Redis and PostgreSQL, hashing embedder,"
            f" no auth; the agent holds a directive and {args.memories} memories. The hook at its"
            " defaults (45 ms). One request at a time, the variants in turn in blocks of"
            f" {args.block}; latency measured by the client, request to full answer, in ms. Python"
            f" {platform.python_version()} on {platform.machine()}.",
            "",
            f"Machine: 2 vCPUs shared with other engineers' test runs; load average"
            f" {load_before[0]:.1f} before and {load_after[0]:.1f} after the measured requests. The"
            " noise is large: compare the rows of this file only.",
            "",
            "Each request, sent to the proxy until its answer is read (the hook's added latency is the"
            " difference of the rows):",
            "",
            "| variant | requests | p50 ms | p99 ms | max ms | added p50 / p99 ms |",
            "|---|---:|---:|---:|---:|---:|",
            *rows,
            "",
            "The hook's own call inside the proxy, as it reports it on the answer (`x-ibex-context-ms`:"
            " the `AssembleContext` call's wall time in the proxy's event loop), and the outcomes"
            " (`x-ibex-context`):",
            "",
            "| variant | p50 ms | p99 ms | max ms | outcomes |",
            "|---|---:|---:|---:|---|",
            *hook_rows,
            "",
            f"With the service up, {assembled} of {up} requests reached the model with the directive and"
            " memories; the outcomes say what became of the others. The hook's own time can pass 45 ms:"
            " the deadline bounds the gRPC call, and the proxy's busy event loop adds its own lag to"
            " when the hook resumes (the p99 and max of the second table).",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=400, help="Per variant.")
    parser.add_argument("--block", type=int, default=20, help="Requests to one variant before the next.")
    parser.add_argument("--warmup", type=int, default=20, help="Per variant, not measured.")
    parser.add_argument("--memories", type=int, default=200)
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "benchmarks" / "results" / f"litellm_hook-{dt.date.today().isoformat()}.md",
    )
    args = parser.parse_args()
    report = asyncio.run(_measure(args))
    args.out.write_text(report)
    print(report)


if __name__ == "__main__":
    main()
