"""Two operator replicas (operator.replicas=2) elect one through the release's KopfPeering: when
the leader dies without a goodbye (SIGKILL), the other takes over once the leader's record expires
(its lifetime, 60 s) and reconciles what changed meanwhile."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.conftest import Stores, prepare_release
from tests.cluster.kube import Cluster, Obj, condition, eventually
from tests.cluster.operator_process import OperatorProcess, start_operator
from tests.cluster.release import Release

pytestmark = pytest.mark.integration

# kopf's peering record lives 60 s after the last keep-alive; the takeover follows within seconds.
TAKEOVER_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def release(cluster: Cluster, namespace: str, release_stores: Stores) -> Iterator[Release]:
    release = Release(cluster, "ha", namespace)
    release = prepare_release(release, release_stores)
    release.install({"operator.replicas": 2})
    yield release
    release.uninstall()


def peers(release: Release) -> dict[str, Any]:
    peering = release.cluster.get("kopfpeering", f"{release.fullname}-operator", release.namespace)
    status: dict[str, Any] = (peering or {}).get("status") or {}
    return status


def reconciled_at(release: Release, max_replicas: int) -> Obj | None:
    profile = release.cluster.get("contextprofile", f"{release.fullname}-default", release.namespace)
    hpa = release.cluster.get("hpa", release.fullname, release.namespace)
    if profile is None or hpa is None or hpa["spec"]["maxReplicas"] != max_replicas:
        return None
    if (profile.get("status") or {}).get("observedGeneration") != profile["metadata"]["generation"]:
        return None
    return profile if condition(profile, "Ready") else None


@pytest.mark.timeout(300)
def test_the_standby_takes_over_when_the_leader_dies(
    release: Release, tmp_path_factory: pytest.TempPathFactory
) -> None:
    cluster, ns = release.cluster, release.namespace
    deployment = cluster.get("deployment", f"{release.fullname}-operator", ns)
    assert deployment is not None
    logs = tmp_path_factory.mktemp("leadership")
    first = start_operator(cluster, deployment, logs, "first")
    replicas: dict[str, OperatorProcess] = {}
    second: OperatorProcess | None = None
    try:
        # Alone, the first replica leads: its record is the only one, and it reconciles.
        (first_identity,) = eventually(lambda: list(peers(release)), 60, "the first replica's peering record")
        replicas[first_identity] = first
        eventually(lambda: reconciled_at(release, 10), 60, "the first replica reconciled the default profile")

        second = start_operator(cluster, deployment, logs, "second")

        def two_records() -> dict[str, Any] | None:
            records = peers(release)
            return records if len(records) == 2 else None

        both = eventually(two_records, 60, "both replicas' records")
        (second_identity,) = set(both) - {first_identity}
        replicas[second_identity] = second
        leader = max(both, key=lambda identity: int(both[identity]["priority"]))
        (standby,) = set(both) - {leader}

        replicas[leader].crash()
        name = f"{release.fullname}-default"
        cluster.kubectl(
            "patch", "contextprofile", name, "-n", ns, "--type=merge",
            "-p", json.dumps({"spec": {"autoscaling": {"maxReplicas": 8}}}),
        )  # fmt: skip
        eventually(lambda: reconciled_at(release, 8), TAKEOVER_TIMEOUT_S, "the standby reconciled the change")
        assert replicas[standby].process.poll() is None, replicas[standby].output()[-3000:]
    finally:
        for process in replicas.values() or [first]:
            process.stop()
        if second is not None:
            second.stop()
