"""Fixtures for the chart tests: the real helm binary and rendered manifests.

helm comes from PATH or from ``.tools/bin`` (``scripts/install-helm.sh`` puts it there; scripts/test
runs it when helm is absent). A missing helm FAILS these tests: the chart would otherwise go unchecked.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "ibex-context"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
RELEASE = "rel"
NAMESPACE = "ibex"
FULLNAME = f"{RELEASE}-ibex-context"
# The Kubernetes version every rendered manifest is validated against (also in Chart.yaml annotations),
# and the oldest version the chart supports (kubeVersion: the CRD's CEL fieldPath needs 1.28).
VALIDATED_KUBERNETES_VERSION = "1.31.0"
MINIMUM_KUBERNETES_VERSION = "1.28.0"

Manifest = dict[str, Any]
# image.repository has no default (a bare name would resolve to docker.io): every render names one, as
# an install must. Values files and --set given later override it.
IMAGE_REPOSITORY_SET = "image.repository=registry.example.com/ibex-context"
# ... and the external stores' Secret (secrets.existingSecret), as an install with external stores must.
INSTALL_VALUES = Path(__file__).parent / "install-values.yaml"


def find_helm() -> str | None:
    on_path = shutil.which("helm")
    if on_path:
        return on_path
    local = REPO / ".tools" / "bin" / "helm"
    return str(local) if local.is_file() else None


@pytest.fixture(scope="session")
def helm() -> str:
    path = find_helm()
    if path is None:
        pytest.fail("helm not found in PATH or .tools/bin: run scripts/install-helm.sh")
    version = subprocess.run(
        [path, "version", "--template", "{{.Version}}"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert version.startswith("v4."), f"the chart targets Helm 4 (server-side apply); found {version}"
    return path


@dataclass(frozen=True)
class Rendered:
    """The manifests of one `helm template` run."""

    values_name: str
    manifests: tuple[Manifest, ...]

    def of_kind(self, kind: str) -> list[Manifest]:
        return [m for m in self.manifests if m["kind"] == kind]

    def one(self, kind: str, name: str) -> Manifest:
        found = [m for m in self.of_kind(kind) if m["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
        return found[0]

    def maybe(self, kind: str, name: str) -> Manifest | None:
        found = [m for m in self.of_kind(kind) if m["metadata"]["name"] == name]
        return found[0] if found else None

    @cached_property
    def pod_specs(self) -> list[tuple[str, Mapping[str, Any], Mapping[str, Any]]]:
        """(workload name, pod metadata, pod spec) of every Deployment, StatefulSet, Job and Pod."""
        out: list[tuple[str, Mapping[str, Any], Mapping[str, Any]]] = []
        for m in self.manifests:
            if m["kind"] in ("Deployment", "StatefulSet", "Job"):
                template = m["spec"]["template"]
                out.append((f"{m['kind']}/{m['metadata']['name']}", template["metadata"], template["spec"]))
            elif m["kind"] == "Pod":
                out.append((f"Pod/{m['metadata']['name']}", m["metadata"], m["spec"]))
        return out


def parse_manifests(text: str) -> tuple[Manifest, ...]:
    return tuple(doc for doc in yaml.safe_load_all(text) if doc)


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, cwd=REPO, timeout=60)


def template_args(
    values_files: Sequence[Path] = (), sets: Sequence[str] = (), *, image: bool = True, stores: bool = True
) -> list[str]:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--include-crds"]
    args += ["--kube-version", VALIDATED_KUBERNETES_VERSION]
    if image:
        args += ["--set", IMAGE_REPOSITORY_SET]
    if stores:
        args += ["--values", str(INSTALL_VALUES)]
    for path in values_files:
        args += ["--values", str(path)]
    for item in sets:
        args += ["--set", item]
    return args


@pytest.fixture(scope="session")
def render(helm: str) -> Callable[..., Rendered]:
    """render(values_files=(), sets=()) -> Rendered; fails the test on a helm error."""
    cache: dict[tuple[tuple[str, ...], tuple[str, ...]], Rendered] = {}

    def _render(values_files: Sequence[Path] = (), sets: Sequence[str] = ()) -> Rendered:
        key = (tuple(str(p) for p in values_files), tuple(sets))
        if key not in cache:
            result = run_helm(helm, *template_args(values_files, sets))
            assert result.returncode == 0, result.stderr
            name = "+".join(p.name for p in values_files) or "default"
            cache[key] = Rendered(name, parse_manifests(result.stdout))
        return cache[key]

    return _render


VALUES_SETS: list[tuple[str, tuple[Path, ...]]] = [("default", ())] + [(p.stem, (p,)) for p in CI_VALUES]


@pytest.fixture(params=VALUES_SETS, ids=[name for name, _ in VALUES_SETS])
def rendered(request: pytest.FixtureRequest, render: Callable[..., Rendered]) -> Iterator[Rendered]:
    """The chart rendered with the default values and with each ci/*-values.yaml."""
    _, files = request.param
    yield render(files)
