"""The ContextProfile CRD, generated from the profile schema.

The spec's fields, bounds, defaults, descriptions and CEL rules are declared once, in
``ibex_context.profiles.schema`` (pydantic models); this module turns their JSON
schema into a Kubernetes structural schema and wraps it in the CRD. The operator
imports the service's ``profiles`` package (schema and loader: pydantic, no server,
no stores) on purpose: both ship in one distribution and one image, and the operator
validates every spec with the loader the service runs, so a profile the service
would reject never reaches its file.

``status.effective`` repeats the spec's schema (without defaults and CEL rules).
The YAML the Helm chart installs (``charts/ibex-context/crds/``) is written by
``scripts/codegen.py``, whose ``--check`` (CI) fails when it is stale. The operator
also reads its defaults from this schema, because kopf sees objects as stored and a
test API server may not default them.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml
from ibex_context.profiles.schema import UUID_PATTERN, ContextProfileSpec

GROUP = "context.ibex.dev"
VERSION = "v1alpha1"
PLURAL = "contextprofiles"
KIND = "ContextProfile"
CRD_NAME = f"{PLURAL}.{GROUP}"
# Where scripts/codegen.py writes the CRD: the chart installs it from crds/.
CRD_FILE = Path(__file__).resolve().parents[2] / "charts" / "ibex-context" / "crds" / f"{CRD_NAME}.yaml"

Schema = dict[str, Any]

# JSON-schema keys that have no place in a structural schema, or say nothing to the API server.
_DROPPED = {"title", "$defs", "propertyNames"}


def structural(node: Any, defs: Schema) -> Any:
    """A pydantic JSON schema (draft 2020-12) as a Kubernetes structural schema (OpenAPI 3.0)."""
    if isinstance(node, list):
        return [structural(v, defs) for v in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        # Keys beside the reference (a field's description, default) win over the model's.
        node = {**defs[node.pop("$ref").rsplit("/", 1)[-1]], **node}
    if "anyOf" in node:
        # ``X | None``: the field is optional; absent is how a structural schema says null.
        (only,) = [n for n in node.pop("anyOf") if n.get("type") != "null"]
        node = {**only, **node}
    if node.get("default", ...) is None:
        del node["default"]
    out: Schema = {}
    for key, value in node.items():
        if key in _DROPPED or (key == "additionalProperties" and value is False):
            continue
        if key in ("exclusiveMinimum", "exclusiveMaximum"):
            # Draft 2020-12 gives the bound; OpenAPI 3.0 a flag beside minimum/maximum.
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "properties":
            out[key] = {k: structural(v, defs) for k, v in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = structural(value, defs)
        elif key == "x-kubernetes-validations":
            out[key] = [{k: rule[k] for k in ("rule", "message", "fieldPath") if k in rule} for rule in value]
        else:
            out[key] = value
    names = node.get("propertyNames", {}).get("enum")
    if names and "additionalProperties" in out:
        # A map with enumerated keys (categories): one property per key.
        value_schema = out.pop("additionalProperties")
        out.pop("maxProperties", None)
        out["properties"] = {name: copy.deepcopy(value_schema) for name in names}
    # pydantic sorts keys; type and description first read better in the YAML.
    first = [k for k in ("type", "description") if k in out]
    return {k: out[k] for k in [*first, *(k for k in out if k not in first)]}


def spec_properties() -> Schema:
    generated = ContextProfileSpec.model_json_schema(by_alias=True)
    properties: Schema = structural(generated, generated.get("$defs", {}))["properties"]
    return {name: materialized_defaults(schema) for name, schema in properties.items()}


def materialized_defaults(schema: Any) -> Any:
    """A section's ``default: {}`` written out with its fields' defaults, innermost first. The API
    server checks a default against the section's CEL rules as written, without defaulting it
    first: ``{}`` fails ``self.minReplicas <= self.maxReplicas`` ("no such key") and the whole
    CRD is refused."""
    if isinstance(schema, list):
        return [materialized_defaults(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: materialized_defaults(v) for k, v in schema.items()}
    if out.get("default") == {} and "properties" in out:
        out["default"] = apply_defaults(out, {})
    return out


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
    header = "# Generated by scripts/codegen.py from ibex_context/profiles/schema.py; do not edit by hand.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=120)


def _bounds(node: Schema) -> str:
    parts = []
    if "minimum" in node:
        parts.append(f"{'>' if node.get('exclusiveMinimum') else '≥'} {node['minimum']}")
    if "maximum" in node:
        parts.append(f"{'<' if node.get('exclusiveMaximum') else '≤'} {node['maximum']}")
    if "enum" in node:
        parts.append(" \\| ".join(f"`{v}`" for v in node["enum"]))
    if "maxItems" in node:
        parts.append(f"≤ {node['maxItems']} items")
    if node.get("pattern") == UUID_PATTERN:
        parts.append("UUID")
    elif node.get("pattern"):
        parts.append(f"`{node['pattern']}`")
    elif "maxLength" in node:
        parts.append(f"≤ {node['maxLength']} chars")
    return ", ".join(parts)


def _rows(properties: Schema, prefix: str) -> list[str]:
    rows = []
    for key, node in properties.items():
        path = f"{prefix}{key}"
        items = node.get("items", {})
        kind = node["type"] + (f" of {items['type']}" if node["type"] == "array" else "")
        if node["type"] == "array" and items.get("pattern") == UUID_PATTERN:
            kind += " (UUIDs)"
        default = node.get("default")
        # A section's default is its fields' defaults: their rows say more.
        shown = "" if default is None or node.get("type") == "object" else f"`{json.dumps(default)}`"
        description = (node.get("description") or "").replace("\n", " ")
        rows.append(f"| `{path}` | {kind} | {shown} | {_bounds(node)} | {description} |")
        if node["type"] == "object" and "properties" in node:
            rows.extend(_rows(node["properties"], f"{path}."))
        if node["type"] == "array" and "properties" in node["items"]:
            rows.extend(_rows(node["items"]["properties"], f"{path}[]."))
    return rows


def _rules(properties: Schema, prefix: str) -> list[str]:
    lines = []
    for key, node in properties.items():
        path = f"{prefix}{key}"
        lines += [f"- `{path}`: {r['message']}" for r in node.get("x-kubernetes-validations", [])]
        lines += _rules(node.get("properties", {}), f"{path}.")
        if "items" in node:
            lines += _rules({"[]": node["items"]}, path)
    return lines


def docs_table() -> str:
    """The field table of docs/profiles.md: every spec field with type, default, bounds, meaning,
    then the rules across fields (CEL in the CRD, the same checks in the service's loader)."""
    header = ["| field | type | default | bounds | meaning |", "|---|---|---|---|---|"]
    rules = ["", "Rules across fields:", "", *_rules(spec_properties(), "")]
    return "\n".join(header + _rows(spec_properties(), "") + rules) + "\n"


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
