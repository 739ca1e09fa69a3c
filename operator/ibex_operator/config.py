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
    # Render an HPA per service (the chart's autoscaling.enabled); without it the replicas are fixed.
    render_hpa: bool = True
    # Scale on in-flight calls per pod too: only when a custom-metrics adapter (prometheus-adapter)
    # serves ibex_context_inflight_calls. Without one an HPA with that metric never scales down.
    inflight_metric: bool = False
    # Reconcile only the ContextProfiles carrying these labels (and label the children with them), so
    # two releases in one namespace never render or delete each other's objects. Empty: every profile.
    profile_selector: tuple[tuple[str, str], ...] = ()
    # Serve the operator's own metrics on this port (/metrics); None: none.
    metrics_port: int | None = 8081
    # The KopfPeering object (in each watched namespace) the replicas elect a leader through; None:
    # standalone (exactly one replica). docs/adr/0004-context-profiles.md.
    peering: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> OperatorConfig:
        namespaces = tuple(n.strip() for n in env.get("WATCH_NAMESPACE", "").split(",") if n.strip())
        liveness = env.get("IBEX_OPERATOR_LIVENESS", "http://0.0.0.0:8080/healthz").strip()
        return cls(
            namespaces=namespaces,
            default_service=env.get("IBEX_OPERATOR_DEFAULT_SERVICE", "").strip() or None,
            drift_interval_s=float(env.get("IBEX_OPERATOR_DRIFT_INTERVAL_SECONDS", "60")),
            liveness_endpoint=liveness or None,
            post_events=_flag(env, "IBEX_OPERATOR_POST_EVENTS", True),
            render_hpa=_flag(env, "IBEX_OPERATOR_HPA", True),
            inflight_metric=_flag(env, "IBEX_OPERATOR_INFLIGHT_METRIC", False),
            profile_selector=parse_selector(env.get("IBEX_OPERATOR_PROFILE_SELECTOR", "")),
            metrics_port=_port(env, "IBEX_OPERATOR_METRICS_PORT", 8081),
            peering=env.get("IBEX_OPERATOR_PEERING", "").strip() or None,
        )

    @property
    def selector_labels(self) -> dict[str, str]:
        return dict(self.profile_selector)

    @property
    def selector_text(self) -> str:
        """The selector in the API server's labelSelector syntax ('' for none)."""
        return ",".join(f"{k}={v}" for k, v in self.profile_selector)


def parse_selector(text: str) -> tuple[tuple[str, str], ...]:
    """``key=value[,key=value...]`` (equality only: children are labelled with it)."""
    pairs = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or "!" in key or "=" in value:
            raise ValueError(f"IBEX_OPERATOR_PROFILE_SELECTOR={text!r}: expected key=value[,key=value]")
        pairs.append((key.strip(), value.strip()))
    return tuple(sorted(pairs))


def _port(env: Mapping[str, str], name: str, default: int) -> int | None:
    """A TCP port; 0 or "" turns the endpoint off."""
    value = env.get(name, str(default)).strip() or "0"
    try:
        port = int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: expected a port number (0 to turn it off)") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{name}={value!r}: expected a port number (0 to turn it off)")
    return port or None


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    value = env.get(name, "").strip().lower()
    if not value:
        return default
    if value in ("1", "true", "yes"):
        return True
    if value in ("0", "false", "no"):
        return False
    raise ValueError(f"{name}={value!r}: expected true or false")
