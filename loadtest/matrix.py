# ruff: noqa: E501  (report templates read better unwrapped)
"""The benchmark matrix on this machine, one command: ``loadtest/matrix``.

Server pinned to CPU 0, locust and the stores to CPU 1 (``loadtest/run`` for each step). Steps:

1. 100 agents x 1k memories, hashing embedder: 50 / 200 / 400 RPS;
2. the maximum sustainable rate of one server process: step the arrival rate up
   (``--step-start``, x ``--step-factor`` per step) until p99 >= 50 ms, >= 0.1 % of calls fail (the
   45 ms deadline) or the achieved rate falls 5 % short of the offered one (degraded answers are
   answers here; the fallback rate is reported and gated on its own);
3. a py-spy profile of the server at 600 RPS (the per-process target);
4. two server processes (``serve --workers 2``, SO_REUSEPORT; one per core, so locust
   shares CPU 1 with the second) at the highest rate tried in step 2;
5. the MiniLM embedder in the service (same data) at 200 RPS;
6. one agent x 100k memories (HNSW, random unit vectors) at 50 RPS: the cold-search
   stage's p95 from the service's histogram against the 30 ms gate;
7. 100 agents x 10k memories (1M rows): only with ``--include-big`` (seeding and the
   HNSW build take tens of minutes here; see the estimate printed);
8. ``shapes`` (only when asked, ``--only shapes [--shapes baseline,agents-10k,...]``): issue 26's
   data shapes (``SHAPES``: 100 x 1k, 1,000 x 1k, 100 x 10k, 10 x 100k, 1 x 1M, mixed) at 50
   RPS with MiniLM serving the queries and stored vectors drawn from the model of its own
   (``loadtest.vectors``), each followed by ``benchmarks.cold_plans`` on its data set (single searches per plan,
   recall@50 against exact), gated on cold p95 <= 10 ms, FULL >= 99.9 %, p99 < 30 ms.
   Each shape but 100 x 1k is 1M memories (~16 GB seeded here); ``--drop-data`` deletes each
   data set the matrix seeded once it is measured, so they fit a disk that cannot hold them all.

Each step writes ``benchmarks/results/loadtest/<date>-<label>.md`` (committed when ``--commit``),
and the matrix writes ``benchmarks/results/loadtest/<date>-matrix.md`` (``-matrix-<steps>.md`` for a
subset) with every figure and the
targets met or missed. ``--only`` runs a subset (comma-separated step names:
rates, max, profile, workers, minilm, large, big).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from loadtest import options, runner  # noqa: E402
from loadtest.machine import git_commit  # noqa: E402
from loadtest.measure import RunResult  # noqa: E402

# The steps measure the service's own work and the stores, so they name the hashing embedder
# (a toy: lexical only) unless they are about the real one: loadtest/run defaults to MiniLM.
HASHING = ["--embedder", "hashing"]
STEPS = ("rates", "max", "profile", "workers", "minilm", "large", "big", "shapes")
# Issue 13's data shapes (scenario, data label), each at 50 RPS and as single searches
# (benchmarks.cold_plans). 1M rows each but the first (100k, the other runs' data set):
# seeding + index builds take minutes apiece.
SHAPES: tuple[tuple[str, str], ...] = (
    ("baseline", "100x1k"),
    ("agents-1k", "1000x1k"),
    ("agents-10k", "100x10k"),
    ("agents-100k", "10x100k"),
    ("one-1m", "1x1M"),
    ("mixed", "5x100k+500x1k"),
)
# Issue 13's targets for every shape at 50 RPS.
SHAPE_COLD_P95_MS = 10.0
SHAPE_FULL_SHARE = 0.999
SHAPE_P99_MS = 30.0


@dataclass(slots=True)
class Row:
    label: str
    data: str
    config: str
    offered: float
    result: RunResult | None
    path: Path | None
    note: str = ""
    shape: bool = False

    def get(self, key: str) -> Any:
        return None if self.result is None else self.result.summary.get(key)

    @property
    def stage_cold_p95(self) -> float | None:
        if self.result is None:
            return None
        return self.result.stages.get("cold", {}).get("p95_ms")

    @property
    def passed(self) -> bool:
        return self.result is not None and runner.passed(self.result)

    @property
    def full_share(self) -> float | None:
        if self.result is None:
            return None
        counts = {k: v.get("count") or 0 for k, v in self.result.assembly.items() if k != "all"}
        total = sum(counts.values())
        return counts.get("full", 0) / total if total else None

    def shape_misses(self) -> list[str]:
        """Issue 13's targets this shape's run missed, with the figures."""
        if self.result is None:
            return ["did not run"]
        cold, full, p99 = self.stage_cold_p95, self.full_share, self.get("p99_ms")
        misses = []
        if cold is None or cold > SHAPE_COLD_P95_MS:
            misses.append(f"cold p95 {f_or(cold)} ms > {SHAPE_COLD_P95_MS:g}")
        if full is None or full < SHAPE_FULL_SHARE:
            misses.append(f"FULL {100 * (full or 0):.2f} % < {100 * SHAPE_FULL_SHARE:g} %")
        if p99 is None or p99 >= SHAPE_P99_MS:
            misses.append(f"p99 {f_or(p99)} ms >= {SHAPE_P99_MS:g}")
        return misses

    @property
    def sustained(self) -> bool:
        """Kept up within the latency goal: p99 < 50 ms, < 0.1 % of calls failed (past the
        45 ms deadline), >= 95 % of the offered rate achieved. Degraded answers count as
        answers here (the fallback rate is reported, and gated, on its own)."""
        achieved = self.get("rps") or 0.0
        p99 = self.get("p99_ms")
        return (
            self.result is not None
            and p99 is not None
            and p99 < 50
            and (self.get("failure_rate") or 0.0) < 0.001
            and achieved >= 0.95 * self.offered
        )


def commit(path: Path, message: str) -> None:
    for _attempt in range(10):
        if not (ROOT / ".git" / "index.lock").exists():
            break
        time.sleep(1)
    subprocess.run(["git", "-C", str(ROOT), "add", str(path)], check=False)
    subprocess.run(["git", "-C", str(ROOT), "commit", "-q", "-m", message, "--", str(path)], check=False)


class Matrix:
    def __init__(self, opts: argparse.Namespace) -> None:
        self.opts = opts
        self.rows: list[Row] = []

    def step(self, label: str, data: str, config: str, argv: list[str], offered: float) -> Row:
        common = ["--duration", str(self.opts.duration), "--warmup", str(self.opts.warmup), "--label", label]
        args = options.parse_args([*argv, *common])
        # The embedder named in the summary is the one the run used, read from its arguments.
        config = f"{args.embedder}, {config}"
        runner.log(f"=== matrix step {label}: loadtest/run {' '.join(args.argv)}")
        try:
            result, path = runner.run_and_report(args)
        except Exception as exc:  # one broken step must not lose the others' figures
            runner.log(f"step {label} failed: {type(exc).__name__}: {exc}")
            row = Row(
                label, data, config, offered, None, None, note=f"did not run: {type(exc).__name__}: {exc}"
            )
            self.rows.append(row)
            return row
        row = Row(label, data, config, offered, result, path)
        self.rows.append(row)
        if path is not None and self.opts.commit:
            commit(path, f"Load-test results: {label} ({data}, {config}, {offered:g} RPS offered)")
        return row

    # -- steps ----------------------------------------------------------------------------

    def rates(self) -> None:
        for rps in self.opts.rates:
            self.step(
                f"baseline-{rps:g}rps",
                "100x1k",
                "1 process",
                [*HASHING, "--scenario", "baseline", "--rps", str(rps)],
                rps,
            )

    def max_rps(self) -> None:
        rps = self.opts.step_start
        while rps <= self.opts.step_max:
            row = self.step(
                f"max-{rps:g}rps",
                "100x1k",
                "1 process",
                [*HASHING, "--scenario", "baseline", "--rps", str(rps)],
                rps,
            )
            if not row.sustained:
                break
            rps = round(rps * self.opts.step_factor)

    def profile(self) -> None:
        rps = self.opts.profile_rps
        self.step(
            f"profile-{rps:g}rps",
            "100x1k",
            "1 process, py-spy",
            [*HASHING, "--scenario", "baseline", "--rps", str(rps), "--profile"],
            rps,
        )

    def workers(self) -> None:
        tried = [r.offered for r in self.rows if r.label.startswith("max-")]
        rps = max(tried) if tried else self.opts.profile_rps
        self.step(
            f"workers2-{rps:g}rps",
            "100x1k",
            "2 processes (SO_REUSEPORT) on CPUs 0,1",
            [*HASHING, "--scenario", "baseline", "--rps", str(rps), "--workers", "2", "--server-cpus", "0,1"],
            rps,
        )

    def minilm(self) -> None:
        self.step(
            "minilm-200rps",
            "100x1k",
            "1 process",
            ["--scenario", "baseline", "--rps", "200", "--embedder", "minilm"],
            200,
        )

    def large(self) -> None:
        self.step(
            "large-agent-100k",
            "1x100k",
            "1 process",
            [*HASHING, "--scenario", "large-agent", "--rps", "50"],
            50,
        )

    def big(self) -> None:
        if not self.opts.include_big:
            runner.log(
                "skipping 100 agents x 10k memories: 1M rows; seeding needs ~3,000 CPU-s (32 min) and ~17 GB of"
                " disk here (benchmarks/results/large-agents-2026-12-06.md). "
                "Run: loadtest/matrix --only big --include-big (or loadtest/run --scenario big)"
            )
            self.rows.append(
                Row(
                    "big-100x10k",
                    "100x10k",
                    "not run",
                    200,
                    None,
                    None,
                    note="not run: 1M rows need ~3,000 CPU-s and ~17 GB to seed here (large-agents-2026-12-06.md);"
                    " command: `loadtest/matrix --only big --include-big`",
                )
            )
            return
        for rps in (50, 200):
            self.step(
                f"big-100x10k-{rps}rps",
                "100x10k",
                "1 process",
                [*HASHING, "--scenario", "big", "--rps", str(rps)],
                rps,
            )

    def shapes(self) -> None:
        wanted = self.opts.shapes.split(",") if self.opts.shapes else [name for name, _ in SHAPES]
        for scenario, data in SHAPES:
            if scenario not in wanted:
                continue
            # MiniLM serves the queries; the stored vectors are drawn from the model of its
            # own (--seed-embedder auto: loadtest.vectors).
            argv = [
                "--scenario",
                scenario,
                "--rps",
                "50",
                "--pg-shared-buffers",
                self.opts.shapes_shared_buffers,
            ]
            config = f"1 process, shared_buffers {self.opts.shapes_shared_buffers}"
            args = options.parse_args(argv)
            data_dir = ROOT / "loadtest" / "out" / "data" / options.dataset_key(args)
            seeded_here = not data_dir.exists()
            row = self.step(f"shape-{data}-50rps", data, config, argv, 50)
            row.shape = True
            if not data_dir.exists():
                continue
            runner.log(f"=== single searches on {data_dir.name}: benchmarks.cold_plans")
            done = subprocess.run(
                [sys.executable, "-m", "benchmarks.cold_plans", str(data_dir)], cwd=ROOT, check=False
            )
            plans = RESULTS / f"cold_plans-{data_dir.name.split('-')[0]}.md"
            if done.returncode == 0 and self.opts.commit:
                commit(plans, f"Cold search plans and recall on {data}")
            if self.opts.drop_data and seeded_here:
                # Each shape is 1M memories (~16 GB with postings and graphs here): measured
                # one after another, they fit a disk that cannot hold them all at once.
                runner.log(f"=== dropping {data_dir.name} (--drop-data)")
                shutil.rmtree(data_dir, ignore_errors=True)

    # -- summary --------------------------------------------------------------------------

    def render(self) -> str:
        def f(v: Any, d: int = 1) -> str:
            if v is None:
                return "-"
            return f"{v:,.{d}f}" if isinstance(v, float) else str(v)

        lines = [
            "# Benchmark matrix",
            "",
            f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {git_commit()}. Command: `loadtest/matrix {' '.join(self.opts.argv)}`.",
            "",
            f"Every step: server pinned to CPU 0 (unless stated), locust and the stores (Redis, PostgreSQL) to CPU 1, {self.opts.warmup:g} s warm-up + "
            f"{self.opts.duration:g} s measured, 45 ms gRPC deadline, unique questions. Details, stage breakdowns and "
            "setup are in each step's own results file.",
            "",
            "| step | data | config | offered RPS | achieved RPS | p50 ms | p99 ms | max ms | fallback % | failures | FULL % | server CPU | server ms/call | stores ms/call | cold ~p95 ms | gate |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in self.rows:
            if r.result is None:
                lines.append(
                    f"| {r.label} | {r.data} | {r.config} | {r.offered:g} | - | - | - | - | - | - | - | - | - | - | - | {r.note} |"
                )
                continue
            cpu = r.result.server_cpu_s / r.result.wall_s if r.result.wall_s else 0.0
            link = f"[{r.label}]({r.path.name})" if r.path else r.label
            lines.append(
                f"| {link} | {r.data} | {r.config} | {r.offered:g} | {f(r.get('rps'))} | {f(r.get('p50_ms'))} | "
                f"{f(r.get('p99_ms'))} | {f(r.get('max_ms'))} | {100 * (r.get('fallback_rate') or 0):.3f} | "
                f"{r.get('failures')} | {f(None if r.full_share is None else 100 * r.full_share)} | {100 * cpu:.0f} % | "
                f"{f(r.result.ms_per_request(r.result.server_cpu_s), 2)} | {f(r.result.ms_per_request(r.result.stores_cpu_s), 2)} | "
                f"{f(r.stage_cold_p95)} | {'pass' if r.passed else 'FAIL'} |"
            )
        lines += ["", "## Targets", "", *self.targets(), ""]
        return "\n".join(lines)

    def _shapes_only(self) -> bool:
        """A run of the shapes alone: the per-process rate targets do not apply to it."""
        return bool(self.rows) and all(r.shape for r in self.rows)

    def targets(self) -> list[str]:
        out: list[str] = []
        by_label = {r.label: r for r in self.rows}
        base = by_label.get("baseline-200rps")
        if base is not None and base.result is not None:
            p99 = base.get("p99_ms")
            # A call past the deadline is the worst fallback (the client gives up and
            # sends the messages unchanged): failures count with the fallbacks.
            answered = (base.get("responses") or 0) + (base.get("failures") or 0)
            fb = 100 * ((base.get("fallbacks") or 0) + (base.get("failures") or 0)) / max(1, answered)
            out.append(
                f"- p99 <= 10 ms at 200 RPS (100x1k, hashing): p99 = {p99} ms -> "
                + (
                    "**met**"
                    if p99 is not None and p99 <= 10
                    else f"**missed** by {p99 - 10:g} ms ({p99 / 10:.1f}x)"
                    if p99
                    else "no data"
                )
            )
            out.append(
                f"- fallback < 0.1 % at 200 RPS (calls past the deadline included): {fb:.3f} % -> "
                + ("**met**" if fb < 0.1 else f"**missed** ({fb / 0.1:.1f}x the limit)")
            )
        elif not self._shapes_only():
            out.append("- 200 RPS targets: not measured")
        steps = [r for r in self.rows if r.label.startswith(("max-", "baseline-")) and r.result is not None]
        sustained = [r.offered for r in steps if r.sustained]
        best = max(sustained) if sustained else None
        if steps or not self._shapes_only():
            out.append(
                f"- p99 < 50 ms at >= 600 RPS per server process: highest rate kept up with p99 < 50 ms and < 0.1 % failed calls = "
                f"{best if best is not None else 'none'} RPS -> "
                + (
                    "**met**"
                    if best is not None and best >= 600
                    else f"**missed** ({best or 0:g} of 600 RPS, {100 * (best or 0) / 600:.0f} %)"
                )
            )
        for r in self.rows:
            if r.shape:
                misses = r.shape_misses()
                out.append(
                    f"- {r.data} at 50 RPS: cold p95 <= {SHAPE_COLD_P95_MS:g} ms, FULL >= {100 * SHAPE_FULL_SHARE:g} %,"
                    f" p99 < {SHAPE_P99_MS:g} ms -> "
                    + ("**met**" if not misses else "**missed**: " + "; ".join(misses))
                )
        large = by_label.get("large-agent-100k")
        if large is not None and large.result is not None:
            cold = large.stage_cold_p95
            out.append(
                f"- cold search p95 < 30 ms at 100k memories per agent: ~{f_or(cold)} ms (service's stage histogram) -> "
                + (
                    "**met**"
                    if cold is not None and cold < 30
                    else "**missed**"
                    if cold is not None
                    else "no cold stage recorded"
                )
            )
        return out


def f_or(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    raw = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(
        prog="loadtest/matrix", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--only",
        default=",".join(s for s in STEPS if s not in ("big", "shapes")),
        help=f"steps to run, of {', '.join(STEPS)}",
    )
    p.add_argument("--duration", type=float, default=40.0)
    p.add_argument("--warmup", type=float, default=30.0)
    p.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[50.0, 200.0, 400.0])
    p.add_argument("--step-start", type=float, default=20.0)
    p.add_argument("--step-factor", type=float, default=1.25, help="each step offers this much more")
    p.add_argument("--step-max", type=float, default=1500.0)
    p.add_argument("--profile-rps", type=float, default=600.0)
    p.add_argument("--include-big", action="store_true")
    p.add_argument(
        "--shapes", default="", help=f"with --only shapes: a subset of {', '.join(n for n, _ in SHAPES)}"
    )
    p.add_argument(
        "--shapes-shared-buffers",
        default="8GB",
        help="PostgreSQL's shared_buffers for the shapes: with 1 GB a 1M-memory shape's rows and"
        " postings are read from the OS cache on most calls (1,000 x 1k: 92 %% FULL against 99 %% with 8 GB)",
    )
    p.add_argument(
        "--drop-data",
        action="store_true",
        help="with shapes: delete each data set the matrix seeded once it is measured (disk);"
        " one that was there before (100 x 1k, the other load tests' data) stays",
    )
    p.add_argument("--commit", action="store_true", help="git-commit each results file as it is written")
    opts = p.parse_args(raw)
    opts.argv = raw
    unknown = set(opts.only.split(",")) - set(STEPS)
    if unknown:
        p.error(f"--only: unknown steps {sorted(unknown)}")
    return opts


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    matrix = Matrix(opts)
    chosen = opts.only.split(",")
    actions = {
        "rates": matrix.rates,
        "max": matrix.max_rps,
        "profile": matrix.profile,
        "workers": matrix.workers,
        "minilm": matrix.minilm,
        "large": matrix.large,
        "big": matrix.big,
        "shapes": matrix.shapes,
    }
    # A subset of the steps gets its own summary, so it does not replace the full one.
    default = [s for s in STEPS if s not in ("big", "shapes")]
    suffix = "" if chosen == default else "-" + "-".join(chosen)
    if "shapes" in chosen and opts.shapes:
        # Shapes measured in separate runs (one at a time for disk) keep separate summaries.
        suffix += "-" + "-".join(opts.shapes.split(","))
    out = ROOT / "benchmarks" / "results" / "loadtest" / f"{datetime.now(UTC):%Y-%m-%d}-matrix{suffix}.md"
    for name in STEPS:
        if name in chosen:
            actions[name]()
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(matrix.render())  # keep the summary current after every step
    print(matrix.render())
    if opts.commit:
        commit(out, "Load-test matrix summary: every step's figures and the targets met or missed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
