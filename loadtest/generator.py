"""The load generator of a run: locust, headless, at a constant arrival rate, pinned to its
CPUs, with the gate it applies and the summary it writes."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.machine import BIN, ROOT, taskset
from loadtest.server import ClientSecrets


class RunProducedNothing(RuntimeError):
    """Locust ran but measured nothing: no report is written (it would be all '-')."""


@dataclass(frozen=True, slots=True)
class LocustCommand:
    argv: list[str]
    users: int
    rps_per_user: float


def locust_command(
    args: argparse.Namespace,
    grpc_port: int,
    agents_file: Path,
    prefix: Path,
    secure: ClientSecrets | None = None,
) -> LocustCommand:
    users = max(1, math.ceil(args.rps / args.rps_per_user))
    rps_per_user = args.rps / users
    user_classes = ["AssembleContextUser"]
    tenants: dict[str, Any] = {}
    if getattr(args, "tenant_orgs", None):
        if secure is None:
            raise ValueError("a tenants run needs --secure (each tenant's own org-bound token)")
        # The quiet org: one user at its rate (Poisson arrivals: its calls are independent).
        tenants = {
            "noisy": {"users": users, "rps_per_user": rps_per_user, "gated": False},
            "quiet": {"users": 1, "rps_per_user": args.quiet_rps, "gated": True},
        }
        for name, tenant in tenants.items():
            tenant["org_id"] = args.tenant_orgs[name]
            tenant["token_file"] = str(secure.tenant_tokens[name])
        user_classes = ["NoisyTenant", "QuietTenant"]
        users += 1
    locust_cmd = [
        *taskset(args.locust_cpus),
        str(BIN / "locust"),
        "-f",
        str(ROOT / "loadtest" / "locustfile.py"),
        "--headless",
        "--only-summary",
        "-H",
        f"127.0.0.1:{grpc_port}",
        "-u",
        str(users),
        "-r",
        str(users),
        "-t",
        f"{int(args.warmup + args.duration)}s",
        "--stop-timeout",
        "5",
        "--agents-file",
        str(agents_file),
        "--rps-per-user",
        f"{rps_per_user:.4f}",
        "--arrivals",
        args.arrivals,
        "--warmup-s",
        str(args.warmup),
        "--p99-ms",
        str(args.p99_ms),
        "--max-fallback-rate",
        str(args.max_fallback_rate),
        "--max-failure-rate",
        str(args.max_failure_rate),
        "--csv",
        str(prefix),
        "--html",
        str(prefix.with_suffix(".html")),
        "--summary-json",
        str(prefix.with_suffix(".json")),
    ]
    if args.scenario_weights:
        locust_cmd += ["--scenario-weights", args.scenario_weights]
    if secure is not None:
        locust_cmd += ["--tls-ca", str(secure.ca_file), "--token-file", str(secure.token_file)]
    if tenants:
        tenants_file = prefix.with_suffix(".tenants.json")
        tenants_file.write_text(json.dumps(tenants, indent=1))
        locust_cmd += ["--tenants-file", str(tenants_file)]
    return LocustCommand([*locust_cmd, *user_classes], users, rps_per_user)


def wait_for_locust(locust: subprocess.Popen[bytes], args: argparse.Namespace) -> int:
    try:
        return locust.wait(timeout=args.duration + args.warmup + 60)
    except subprocess.TimeoutExpired:
        locust.terminate()
        return locust.wait(timeout=10)


def locust_summary(prefix: Path, locust_rc: int, locust_log: Path) -> dict[str, Any]:
    """What locust measured (its ``--summary-json``); RunProducedNothing when it measured nothing."""
    summary_path = prefix.with_suffix(".json")
    summary: dict[str, Any] = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    if not summary:
        raise RunProducedNothing(
            f"locust measured nothing (exit {locust_rc}); no results file written. "
            f"Its log, {locust_log}, ends:\n{locust_log.read_text()[-3000:]}"
        )
    return summary
