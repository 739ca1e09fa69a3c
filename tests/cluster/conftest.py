"""Fixtures for the tests against the real API server that scripts/test-cluster starts.

These tests need that server: run them with ``scripts/test-cluster`` (which exports
IBEX_TEST_CLUSTER_KUBECONFIG). Collected without it they FAIL, never skip: a cluster suite that
quietly skips would prove nothing. The default pytest run leaves this directory out (scripts/test
runs scripts/test-cluster before it).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
import yaml
from ibex_context.devtools.certs import Authority
from ibex_context.server.auth import token_digest

from tests.chart.conftest import find_helm
from tests.cluster.kube import KUBECONFIG_VARIABLE, KUBECTL_VARIABLE, REPO, Cluster
from tests.cluster.release import Release, create_namespace

# The chart does not yet create every Secret its pods mount (issue 38, deliverable 3): the tests
# create them first, as docs/security.md tells an installer to. When the chart makes its own, set
# this to True: every install here becomes a pure default install (only image.repository set).
CHART_MAKES_ITS_SECRETS = False


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    kubeconfig = os.environ.get(KUBECONFIG_VARIABLE)
    if not kubeconfig:
        pytest.fail(
            f"tests/cluster needs the API server of scripts/test-cluster ({KUBECONFIG_VARIABLE} unset)"
        )
    kubectl = os.environ.get(KUBECTL_VARIABLE) or str(REPO / ".tools" / "bin" / "kubectl")
    helm = find_helm()
    if helm is None:
        pytest.fail("helm not found in PATH or .tools/bin: run scripts/install-helm.sh")
    return Cluster(Path(kubeconfig), kubectl, helm)


@pytest.fixture(autouse=True, scope="session")
def _needs_the_cluster(cluster: Cluster) -> None:
    """Every test here fails at once without scripts/test-cluster's server."""


@dataclass(frozen=True)
class Stores:
    redis_url: str
    postgres_dsn: str


@pytest.fixture(scope="module")
def namespace(cluster: Cluster) -> Iterator[str]:
    """A namespace of this test module alone, deleted afterwards (the namespace controller runs)."""
    name = f"ibex-{uuid.uuid4().hex[:8]}"
    create_namespace(cluster, name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false")


async def new_database(postgres_dsn: str) -> str:
    """An empty database in the session's PostgreSQL: the release's migration hook migrates it."""
    admin = await asyncpg.connect(postgres_dsn)
    database = f"release_{uuid.uuid4().hex}"
    try:
        await admin.execute(f'CREATE DATABASE "{database}"')
    finally:
        await admin.close()
    return postgres_dsn.replace("/postgres?", f"/{database}?")


@pytest.fixture(scope="module")
async def release_stores(redis_url: str, postgres_dsn: str) -> AsyncIterator[Stores]:
    yield Stores(redis_url, await new_database(postgres_dsn))


def create_prerequisite_secrets(release: Release, stores: Stores) -> str:
    """The Secrets the chart's pods mount that the chart does not create (docs/security.md): the
    stores' URLs, the TLS certificate and the credentials file with one assemble principal.
    Returns that principal's token."""
    cluster, ns, full = release.cluster, release.namespace, release.fullname
    cluster.kubectl(
        "create", "secret", "generic", f"{full}-stores", "-n", ns,
        f"--from-literal=redis-url={stores.redis_url}", f"--from-literal=postgres-dsn={stores.postgres_dsn}",
    )  # fmt: skip
    authority = Authority.create("test-cluster CA")
    server = authority.server()
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": f"{full}-tls", "namespace": ns},
            "stringData": {
                "tls.crt": server.cert_pem.decode(),
                "tls.key": server.key_pem.decode(),
                "ca.crt": authority.cert_pem.decode(),
            },
        }
    )
    token = f"helm-test-{uuid.uuid4().hex}"
    credentials = {
        "principals": [
            {"name": "helm-test", "roles": ["assemble"], "token_sha256": [token_digest(token).hex()]}
        ]
    }
    cluster.kubectl(
        "create", "secret", "generic", f"{full}-credentials", "-n", ns,
        f"--from-literal=credentials.yaml={yaml.safe_dump(credentials)}",
    )  # fmt: skip
    cluster.kubectl(
        "create", "secret", "generic", f"{full}-test-token", "-n", ns, f"--from-literal=token={token}"
    )
    return token


def prepare_release(release: Release, stores: Stores) -> None:
    """What an installer does before ``helm install`` (nothing, once the chart makes its Secrets)."""
    if not CHART_MAKES_ITS_SECRETS:
        create_prerequisite_secrets(release, stores)
