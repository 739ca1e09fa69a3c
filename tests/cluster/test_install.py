"""`helm install` of the chart on a real API server: the migration hook, the objects the server
accepted, and everything a pod would mount or read being there (up to the kubelet: no pod runs)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from typing import Any

import asyncpg
import pytest

from tests.cluster.conftest import Stores, prepare_release
from tests.cluster.kube import Cluster, Obj, condition
from tests.cluster.release import InstallFailed, MigrationHook, Release

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def installed(
    cluster: Cluster, namespace: str, release_stores: Stores
) -> Iterator[tuple[Release, MigrationHook]]:
    release = Release(cluster, "alpha", namespace)
    release = prepare_release(release, release_stores)
    hook = release.install()
    yield release, hook
    release.uninstall()


def test_the_migration_hook_runs_the_jobs_command_against_the_release_database(
    installed: tuple[Release, MigrationHook], release_stores: Stores
) -> None:
    release, hook = installed
    (run,) = hook.runs
    assert run.command[-1] == "migrate", run.command
    assert run.returncode == 0, run.output
    job = release.cluster.get("job", f"{release.fullname}-migrate", release.namespace)
    assert (condition(job, "Complete") or {}).get("status") == "True"

    async def tables() -> set[str]:
        connection = await asyncpg.connect(release_stores.postgres_dsn)
        try:
            rows = await connection.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        finally:
            await connection.close()
        return {r["tablename"] for r in rows}

    # The database was empty before `helm install`: the hook's run made the schema.
    assert "memories" in asyncio.run(tables())


def test_a_failing_migration_stops_the_install_before_any_workload_exists(
    cluster: Cluster, namespace: str, release_stores: Stores
) -> None:
    unreachable = Stores(release_stores.redis_url, "postgresql://ibex@127.0.0.1:1/ibex?connect_timeout=5")
    broken = prepare_release(Release(cluster, "broken", namespace), unreachable)
    try:
        with pytest.raises(InstallFailed) as failed:
            broken.install()
        (run,) = failed.value.hook.runs
        assert run.returncode != 0
        assert "cannot migrate the database at IBEX_POSTGRES_DSN" in run.output
        assert f"{broken.fullname}-migrate" in failed.value.stderr
        job = cluster.get("job", f"{broken.fullname}-migrate", namespace)
        assert (condition(job, "Failed") or {}).get("status") == "True"
        # pre-install: nothing of the release but its hook reached the server.
        assert cluster.get("deployment", broken.fullname, namespace) is None
        assert cluster.get("deployment", f"{broken.fullname}-operator", namespace) is None
    finally:
        cluster.helm("uninstall", broken.name, "--namespace", namespace, "--ignore-not-found", timeout=90)


def test_every_object_of_the_release_is_stored_by_the_server(
    installed: tuple[Release, MigrationHook],
) -> None:
    release, _ = installed
    manifest = release.manifest()
    assert {m["kind"] for m in manifest} >= {"Deployment", "Service", "Role", "RoleBinding", "ContextProfile"}
    for obj in manifest:
        live = release.cluster.get(f"{obj['kind']}.{_group(obj)}", obj["metadata"]["name"], release.namespace)
        assert live is not None, f"{obj['kind']}/{obj['metadata']['name']} is not on the server"


def test_the_helm_test_pod_passes_the_servers_admission(installed: tuple[Release, MigrationHook]) -> None:
    """`helm test` is never run (its pod would wait for a kubelet); its pod is created in a
    server-side dry run: validation, defaulting and admission (its ServiceAccount must exist)."""
    release, _ = installed
    tests = [
        h for h in release.hooks() if "test" in h["metadata"].get("annotations", {}).get("helm.sh/hook", "")
    ]
    assert tests, "the chart has a helm test pod"
    for pod in tests:
        release.cluster.apply(pod, "--dry-run=server", "-n", release.namespace)


def test_every_secret_and_configmap_a_pod_reads_exists_with_its_keys(
    installed: tuple[Release, MigrationHook],
) -> None:
    """What the kubelet would refuse with ContainerCreating or CreateContainerConfigError."""
    release, _ = installed
    cluster, ns = release.cluster, release.namespace
    # The profiles ConfigMap is the operator's to render (test_operator.py); no operator runs here.
    rendered_by_operator = {f"{release.fullname}-profiles"}
    missing: list[str] = []
    for workload, pod in _pod_specs([*release.manifest(), *release.hooks()]):
        for kind, name, keys, optional in _references(pod):
            if optional or name in rendered_by_operator:
                continue
            obj = cluster.get(kind, name, ns)
            if obj is None:
                missing.append(f"{workload}: {kind} {name}")
                continue
            data = {**(obj.get("data") or {}), **(obj.get("binaryData") or {})}
            missing += [f"{workload}: {kind} {name} key {k}" for k in keys if k not in data]
    assert not missing, missing


def test_the_contextprofile_crd_is_established(
    cluster: Cluster, installed: tuple[Release, MigrationHook]
) -> None:
    crd = cluster.get("crd", "contextprofiles.context.ibex.dev", "default")
    assert (condition(crd, "Established") or {}).get("status") == "True"
    assert (condition(crd, "NamesAccepted") or {}).get("status") == "True"


def _group(obj: Mapping[str, Any]) -> str:
    api_version: str = obj["apiVersion"]
    return api_version.split("/")[0] if "/" in api_version else ""


def _pod_specs(objects: list[Obj]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for obj in objects:
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] in ("Deployment", "StatefulSet", "Job"):
            yield name, obj["spec"]["template"]["spec"]
        elif obj["kind"] == "Pod":
            yield name, obj["spec"]


def _references(pod: Mapping[str, Any]) -> Iterator[tuple[str, str, list[str], bool]]:
    """(kind, name, keys, optional) of every Secret and ConfigMap the pod mounts or reads."""
    for volume in pod.get("volumes") or ():
        for kind, source, name_field in (
            ("secret", volume.get("secret"), "secretName"),
            ("configmap", volume.get("configMap"), "name"),
        ):
            if source:
                keys = [item["key"] for item in source.get("items") or ()]
                yield kind, source[name_field], keys, bool(source.get("optional"))
        for projected in (volume.get("projected") or {}).get("sources") or ():
            for kind, source in (
                ("secret", projected.get("secret")),
                ("configmap", projected.get("configMap")),
            ):
                if source:
                    keys = [item["key"] for item in source.get("items") or ()]
                    yield kind, source["name"], keys, bool(source.get("optional"))
    for container in [*(pod.get("initContainers") or ()), *(pod.get("containers") or ())]:
        for entry in container.get("env") or ():
            source = entry.get("valueFrom") or {}
            for kind, ref in (
                ("secret", source.get("secretKeyRef")),
                ("configmap", source.get("configMapKeyRef")),
            ):
                if ref:
                    yield kind, ref["name"], [ref["key"]], bool(ref.get("optional"))
        for entry in container.get("envFrom") or ():
            for kind, ref in (("secret", entry.get("secretRef")), ("configmap", entry.get("configMapRef"))):
                if ref:
                    yield kind, ref["name"], [], bool(ref.get("optional"))
