"""Several server processes per pod: ``ibex-context serve --workers N``.

One event loop runs every call of a process, so one process uses one core at most.
The supervisor (this module, in the process the container starts) runs N copies of
``ibex-context serve`` that share the gRPC port through SO_REUSEPORT: the kernel
spreads new connections over the listening workers by a hash of their addresses.

* Metrics: one port per worker (worker i on ``IBEX_METRICS_PORT + i``), each its own
  Prometheus target; the chart declares every port and the ServiceMonitor scrapes
  each. prometheus_client's multiprocess mode was the alternative: it drops
  exemplars (the trace ids on the latency histograms), scrape-time gauges
  (``set_function``: the post-response queue) and per-process labels, and its
  observations cost more (ADR-0010).
* Shutdown: SIGTERM and SIGINT are forwarded to every worker, which drains as a
  single process does (NOT_SERVING, in-flight calls finish, then close); the
  supervisor exits once all have, with the worst exit status.
* A worker that exits on its own (a crash, a failed start) takes the others down
  gracefully and the supervisor exits non-zero, so Kubernetes restarts the pod
  instead of leaving it serving on fewer cores than it requested.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from types import FrameType

__all__ = ["Supervisor", "worker_count", "worker_environment"]

_POLL_SECONDS = 0.1


def worker_count(configured: int) -> int:
    """``configured`` workers, or (0) one per CPU this process may run on."""
    if configured > 0:
        return configured
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def worker_environment(base: Mapping[str, str], index: int, metrics_port_base: int) -> dict[str, str]:
    """The environment of worker ``index``: a single-process server on the shared port."""
    metrics_port = metrics_port_base + index if metrics_port_base else 0
    return dict(
        base,
        IBEX_WORKERS="1",
        IBEX_GRPC_REUSE_PORT="true",
        IBEX_METRICS_PORT=str(metrics_port),
    )


class Supervisor:
    """Starts the workers, forwards stop signals, and returns the exit status."""

    def __init__(self, commands: Sequence[tuple[Sequence[str], Mapping[str, str]]]) -> None:
        self._commands = commands
        self._workers: list[subprocess.Popen[bytes]] = []
        self._stopping = False
        self._left_on_its_own = False

    @classmethod
    def for_serve(cls, workers: int, metrics_port_base: int) -> Supervisor:
        command = [sys.executable, "-m", "ibex_context", "serve"]
        env = dict(os.environ)
        return cls([(command, worker_environment(env, i, metrics_port_base)) for i in range(workers)])

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self._forward) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            for command, env in self._commands:
                self._workers.append(subprocess.Popen(list(command), env=dict(env)))
            return self._wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _forward(self, signum: int, _frame: FrameType | None) -> None:
        self._stopping = True
        for worker in self._workers:
            if worker.poll() is None:
                worker.send_signal(signum)

    def _wait(self) -> int:
        while True:
            codes = [worker.poll() for worker in self._workers]
            if all(code is not None for code in codes):
                status = max(_exit_status(code) for code in codes if code is not None)
                return max(status, 1) if self._left_on_its_own else status
            if not self._stopping and any(code is not None for code in codes):
                # A worker left on its own: stop the others the graceful way.
                self._left_on_its_own = True
                self._forward(signal.SIGTERM, None)
            time.sleep(_POLL_SECONDS)


def _exit_status(code: int) -> int:
    # Popen reports death by signal as -signum; the shell convention is 128 + signum.
    return 128 - code if code < 0 else code
