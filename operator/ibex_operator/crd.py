"""The ContextProfile CRD, built in code so the spec schema is written once.

``status.effective`` repeats the spec's schema (without defaults and CEL rules),
which hand-written YAML would have to duplicate. The canonical YAML file
(``crds/contextprofiles.context.ibex.dev.yaml``, copied by the Helm chart) is
generated from here: ``python -m ibex_operator.crd > <file>``; a test checks the
committed file matches. The operator also reads its defaults from this schema,
because kopf sees objects as stored and a test API server may not default them.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml

GROUP = "context.ibex.dev"
VERSION = "v1alpha1"
PLURAL = "contextprofiles"
KIND = "ContextProfile"
CRD_NAME = f"{PLURAL}.{GROUP}"
CRD_FILE = Path(__file__).parent / "crds" / f"{CRD_NAME}.yaml"

Schema = dict[str, Any]

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# Requests carry org and agent ids as UUIDs (lower-cased by the service): any other
# selector id could never match. The service's loader has the same pattern.
UUID_PATTERN = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
_ID = {"type": "string", "maxLength": 36, "pattern": UUID_PATTERN}
# ibex_context.models.Category, in its order (the operator does not import the service).
CATEGORIES = ("procedural", "factual", "preference", "behavioral", "episodic")


def _int(minimum: int, maximum: int, default: int | None = None, description: str = "") -> Schema:
    s: Schema = {"type": "integer", "minimum": minimum, "maximum": maximum}
    if default is not None:
        s["default"] = default
    if description:
        s["description"] = description
    return s


def _num(
    minimum: float,
    maximum: float,
    default: float | None = None,
    description: str = "",
    exclusive_maximum: bool = False,
) -> Schema:
    s: Schema = {"type": "number", "minimum": minimum, "maximum": maximum}
    if exclusive_maximum:
        s["exclusiveMaximum"] = True
    if default is not None:
        s["default"] = default
    if description:
        s["description"] = description
    return s


def _id_list(description: str) -> Schema:
    return {
        "type": "array",
        "maxItems": 256,
        "x-kubernetes-list-type": "set",
        "items": dict(_ID),
        "description": description,
    }


def spec_properties() -> Schema:
    weight = {"type": "number", "minimum": 0, "maximum": 1}
    return {
        "selector": {
            "type": "object",
            "description": "Which requests use this profile. Precedence: agentIds > orgIds > default.",
            "properties": {
                "agentIds": _id_list("Agent ids this profile applies to."),
                "orgIds": _id_list("Org ids this profile applies to (agents without their own profile)."),
                "default": {
                    "type": "boolean",
                    "default": False,
                    "description": "Use for requests no agent or org profile matches.",
                },
            },
            "x-kubernetes-validations": [
                {
                    "rule": "(has(self.agentIds) && size(self.agentIds) > 0) || "
                    "(has(self.orgIds) && size(self.orgIds) > 0) || (has(self.default) && self.default)",
                    "message": "selector must name at least one agentId or orgId, or set default: true",
                }
            ],
        },
        "service": {
            "type": "string",
            "maxLength": 63,
            "pattern": _DNS_LABEL,
            "description": "Name of the context-service Deployment this profile configures. "
            "Defaults to the operator's IBEX_OPERATOR_DEFAULT_SERVICE.",
        },
        "budget": {
            "type": "object",
            "default": {},
            "properties": {
                "maxMemoryTokens": _int(0, 1_000_000, 4000, "Most tokens the injected memories may take."),
                "maxMemories": _int(0, 1000, 20, "Most memories injected."),
                "responseReserveTokens": _int(
                    0, 1_000_000, None, "Tokens kept free for the answer (default: the model's)."
                ),
                "safetyBufferRatio": _num(
                    0, 0.5, None, "Share of the window kept free (default: the model's)."
                ),
            },
        },
        "deadlines": {
            "type": "object",
            "default": {},
            "description": "Milliseconds. Each source deadline must be less than assemblyMs.",
            "properties": {
                "assemblyMs": _int(1, 45, 40, "Bound of the whole assembly (the proxy gives up at 45 ms)."),
                "directiveMs": _int(1, 45, 10),
                "hotMs": _int(1, 45, 15),
                "coldMs": _int(1, 45, 35),
            },
            "x-kubernetes-validations": [
                {
                    "rule": f"self.{f} < self.assemblyMs",
                    "message": f"{f} must be less than assemblyMs",
                    "fieldPath": f".{f}",
                }
                for f in ("directiveMs", "hotMs", "coldMs")
            ],
        },
        "scoring": {
            "type": "object",
            "default": {},
            "properties": {
                "weights": {
                    "type": "object",
                    "default": {},
                    "properties": {
                        "relevance": {**weight, "default": 0.80},
                        "recency": {**weight, "default": 0.08},
                        "usefulness": {**weight, "default": 0.08},
                        "confidence": {**weight, "default": 0.04},
                        "frequency": {**weight, "default": 0.0},
                    },
                    "x-kubernetes-validations": [
                        {
                            "rule": "self.relevance + self.recency + self.usefulness + self.confidence"
                            " + self.frequency > 0.0",
                            "message": "at least one weight must be greater than 0",
                        }
                    ],
                },
                "halfLifeDays": {
                    "type": "object",
                    "description": "Recency half-life (days) per memory category, over the built-in ones.",
                    "properties": {
                        c: {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 36500}
                        for c in CATEGORIES
                    },
                },
                "relevanceFloor": _num(
                    0, 1, 0.15, "Candidates less relevant than this are dropped.", exclusive_maximum=True
                ),
                "lexicalWeight": _num(
                    0, 1, 0.5, "Share of relevance from the lexical (BM25) match; the rest is semantic."
                ),
            },
        },
        "format": {"type": "string", "enum": ["xml", "markdown", "json"], "default": "xml"},
        "injectionMode": {
            "type": "string",
            "enum": ["system_first", "merge_system"],
            "default": "system_first",
        },
        "models": {
            "type": "array",
            "maxItems": 32,
            "description": "Models added to or overriding the built-in catalogue.",
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            "items": {
                "type": "object",
                "required": ["name", "contextWindow", "maxOutputTokens", "encoding"],
                "properties": {
                    "name": {"type": "string", "minLength": 1, "maxLength": 128},
                    "contextWindow": _int(1, 10_000_000),
                    "maxOutputTokens": _int(1, 10_000_000),
                    "encoding": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": 64,
                        "pattern": "^[a-z0-9_]+$",
                        "description": "tiktoken encoding, e.g. o200k_base.",
                    },
                    "exact": {
                        "type": "boolean",
                        "default": True,
                        "description": "False when the encoding only approximates the tokenizer.",
                    },
                },
                "x-kubernetes-validations": [
                    {
                        "rule": "self.maxOutputTokens < self.contextWindow",
                        "message": "maxOutputTokens must be less than contextWindow",
                    }
                ],
            },
        },
        "autoscaling": {
            "type": "object",
            "default": {},
            "description": "Contributes to the service's HPA: max of minReplicas and maxReplicas, "
            "min of the targets over every profile of the service.",
            "properties": {
                "minReplicas": _int(1, 100, 2),
                "maxReplicas": _int(1, 1000, 10),
                "targetInflightPerPod": _int(1, 10_000, 16, "Average in-flight calls per pod to aim for."),
                "targetCPUUtilizationPercentage": _int(1, 100, 70),
            },
            "x-kubernetes-validations": [
                {
                    "rule": "self.minReplicas <= self.maxReplicas",
                    "message": "minReplicas must be less than or equal to maxReplicas",
                    "fieldPath": ".minReplicas",
                }
            ],
        },
    }


def _strip(schema: Any) -> Any:
    """The spec schema as a status schema: no defaults, no CEL rules."""
    if isinstance(schema, dict):
        return {k: _strip(v) for k, v in schema.items() if k not in ("default", "x-kubernetes-validations")}
    if isinstance(schema, list):
        return [_strip(v) for v in schema]
    return schema


def _condition_schema() -> Schema:
    return {
        "type": "object",
        "required": ["type", "status", "reason", "message", "lastTransitionTime"],
        "properties": {
            "type": {
                "type": "string",
                "maxLength": 316,
                "pattern": r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
            },
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
            "lastTransitionTime": {"type": "string", "format": "date-time", "maxLength": 64},
            "reason": {
                "type": "string",
                "minLength": 1,
                "maxLength": 1024,
                "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
            },
            "message": {"type": "string", "maxLength": 32768},
        },
    }


def build_crd() -> Schema:
    spec_schema: Schema = {
        "type": "object",
        "required": ["selector"],
        "properties": spec_properties(),
    }
    status_schema: Schema = {
        "type": "object",
        "properties": {
            "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
            "service": {
                "type": "string",
                "maxLength": 63,
                "description": "The Deployment this profile configures.",
            },
            "configMap": {"type": "string", "maxLength": 253},
            "conditions": {
                "type": "array",
                "maxItems": 16,
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
                "items": _condition_schema(),
            },
            "effective": {
                "type": "object",
                "description": "The spec with defaults applied, as rendered into the ConfigMap and HPA.",
                "properties": _strip(spec_properties()),
            },
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/name": "ibex-context", "app.kubernetes.io/component": "operator"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": "contextprofile",
                "shortNames": ["cprof"],
                "categories": ["ibex"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {
                            "name": "Ready",
                            "type": "string",
                            "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
                        },
                        {
                            "name": "Conflict",
                            "type": "string",
                            "priority": 1,
                            "jsonPath": '.status.conditions[?(@.type=="Conflict")].status',
                        },
                        {"name": "Service", "type": "string", "jsonPath": ".status.service"},
                        {"name": "Agents", "type": "string", "jsonPath": ".spec.selector.agentIds"},
                        {
                            "name": "Orgs",
                            "type": "string",
                            "jsonPath": ".spec.selector.orgIds",
                            "priority": 1,
                        },
                        {"name": "Default", "type": "boolean", "jsonPath": ".spec.selector.default"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "Context-assembly settings for agents, orgs, or the default.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


def render_crd_yaml() -> str:
    header = "# Generated by `python -m ibex_operator.crd`; do not edit by hand.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=120)


def openapi_schema() -> Schema:
    return copy.deepcopy(build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def apply_defaults(schema: Schema, value: Any) -> Any:
    """Structural defaulting as the API server does it: fill absent fields, recursively."""
    if not isinstance(value, dict) or schema.get("type") != "object":
        if isinstance(value, list) and "items" in schema:
            return [apply_defaults(schema["items"], v) for v in value]
        return value
    result = dict(value)
    for key, sub in schema.get("properties", {}).items():
        if key not in result and "default" in sub:
            result[key] = copy.deepcopy(sub["default"])
        if key in result:
            result[key] = apply_defaults(sub, result[key])
    return result


def default_spec(spec: dict[str, Any]) -> dict[str, Any]:
    spec_schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    defaulted: dict[str, Any] = apply_defaults(spec_schema, spec)
    return defaulted


if __name__ == "__main__":
    sys.stdout.write(render_crd_yaml())
