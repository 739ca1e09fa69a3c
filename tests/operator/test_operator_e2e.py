"""The real kopf operator against kmock: profiles in, one ConfigMap + one HPA per service out."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import kopf_harness
from ibex_context.profiles.loader import parse_profiles
from ibex_context.profiles.registry import ProfileRegistry
from ibex_operator.crd import GROUP, KIND, VERSION
from kopf_harness import CR_RESOURCE, NAMESPACE, eventually, key

# Selector ids are UUIDs, as requests carry them.
A = "aaaaaaaa-0000-4000-8000-000000000000"
B = "bbbbbbbb-0000-4000-8000-000000000000"
X = "eeeeeeee-0000-4000-8000-000000000001"
BOT_1 = "b0000000-0000-4000-8000-000000000001"
BOT_2 = "b0000000-0000-4000-8000-000000000002"
SUPPORT_BOT = "5b000000-0000-4000-8000-000000000000"
ACME = "ac000000-0000-4000-8000-000000000000"

k8s = kopf_harness.k8s  # fixtures, requested by name
operator = kopf_harness.operator
operator_config = kopf_harness.operator_config

BASE = f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/contextprofiles"
CM = "v1/configmaps"
HPA = "autoscaling/v2/horizontalpodautoscalers"
MERGE = {"Content-Type": "application/merge-patch+json"}


async def create_profile(k8s: Any, name: str, spec: dict[str, Any], *, created: str) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        # kmock assigns none of these; kopf and the ownerReferences need them.
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "generation": 1,
            "creationTimestamp": created,
        },
        "spec": spec,
    }
    response = await k8s.post(BASE, json=body)
    assert response.status == 200, await response.text()


def live(k8s: Any, resource: str, name: str) -> Any:
    k = key(resource, name)
    if k in k8s.objects and not k8s.objects[k].deleted:
        return k8s.objects[k]
    return None


def profiles_file(k8s: Any, service: str = "ibex-context") -> dict[str, Any]:
    cm = live(k8s, CM, f"{service}-profiles")
    assert cm is not None
    document: dict[str, Any] = json.loads(cm["data"]["profiles.json"])
    return document


def posted_events(k8s: Any) -> list[dict[str, Any]]:
    # From the request log: kmock 0.8 ignores generateName, so stored events overwrite each other.
    return [r.data for r in k8s["post"] if r.url.path.endswith("/events") and isinstance(r.data, dict)]


def condition(k8s: Any, name: str, type_: str) -> dict[str, Any]:
    status = k8s.objects[key(CR_RESOURCE, name)]["status"]
    return next(c for c in status["conditions"] if c["type"] == type_)


async def test_a_new_profile_gets_a_configmap_an_hpa_and_a_ready_status(k8s: Any, operator: Any) -> None:
    await create_profile(
        k8s,
        "support",
        {
            "selector": {"agentIds": [SUPPORT_BOT]},
            "autoscaling": {"minReplicas": 3, "maxReplicas": 8},
        },
        created="2026-11-01T10:00:00Z",
    )

    await eventually(lambda: live(k8s, CM, "ibex-context-profiles") and live(k8s, HPA, "ibex-context"))
    cm = live(k8s, CM, "ibex-context-profiles")
    assert cm["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "ibex-context-operator"
    assert cm["metadata"]["ownerReferences"] == [
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "name": "support",
            "uid": "uid-support",
            "controller": False,
            "blockOwnerDeletion": False,
        }
    ]
    profile_set = parse_profiles(cm["data"]["profiles.json"])  # the service accepts what was rendered
    assert [b.profile.name for b in profile_set.bindings] == ["support"]

    hpa = live(k8s, HPA, "ibex-context")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "ibex-context",
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 8)

    await eventually(lambda: condition(k8s, "support", "Ready")["status"] == "True")
    status = k8s.objects[key(CR_RESOURCE, "support")]["status"]
    assert status["observedGeneration"] == 1
    assert status["service"] == "ibex-context"
    assert status["effective"]["deadlines"] == {
        "assemblyMs": 40,
        "directiveMs": 10,
        "hotMs": 15,
        "coldMs": 35,
    }
    assert condition(k8s, "support", "Conflict")["status"] == "False"
    # An Event tells the user what was written.
    await eventually(
        lambda: any(
            e["reason"] == "Rendered" and e["involvedObject"]["name"] == "support" for e in posted_events(k8s)
        )
    )


async def test_a_spec_update_rerenders_and_moves_observed_generation(k8s: Any, operator: Any) -> None:
    await create_profile(
        k8s,
        "support",
        {"selector": {"agentIds": [SUPPORT_BOT]}},
        created="2026-11-01T10:00:00Z",
    )
    await eventually(lambda: live(k8s, CM, "ibex-context-profiles"))

    # kmock does not bump metadata.generation on spec changes: the test does what the API server would.
    response = await k8s.patch(
        f"{BASE}/support",
        headers=MERGE,
        json={
            "metadata": {"generation": 2},
            "spec": {"scoring": {"weights": {"relevance": 0.9}}, "format": "markdown"},
        },
    )
    assert response.status == 200

    def updated() -> bool:
        entry = profiles_file(k8s)["profiles"][0]
        return bool(entry["format"] == "markdown" and entry["scoring"]["weights"]["relevance"] == 0.9)

    await eventually(updated)
    await eventually(lambda: k8s.objects[key(CR_RESOURCE, "support")]["status"]["observedGeneration"] == 2)
    assert condition(k8s, "support", "Ready")["observedGeneration"] == 2


async def test_profiles_of_one_service_share_one_configmap_and_an_aggregated_hpa(
    k8s: Any, operator: Any
) -> None:
    await create_profile(
        k8s,
        "small",
        {
            "selector": {"orgIds": [ACME]},
            "autoscaling": {
                "minReplicas": 2,
                "maxReplicas": 6,
                "targetInflightPerPod": 32,
                "targetCPUUtilizationPercentage": 60,
            },
        },
        created="2026-11-01T10:00:00Z",
    )
    await create_profile(
        k8s,
        "big",
        {
            "selector": {"default": True},
            "autoscaling": {
                "minReplicas": 4,
                "maxReplicas": 20,
                "targetInflightPerPod": 8,
                "targetCPUUtilizationPercentage": 75,
            },
        },
        created="2026-11-02T10:00:00Z",
    )
    await create_profile(
        k8s, "other", {"selector": {"default": True}, "service": "ibex-batch"}, created="2026-11-03T10:00:00Z"
    )

    await eventually(lambda: [p["name"] for p in profiles_file(k8s)["profiles"]] == ["small", "big"])
    hpa = await eventually(lambda: live(k8s, HPA, "ibex-context"))
    await eventually(
        lambda: hpa["spec"]["minReplicas"] == 4 or live(k8s, HPA, "ibex-context")["spec"]["minReplicas"] == 4
    )
    spec = live(k8s, HPA, "ibex-context")["spec"]
    assert (spec["minReplicas"], spec["maxReplicas"]) == (4, 20)
    pods, cpu = spec["metrics"]
    assert pods["pods"] == {
        "metric": {"name": "ibex_context_inflight_calls"},
        "target": {"type": "AverageValue", "averageValue": "8"},
    }
    assert cpu["resource"]["target"] == {"type": "Utilization", "averageUtilization": 60}
    owners = [r["name"] for r in live(k8s, CM, "ibex-context-profiles")["metadata"]["ownerReferences"]]
    assert owners == ["big", "small"]

    # The profile targeting another service gets its own pair of objects.
    await eventually(lambda: [p["name"] for p in profiles_file(k8s, "ibex-batch")["profiles"]] == ["other"])
    assert live(k8s, HPA, "ibex-batch")["spec"]["scaleTargetRef"]["name"] == "ibex-batch"


async def test_two_profiles_claiming_one_agent_both_show_conflict_and_the_oldest_wins(
    k8s: Any, operator: Any
) -> None:
    await create_profile(
        k8s,
        "newer",
        {
            "selector": {"agentIds": [BOT_1, BOT_2]},
            "format": "json",
        },
        created="2026-11-05T10:00:00Z",
    )
    await create_profile(
        k8s,
        "older",
        {"selector": {"agentIds": [BOT_1]}, "format": "markdown"},
        created="2026-11-01T10:00:00Z",
    )

    await eventually(
        lambda: (
            condition(k8s, "newer", "Conflict")["status"] == "True"
            and condition(k8s, "older", "Conflict")["status"] == "True"
        )
    )
    assert f"agent:{BOT_1} is used from older" in condition(k8s, "newer", "Conflict")["message"]
    assert "this profile wins" in condition(k8s, "older", "Conflict")["message"]
    # The loser still serves bot-2, so it stays Ready.
    assert condition(k8s, "newer", "Ready")["status"] == "True"

    # The service resolves the conflict with the same rule.
    registry = ProfileRegistry(parse_profiles(json.dumps(profiles_file(k8s))).bindings)
    assert registry.resolve("org", BOT_1).format == "markdown"
    assert registry.resolve("org", BOT_2).format == "json"
    await eventually(
        lambda: (
            {
                e["involvedObject"]["name"]
                for e in posted_events(k8s)
                if e["reason"] == "SelectorConflict" and e["type"] == "Warning"
            }
            == {"newer", "older"}
        )
    )


async def test_deleting_profiles_rerenders_and_the_last_deletion_removes_the_children(
    k8s: Any, operator: Any
) -> None:
    await create_profile(
        k8s,
        "a",
        {"selector": {"agentIds": [A]}},
        created="2026-11-01T10:00:00Z",
    )
    await create_profile(
        k8s,
        "b",
        {"selector": {"agentIds": [B]}},
        created="2026-11-02T10:00:00Z",
    )
    await eventually(lambda: [p["name"] for p in profiles_file(k8s)["profiles"]] == ["a", "b"])

    assert (await k8s.delete(f"{BASE}/a")).status == 200
    await eventually(lambda: [p["name"] for p in profiles_file(k8s)["profiles"]] == ["b"])
    owners = [r["name"] for r in live(k8s, CM, "ibex-context-profiles")["metadata"]["ownerReferences"]]
    assert owners == ["b"]

    assert (await k8s.delete(f"{BASE}/b")).status == 200
    await eventually(
        lambda: live(k8s, CM, "ibex-context-profiles") is None and live(k8s, HPA, "ibex-context") is None
    )


async def test_the_drift_timer_restores_deleted_and_hand_edited_children(k8s: Any, operator: Any) -> None:
    await create_profile(
        k8s,
        "support",
        {"selector": {"agentIds": [SUPPORT_BOT]}},
        created="2026-11-01T10:00:00Z",
    )
    cm = await eventually(lambda: live(k8s, CM, "ibex-context-profiles"))
    original = cm["data"]["profiles.json"]
    await eventually(lambda: live(k8s, HPA, "ibex-context"))

    assert (
        await k8s.delete(f"/api/v1/namespaces/{NAMESPACE}/configmaps/ibex-context-profiles")
    ).status == 200
    response = await k8s.patch(
        f"/apis/autoscaling/v2/namespaces/{NAMESPACE}/horizontalpodautoscalers/ibex-context",
        headers=MERGE,
        json={"spec": {"maxReplicas": 99, "extra": {"hand": "edit"}}},
    )
    assert response.status == 200

    await eventually(lambda: live(k8s, CM, "ibex-context-profiles") is not None)
    assert live(k8s, CM, "ibex-context-profiles")["data"]["profiles.json"] == original
    await eventually(lambda: live(k8s, HPA, "ibex-context")["spec"]["maxReplicas"] == 10)
    assert "extra" not in live(k8s, HPA, "ibex-context")["spec"]

    response = await k8s.patch(
        f"/api/v1/namespaces/{NAMESPACE}/configmaps/ibex-context-profiles",
        headers=MERGE,
        json={"data": {"profiles.json": "{}", "stray": "x"}},
    )
    assert response.status == 200
    await eventually(lambda: live(k8s, CM, "ibex-context-profiles")["data"] == {"profiles.json": original})


async def test_an_invalid_profile_is_left_out_and_reported_while_the_others_render(
    k8s: Any, operator: Any
) -> None:
    await create_profile(k8s, "good", {"selector": {"default": True}}, created="2026-11-01T10:00:00Z")
    # kmock runs no CEL: the operator's own validation (the service's loader) must catch this.
    await create_profile(
        k8s,
        "bad",
        {"selector": {"agentIds": [X]}, "deadlines": {"assemblyMs": 20}},
        created="2026-11-02T10:00:00Z",
    )

    await eventually(lambda: condition(k8s, "bad", "Ready")["reason"] == "InvalidSpec")
    assert "coldMs must be less than assemblyMs" in condition(k8s, "bad", "Ready")["message"]
    assert [p["name"] for p in profiles_file(k8s)["profiles"]] == ["good"]
    await eventually(lambda: condition(k8s, "good", "Ready")["status"] == "True")


async def test_the_liveness_endpoint_reports_the_reconciler(k8s: Any, operator: Any) -> None:
    await create_profile(k8s, "support", {"selector": {"default": True}}, created="2026-11-01T10:00:00Z")
    await eventually(lambda: operator.reconciler.stats.reconciles > 0)
    async with aiohttp.ClientSession() as session, session.get(operator.liveness_url) as response:
        assert response.status == 200
        body = await response.json()
    assert body["reconciler"]["reconciles"] >= 1
    assert body["reconciler"]["lastError"] is None


async def test_profiles_carry_no_finalizer_so_deletion_never_waits_for_the_operator(
    k8s: Any, operator: Any
) -> None:
    # `helm uninstall` deletes the operator's Deployment and Role before custom resources, and a
    # namespace deletion removes everything at once: a finalizer would leave the profile Terminating.
    await create_profile(k8s, "default", {"selector": {"default": True}}, created="2026-11-01T10:00:00Z")
    await eventually(lambda: condition(k8s, "default", "Ready")["status"] == "True")
    await eventually(lambda: live(k8s, HPA, "ibex-context") is not None)
    body = k8s.objects[key(CR_RESOURCE, "default")]
    assert not body["metadata"].get("finalizers"), body["metadata"]
    # The children are the garbage collector's to remove once the profile is gone.
    for resource, name in ((CM, "ibex-context-profiles"), (HPA, "ibex-context")):
        owners = live(k8s, resource, name)["metadata"]["ownerReferences"]
        assert [(o["kind"], o["name"], o["uid"]) for o in owners] == [(KIND, "default", "uid-default")]
    # kmock keeps an object with finalizers until they are removed; without one it goes at once.
    assert (await k8s.delete(f"{BASE}/default")).status == 200
    assert live(k8s, CR_RESOURCE, "default") is None


async def test_a_finalizer_left_by_an_older_operator_is_removed(k8s: Any, operator: Any) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": "legacy",
            "namespace": NAMESPACE,
            "uid": "uid-legacy",
            "resourceVersion": "1",
            "generation": 1,
            "creationTimestamp": "2026-11-01T10:00:00Z",
            "finalizers": [f"{GROUP}/finalizer"],
        },
        "spec": {"selector": {"default": True}},
    }
    assert (await k8s.post(BASE, json=body)).status == 200
    await eventually(lambda: not k8s.objects[key(CR_RESOURCE, "legacy")]["metadata"].get("finalizers"))
