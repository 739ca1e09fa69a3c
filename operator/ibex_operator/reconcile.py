"""What the cluster should look like, from the ContextProfiles of one namespace. Pure.

``plan_namespace`` takes every ContextProfile of a namespace and returns, per
target service, the one ConfigMap and the one HPA that service needs, and, per
profile, its status. No I/O and no clock: the caller passes ``now``. The same
input in any order gives the same output, byte for byte, so repeated
reconciles and the drift timer are no-ops when nothing changed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ibex_context.errors import ConfigurationError
from ibex_context.profiles.loader import API_VERSION as FILE_API_VERSION
from ibex_context.profiles.loader import FILE_KIND, parse_entry
from ibex_context.profiles.schema import DEFAULT_HALF_LIVES_DAYS, OPERATOR_ONLY_FIELDS

from ibex_operator.crd import GROUP, KIND, VERSION, default_spec

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "ibex-context-operator"
SERVICE_LABEL = f"{GROUP}/service"
CHECKSUM_ANNOTATION = f"{GROUP}/profiles-checksum"
PROFILES_KEY = "profiles.json"
INFLIGHT_METRIC = "ibex_context_inflight_calls"
# Fast scale-up (double, or +4 pods, every 15 s), slow and stabilised scale-down (1 pod a minute after
# 5 minutes of lower load). Every field is explicit: no API-server defaults that would read as drift.
HPA_BEHAVIOR: Mapping[str, Any] = {
    "scaleUp": {
        "stabilizationWindowSeconds": 0,
        "selectPolicy": "Max",
        "policies": [
            {"type": "Percent", "value": 100, "periodSeconds": 15},
            {"type": "Pods", "value": 4, "periodSeconds": 15},
        ],
    },
    "scaleDown": {
        "stabilizationWindowSeconds": 300,
        "selectPolicy": "Min",
        "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
    },
}

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ProfileView:
    """The parts of a ContextProfile the reconciler reads."""

    name: str
    namespace: str
    uid: str | None
    generation: int
    created_at: str | None
    spec: Mapping[str, Any]
    conditions: tuple[Mapping[str, Any], ...] = ()
    deleting: bool = False

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ProfileView:
        meta = body.get("metadata") or {}
        status = body.get("status") or {}
        return cls(
            name=meta["name"],
            namespace=meta.get("namespace", ""),
            uid=meta.get("uid"),
            generation=int(meta.get("generation") or 0),
            created_at=meta.get("creationTimestamp"),
            spec=body.get("spec") or {},
            conditions=tuple(status.get("conditions") or ()),
            deleting=bool(meta.get("deletionTimestamp")),
        )


@dataclass(frozen=True, slots=True)
class ServiceObjects:
    service: str
    configmap: Obj
    # None when the operator renders no HPA (the chart's autoscaling.enabled=false).
    hpa: Obj | None


@dataclass(frozen=True, slots=True)
class NamespacePlan:
    namespace: str
    services: tuple[ServiceObjects, ...]
    # Desired ``status`` per profile name.
    statuses: Mapping[str, Obj] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Valid:
    view: ProfileView
    service: str
    spec: Mapping[str, Any]
    entry: Obj


def configmap_name(service: str) -> str:
    return f"{service}-profiles"


def precedence_key(view: ProfileView) -> tuple[bool, str, str]:
    """The conflict rule (same as ``ibex_context.profiles.registry``): oldest wins, then by name."""
    return (view.created_at is None, view.created_at or "", view.name)


def claims(selector: Mapping[str, Any]) -> list[str]:
    # Lower-cased as the service matches them: "ABC…" and "abc…" claim the same agent.
    keys = [f"agent:{a}" for a in sorted({str(a).lower() for a in selector.get("agentIds") or ()})]
    keys += [f"org:{o}" for o in sorted({str(o).lower() for o in selector.get("orgIds") or ()})]
    if selector.get("default"):
        keys.append("default")
    return keys


def file_entry(name: str, created_at: str | None, spec: Mapping[str, Any]) -> Obj:
    """One profile as the service reads it: the defaulted spec minus the operator-only parts."""
    entry: Obj = {"name": name}
    if created_at:
        entry["createdAt"] = created_at
    entry.update((k, v) for k, v in spec.items() if k not in OPERATOR_ONLY_FIELDS)
    return entry


def render_profiles_json(service: str, entries: Sequence[Obj]) -> str:
    document = {
        "apiVersion": FILE_API_VERSION,
        "kind": FILE_KIND,
        "service": service,
        "profiles": list(entries),
    }
    return json.dumps(document, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def _labels(service: str, extra: Mapping[str, str]) -> dict[str, str]:
    return {
        **extra,
        MANAGED_BY_LABEL: MANAGED_BY,
        "app.kubernetes.io/name": "ibex-context",
        "app.kubernetes.io/component": "context-profiles",
        SERVICE_LABEL: service,
    }


def _owner_references(views: Iterable[ProfileView]) -> list[Obj]:
    # Shared children: every contributing profile is a non-controller owner, so the garbage collector
    # deletes the children once the last profile is gone, even if the operator is not running.
    return [
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "name": v.name,
            "uid": v.uid,
            "controller": False,
            "blockOwnerDeletion": False,
        }
        for v in sorted(views, key=lambda v: v.name)
        if v.uid
    ]


def render_configmap(
    namespace: str, service: str, valid: Sequence[_Valid], labels: Mapping[str, str] | None = None
) -> Obj:
    ordered = sorted(valid, key=lambda v: precedence_key(v.view))
    text = render_profiles_json(service, [v.entry for v in ordered])
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(service),
            "namespace": namespace,
            "labels": _labels(service, labels or {}),
            "annotations": {CHECKSUM_ANNOTATION: hashlib.sha256(text.encode()).hexdigest()},
            "ownerReferences": _owner_references(v.view for v in valid),
        },
        "data": {PROFILES_KEY: text},
    }


def aggregate_autoscaling(specs: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Max of the replica bounds, min of the targets: every profile's floor and headroom hold."""
    scalings = [s["autoscaling"] for s in specs]
    return {
        "minReplicas": max(a["minReplicas"] for a in scalings),
        "maxReplicas": max(a["maxReplicas"] for a in scalings),
        "targetInflightPerPod": min(a["targetInflightPerPod"] for a in scalings),
        "targetCPUUtilizationPercentage": min(a["targetCPUUtilizationPercentage"] for a in scalings),
    }


def render_hpa(
    namespace: str,
    service: str,
    valid: Sequence[_Valid],
    *,
    inflight_metric: bool,
    labels: Mapping[str, str] | None = None,
) -> Obj:
    """The HPA of ``service``: CPU always; in-flight calls per pod only with ``inflight_metric``, i.e.
    when a custom-metrics adapter serves ``ibex_context_inflight_calls`` (an HPA with a metric nobody
    serves reports it missing and never scales down)."""
    agg = aggregate_autoscaling(v.spec for v in valid)
    metrics: list[Obj] = []
    if inflight_metric:
        metrics.append(
            {
                "type": "Pods",
                "pods": {
                    "metric": {"name": INFLIGHT_METRIC},
                    "target": {"type": "AverageValue", "averageValue": str(agg["targetInflightPerPod"])},
                },
            }
        )
    metrics.append(
        {
            "type": "Resource",
            "resource": {
                "name": "cpu",
                "target": {
                    "type": "Utilization",
                    "averageUtilization": agg["targetCPUUtilizationPercentage"],
                },
            },
        }
    )
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {
            "name": service,
            "namespace": namespace,
            "labels": _labels(service, labels or {}),
            "ownerReferences": _owner_references(v.view for v in valid),
        },
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": service},
            "minReplicas": agg["minReplicas"],
            "maxReplicas": agg["maxReplicas"],
            "metrics": metrics,
            "behavior": json.loads(json.dumps(HPA_BEHAVIOR)),
        },
    }


def _validate(view: ProfileView, default_service: str | None) -> _Valid | tuple[str, str]:
    spec = default_spec(dict(view.spec))
    service = spec.get("service") or default_service
    if not service:
        return ("NoService", "spec.service is empty and the operator has no IBEX_OPERATOR_DEFAULT_SERVICE")
    entry = file_entry(view.name, view.created_at, spec)
    try:
        # The service's own validator, over the whole spec (the operator-only parts too: the API
        # server's schema and CEL normally guarantee them, a test server or an old CRD may not):
        # a profile the service would reject never reaches the file.
        parse_entry({**entry, **{k: spec[k] for k in OPERATOR_ONLY_FIELDS if k in spec}}, label="spec")
    except ConfigurationError as exc:
        return ("InvalidSpec", str(exc))
    effective = dict(spec, service=service)
    scoring = dict(effective["scoring"])
    scoring["halfLifeDays"] = {**DEFAULT_HALF_LIVES_DAYS, **(scoring.get("halfLifeDays") or {})}
    effective["scoring"] = scoring
    return _Valid(view=view, service=service, spec=effective, entry=entry)


def _condition(type_: str, status: bool, reason: str, message: str, view: ProfileView, now: str) -> Obj:
    value = "True" if status else "False"
    previous = next((c for c in view.conditions if c.get("type") == type_), None)
    # The transition time moves only when the status flips, so a re-render does not churn it.
    since = previous["lastTransitionTime"] if previous and previous.get("status") == value else now
    return {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
        "observedGeneration": view.generation,
    }


def _resolve_claims(ordered: Sequence[_Valid]) -> tuple[dict[str, str], dict[str, list[str]]]:
    winners: dict[str, str] = {}
    contenders: dict[str, list[str]] = {}
    for v in ordered:
        for key in claims(v.spec["selector"]):
            winners.setdefault(key, v.view.name)
            contenders.setdefault(key, []).append(v.view.name)
    return winners, contenders


def _valid_status(
    v: _Valid, winners: Mapping[str, str], contenders: Mapping[str, list[str]], now: str, *, hpa: bool
) -> Obj:
    mine = claims(v.spec["selector"])
    won = [k for k in mine if winners[k] == v.view.name]
    notes = []
    for key in mine:
        others = [n for n in contenders[key] if n != v.view.name]
        if not others:
            continue
        if winners[key] == v.view.name:
            notes.append(f"{key} also claimed by {', '.join(others)}; this profile wins (older)")
        else:
            notes.append(f"{key} is used from {winners[key]} (older); ignored here")
    if won:
        ready = _condition(
            "Ready",
            True,
            "Rendered",
            # Say what was really rendered: no HPA exists with autoscaling off.
            f"rendered into ConfigMap {configmap_name(v.service)} and HPA {v.service}"
            if hpa
            else f"rendered into ConfigMap {configmap_name(v.service)} (no HPA: autoscaling is off)",
            v.view,
            now,
        )
    else:
        ready = _condition(
            "Ready", False, "Overridden", "every selector key is claimed by an older profile", v.view, now
        )
    if notes:
        conflict = _condition("Conflict", True, "SelectorConflict", "; ".join(notes), v.view, now)
    else:
        conflict = _condition("Conflict", False, "NoConflict", "", v.view, now)
    return {
        "observedGeneration": v.view.generation,
        "service": v.service,
        "configMap": configmap_name(v.service),
        "conditions": [ready, conflict],
        "effective": v.spec,
    }


def plan_namespace(
    namespace: str,
    profiles: Iterable[ProfileView],
    default_service: str | None,
    now: str,
    *,
    render_hpa_objects: bool = True,
    inflight_metric: bool = False,
    child_labels: Mapping[str, str] | None = None,
) -> NamespacePlan:
    """Desired children and profile statuses for one namespace. ``now``: RFC 3339 UTC.

    ``render_hpa_objects=False``: no HPA at all (autoscaling off; the Deployment's replicas are fixed).
    ``inflight_metric``: the HPA also scales on in-flight calls per pod (needs a custom-metrics adapter).
    ``child_labels``: added to the children's labels (the operator's profile selector).
    """
    views = sorted((p for p in profiles if not p.deleting), key=precedence_key)
    statuses: dict[str, Obj] = {}
    by_service: dict[str, list[_Valid]] = {}
    for view in views:
        result = _validate(view, default_service)
        if isinstance(result, _Valid):
            by_service.setdefault(result.service, []).append(result)
            continue
        reason, message = result
        statuses[view.name] = {
            "observedGeneration": view.generation,
            "service": view.spec.get("service") or default_service or None,
            "configMap": None,
            "conditions": [
                _condition("Ready", False, reason, message, view, now),
                _condition("Conflict", False, "NoConflict", "", view, now),
            ],
            "effective": None,
        }
    services = []
    for service in sorted(by_service):
        valid = by_service[service]
        winners, contenders = _resolve_claims(valid)
        for v in valid:
            statuses[v.view.name] = _valid_status(v, winners, contenders, now, hpa=render_hpa_objects)
        services.append(
            ServiceObjects(
                service=service,
                configmap=render_configmap(namespace, service, valid, child_labels),
                hpa=(
                    render_hpa(
                        namespace, service, valid, inflight_metric=inflight_metric, labels=child_labels
                    )
                    if render_hpa_objects
                    else None
                ),
            )
        )
    return NamespacePlan(namespace=namespace, services=tuple(services), statuses=statuses)


# --- comparing with what is there ----------------------------------------------------------------


def merge_diff(actual: Any, desired: Any) -> Any:
    """The RFC 7386 merge patch turning ``actual`` into ``desired``; ``{}`` when equal."""
    if not isinstance(actual, dict) or not isinstance(desired, dict):
        return desired
    patch: Obj = {}
    for key, value in desired.items():
        if key not in actual:
            patch[key] = value
        elif actual[key] != value:
            patch[key] = merge_diff(actual[key], value) if isinstance(value, dict) else value
    for key in actual:
        if key not in desired:
            patch[key] = None
    return patch


def child_patch(actual: Mapping[str, Any], desired: Mapping[str, Any]) -> Obj:
    """A merge patch repairing what the operator manages on a child; ``{}`` when in sync.

    Managed: our labels and annotations (others' keys are left alone), the owner references,
    and the whole ``data`` (ConfigMap) or ``spec`` (HPA) -- hand edits there are drift.
    """
    patch: Obj = {}
    meta_a, meta_d = actual.get("metadata") or {}, desired["metadata"]
    meta_patch: Obj = {}
    for part in ("labels", "annotations"):
        have = meta_a.get(part) or {}
        changed = {k: v for k, v in (meta_d.get(part) or {}).items() if have.get(k) != v}
        if changed:
            meta_patch[part] = changed
    if (meta_a.get("ownerReferences") or []) != meta_d["ownerReferences"]:
        meta_patch["ownerReferences"] = meta_d["ownerReferences"]
    if meta_patch:
        patch["metadata"] = meta_patch
    for part in ("data", "spec"):
        if part in desired:
            diff = merge_diff(actual.get(part) or {}, desired[part])
            if diff:
                patch[part] = diff
    return patch


def status_patch(actual: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> Obj:
    """The merge patch of ``status``; ``{}`` when in sync. ``None`` values remove keys."""
    have = dict(actual or {})
    patch: Obj = {}
    for key, value in desired.items():
        if value is None:
            if have.get(key) is not None:
                patch[key] = None
        elif have.get(key) != value:
            patch[key] = merge_diff(have[key], value) if isinstance(have.get(key), dict) else value
    return patch
