"""One load-test run on this machine: stores, service, seed, locust, metrics, report.

    loadtest/run --scenario smoke
    loadtest/run --scenario baseline --rps 200 --duration 60
    loadtest/run --scenario baseline --rps 600 --profile        # + py-spy profile of the server

This module puts the steps together; each lives in its own module: the command line and
scenario presets (``options``), the stores and seeding (``datastores``), the service
(``server``), locust (``generator``), what is measured over the window (``measure``),
the py-spy profile (``profiling``), the Markdown report (``report``), and the machine
(``machine``: ports, CPUs, versions). The exit code is locust's gate (0: passed).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from loadtest.datastores import (  # noqa: E402
    DataSetMismatch,
    PgActivitySampler,
    pin_stores,
    seed_if_needed,
    stores,
    warm_postgres,
)
from loadtest.generator import (  # noqa: E402
    RunProducedNothing,
    locust_command,
    locust_summary,
    wait_for_locust,
)
from loadtest.machine import BIN, PYTHON, taskset  # noqa: E402
from loadtest.measure import RunResult, read_counters, window_figures  # noqa: E402
from loadtest.options import dataset_key, parse_args  # noqa: E402
from loadtest.profiling import finish_profiler, start_profiler  # noqa: E402
from loadtest.report import render_report  # noqa: E402
from loadtest.server import start_server, wait_ready  # noqa: E402
from loadtest.side_export import SideExport, orgs_of  # noqa: E402


def run(args: argparse.Namespace, log: Any = print) -> RunResult | None:
    started = time.monotonic()
    temp_dir: tempfile.TemporaryDirectory[str] | None = None
    if args.data_dir is not None:
        data_dir = Path(args.data_dir)
    elif args.scenario == "smoke":
        temp_dir = tempfile.TemporaryDirectory(prefix="ibex-loadtest-")
        data_dir = Path(temp_dir.name)
        # Traversable, so PostgreSQL (run as 'pgserver' under root) keeps its files in here
        # and they go away with the directory.
        data_dir.chmod(0o755)
    else:
        data_dir = ROOT / "loadtest" / "out" / "data" / dataset_key(args)
    data_dir.mkdir(parents=True, exist_ok=True)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    prefix = out_dir / f"{stamp}-{args.label}"
    try:
        with stores(data_dir, args.pg_shared_buffers) as (dsn, redis_url, redis, postgres):
            agents_file, seed_output = seed_if_needed(args, dsn, data_dir, log)
            if args.seed_only:
                return None
            store_pids = [pid for pid in (redis.pid, postgres.pid) if pid]
            pin_stores(store_pids, args.stores_cpus)
            warm_postgres(dsn, agents_file, log)
            return _run_with_stores(
                args, dsn, redis_url, agents_file, seed_output, prefix, started, log, store_pids
            )
    finally:
        if temp_dir is not None:
            temp_dir.cleanup()


def _run_with_stores(
    args: argparse.Namespace,
    dsn: str,
    redis_url: str,
    agents_file: Path,
    seed_output: str,
    prefix: Path,
    started: float,
    log: Any,
    store_pids: Sequence[int] = (),
) -> RunResult:
    if args.tenants:
        # Org A (noisy) and org B (quiet): the seeded data's first two orgs.
        orgs = orgs_of(agents_file)
        if len(orgs) < 2:
            raise RunProducedNothing("a tenants run needs data of two orgs or more")
        args.tenant_orgs = {"noisy": orgs[0], "quiet": orgs[1]}
    server = start_server(args, dsn, redis_url, prefix, log)
    profiler: subprocess.Popen[bytes] | None = None
    try:
        wait_ready(server.grpc_port, server.metrics_ports, server.proc, args.start_timeout)
        load = locust_command(args, server.grpc_port, agents_file, prefix, server.client)
        log(
            f"locust: {load.users} users x {load.rps_per_user:.2f} RPS ({args.arrivals}) = {args.rps:g} RPS "
            f"for {args.warmup:g}+{args.duration:g} s"
        )
        locust_log = prefix.with_suffix(".locust.log")
        with locust_log.open("wb") as locust_out:
            locust = subprocess.Popen(load.argv, stdout=locust_out, stderr=subprocess.STDOUT, cwd=ROOT)
            time.sleep(args.warmup)
            side_export = None
            if args.export_during:
                # --secure: the CLI's top-level flags present the run's CA and token.
                secure = (
                    ["--tls-ca", str(server.client.ca_file), "--token-file", str(server.client.token_file)]
                    if server.client is not None
                    else []
                )
                side_export = SideExport(
                    [*taskset(args.locust_cpus), str(BIN / "ibex-context"), *secure],
                    f"127.0.0.1:{server.grpc_port}",
                    orgs_of(agents_file),
                    prefix.parent,
                )
                side_export.start()
            before = read_counters(server.metrics_ports, server.proc.pid, locust.pid, store_pids)
            sampler = PgActivitySampler(dsn)
            sampler.start()
            if args.profile:
                profiler = start_profiler(
                    server.proc.pid, prefix, min(args.duration, args.profile_seconds), log
                )
            time.sleep(max(0.0, args.duration - 0.5))
            after = read_counters(server.metrics_ports, server.proc.pid, locust.pid, store_pids)
            # The sampler's backend is one of the postmaster's children: not the service's work.
            sampler_cpu_s = sampler.backend_cpu_seconds()
            sampler.stop()
            if side_export is not None:
                # Finishing after the window is reported, not waited out indefinitely.
                side_export.join(timeout=600)
            locust_rc = wait_for_locust(locust, args)
        summary = locust_summary(prefix, locust_rc, locust_log)
        figures = window_figures(before, after)
        figures["stores_cpu_s"] -= sampler_cpu_s
        profile_summary = finish_profiler(profiler, prefix, log) if profiler is not None else ""
        return RunResult(
            summary=summary,
            locust_rc=locust_rc,
            pg_activity=sampler.summary(),
            seed_output=seed_output,
            setup={
                "users": load.users,
                "rps_per_user": load.rps_per_user,
                "grpc_port": server.grpc_port,
                "serve_cmd": " ".join(server.command),
                "locust_cmd": " ".join(load.argv),
                "elapsed_total_s": time.monotonic() - started,
                "server_log": str(server.log_path),
                "export": side_export.summary() if side_export is not None else None,
            },
            profile_summary=profile_summary,
            sampler_cpu_s=sampler_cpu_s,
            **figures,
        )
    finally:
        if profiler is not None and profiler.poll() is None:
            profiler.terminate()
        server.stop()


def log(msg: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {msg}", flush=True)


def passed(result: RunResult) -> bool:
    return result.locust_rc == 0 and bool(result.summary.get("passed"))


class RunCannotStart(RuntimeError):
    """A tool the run needs is missing or does not start: said before anything runs."""


def preflight(args: argparse.Namespace) -> None:
    """Runs locust and the server's launcher the way the run will, before the stores
    start and the data is seeded: a missing tool costs a second and says what to do,
    instead of a minute of seeding and a results file marked FAILED full of '-'."""
    locust = BIN / "locust"
    if not locust.exists():
        raise RunCannotStart(
            f"{locust} is missing: a load test needs the 'loadtest' extra (locust, grpcio). "
            f"Run loadtest/run (it installs the extra into .venv), or: "
            f"{PYTHON} -m pip install -e '{ROOT}[embedded,loadtest]'"
        )
    for command in (
        [*taskset(args.locust_cpus), str(locust), "--version"],
        [*taskset(args.server_cpus), str(BIN / "ibex-context"), "--version"],
    ):
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        except OSError as exc:
            raise RunCannotStart(f"`{' '.join(command)}` cannot run: {exc}") from None
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()[-500:]
            raise RunCannotStart(f"`{' '.join(command)}` failed (exit {done.returncode}): {said}")


def run_and_report(args: argparse.Namespace) -> tuple[RunResult | None, Path | None]:
    """One run; writes ``benchmarks/results/loadtest/<date>-<label>.md`` unless --no-results."""
    if not args.seed_only:
        preflight(args)
    result = run(args, log)
    if result is None:  # --seed-only
        return None, None
    report = render_report(args, result)
    print(report)
    if args.no_results:
        return result, None
    results_dir = Path(args.results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{datetime.now(UTC):%Y-%m-%d}-{args.label}.md"
    path.write_text(report)
    log(f"results: {path}")
    return result, path


def main(argv: Sequence[str] | None = None) -> int:
    try:
        result, _ = run_and_report(parse_args(argv))
    except (RunCannotStart, DataSetMismatch) as exc:
        print(f"loadtest/run cannot start: {exc}", file=sys.stderr)
        return 2
    except RunProducedNothing as exc:
        print(f"loadtest/run failed: {exc}", file=sys.stderr)
        return 1
    return 0 if result is None or passed(result) else 1


if __name__ == "__main__":
    raise SystemExit(main())
