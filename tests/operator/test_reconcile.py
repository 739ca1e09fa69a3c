"""The pure reconcile rules: aggregation, deterministic output, the conflict rule, drift patches."""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import Any

import pytest
from ibex_context.profiles.loader import parse_profiles
from ibex_context.profiles.registry import ProfileRegistry
from ibex_operator.reconcile import (
    CHECKSUM_ANNOTATION,
    ProfileView,
    aggregate_autoscaling,
    child_patch,
    merge_diff,
    plan_namespace,
    status_patch,
)

# Selector ids are UUIDs, as requests carry them.
A = "aaaaaaaa-0000-4000-8000-000000000000"
B = "bbbbbbbb-0000-4000-8000-000000000000"
X = "eeeeeeee-0000-4000-8000-000000000001"
Y = "eeeeeeee-0000-4000-8000-000000000002"
ORG = "cccccccc-0000-4000-8000-000000000000"
ORG_1 = "cccccccc-0000-4000-8000-000000000001"
BOT = "b0000000-0000-4000-8000-000000000000"
ACME = "ac000000-0000-4000-8000-000000000000"

NOW = "2026-11-22T04:00:00Z"


def view(
    name: str, spec: dict[str, Any], created: str | None = "2026-11-01T00:00:00Z", **kw: Any
) -> ProfileView:
    return ProfileView(
        name=name,
        namespace="ns",
        uid=f"uid-{name}",
        generation=kw.pop("generation", 1),
        created_at=created,
        spec=spec,
        **kw,
    )


def plan(
    *views: ProfileView, default_service: str | None = "svc", hpa: bool = True, inflight: bool = True
) -> Any:
    return plan_namespace("ns", views, default_service, NOW, render_hpa_objects=hpa, inflight_metric=inflight)


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_hpa_takes_the_max_of_replica_bounds_and_the_min_of_targets() -> None:
    a = {
        "autoscaling": {
            "minReplicas": 2,
            "maxReplicas": 30,
            "targetInflightPerPod": 8,
            "targetCPUUtilizationPercentage": 80,
        }
    }
    b = {
        "autoscaling": {
            "minReplicas": 5,
            "maxReplicas": 10,
            "targetInflightPerPod": 24,
            "targetCPUUtilizationPercentage": 55,
        }
    }
    assert aggregate_autoscaling([a, b]) == {
        "minReplicas": 5,
        "maxReplicas": 30,
        "targetInflightPerPod": 8,
        "targetCPUUtilizationPercentage": 55,
    }


def test_the_rendered_hpa_scales_the_deployment_on_inflight_calls_and_cpu() -> None:
    p = plan(view("a", {"selector": {"default": True}}))
    hpa = p.services[0].hpa
    assert hpa["metadata"]["name"] == "svc"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "svc"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 10)  # the CRD defaults
    pods, cpu = hpa["spec"]["metrics"]
    assert pods["pods"]["metric"] == {"name": "ibex_context_inflight_calls"}
    assert pods["pods"]["target"] == {"type": "AverageValue", "averageValue": "16"}
    assert cpu["resource"] == {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}
    behavior = hpa["spec"]["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 300


def test_without_a_custom_metrics_adapter_the_hpa_scales_on_cpu_alone() -> None:
    # The default: no adapter serves ibex_context_inflight_calls, and an HPA listing a metric nobody
    # serves reports it missing and never scales down.
    default = plan_namespace("ns", [view("a", {"selector": {"default": True}})], "svc", NOW)
    hpa = default.services[0].hpa
    assert hpa is not None
    assert [m["type"] for m in hpa["spec"]["metrics"]] == ["Resource"]
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"


def test_with_autoscaling_off_no_hpa_is_planned_but_the_configmap_is() -> None:
    p = plan(view("a", {"selector": {"default": True}}), hpa=False)
    (objects,) = p.services
    assert objects.hpa is None
    assert objects.configmap["metadata"]["name"] == "svc-profiles"
    assert conditions(p.statuses["a"])["Ready"]["status"] == "True"


def test_output_is_byte_identical_for_every_input_order() -> None:
    views = [
        view(
            "c",
            {
                "selector": {"agentIds": [X]},
                "scoring": {"weights": {"recency": 0.9}},
            },
            "2026-11-03T00:00:00Z",
        ),
        view(
            "a",
            {
                "selector": {"orgIds": [ORG]},
                "autoscaling": {"minReplicas": 3},
            },
            "2026-11-01T00:00:00Z",
        ),
        view("b", {"selector": {"default": True}, "format": "json"}, "2026-11-02T00:00:00Z"),
        view("d", {"selector": {"default": True}, "service": "other"}, "2026-11-02T00:00:00Z"),
    ]
    rendered = set()
    for order in itertools.permutations(views):
        p = plan(*order)
        rendered.add(
            json.dumps([[s.configmap, s.hpa] for s in p.services], sort_keys=True)
            + json.dumps(p.statuses, sort_keys=True)
        )
    assert len(rendered) == 1


def test_the_profiles_file_is_sorted_stable_json_with_its_checksum_annotated() -> None:
    p = plan(
        view(
            "late",
            {"selector": {"agentIds": [X]}},
            "2026-11-05T00:00:00Z",
        ),
        view(
            "early",
            {"selector": {"agentIds": [Y]}},
            "2026-11-01T00:00:00Z",
        ),
    )
    cm = p.services[0].configmap
    text = cm["data"]["profiles.json"]
    document = json.loads(text)
    assert text == json.dumps(document, sort_keys=True, indent=2) + "\n"
    assert [e["name"] for e in document["profiles"]] == ["early", "late"]  # precedence order
    assert document["profiles"][0]["createdAt"] == "2026-11-01T00:00:00Z"
    assert "autoscaling" not in document["profiles"][0] and "service" not in document["profiles"][0]
    assert cm["metadata"]["annotations"][CHECKSUM_ANNOTATION] == hashlib.sha256(text.encode()).hexdigest()
    assert cm["metadata"]["name"] == "svc-profiles"
    assert cm["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "ibex-context-operator"
    assert [r["name"] for r in cm["metadata"]["ownerReferences"]] == ["early", "late"]
    assert all(r["controller"] is False for r in cm["metadata"]["ownerReferences"])


def test_the_service_loads_every_file_the_operator_renders() -> None:
    p = plan(
        view(
            "a",
            {
                "selector": {"agentIds": [X]},
                "models": [
                    {
                        "name": "tiny",
                        "contextWindow": 8192,
                        "maxOutputTokens": 1024,
                        "encoding": "cl100k_base",
                    }
                ],
            },
        )
    )
    profile_set = parse_profiles(p.services[0].configmap["data"]["profiles.json"])
    assert profile_set.bindings[0].profile.models["tiny"].context_window == 8192


def test_the_oldest_claim_wins_whatever_the_input_order() -> None:
    views = [
        view(
            "zeta",
            {"selector": {"agentIds": [BOT]}},
            "2026-11-01T00:00:00Z",
        ),
        view(
            "alpha",
            {"selector": {"agentIds": [BOT]}},
            "2026-11-02T00:00:00Z",
        ),
        view(
            "beta",
            {"selector": {"agentIds": [BOT]}},
            "2026-11-02T00:00:00Z",
        ),  # tie: name decides
        view("undated", {"selector": {"agentIds": [BOT]}}, None),  # ranks last
    ]
    for order in itertools.permutations(views):
        statuses = plan(*order).statuses
        ready = {name: conditions(s)["Ready"]["status"] for name, s in statuses.items()}
        assert ready == {"zeta": "True", "alpha": "False", "beta": "False", "undated": "False"}
        assert all(conditions(s)["Conflict"]["status"] == "True" for s in statuses.values())
        assert f"agent:{BOT} is used from zeta" in conditions(statuses["alpha"])["Conflict"]["message"]


def test_two_defaults_and_two_claims_on_one_org_are_conflicts_too() -> None:
    statuses = plan(
        view(
            "old",
            {"selector": {"default": True, "orgIds": [ACME]}},
            "2026-11-01T00:00:00Z",
        ),
        view(
            "new",
            {"selector": {"default": True, "orgIds": [ACME]}},
            "2026-11-02T00:00:00Z",
        ),
    ).statuses
    message = conditions(statuses["new"])["Conflict"]["message"]
    assert f"org:{ACME} is used from old" in message and "default is used from old" in message
    assert conditions(statuses["new"])["Ready"]["reason"] == "Overridden"


def test_profiles_of_different_services_never_conflict() -> None:
    statuses = plan(
        view("a", {"selector": {"default": True}, "service": "one"}),
        view("b", {"selector": {"default": True}, "service": "two"}),
    ).statuses
    assert {conditions(s)["Conflict"]["status"] for s in statuses.values()} == {"False"}


def test_the_operator_and_the_service_pick_the_same_winner() -> None:
    views = [
        view(
            "p1",
            {
                "selector": {
                    "agentIds": [
                        A,
                        B,
                    ],
                    "orgIds": [ORG_1],
                },
                "format": "json",
            },
            "2026-11-03T00:00:00Z",
        ),
        view(
            "p2",
            {
                "selector": {"agentIds": [B], "default": True},
                "format": "markdown",
            },
            "2026-11-01T00:00:00Z",
        ),
        view(
            "p3",
            {
                "selector": {"orgIds": [ORG_1], "default": True},
                "format": "xml",
            },
            "2026-11-02T00:00:00Z",
        ),
    ]
    p = plan(*views)
    registry = ProfileRegistry(parse_profiles(p.services[0].configmap["data"]["profiles.json"]).bindings)
    assert registry.resolve("o9", A).name == "p1"
    assert registry.resolve("o9", B).name == "p2"  # older than p1
    assert registry.resolve(ORG_1, "zz").name == "p3"  # older than p1
    assert registry.resolve("o9", "zz").name == "p2"  # the oldest default
    messages = {n: conditions(s)["Conflict"]["message"] for n, s in p.statuses.items()}
    assert f"agent:{B} is used from p2" in messages["p1"]
    assert f"org:{ORG_1} is used from p3" in messages["p1"]
    assert "default is used from p2" in messages["p3"]


def test_an_invalid_profile_is_left_out_with_a_reason_naming_the_field() -> None:
    p = plan(
        view("ok", {"selector": {"default": True}}),
        view(
            "bad",
            {
                "selector": {"agentIds": [X]},
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
        ),
    )
    assert [e["name"] for e in json.loads(p.services[0].configmap["data"]["profiles.json"])["profiles"]] == [
        "ok"
    ]
    ready = conditions(p.statuses["bad"])["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "scoring.weights" in ready["message"]
    assert p.statuses["bad"]["effective"] is None


def test_min_replicas_above_max_is_rejected_without_the_api_servers_cel() -> None:
    p = plan(
        view("bad", {"selector": {"default": True}, "autoscaling": {"minReplicas": 9, "maxReplicas": 3}})
    )
    assert p.services == ()
    assert "minReplicas" in conditions(p.statuses["bad"])["Ready"]["message"]


def test_a_malformed_spec_is_reported_on_its_profile_and_does_not_stop_the_others() -> None:
    p = plan(
        view("ok", {"selector": {"default": True}}),
        view(
            "null-scaling",
            {"selector": {"agentIds": [A]}, "autoscaling": None},
        ),
        view(
            "text-scaling",
            {
                "selector": {"agentIds": [B]},
                "autoscaling": {"minReplicas": "2"},
            },
        ),
        view("list-selector", {"selector": ["x"]}),
    )
    rendered = json.loads(p.services[0].configmap["data"]["profiles.json"])
    assert [e["name"] for e in rendered["profiles"]] == ["ok"]
    for name in ("null-scaling", "text-scaling", "list-selector"):
        assert conditions(p.statuses[name])["Ready"]["reason"] == "InvalidSpec", name


def test_without_spec_service_or_operator_default_the_profile_is_not_ready() -> None:
    p = plan(view("a", {"selector": {"default": True}}), default_service=None)
    assert conditions(p.statuses["a"])["Ready"]["reason"] == "NoService"


def test_a_deleting_profile_is_rendered_out() -> None:
    p = plan(
        view("a", {"selector": {"default": True}}),
        view("b", {"selector": {"agentIds": [X]}}, deleting=True),
    )
    assert [e["name"] for e in json.loads(p.services[0].configmap["data"]["profiles.json"])["profiles"]] == [
        "a"
    ]
    assert "b" not in p.statuses


def test_status_reports_the_effective_settings_and_observed_generation() -> None:
    status = plan(
        view("a", {"selector": {"default": True}, "scoring": {"halfLifeDays": {"episodic": 3}}}, generation=7)
    ).statuses["a"]
    assert status["observedGeneration"] == 7
    assert all(c["observedGeneration"] == 7 for c in status["conditions"])
    assert status["effective"]["service"] == "svc"
    assert status["effective"]["scoring"]["halfLifeDays"]["episodic"] == 3
    assert status["effective"]["scoring"]["halfLifeDays"]["factual"] == 180.0
    assert status["effective"]["deadlines"]["assemblyMs"] == 40


def test_transition_time_moves_only_when_a_condition_flips() -> None:
    first = plan(view("a", {"selector": {"default": True}})).statuses["a"]
    old = tuple(dict(c, lastTransitionTime="2026-01-01T00:00:00Z") for c in first["conditions"])
    same = plan_namespace("ns", [view("a", {"selector": {"default": True}}, conditions=old)], "svc", NOW)
    assert {c["lastTransitionTime"] for c in same.statuses["a"]["conditions"]} == {"2026-01-01T00:00:00Z"}
    flipped = plan_namespace(
        "ns",
        [
            view("z", {"selector": {"default": True}}, "2025-01-01T00:00:00Z"),
            view("a", {"selector": {"default": True}}, conditions=old),
        ],
        "svc",
        NOW,
    )
    assert {c["lastTransitionTime"] for c in flipped.statuses["a"]["conditions"]} == {NOW}


def test_child_patch_is_empty_in_sync_and_repairs_only_what_the_operator_owns() -> None:
    desired = plan(view("a", {"selector": {"default": True}})).services[0].configmap
    assert child_patch(json.loads(json.dumps(desired)), desired) == {}
    edited = json.loads(json.dumps(desired))
    edited["data"]["profiles.json"] = "{}"
    edited["data"]["stray"] = "x"
    edited["metadata"]["labels"]["team"] = "keep-me"
    edited["metadata"]["ownerReferences"] = []
    patch = child_patch(edited, desired)
    assert patch["data"] == {"profiles.json": desired["data"]["profiles.json"], "stray": None}
    assert patch["metadata"] == {"ownerReferences": desired["metadata"]["ownerReferences"]}


def test_merge_diff_nulls_removed_keys_and_recurses_into_objects() -> None:
    assert merge_diff({"a": 1, "b": {"c": 1, "d": 2}}, {"a": 1, "b": {"c": 2}}) == {"b": {"c": 2, "d": None}}
    assert merge_diff({"l": [1, 2]}, {"l": [1]}) == {"l": [1]}


def test_status_patch_removes_nulls_and_skips_equal_values() -> None:
    assert status_patch({"service": "svc", "effective": {"x": 1}}, {"service": "svc", "effective": None}) == {
        "effective": None
    }
    assert status_patch(None, {"service": "svc", "configMap": None}) == {"service": "svc"}


def test_the_profile_selector_parses_equality_pairs_and_refuses_anything_else() -> None:
    from ibex_operator.config import OperatorConfig, parse_selector

    assert parse_selector("") == ()
    assert parse_selector(" context.ibex.dev/release=blue , a=b") == (
        ("a", "b"),
        ("context.ibex.dev/release", "blue"),
    )
    config = OperatorConfig.from_env({"IBEX_OPERATOR_PROFILE_SELECTOR": "context.ibex.dev/release=blue"})
    assert config.selector_text == "context.ibex.dev/release=blue"
    for bad in ("release", "release!=blue", "=blue", "a==b"):
        with pytest.raises(ValueError, match="IBEX_OPERATOR_PROFILE_SELECTOR"):
            parse_selector(bad)
