"""Operator configuration, from the environment (and CLI flags in ``__main__``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class OperatorConfig:
    # Namespaces to watch; empty = cluster-wide (needs a ClusterRole).
    namespaces: tuple[str, ...] = ()
    # Target Deployment of profiles without spec.service (the chart sets its fullname).
    default_service: str | None = None
    # Seconds between drift checks of each namespace's ConfigMaps and HPAs.
    drift_interval_s: float = 60.0
    liveness_endpoint: str | None = "http://0.0.0.0:8080/healthz"
    # Post Kubernetes Events on the ContextProfiles when children change.
    post_events: bool = True

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> OperatorConfig:
        namespaces = tuple(n.strip() for n in env.get("WATCH_NAMESPACE", "").split(",") if n.strip())
        liveness = env.get("IBEX_OPERATOR_LIVENESS", "http://0.0.0.0:8080/healthz").strip()
        return cls(
            namespaces=namespaces,
            default_service=env.get("IBEX_OPERATOR_DEFAULT_SERVICE", "").strip() or None,
            drift_interval_s=float(env.get("IBEX_OPERATOR_DRIFT_INTERVAL_SECONDS", "60")),
            liveness_endpoint=liveness or None,
            post_events=env.get("IBEX_OPERATOR_POST_EVENTS", "true").strip().lower() in ("1", "true", "yes"),
        )
