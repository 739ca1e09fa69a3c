"""The chart's CRDs on a real API server: admitted with their CEL rules (whose cost the server
estimates at admission and refuses over its limit) and enforced at `kubectl apply`."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from tests.cluster.kube import CHART, Cluster, condition, eventually

CRDS = sorted((CHART / "crds").glob("*.yaml"))


@pytest.fixture(scope="module")
def crds(cluster: Cluster) -> None:
    for path in CRDS:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    for name in ("contextprofiles.context.ibex.dev", "kopfpeerings.kopf.dev"):
        eventually(functools.partial(established, cluster, name), 30, f"CRD {name} established")


def established(cluster: Cluster, name: str) -> bool:
    return (condition(cluster.get("crd", name, "default"), "Established") or {}).get("status") == "True"


def profile(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "context.ibex.dev/v1alpha1",
        "kind": "ContextProfile",
        "metadata": {"name": name},
        "spec": spec,
    }


def test_the_crds_are_admitted_with_their_cel_rules(cluster: Cluster, crds: None) -> None:
    crd = cluster.get("crd", "contextprofiles.context.ibex.dev", "default")
    assert crd is not None
    schema = str(crd["spec"]["versions"])
    assert "x-kubernetes-validations" in schema, "the stored CRD kept its CEL rules"


def test_a_valid_profile_is_stored_with_its_defaults(cluster: Cluster, crds: None, namespace: str) -> None:
    cluster.apply(profile("valid", {"selector": {"default": True}}), "-n", namespace)
    stored = cluster.get("contextprofile", "valid", namespace)
    assert stored is not None
    assert stored["spec"]["autoscaling"]["minReplicas"] <= stored["spec"]["autoscaling"]["maxReplicas"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"selector": {}}, "selector must name at least one agentId or orgId, or set default: true"),
        (
            {"selector": {"default": True}, "autoscaling": {"minReplicas": 5, "maxReplicas": 2}},
            "minReplicas must be less than or equal to maxReplicas",
        ),
    ],
    ids=["empty-selector", "min-above-max"],
)
def test_an_invalid_profile_is_refused_at_kubectl_apply_with_the_cel_message(
    cluster: Cluster, crds: None, namespace: str, spec: dict[str, Any], message: str
) -> None:
    import yaml

    result = cluster.kubectl_result(
        "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(profile("invalid", spec))
    )
    assert result.returncode != 0
    assert "is invalid" in result.stderr
    assert message in result.stderr
    assert cluster.get("contextprofile", "invalid", namespace) is None
