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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest.machine import BIN, ROOT, free_port, free_port_run, taskset
from loadtest.options import WORKER_NICE_VARIABLE


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


@dataclass(frozen=True, slots=True)
class ClientSecrets:
    """What locust presents to a ``--secure`` server: the CA that verifies it, a token file
    (and one per tenant of a tenants run, each bound to its org)."""

    ca_file: Path
    token_file: Path
    tenant_tokens: dict[str, Path] = field(default_factory=dict)


@dataclass(slots=True)
class ServerProcess:
    proc: subprocess.Popen[bytes]
    grpc_port: int
    metrics_ports: list[int]
    command: list[str]
    log_path: Path
    client: ClientSecrets | None = None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def secure_settings(
    directory: Path, tenant_orgs: dict[str, str] | None = None
) -> tuple[dict[str, str], ClientSecrets]:
    """TLS and authentication for the run (docs/security.md): a CA and a server certificate
    made here, a token with the assemble and read roles, and for each of ``tenant_orgs``
    (tenant -> org id) a token with the assemble role bound to that org. The server's IBEX_*
    settings and the client's files."""
    import secrets

    import yaml
    from ibex_context.devtools.certs import Authority
    from ibex_context.server.auth import token_digest

    directory.mkdir(parents=True, exist_ok=True)
    ca = Authority.create("loadtest CA")
    cert, key = ca.server().write(directory, "server")
    ca_file, token_file, credentials = (
        directory / "ca.crt",
        directory / "token",
        directory / "credentials.yaml",
    )
    ca_file.write_bytes(ca.cert_pem)
    token = secrets.token_urlsafe(32)
    token_file.write_text(token)
    # assemble for locust, read for --export-during's `ibex-context export`.
    principal = {
        "name": "loadtest",
        "roles": ["assemble", "read"],
        "token_sha256": [token_digest(token).hex()],
    }
    principals = [principal]
    tenant_tokens: dict[str, Path] = {}
    for tenant, org_id in (tenant_orgs or {}).items():
        tenant_token = secrets.token_urlsafe(32)
        tenant_tokens[tenant] = directory / f"token-{tenant}"
        tenant_tokens[tenant].write_text(tenant_token)
        principals.append(
            {
                "name": f"loadtest-{tenant}",
                "roles": ["assemble"],
                "org_id": org_id,
                "token_sha256": [token_digest(tenant_token).hex()],
            }
        )
    credentials.write_text(yaml.safe_dump({"principals": principals}))
    env = {
        "IBEX_TLS_CERT_FILE": str(cert),
        "IBEX_TLS_KEY_FILE": str(key),
        "IBEX_AUTH_ENABLED": "true",
        "IBEX_AUTH_CREDENTIALS_FILE": str(credentials),
    }
    return env, ClientSecrets(ca_file, token_file, tenant_tokens)


def start_server(args: argparse.Namespace, dsn: str, redis_url: str, prefix: Path, log: Any) -> ServerProcess:
    grpc_port = free_port()
    metrics_base = free_port_run(max(1, args.workers), avoid={grpc_port})
    # serve --workers gives worker i the metrics port base+i.
    metrics_ports = [metrics_base + i for i in range(max(1, args.workers))]
    env = server_environment(args, dsn, redis_url, grpc_port, metrics_base)
    client: ClientSecrets | None = None
    tenant_orgs: dict[str, str] | None = getattr(args, "tenant_orgs", None)
    if args.secure:
        secure_env, client = secure_settings(prefix.with_suffix(".secure"), tenant_orgs)
        env.update(secure_env)
    if tenant_orgs and args.noisy_rate_limit is not None:
        env["IBEX_PROFILES_PATH"] = str(noisy_profiles(prefix, tenant_orgs["noisy"], args.noisy_rate_limit))
    serve_cmd = [*taskset(args.server_cpus), str(BIN / "ibex-context"), "serve"]
    if args.workers > 1:
        serve_cmd += ["--workers", str(args.workers)]
    server_log = prefix.with_suffix(".server.log")
    log("starting: " + " ".join(serve_cmd))
    with server_log.open("wb") as server_out:
        proc = subprocess.Popen(serve_cmd, env=env, stdout=server_out, stderr=subprocess.STDOUT, cwd=ROOT)
    return ServerProcess(proc, grpc_port, metrics_ports, serve_cmd, server_log, client)


def server_environment(
    args: argparse.Namespace, dsn: str, redis_url: str, grpc_port: int, metrics_port: int
) -> dict[str, str]:
    """The server's environment: this process's, with the run's stores, ports and settings."""
    return dict(
        os.environ,
        IBEX_POSTGRES_DSN=dsn,
        IBEX_REDIS_URL=redis_url,
        IBEX_GRPC_HOST="127.0.0.1",
        IBEX_GRPC_PORT=str(grpc_port),
        IBEX_METRICS_PORT=str(metrics_port),
        IBEX_EMBEDDER=args.embedder,
        IBEX_EMBEDDING_DIM=str(args.dim),
        IBEX_LOG_LEVEL=args.server_log_level,
        IBEX_TRACING_EXPORTER="none",
        IBEX_AUTH_ENABLED="false",
        **{WORKER_NICE_VARIABLE: str(args.worker_nice)},
    )


def noisy_profiles(prefix: Path, org_id: str, rate_per_second: float) -> Path:
    """A profiles file giving the flooding org an admission rate limit (the rest: defaults)."""
    import json

    path = prefix.with_suffix(".profiles.json")
    profile = {
        "name": "loadtest-noisy-org",
        "selector": {"orgIds": [org_id]},
        "admission": {"ratePerSecond": rate_per_second},
    }
    path.write_text(json.dumps({"apiVersion": "context.ibex.dev/v1alpha1", "profiles": [profile]}))
    return path
