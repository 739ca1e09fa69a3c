"""``ibex-context-operator``: run the ContextProfile operator (kopf, standalone).

Environment (flags override): WATCH_NAMESPACE (comma-separated; empty = cluster-wide),
IBEX_OPERATOR_DEFAULT_SERVICE, IBEX_OPERATOR_DRIFT_INTERVAL_SECONDS (60),
IBEX_OPERATOR_LIVENESS (http://0.0.0.0:8080/healthz; empty disables),
IBEX_OPERATOR_POST_EVENTS (true), IBEX_OPERATOR_LOG_FORMAT (json|plain|full, default json),
IBEX_OPERATOR_VERBOSE (false), IBEX_OPERATOR_PROFILE_SELECTOR (key=value: only those profiles),
IBEX_OPERATOR_METRICS_PORT (8081; 0: no /metrics), IBEX_OPERATOR_PEERING (a KopfPeering name:
replicas elect a leader through it, ``leadership.py``; empty: standalone, exactly one replica).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys
import uuid
from collections.abc import Sequence
from typing import Any, cast

import kopf

from ibex_operator.config import OperatorConfig
from ibex_operator.handlers import build_registry
from ibex_operator.kube import Credentials
from ibex_operator.leadership import random_priority
from ibex_operator.metrics import OperatorMetrics

_LOG_FORMATS = {"json": kopf.LogFormat.JSON, "plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL}


def parse_args(argv: Sequence[str], base: OperatorConfig) -> OperatorConfig:
    parser = argparse.ArgumentParser(prog="ibex-context-operator", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=None,
        help="namespace to watch (repeatable); default: WATCH_NAMESPACE",
    )
    parser.add_argument("--default-service", default=None, help="Deployment of profiles without spec.service")
    parser.add_argument("--drift-interval", type=float, default=None, help="seconds between drift checks")
    parser.add_argument("--liveness", default=None, help="liveness endpoint URL, '' to disable")
    args = parser.parse_args(list(argv))
    changes: dict[str, object] = {}
    if args.namespace:
        changes["namespaces"] = tuple(args.namespace)
    if args.default_service is not None:
        changes["default_service"] = args.default_service or None
    if args.drift_interval is not None:
        changes["drift_interval_s"] = args.drift_interval
    if args.liveness is not None:
        changes["liveness_endpoint"] = args.liveness or None
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> None:
    config = parse_args(sys.argv[1:] if argv is None else argv, OperatorConfig.from_env())
    log_format = _LOG_FORMATS.get(
        os.environ.get("IBEX_OPERATOR_LOG_FORMAT", "json").lower(), kopf.LogFormat.JSON
    )
    verbose = os.environ.get("IBEX_OPERATOR_VERBOSE", "").lower() in ("1", "true", "yes")
    kopf.configure(verbose=verbose, log_format=log_format, log_prefix=False)
    metrics = OperatorMetrics()
    if config.metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(config.metrics_port, registry=metrics.registry)
    # Each replica its own identity and a random priority: the highest live one works.
    identity = f"{socket.gethostname()}/{uuid.uuid4().hex[:8]}"
    priority = random_priority()
    registry, _ = build_registry(config, Credentials(), metrics=metrics, identity=identity, priority=priority)
    peering = config.peering is not None
    kopf.run(
        registry=registry,
        standalone=not peering,
        peering_name=config.peering,
        priority=priority if peering else None,
        identity=cast(Any, identity) if peering else None,  # kopf's Identity is a NewType of str
        namespaces=config.namespaces,
        clusterwide=not config.namespaces,
        liveness_endpoint=config.liveness_endpoint,
    )


if __name__ == "__main__":
    main()
