"""The chart as an artefact (issue 38, deliverable 7): `helm package` makes a chart archive that lints,
renders the same manifests as the source directory, carries its schema, CRDs, alerts and dashboard, and
leaves the CI values out. scripts/test writes it to dist/; scripts/image-check writes the image beside it
as an OCI archive."""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

import yaml

from tests.chart.conftest import CHART, INSTALL_VALUES, REPO, parse_manifests, run_helm, template_args

CHART_YAML = yaml.safe_load((CHART / "Chart.yaml").read_text())


def package(helm: str, destination: Path) -> Path:
    result = run_helm(helm, "package", str(CHART), "--destination", str(destination))
    assert result.returncode == 0, result.stderr
    archive = destination / f"ibex-context-{CHART_YAML['version']}.tgz"
    assert archive.is_file(), result.stdout
    return archive


def test_the_packaged_chart_lints_and_renders_what_the_source_renders(helm: str, tmp_path: Path) -> None:
    archive = package(helm, tmp_path)
    lint = run_helm(
        helm,
        "lint",
        "--strict",
        str(archive),
        "--set",
        "image.repository=r.example/i",
        "--values",
        str(INSTALL_VALUES),
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    from_source = template_args()
    from_archive = [str(archive) if arg == str(CHART) else arg for arg in from_source]
    rendered = [run_helm(helm, *args) for args in (from_source, from_archive)]
    assert all(r.returncode == 0 for r in rendered), [r.stderr for r in rendered]

    def stable(text: str) -> list[tuple[str, str]]:
        # Generated keys and certificates differ on every render; the objects must not.
        return sorted((m["kind"], m["metadata"]["name"]) for m in parse_manifests(text))

    assert stable(rendered[0].stdout) == stable(rendered[1].stdout)


def test_the_package_carries_schema_crds_alerts_and_dashboard_and_not_the_ci_values(
    helm: str, tmp_path: Path
) -> None:
    with tarfile.open(package(helm, tmp_path)) as tar:
        names = set(tar.getnames())
    for path in (
        "values.schema.json",
        "crds/contextprofiles.context.ibex.dev.yaml",
        "alerts/ibex-context.rules.yaml",
        "dashboards/ibex-context.json",
        "README.md",
    ):
        assert f"ibex-context/{path}" in names, path
    assert not any(name.startswith("ibex-context/ci/") for name in names)


def test_ci_builds_both_artefacts_into_dist() -> None:
    test = (REPO / "scripts" / "test").read_text()
    assert "helm package charts/ibex-context --destination dist" in test
    assert re.search(r'helm lint --strict "dist/ibex-context-\$\{chart_version\}\.tgz"', test)
    image_check = (REPO / "scripts" / "image-check").read_text()
    # The image as tested (after tests/image), pushed by buildah to an OCI archive in dist/.
    push = image_check.index('bah push --quiet "$SERVICE_IMAGE" "oci-archive:${archive}')
    assert image_check.index('pytest" tests/image') < push
    assert 'archive="$ROOT/dist/ibex-context-${app_version}.oci.tar"' in image_check


def test_the_readme_says_how_to_push_both_to_a_registry() -> None:
    readme = (REPO / "README.md").read_text()
    assert "helm push dist/ibex-context-" in readme and "oci://" in readme
    assert "skopeo copy oci-archive:dist/ibex-context-" in readme
