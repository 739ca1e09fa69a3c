"""The operator, run as the chart deploys it, with its ServiceAccount's token: RBAC enforced by a
real API server. It renders the release's ContextProfiles into the profiles ConfigMap and the
HPA, and reports conditions and observedGeneration on each profile."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.conftest import Stores, prepare_release
from tests.cluster.kube import Cluster, Obj, condition, eventually
from tests.cluster.operator_process import OperatorProcess, start_operator
from tests.cluster.release import Release

pytestmark = pytest.mark.integration

RECONCILE_TIMEOUT_S = 45.0


@pytest.fixture(scope="module")
def release(cluster: Cluster, namespace: str, release_stores: Stores) -> Iterator[Release]:
    release = Release(cluster, "op", namespace)
    release = prepare_release(release, release_stores)
    release.install({"autoscaling.maxReplicas": 5})
    yield release
    release.uninstall()


@pytest.fixture(scope="module")
def operator(release: Release, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    deployment = release.cluster.get("deployment", f"{release.fullname}-operator", release.namespace)
    assert deployment is not None
    process = start_operator(release.cluster, deployment, tmp_path_factory.mktemp("operator"), "op")
    yield process
    process.stop()


def default_profile(release: Release) -> Obj:
    found = release.cluster.get("contextprofile", f"{release.fullname}-default", release.namespace)
    assert found is not None
    return found


def reconciled(release: Release) -> Obj | None:
    """The default profile once the operator has reported on its current generation."""
    profile = default_profile(release)
    ready = condition(profile, "Ready")
    status = profile.get("status") or {}
    if ready is None or status.get("observedGeneration") != profile["metadata"]["generation"]:
        return None
    return profile


def test_the_operator_renders_the_default_profile_into_the_configmap_and_the_hpa(
    release: Release, operator: OperatorProcess
) -> None:
    profile = eventually(lambda: reconciled(release), RECONCILE_TIMEOUT_S, "the default profile reconciled")
    assert (condition(profile, "Ready") or {}).get("status") == "True", profile["status"]
    cm = release.cluster.get("configmap", f"{release.fullname}-profiles", release.namespace)
    assert cm is not None
    document = json.loads(cm["data"]["profiles.json"])
    assert [p["name"] for p in document["profiles"]] == [profile["metadata"]["name"]]
    hpa = release.cluster.get("hpa", release.fullname, release.namespace)
    assert hpa is not None
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": release.fullname,
    }
    assert hpa["spec"]["maxReplicas"] == 5
    # Children are owned by the profile: the garbage collector removes them after the last profile.
    assert {o["uid"] for o in cm["metadata"]["ownerReferences"]} == {profile["metadata"]["uid"]}


def test_a_spec_change_is_reconciled_at_its_new_generation(
    release: Release, operator: OperatorProcess
) -> None:
    before = eventually(lambda: reconciled(release), RECONCILE_TIMEOUT_S, "the default profile reconciled")
    release.cluster.kubectl(
        "patch", "contextprofile", before["metadata"]["name"], "-n", release.namespace, "--type=merge",
        "-p", json.dumps({"spec": {"autoscaling": {"maxReplicas": 7}}}),
    )  # fmt: skip
    after = eventually(lambda: reconciled(release), RECONCILE_TIMEOUT_S, "the changed profile reconciled")
    assert after["metadata"]["generation"] > before["metadata"]["generation"]
    hpa = eventually(
        lambda: (
            (h := release.cluster.get("hpa", release.fullname, release.namespace))
            and h["spec"]["maxReplicas"] == 7
            and h
        ),
        RECONCILE_TIMEOUT_S,
        "the HPA at the new maxReplicas",
    )
    assert hpa["spec"]["minReplicas"] <= 7


def test_the_operator_was_never_refused_by_rbac(release: Release, operator: OperatorProcess) -> None:
    eventually(lambda: reconciled(release), RECONCILE_TIMEOUT_S, "the default profile reconciled")
    output = operator.output()
    assert "Forbidden" not in output and " 403" not in output, output[-3000:]
    assert operator.process.poll() is None, output[-3000:]


@pytest.mark.parametrize(
    "command",
    [
        ["delete", "contextprofile", "{fullname}-default"],
        ["get", "secret", "{fullname}-stores"],
        ["get", "pods"],
        ["create", "deployment", "intruder", "--image=registry.example.com/intruder"],
        ["create", "role", "escalate", "--verb=*", "--resource=*"],
    ],
    ids=["delete-profile", "read-secret", "list-pods", "create-deployment", "create-role"],
)
def test_a_verb_the_role_lacks_is_forbidden_to_the_operators_serviceaccount(
    release: Release, tmp_path: Path, command: list[str]
) -> None:
    account = f"{release.fullname}-operator"
    as_operator = release.cluster.as_service_account(release.namespace, account, tmp_path)
    args = [word.format(fullname=release.fullname) for word in command]
    result = as_operator.kubectl_result(*args, "-n", release.namespace)
    assert result.returncode != 0
    assert "forbidden" in result.stderr.lower(), result.stderr
    assert f"system:serviceaccount:{release.namespace}:{account}" in result.stderr


def test_a_profile_naming_another_service_gets_no_children_there(
    release: Release, operator: OperatorProcess
) -> None:
    """The Role names the release's own ConfigMap and HPA: a profile of the release whose
    spec.service names another Deployment renders nothing for it (the server refuses), and the
    release's own children stay as they were."""
    cluster, ns = release.cluster, release.namespace
    eventually(lambda: reconciled(release), RECONCILE_TIMEOUT_S, "the default profile reconciled")
    own = cluster.get("configmap", f"{release.fullname}-profiles", ns)
    assert own is not None
    intruder = {
        "apiVersion": "context.ibex.dev/v1alpha1",
        "kind": "ContextProfile",
        "metadata": {"name": "intruder", "labels": {"context.ibex.dev/release": release.name}},
        "spec": {"selector": {"agentIds": ["00000000-0000-4000-8000-000000000001"]}, "service": "intruder"},
    }
    seen = len(operator.output())
    cluster.apply(intruder, "-n", ns)
    try:
        eventually(
            lambda: "forbidden" in operator.output()[seen:].lower(),
            RECONCILE_TIMEOUT_S,
            "the operator refused",
        )
        assert cluster.get("configmap", "intruder-profiles", ns) is None
        assert cluster.get("hpa", "intruder", ns) is None
        after = cluster.get("configmap", f"{release.fullname}-profiles", ns)
        assert after is not None and after["data"] == own["data"]
    finally:
        cluster.kubectl("delete", "contextprofile", "intruder", "-n", ns, "--wait=false")


def test_without_its_rolebinding_the_operator_is_refused_and_stops_reconciling(
    release: Release, operator: OperatorProcess
) -> None:
    """Last in this module: RBAC, not the operator's goodwill, decides what it may do."""
    cluster, ns = release.cluster, release.namespace
    done = eventually(lambda: reconciled(release), RECONCILE_TIMEOUT_S, "the default profile reconciled")
    binding = cluster.get("rolebinding", f"{release.fullname}-operator", ns)
    assert binding is not None
    seen = len(operator.output())
    cluster.kubectl("delete", "rolebinding", binding["metadata"]["name"], "-n", ns)
    try:
        cluster.kubectl(
            "patch", "contextprofile", done["metadata"]["name"], "-n", ns, "--type=merge",
            "-p", json.dumps({"spec": {"autoscaling": {"maxReplicas": 9}}}),
        )  # fmt: skip
        eventually(
            lambda: "forbidden" in operator.output()[seen:].lower(),
            RECONCILE_TIMEOUT_S,
            "the operator refused",
        )
        hpa = cluster.get("hpa", release.fullname, ns)
        assert hpa is not None and hpa["spec"]["maxReplicas"] != 9
        assert reconciled(release) is None, "no status for the new generation without the rights to render it"
    finally:
        for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
            binding["metadata"].pop(key, None)
        cluster.apply(binding)
