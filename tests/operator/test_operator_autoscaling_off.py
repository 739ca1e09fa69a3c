"""The real kopf operator with autoscaling off (the chart's autoscaling.enabled=false): profiles still
render into the ConfigMap, no HPA is made, and an HPA the operator made earlier is removed."""

from __future__ import annotations

import dataclasses
from typing import Any

import kopf_harness
import pytest
from ibex_operator.config import OperatorConfig
from ibex_operator.crd import GROUP
from kopf_harness import NAMESPACE, eventually
from test_operator_e2e import CM, HPA, condition, create_profile, live

k8s = kopf_harness.k8s  # fixtures, requested by name
operator = kopf_harness.operator


@pytest.fixture()
def operator_config() -> OperatorConfig:
    return dataclasses.replace(kopf_harness.default_operator_config(), render_hpa=False)


async def test_no_hpa_and_an_earlier_operator_made_hpa_is_deleted(k8s: Any, operator: Any) -> None:
    # Left by the operator while autoscaling was on.
    earlier = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {
            "name": "ibex-context",
            "namespace": NAMESPACE,
            "labels": {
                "app.kubernetes.io/managed-by": "ibex-context-operator",
                f"{GROUP}/service": "ibex-context",
            },
        },
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "ibex-context"}},
    }
    path = f"/apis/autoscaling/v2/namespaces/{NAMESPACE}/horizontalpodautoscalers"
    assert (await k8s.post(path, json=earlier)).status == 200
    await create_profile(k8s, "default", {"selector": {"default": True}}, created="2026-11-01T10:00:00Z")

    await eventually(lambda: live(k8s, CM, "ibex-context-profiles") is not None)
    await eventually(lambda: live(k8s, HPA, "ibex-context") is None)


async def test_ready_says_no_hpa_was_rendered(k8s: Any, operator: Any) -> None:
    await create_profile(k8s, "default", {"selector": {"default": True}}, created="2026-11-01T10:00:00Z")

    ready = await eventually(lambda: condition(k8s, "default", "Ready"))
    assert ready["status"] == "True"
    assert "ibex-context-profiles" in ready["message"]
    assert "no HPA" in ready["message"] and "and HPA" not in ready["message"]
