"""This machine, as a load-test run sees it: where things are, free ports, CPU pinning,
CPU time of processes, time stolen by the hypervisor, versions and the commit."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
BIN = Path(PYTHON).parent


def free_port_run(count: int, avoid: set[int]) -> int:
    """The first of ``count`` consecutive free ports (serve --workers gives worker i
    the metrics port base+i), none of them in ``avoid``."""
    for _attempt in range(100):
        base = free_port()
        ports = range(base, base + count)
        if avoid.isdisjoint(ports) and all(_port_free(p) for p in ports[1:]):
            return base
    raise RuntimeError(f"no run of {count} free ports found")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def taskset(cpus: str | None) -> list[str]:
    if not cpus or shutil.which("taskset") is None:
        return []
    return ["taskset", "-c", cpus]


def git_commit() -> str:
    try:
        sha = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no", "service", "loadtest"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return f"{sha}{' (+ uncommitted changes in service/ or loadtest/)' if dirty else ''}"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for dist in (
        "protobuf",
        "grpcio",
        "locust",
        "asyncpg",
        "redis",
        "numpy",
        "tiktoken",
        "uvloop",
    ):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "-"
    return out


def cpu_seconds(pid: int) -> float:
    """User+system CPU of ``pid`` and its live children (psutil)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def process_cpu_ns(pid: int) -> int:
    """One single-threaded process's CPU time (a PostgreSQL process), ns, from the
    scheduler: ``cpu_seconds`` counts in /proc's 10 ms ticks, and a fast core runs a
    few hundred short statements inside one tick. 0 once the process is gone."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    except (OSError, ValueError):
        return 0


def stolen_seconds() -> dict[str, float]:
    """CPU time the hypervisor gave to other guests, per CPU (``/proc/stat``, steal
    column), in seconds. Stalls of a virtual CPU show up here and nowhere else."""
    ticks = os.sysconf("SC_CLK_TCK")
    stolen: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/stat").read_text().splitlines():
            fields = line.split()
            if fields and fields[0].startswith("cpu") and fields[0] != "cpu" and len(fields) > 8:
                stolen[fields[0][3:]] = int(fields[8]) / ticks
    return stolen


def runqueue_wait_seconds(pid: int) -> float:
    """Seconds ``pid``'s threads (and its children's) spent runnable but waiting for a CPU.

    From ``/proc/<pid>/task/<tid>/schedstat`` (field 2, ns). On a shared machine this
    says how much of the latency is other processes holding the server's core.
    """
    import psutil

    try:
        pids = [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except psutil.Error:
        return 0.0
    total_ns = 0
    for p in pids:
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                total_ns += int((task / "schedstat").read_text().split()[1])
    return total_ns / 1e9


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


_SECRET_MARKS = ("KEY", "SECRET", "TOKEN", "PASSWORD", "DSN", "CREDENTIALS")


def inherited_settings(environ: Mapping[str, str]) -> str:
    """The IBEX_* settings the server inherits from this process's environment (secrets by
    name only): a run with a setting changed says so in its report."""
    shown = [
        name if any(mark in name for mark in _SECRET_MARKS) else f"{name}={value}"
        for name, value in sorted(environ.items())
        if name.startswith("IBEX_")
    ]
    return "settings from the environment: " + (", ".join(f"`{v}`" for v in shown) if shown else "none")
