"""Two releases in one namespace, each with its operator: neither touches the other's objects;
`helm upgrade` changes only its own; `helm uninstall` leaves nothing of the release behind."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.conftest import CHART_MAKES_ITS_SECRETS, Stores, new_database, prepare_release
from tests.cluster.kube import Cluster, condition, eventually
from tests.cluster.operator_process import OperatorProcess, start_operator
from tests.cluster.release import Release

pytestmark = pytest.mark.integration

RECONCILE_TIMEOUT_S = 45.0
# What `helm uninstall` leaves on purpose: the CRDs (crds/: Helm never deletes them) are
# cluster-scoped and not listed here; the migration Job is a hook, which Helm does not track as
# part of the release: it stays for its logs until the next install replaces it (before-hook-creation).
KEPT_AFTER_UNINSTALL = {("Job", "migrate")}


@pytest.fixture(scope="module")
async def second_stores(redis_url: str, postgres_dsn: str) -> Stores:
    return Stores(redis_url, await new_database(postgres_dsn))


@pytest.fixture(scope="module")
def releases(
    cluster: Cluster, namespace: str, release_stores: Stores, second_stores: Stores,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, tuple[Release, OperatorProcess]]]:  # fmt: skip
    logs = tmp_path_factory.mktemp("releases")
    running: dict[str, tuple[Release, OperatorProcess]] = {}
    try:
        for name, stores, max_replicas in (("one", release_stores, 3), ("two", second_stores, 4)):
            release = Release(cluster, name, namespace)
            release = prepare_release(release, stores)
            release.install({"autoscaling.maxReplicas": max_replicas})
            deployment = cluster.get("deployment", f"{release.fullname}-operator", namespace)
            assert deployment is not None
            running[name] = (release, start_operator(cluster, deployment, logs, name))
        yield running
    finally:
        for release, operator in running.values():
            operator.stop()
            if release.cluster.helm("list", "-n", namespace, "-q", "--filter", f"^{release.name}$").strip():
                release.uninstall()


def hpa_max(release: Release) -> int | None:
    hpa = release.cluster.get("hpa", release.fullname, release.namespace)
    return None if hpa is None else int(hpa["spec"]["maxReplicas"])


def settled(release: Release, max_replicas: int) -> bool:
    profile = release.cluster.get("contextprofile", f"{release.fullname}-default", release.namespace)
    if (
        profile is None
        or (profile.get("status") or {}).get("observedGeneration") != profile["metadata"]["generation"]
    ):
        return False
    return hpa_max(release) == max_replicas and (condition(profile, "Ready") or {}).get("status") == "True"


def release_objects(cluster: Cluster, namespace: str, release: str) -> list[tuple[str, str]]:
    """(kind, name) of every namespaced object labelled with the release (Helm's instance label,
    or the operator's release label on its children), of every kind the server lists."""
    kinds = cluster.kubectl("api-resources", "--namespaced=true", "--verbs=list", "-o", "name").split()
    found: list[tuple[str, str]] = []
    for selector in (f"app.kubernetes.io/instance={release}", f"context.ibex.dev/release={release}"):
        listing = json.loads(
            cluster.kubectl("get", ",".join(kinds), "-n", namespace, "-l", selector, "-o", "json")
        )
        found += [(item["kind"], item["metadata"]["name"]) for item in listing["items"]]
    return sorted(set(found))


def test_each_operator_renders_only_its_own_release(
    releases: dict[str, tuple[Release, OperatorProcess]],
) -> None:
    one, two = releases["one"][0], releases["two"][0]
    eventually(lambda: settled(one, 3) and settled(two, 4), RECONCILE_TIMEOUT_S, "both releases reconciled")
    for release, other in ((one, two), (two, one)):
        cm = release.cluster.get("configmap", f"{release.fullname}-profiles", release.namespace)
        assert cm is not None
        names = [p["name"] for p in json.loads(cm["data"]["profiles.json"])["profiles"]]
        assert names == [f"{release.fullname}-default"], names
        assert cm["metadata"]["labels"]["context.ibex.dev/release"] == release.name
        assert f"{other.fullname}-default" not in names


def test_helm_upgrade_changes_only_its_own_release(
    releases: dict[str, tuple[Release, OperatorProcess]],
) -> None:
    one, two = releases["one"][0], releases["two"][0]
    eventually(lambda: settled(one, 3) and settled(two, 4), RECONCILE_TIMEOUT_S, "both releases reconciled")
    generated = {
        name: two.cluster.get("secret", f"{two.fullname}-{name}", two.namespace)
        for name in ("tls", "credentials")
    }
    hook = two.install({"autoscaling.maxReplicas": 6}, upgrade=True)
    assert [r.returncode for r in hook.runs] == [0], "pre-upgrade: the migrations ran again"
    revision = json.loads(two.cluster.helm("status", two.name, "-n", two.namespace, "-o", "json"))["version"]
    assert revision == 2
    eventually(lambda: settled(two, 6), RECONCILE_TIMEOUT_S, "the upgraded release reconciled")
    assert hpa_max(one) == 3
    if CHART_MAKES_ITS_SECRETS:
        # The certificate and the bootstrap credential the chart generated survive the upgrade.
        for name, before in generated.items():
            after = two.cluster.get("secret", f"{two.fullname}-{name}", two.namespace)
            assert before is not None and after is not None, name
            assert after["data"] == before["data"], f"{name} regenerated by helm upgrade"


def test_helm_uninstall_leaves_nothing_of_the_release_and_spares_the_other(
    releases: dict[str, tuple[Release, OperatorProcess]], tmp_path: Path
) -> None:
    (one, one_operator), (two, _) = releases["one"], releases["two"]
    eventually(
        lambda: settled(one, 3) and (settled(two, 6) or settled(two, 4)), RECONCILE_TIMEOUT_S, "reconciled"
    )
    before_two = release_objects(two.cluster, two.namespace, "two")
    # Uninstall removes the operator's Deployment: its process goes too. The ConfigMap and HPA it
    # rendered are then removed by the garbage collector (their owner, the profile, is gone).
    one_operator.stop()
    one.uninstall()

    def leftovers() -> list[tuple[str, str]]:
        return [
            (kind, name) for kind, name in release_objects(one.cluster, one.namespace, "one")
            if (kind, name.removeprefix(f"{one.fullname}-")) not in KEPT_AFTER_UNINSTALL
        ]  # fmt: skip

    eventually(lambda: not leftovers() or None, 60, f"nothing of release one left (left: {leftovers()})")
    # What is kept is kept as documented, no more, no less.
    kept = {
        (kind, name.removeprefix(f"{one.fullname}-"))
        for kind, name in release_objects(one.cluster, one.namespace, "one")
    }
    assert kept == KEPT_AFTER_UNINSTALL
    assert release_objects(two.cluster, two.namespace, "two") == before_two
    assert settled(two, 6) or settled(two, 4)
