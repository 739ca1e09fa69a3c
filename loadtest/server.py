"""The service under test: ``ibex-context serve`` started on free ports, pinned to its CPUs,
waited for until it answers, scraped, and stopped."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.machine import BIN, ROOT, free_port, free_port_run, taskset


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def wait_ready(
    grpc_port: int, metrics_ports: Sequence[int], proc: subprocess.Popen[bytes], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the service exited with {proc.returncode} during start-up")
        try:
            with socket.create_connection(("127.0.0.1", grpc_port), timeout=0.5):
                pass
            for port in metrics_ports:
                scrape(port)
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the service did not become ready within {timeout:.0f} s")


@dataclass(slots=True)
class ServerProcess:
    proc: subprocess.Popen[bytes]
    grpc_port: int
    metrics_ports: list[int]
    command: list[str]
    log_path: Path

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_server(args: argparse.Namespace, dsn: str, redis_url: str, prefix: Path, log: Any) -> ServerProcess:
    grpc_port = free_port()
    metrics_base = free_port_run(max(1, args.workers), avoid={grpc_port})
    # serve --workers gives worker i the metrics port base+i.
    metrics_ports = [metrics_base + i for i in range(max(1, args.workers))]
    env = dict(
        os.environ,
        IBEX_POSTGRES_DSN=dsn,
        IBEX_REDIS_URL=redis_url,
        IBEX_GRPC_HOST="127.0.0.1",
        IBEX_GRPC_PORT=str(grpc_port),
        IBEX_METRICS_PORT=str(metrics_base),
        IBEX_EMBEDDER=args.embedder,
        IBEX_EMBEDDING_DIM=str(args.dim),
        IBEX_LOG_LEVEL=args.server_log_level,
        IBEX_TRACING_EXPORTER="none",
        IBEX_AUTH_ENABLED="false",
    )
    serve_cmd = [*taskset(args.server_cpus), str(BIN / "ibex-context"), "serve"]
    if args.workers > 1:
        serve_cmd += ["--workers", str(args.workers)]
    server_log = prefix.with_suffix(".server.log")
    log("starting: " + " ".join(serve_cmd))
    with server_log.open("wb") as server_out:
        proc = subprocess.Popen(serve_cmd, env=env, stdout=server_out, stderr=subprocess.STDOUT, cwd=ROOT)
    return ServerProcess(proc, grpc_port, metrics_ports, serve_cmd, server_log)
