"""Two releases in one namespace: each release's operator (IBEX_OPERATOR_PROFILE_SELECTOR, set by the
chart to context.ibex.dev/release=<release>) renders only its own release's profiles and never
touches, let alone deletes, what the other release's operator rendered."""

from __future__ import annotations

import dataclasses
from typing import Any

import kopf_harness
import pytest
from ibex_operator.config import OperatorConfig
from ibex_operator.crd import GROUP, KIND, VERSION
from kopf_harness import CR_RESOURCE, NAMESPACE, eventually, key
from test_operator_e2e import BASE, CM, HPA, live

k8s = kopf_harness.k8s  # fixtures, requested by name
operator = kopf_harness.operator

RELEASE_LABEL = f"{GROUP}/release"


@pytest.fixture()
def operator_config() -> OperatorConfig:
    return dataclasses.replace(
        kopf_harness.default_operator_config(),
        default_service="blue-ibex-context",
        profile_selector=((RELEASE_LABEL, "blue"),),
    )


async def create_labelled_profile(k8s: Any, name: str, release: str, spec: dict[str, Any]) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "generation": 1,
            "creationTimestamp": "2026-11-01T10:00:00Z",
            "labels": {RELEASE_LABEL: release},
        },
        "spec": spec,
    }
    response = await k8s.post(BASE, json=body)
    assert response.status == 200, await response.text()


async def test_only_this_releases_profiles_are_rendered_and_the_other_releases_children_stay(
    k8s: Any, operator: Any
) -> None:
    # What green's operator rendered earlier: labelled with green's selector.
    green_cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "green-ibex-context-profiles",
            "namespace": NAMESPACE,
            "labels": {
                "app.kubernetes.io/managed-by": "ibex-context-operator",
                f"{GROUP}/service": "green-ibex-context",
                RELEASE_LABEL: "green",
            },
        },
        "data": {"profiles.json": "{}"},
    }
    assert (await k8s.post(f"/api/v1/namespaces/{NAMESPACE}/configmaps", json=green_cm)).status == 200
    await create_labelled_profile(k8s, "green-default", "green", {"selector": {"default": True}})
    await create_labelled_profile(k8s, "blue-default", "blue", {"selector": {"default": True}})

    blue_cm = await eventually(lambda: live(k8s, CM, "blue-ibex-context-profiles"))
    assert blue_cm["metadata"]["labels"][RELEASE_LABEL] == "blue"
    blue_hpa = await eventually(lambda: live(k8s, HPA, "blue-ibex-context"))
    assert blue_hpa["metadata"]["labels"][RELEASE_LABEL] == "blue"
    # One more full reconcile after both profiles exist, then look at green's side.
    await operator.reconciler.reconcile_namespace(NAMESPACE)
    assert live(k8s, CM, "green-ibex-context-profiles") is not None, "blue deleted green's ConfigMap"
    assert live(k8s, CM, "green-ibex-context-profiles")["data"] == {"profiles.json": "{}"}
    assert live(k8s, HPA, "green-ibex-context") is None
    # Green's profile got no status from blue's operator (a second default would have conflicted).
    assert "status" not in k8s.objects[key(CR_RESOURCE, "green-default")]
    blue_status = k8s.objects[key(CR_RESOURCE, "blue-default")]["status"]
    conflict = next(c for c in blue_status["conditions"] if c["type"] == "Conflict")
    assert conflict["status"] == "False"
