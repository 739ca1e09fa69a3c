"""How long large requests hold the event loop from every other call: token counting of
fresh 400,000-character conversations, inline (before) and on the counting thread (after).

Run: ``python -m benchmarks.loop_stall [--large 40] [--out FILE]``

One event loop runs the public ``Assembler.assemble`` (stores answered at once from
memory, as ``benchmarks.compose`` does) for two callers at once: a large caller sending
fresh conversations of 80 messages and 400,000 characters, one 2 ms after the other's
answer (new text each time, so no count is cached: the attack), and a small caller sending a one-message call
due every 5 ms (its latency counted from when it was due). A probe due every millisecond
records how late it ran (the loop's lag). Reported: the probe's lag and the small calls'
latency, for each mode:

* ``inline``: ``IBEX_INLINE_COUNT_CHARS`` out of reach, every request counted on the loop
  (the service before);
* ``off the loop``: the service's default (65,536 characters) with its one counting thread.

The counts are the same exact counts in both modes (checked here too).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ibex_context.models import AssemblyRequest, ChatMessage  # noqa: E402
from ibex_context.pipeline.assembler import Assembler, AssemblerConfig  # noqa: E402
from ibex_context.pipeline.deadlines import DeadlinePolicy  # noqa: E402
from ibex_context.profiles.model import Profile  # noqa: E402
from ibex_context.settings import Settings  # noqa: E402
from ibex_context.tokens.counting import MessageTokenCounter  # noqa: E402
from ibex_context.tokens.encodings import EncodingRegistry  # noqa: E402

from benchmarks.compose import _Sources  # noqa: E402

LARGE_CHARS, LARGE_MESSAGES = 400_000, 80
_WORDS = ("account", "invoice", "refund", "deploy", "rollback", "incident", "ticket", "customer")


def _conversation(rng: random.Random) -> tuple[ChatMessage, ...]:
    per_message = LARGE_CHARS // LARGE_MESSAGES
    messages = []
    for i in range(LARGE_MESSAGES):
        words: list[str] = []
        size = 0
        while size < per_message:
            word = f"{rng.choice(_WORDS)}{rng.randrange(10_000)}"
            words.append(word)
            size += len(word) + 1
        messages.append(ChatMessage("user" if i % 2 == 0 else "assistant", " ".join(words)[:per_message]))
    return tuple(messages)


def _request(i: int, messages: tuple[ChatMessage, ...]) -> AssemblyRequest:
    return AssemblyRequest(
        org_id="o", agent_id="a", session_id="s", model="gpt-4o", request_id=str(i), messages=messages
    )


async def _measure(inline_chars: int, large: int, registry: EncodingRegistry) -> dict[str, object]:
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ibex-token-count")
    counter = MessageTokenCounter(registry)
    assembler = Assembler(
        retriever=_Sources(),  # type: ignore[arg-type]
        encodings=registry,
        message_counter=counter,
        config=AssemblerConfig(
            hot_limit=20,
            cold_limit=50,
            query_max_chars=2000,
            nonce_secret=b"benchmark",
            inline_count_chars=inline_chars,
        ),
        counting_executor=executor,
    )
    profile = Profile()
    deadlines = DeadlinePolicy().within(5.0, profile.deadlines)
    rng = random.Random(20261206)
    conversations = [_conversation(rng) for _ in range(large)]
    small = (ChatMessage("user", "what did we decide about the rollback?"),)
    lags: list[float] = []
    small_ms: list[float] = []
    tokens: list[int] = []
    done = asyncio.Event()

    async def probe() -> None:
        loop = asyncio.get_running_loop()
        while not done.is_set():
            due = loop.time() + 0.001
            await asyncio.sleep(0.001)
            lags.append(max(0.0, loop.time() - due))

    async def large_caller() -> None:
        for i, messages in enumerate(conversations):
            assembly = await assembler.assemble(_request(i, messages), profile, deadlines)
            assert assembly.composed.budget is not None
            tokens.append(assembly.composed.budget.messages_tokens)
            await asyncio.sleep(0.002)  # the next request's arrival
        done.set()

    async def small_caller() -> None:
        # Due every 5 ms from the start: a call's latency runs from when it was due, so the
        # time it waited for the loop counts (a stalled loop delays every call due meanwhile).
        loop = asyncio.get_running_loop()
        first = loop.time()
        i = 0
        while not done.is_set():
            due = first + i * 0.005
            await asyncio.sleep(max(0.0, due - loop.time()))
            await assembler.assemble(_request(-i, small), profile, deadlines)
            small_ms.append((loop.time() - due) * 1000)
            i += 1

    started = time.perf_counter()
    await asyncio.gather(probe(), large_caller(), small_caller())
    wall = time.perf_counter() - started
    executor.shutdown()
    lag_ms = sorted(x * 1000 for x in lags)
    small_sorted = sorted(small_ms)
    return {
        "wall_s": wall,
        "lag_p50": statistics.median(lag_ms),
        "lag_p99": lag_ms[int(0.99 * (len(lag_ms) - 1))],
        "lag_max": lag_ms[-1],
        "small_calls": len(small_ms),
        "small_p50": statistics.median(small_sorted),
        "small_p99": small_sorted[int(0.99 * (len(small_sorted) - 1))],
        "small_max": small_sorted[-1],
        "tokens": tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--large", type=int, default=40, help="fresh 400k-character conversations sent")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both modes, alternated")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures (markdown) here")
    args = parser.parse_args()
    registry = EncodingRegistry()
    registry.preload(["o200k_base"])
    default = Settings().inline_count_chars
    modes = (("inline (before)", 10**9), (f"off the loop above {default:,} (after)", default))
    results: list[tuple[int, str, dict[str, object]]] = []
    for round_ in range(1, args.rounds + 1):  # the modes alternate: both see the machine's load
        for name, inline_chars in modes:
            results.append((round_, name, asyncio.run(_measure(inline_chars, args.large, registry))))
    counts = {tuple(r["tokens"]) for _, _, r in results}  # type: ignore[call-overload]
    assert len(counts) == 1, "the two modes counted differently"
    rows = [
        f"| {round_} | {name} | {r['lag_p50']:.2f} | {r['lag_p99']:.2f} | {r['lag_max']:.2f} | "
        f"{r['small_calls']} | {r['small_p50']:.2f} | {r['small_p99']:.2f} | {r['small_max']:.2f} | "
        f"{r['wall_s']:.2f} |"
        for round_, name, r in results
    ]
    text = "\n".join(
        [
            f"Command: `python -m benchmarks.loop_stall --large {args.large} --rounds {args.rounds}`",
            "",
            f"Setup: {platform.machine()}, {os.cpu_count()} CPUs (shared VM; load average "
            f"{os.getloadavg()[0]:.1f} at the end), Python {platform.python_version()}, asyncio's loop; "
            f"{args.large} fresh conversations of {LARGE_MESSAGES} messages and {LARGE_CHARS:,} characters "
            f"(~{next(iter(counts))[0]:,} o200k tokens each, exact in both modes) 2 ms apart, beside "
            "one-message calls due every 5 ms; a 1 ms probe for the loop's lag; the modes alternate.",
            "",
            "| round | mode | loop lag p50 ms | p99 | max | small calls | small call p50 ms (from due) | p99 "
            "| max | wall s |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
        ]
    )
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
