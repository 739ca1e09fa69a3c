"""CPU seconds of process trees on this machine, for phase-by-phase cost figures.

On a shared machine wall time says more about the neighbours than about the work;
CPU seconds (user + system, from ``/proc``) of the processes that did it do not. A
process's ``cutime``/``cstime`` include its reaped children, so a tree's total counts
the short-lived ones too (PostgreSQL's parallel workers, a process pool's workers).
Linux only; where ``/proc`` is unreadable the figures are ``None``, never a guess.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_fields(pid: int) -> list[str]:
    # The command name may hold spaces and parentheses: the fields follow the last ")".
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _children(pid: int) -> list[int]:
    try:
        tasks = Path(f"/proc/{pid}/task").iterdir()
        return [int(c) for t in tasks for c in (t / "children").read_text().split()]
    except OSError:
        return []


def tree_cpu_seconds(pid: int) -> float | None:
    """User + system CPU of ``pid``, its reaped children and its live descendants."""
    try:
        fields = _stat_fields(pid)
    except OSError:
        return None
    # fields[0] is the state (stat field 3): utime, stime, cutime, cstime are 14-17.
    total = sum(int(v) for v in fields[11:15]) / _TICKS
    for child in _children(pid):
        total += tree_cpu_seconds(child) or 0.0
    return total


def postmaster_pid(data_directory: str) -> int | None:
    """The PostgreSQL server's pid from its data directory, if this machine runs it."""
    try:
        return int((Path(data_directory) / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def own_cpu_seconds() -> float:
    """This process's CPU and that of its reaped children (a process pool's workers
    count once the pool has shut down)."""
    import resource

    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


@dataclass(frozen=True, slots=True)
class PhaseCost:
    name: str
    wall_seconds: float
    own_cpu_seconds: float
    server_cpu_seconds: float | None  # None: the server is not on this machine (or not readable)


class PhaseClock:
    """Wall time and CPU seconds (this process tree's and the database server's) of
    consecutive phases. Phases that run side by side share the server's figure."""

    def __init__(self, server_pid: int | None) -> None:
        self._server_pid = server_pid
        self.phases: list[PhaseCost] = []

    def _server(self) -> float | None:
        return None if self._server_pid is None else tree_cpu_seconds(self._server_pid)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        wall, own, server = time.perf_counter(), own_cpu_seconds(), self._server()
        yield
        server_after = self._server()
        self.phases.append(
            PhaseCost(
                name=name,
                wall_seconds=time.perf_counter() - wall,
                own_cpu_seconds=own_cpu_seconds() - own,
                server_cpu_seconds=None if server is None or server_after is None else server_after - server,
            )
        )
