"""Fixtures for the tests against the real API server that scripts/test-cluster starts.

These tests need that server: run them with ``scripts/test-cluster`` (which exports
IBEX_TEST_CLUSTER_KUBECONFIG). Collected without it they FAIL, never skip: a cluster suite that
quietly skips would prove nothing. The default pytest run leaves this directory out (scripts/test
runs scripts/test-cluster before it).
"""

from __future__ import annotations

import dataclasses
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

# The chart makes its TLS certificate (and CA) and its credentials (a bootstrap token) itself, so every
# install here is a default install: image.repository, and the external stores' Secret named by
# secrets.existingSecret (the chart refuses to install without it). False: the tests create the TLS
# and credentials Secrets first, as docs/security.md tells an installer who brings their own.
CHART_MAKES_ITS_SECRETS = True


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


def create_own_tls_and_credentials(release: Release) -> str:
    """An installer's own TLS certificate and credentials file (one assemble principal), under the
    names the chart uses by default. Returns that principal's token."""
    cluster, ns, full = release.cluster, release.namespace, release.fullname
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


def prepare_release(release: Release, stores: Stores) -> Release:
    """What an installer does before ``helm install``: the Secret with the external stores' URLs.
    Returns the release with the value that names it."""
    cluster, ns = release.cluster, release.namespace
    name = f"{release.fullname}-stores"
    cluster.kubectl(
        "create", "secret", "generic", name, "-n", ns,
        f"--from-literal=redis-url={stores.redis_url}", f"--from-literal=postgres-dsn={stores.postgres_dsn}",
    )  # fmt: skip
    if not CHART_MAKES_ITS_SECRETS:
        create_own_tls_and_credentials(release)
    return dataclasses.replace(release, values={**release.values, "secrets.existingSecret": name})
