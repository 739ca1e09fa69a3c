"""``ibex-context-operator``: run the ContextProfile operator (kopf, standalone).

Environment (flags override): WATCH_NAMESPACE (comma-separated; empty = cluster-wide),
IBEX_OPERATOR_DEFAULT_SERVICE, IBEX_OPERATOR_DRIFT_INTERVAL_SECONDS (60),
IBEX_OPERATOR_LIVENESS (http://0.0.0.0:8080/healthz; empty disables),
IBEX_OPERATOR_POST_EVENTS (true), IBEX_OPERATOR_LOG_FORMAT (json|plain|full, default json),
IBEX_OPERATOR_VERBOSE (false).
Standalone because kopf has no leader election: run exactly one replica with
``strategy: Recreate`` (docs/adr/0004-context-profiles.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence

import kopf

from ibex_operator.config import OperatorConfig
from ibex_operator.handlers import build_registry
from ibex_operator.kube import Credentials

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
    registry, _ = build_registry(config, Credentials())
    kopf.run(
        registry=registry,
        standalone=True,
        namespaces=config.namespaces,
        clusterwide=not config.namespaces,
        liveness_endpoint=config.liveness_endpoint,
    )


if __name__ == "__main__":
    main()
