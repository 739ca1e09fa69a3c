"""What a seed costs: wall time, the seeder's CPU and PostgreSQL's CPU, for one or
more checkouts of the seeder run back to back against the same server.

    .venv/bin/python -m benchmarks.seed_cost --dsn "$DSN" --data-dir PGDATA \\
        --checkout before=/path/to/main --checkout after=. --shape 20x1000 --shape 2x10000

Each checkout's ``python -m loadtest.seed`` runs under ``nice -n 15`` (the machine is
shared) with the shape's agents and memories; its own output (per-phase figures,
when it prints them) is kept. CPU seconds come from ``/proc`` (``loadtest.cpu_meter``):
the seeder's process tree and the PostgreSQL server's, whose data directory must be on
this machine. On a shared machine compare the CPU figures; wall time follows the load
average, printed beside it. Prints a markdown table (``--out`` also writes it).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from loadtest.cpu_meter import postmaster_pid, tree_cpu_seconds

# The seeder's progress lines ("  20/100 agents, 20,000 memories, 700/s").
_PROGRESS = re.compile(r"^\s+\d+/\d+ agents,")


@dataclass(frozen=True, slots=True)
class SeedCost:
    checkout: str
    shape: str
    wall_seconds: float
    seeder_cpu_seconds: float
    server_cpu_seconds: float
    load_before: float
    load_after: float
    output: str


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_seed(name: str, checkout: Path, shape: str, dsn: str, server_pid: int, extra: list[str]) -> SeedCost:
    agents, memories = shape.split("x")
    env = dict(os.environ, PYTHONPATH=f"{checkout / 'service'}:{checkout}")
    cmd = ["nice", "-n", "15", sys.executable, "-m", "loadtest.seed", "--dsn", dsn]
    cmd += [
        "--agents",
        agents,
        "--memories",
        memories,
        "--agents-file",
        f"/tmp/seed_cost-{name}.json",
        *extra,
    ]
    load_before, server_before, own_before = os.getloadavg()[0], tree_cpu_seconds(server_pid), _children_cpu()
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    server_after = tree_cpu_seconds(server_pid)
    if server_before is None or server_after is None:
        raise SystemExit(f"cannot read the server's CPU (pid {server_pid})")
    return SeedCost(
        checkout=name,
        shape=shape,
        wall_seconds=wall,
        seeder_cpu_seconds=_children_cpu() - own_before,
        server_cpu_seconds=server_after - server_before,
        load_before=load_before,
        load_after=os.getloadavg()[0],
        output="\n".join(line for line in done.stdout.splitlines() if not _PROGRESS.match(line)),
    )


def table(costs: list[SeedCost]) -> str:
    lines = [
        "| checkout | shape | wall s | seeder CPU s | PostgreSQL CPU s | total CPU s "
        "| CPU µs per memory | load avg |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for c in costs:
        agents, memories = (int(x) for x in c.shape.split("x"))
        total = c.seeder_cpu_seconds + c.server_cpu_seconds
        lines.append(
            f"| {c.checkout} | {c.shape} | {c.wall_seconds:.1f} | {c.seeder_cpu_seconds:.1f} | "
            f"{c.server_cpu_seconds:.1f} | {total:.1f} | {total / (agents * memories) * 1e6:,.0f} | "
            f"{c.load_before:.1f} → {c.load_after:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dsn", required=True)
    p.add_argument("--data-dir", required=True, help="the PostgreSQL server's data directory (for its CPU)")
    p.add_argument("--checkout", action="append", required=True, help="name=path of a checkout")
    p.add_argument("--shape", action="append", required=True, help="AGENTSxMEMORIES, e.g. 20x1000")
    p.add_argument("--seed-arg", action="append", default=[], help="passed on to every seed")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    server_pid = postmaster_pid(args.data_dir)
    if server_pid is None:
        p.error(f"no postmaster.pid in {args.data_dir}")
    costs: list[SeedCost] = []
    for shape in args.shape:
        for spec in args.checkout:
            name, _, path = spec.partition("=")
            cost = run_seed(name, Path(path).resolve(), shape, args.dsn, server_pid, args.seed_arg)
            print(f"{name} {shape}: {cost.wall_seconds:.1f} s\n{cost.output}", flush=True)
            costs.append(cost)
    report = table(costs)
    print(report)
    if args.out is not None:
        args.out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
