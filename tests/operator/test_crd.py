"""The ContextProfile CRD, checked offline.

- The CRD object itself: kubernetes-validate --strict against Kubernetes 1.30 (the oldest
  release the chart supports: CEL validation rules are GA since 1.29) and the newest bundled one.
- The examples: jsonschema (draft 4, as OpenAPI 3.0) against the openAPIV3Schema
  (x-kubernetes-* keys are ignored).
- The CEL rules: cel-python on defaulted good and bad objects. cel-python has no Kubernetes
  CEL libraries and no cost estimation; the rules here use only core CEL.
What this cannot check: the API server's structural-schema and CEL-cost checks, pruning and
defaulting as the API server does them. Those need a real cluster (kind job in CI).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import kubernetes_validate
import pytest
import yaml
from ibex_context.errors import ConfigurationError
from ibex_context.models import CATEGORY_ORDER
from ibex_context.profiles.loader import parse_entry
from ibex_context.profiles.model import DEFAULT_PROFILE
from ibex_operator.crd import CRD_FILE, apply_defaults, docs_table, openapi_schema, render_crd_yaml

# Selector ids are UUIDs, as requests carry them.
A = "aaaaaaaa-0000-4000-8000-000000000000"
ORG = "cccccccc-0000-4000-8000-000000000000"

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))
K8S_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]


def validate(document: Any, schema: dict[str, Any]) -> None:
    # OpenAPI 3.0 schema objects use draft-4 semantics (boolean exclusiveMinimum/Maximum).
    jsonschema.Draft4Validator(schema, format_checker=jsonschema.Draft4Validator.FORMAT_CHECKER).validate(
        document
    )


def crd_from_file() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CRD_FILE.read_text())
    return loaded


def spec_schema() -> dict[str, Any]:
    schema: dict[str, Any] = openapi_schema()["properties"]["spec"]
    return schema


def rule_sites(schema: dict[str, Any], value: Any, path: str = "spec") -> Iterator[tuple[str, str, Any]]:
    """(path, rule, self) for every CEL rule whose node is present in ``value``."""
    for rule in schema.get("x-kubernetes-validations", []):
        yield path, rule["rule"], value
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                yield from rule_sites(sub, value[key], f"{path}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            yield from rule_sites(schema["items"], item, f"{path}[{i}]")


def as_api_server_types(schema: dict[str, Any], value: Any) -> Any:
    """The API server hands CEL ``type: number`` fields as doubles, even when written as 0."""
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        return {k: as_api_server_types(props.get(k, {}), v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_api_server_types(schema.get("items", {}), v) for v in value]
    return value


def failing_rules(spec: dict[str, Any]) -> list[str]:
    env = celpy.Environment()
    defaulted = as_api_server_types(spec_schema(), apply_defaults(spec_schema(), spec))
    failures = []
    for path, rule, value in rule_sites(spec_schema(), defaulted):
        result = env.program(env.compile(rule)).evaluate({"self": celpy.json_to_cel(value)})
        if not bool(result):
            failures.append(path)
    return failures


def test_the_committed_crd_file_is_the_generated_one() -> None:
    assert CRD_FILE.read_text() == render_crd_yaml(), "regenerate: python scripts/codegen.py"


def test_the_docs_field_table_is_the_generated_one() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "profiles.md").read_text()
    assert docs_table() in doc, "regenerate: python scripts/codegen.py"


def test_a_rule_of_the_schema_is_both_a_cel_rule_and_a_loader_check() -> None:
    # One declaration (profiles.schema.Rule): the CRD's CEL and the loader's message agree.
    deadlines = spec_schema()["properties"]["deadlines"]
    cold = next(r for r in deadlines["x-kubernetes-validations"] if r.get("fieldPath") == ".coldMs")
    assert cold == {
        "rule": "self.coldMs < self.assemblyMs",
        "message": "coldMs must be less than assemblyMs",
        "fieldPath": ".coldMs",
    }
    with pytest.raises(ConfigurationError, match=cold["message"]):
        parse_entry({"name": "x", "selector": {"default": True}, "deadlines": {"assemblyMs": 20}})
    assert failing_rules({"selector": {"default": True}, "deadlines": {"assemblyMs": 20}}) == [
        "spec.deadlines"
    ]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_crd_is_a_valid_kubernetes_object_in_strict_mode(version: str) -> None:
    kubernetes_validate.validate(crd_from_file(), version, strict=True)


def test_names_scope_and_printer_columns_follow_the_team_conventions() -> None:
    spec = crd_from_file()["spec"]
    assert crd_from_file()["metadata"]["name"] == "contextprofiles.context.ibex.dev"
    assert (spec["group"], spec["scope"]) == ("context.ibex.dev", "Namespaced")
    assert spec["names"]["kind"] == "ContextProfile"
    assert spec["names"]["shortNames"] == ["cprof"] and spec["names"]["categories"] == ["ibex"]
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
    assert {"Service", "Agents", "Default", "Age"} <= set(columns)


def walk(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for key, sub in schema.get("properties", {}).items():
        yield from walk(sub, f"{path}.{key}")
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}{{}}")


def test_the_schema_is_structural_and_every_string_array_and_map_is_bounded() -> None:
    for path, node in walk(openapi_schema()):
        if path == ".metadata":
            continue
        assert "type" in node, path
        assert "x-kubernetes-preserve-unknown-fields" not in node, path
        if node["type"] == "string" and path not in (".apiVersion", ".kind"):
            assert "maxLength" in node or "enum" in node, path
        if node["type"] == "array":
            assert "maxItems" in node, path
        if node["type"] == "object" and "additionalProperties" in node:
            assert "maxProperties" in node, path


def test_crd_defaults_are_the_services_built_in_defaults() -> None:
    defaulted = apply_defaults(spec_schema(), {"selector": {"default": True}})
    assert (
        parse_entry({"name": "x", **defaulted}).profile
        == parse_entry({"name": "x", "selector": {"default": True}}).profile
    )
    w, d, b = DEFAULT_PROFILE.scoring.weights, DEFAULT_PROFILE.deadlines, DEFAULT_PROFILE.budget
    assert defaulted["scoring"]["weights"] == {
        "relevance": w.relevance,
        "recency": w.recency,
        "usefulness": w.usefulness,
        "confidence": w.confidence,
        "frequency": w.frequency,
    }
    assert defaulted["deadlines"] == {
        "assemblyMs": d.assembly_ms,
        "directiveMs": d.directive_ms,
        "hotMs": d.hot_ms,
        "coldMs": d.cold_ms,
    }
    assert defaulted["budget"] == {"maxMemoryTokens": b.max_memory_tokens, "maxMemories": b.max_memories}
    assert defaulted["scoring"]["relevanceFloor"] == DEFAULT_PROFILE.scoring.relevance_floor
    assert (defaulted["format"], defaulted["injectionMode"]) == (
        DEFAULT_PROFILE.format,
        DEFAULT_PROFILE.injection_mode,
    )
    half_lives = spec_schema()["properties"]["scoring"]["properties"]["halfLifeDays"]["properties"]
    assert list(half_lives) == list(CATEGORY_ORDER)


def test_every_default_passes_its_own_schema() -> None:
    defaulted = apply_defaults(spec_schema(), {"selector": {"default": True}})
    validate(defaulted, spec_schema())
    assert failing_rules(defaulted) == []


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_each_example_is_valid_against_the_schema_the_cel_rules_and_the_service_loader(path: Path) -> None:
    document = yaml.safe_load(path.read_text())
    assert document["apiVersion"] == "context.ibex.dev/v1alpha1" and document["kind"] == "ContextProfile"
    validate(document, openapi_schema())
    assert failing_rules(document["spec"]) == []
    spec = apply_defaults(spec_schema(), document["spec"])
    keep = ("selector", "budget", "deadlines", "scoring", "format", "injectionMode", "models")
    parse_entry({"name": document["metadata"]["name"], **{k: spec[k] for k in keep if k in spec}})


def test_the_examples_cover_default_agent_and_org_profiles() -> None:
    selectors = [yaml.safe_load(p.read_text())["spec"]["selector"] for p in EXAMPLES]
    assert any(s.get("default") for s in selectors)
    assert any(s.get("agentIds") for s in selectors)
    assert any(s.get("orgIds") for s in selectors)


GOOD = {"selector": {"agentIds": [A]}}


@pytest.mark.parametrize(
    ("spec", "failing_path"),
    [
        ({"selector": {}}, "spec.selector"),
        ({"selector": {"agentIds": [], "orgIds": [], "default": False}}, "spec.selector"),
        ({**GOOD, "autoscaling": {"minReplicas": 5, "maxReplicas": 4}}, "spec.autoscaling"),
        ({**GOOD, "deadlines": {"assemblyMs": 30}}, "spec.deadlines"),  # default coldMs 35 >= 30
        ({**GOOD, "deadlines": {"assemblyMs": 40, "hotMs": 40}}, "spec.deadlines"),
        (
            {
                **GOOD,
                "scoring": {
                    "weights": {
                        "relevance": 0,
                        "recency": 0,
                        "usefulness": 0,
                        "confidence": 0,
                        "frequency": 0,
                    }
                },
            },
            "spec.scoring.weights",
        ),
        (
            {
                **GOOD,
                "models": [{"name": "m", "contextWindow": 1000, "maxOutputTokens": 1000, "encoding": "x"}],
            },
            "spec.models[0]",
        ),
    ],
)
def test_cel_rules_reject_inconsistent_specs(spec: dict[str, Any], failing_path: str) -> None:
    assert failing_rules(spec) == [failing_path]


@pytest.mark.parametrize(
    "spec",
    [
        {"selector": {"default": True}},
        {
            "selector": {"orgIds": [ORG]},
            "autoscaling": {"minReplicas": 4, "maxReplicas": 4},
        },
        {**GOOD, "deadlines": {"assemblyMs": 45, "directiveMs": 44, "hotMs": 44, "coldMs": 44}},
        {
            **GOOD,
            "scoring": {
                "weights": {"relevance": 0, "recency": 0, "usefulness": 0, "confidence": 0, "frequency": 0.01}
            },
        },
    ],
)
def test_cel_rules_accept_consistent_specs(spec: dict[str, Any]) -> None:
    assert failing_rules(spec) == []


@pytest.mark.parametrize(
    "mutation",
    [
        lambda s: s["spec"].update(format="yaml"),
        lambda s: s["spec"]["deadlines"].update(assemblyMs=46),
        lambda s: s["spec"]["scoring"]["weights"].update(relevance=1.5),
        lambda s: s["spec"]["scoring"].update(relevanceFloor=1.0),
        lambda s: s["spec"]["scoring"].update(halfLifeDays={"episodic": 0}),
        lambda s: s["spec"]["selector"].update(agentIds=[A] * 257),
        # Requests carry UUIDs: an agent's name or an org's slug could never match.
        lambda s: s["spec"]["selector"].update(agentIds=["edge-summarizer"]),
        lambda s: s["spec"]["selector"].update(orgIds=["acme"]),
        lambda s: s["spec"].update(service="Not_A_DNS_Label"),
        lambda s: s.pop("spec"),
    ],
)
def test_the_schema_rejects_out_of_bounds_values(mutation: Any) -> None:
    document = yaml.safe_load(EXAMPLES[0].read_text())
    document = {**document, "spec": apply_defaults(spec_schema(), copy.deepcopy(document["spec"]))}
    validate(document, openapi_schema())
    mutation(document)
    with pytest.raises(jsonschema.ValidationError):
        validate(document, openapi_schema())


def test_the_status_schema_accepts_what_the_operator_writes() -> None:
    from ibex_operator.reconcile import ProfileView, plan_namespace

    document = yaml.safe_load(EXAMPLES[0].read_text())
    view = ProfileView(
        name="x",
        namespace="ns",
        uid="u",
        generation=3,
        created_at="2026-11-01T00:00:00Z",
        spec=document["spec"],
    )
    status = plan_namespace("ns", [view], "svc", "2026-11-22T04:00:00Z").statuses["x"]
    validate({**document, "status": status}, openapi_schema())
