"""scripts/image-check (the CI step that builds and runs the image) and the scripts around it, checked
statically here; the step itself runs in scripts/test, before this suite."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.chart.conftest import REPO

IMAGE_CHECK = REPO / "scripts" / "image-check"
TEST = REPO / "scripts" / "test"
SCRIPTS = [
    IMAGE_CHECK,
    TEST,
    REPO / "scripts" / "bootstrap.sh",
    REPO / "scripts" / "dev",
    REPO / "scripts" / "test-go",
    REPO / "scripts" / "test-cluster",
    REPO / "scripts" / "codegen-go",
    REPO / ".ci" / "run",
]


@pytest.mark.parametrize("script", SCRIPTS, ids=[str(p.relative_to(REPO)) for p in SCRIPTS])
def test_shellcheck_follows_sources_and_finds_nothing(script: Path) -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck not found: apt-get install -y shellcheck (scripts/test installs it)")
    result = subprocess.run(
        [shellcheck, "-x", "--severity=style", str(script.relative_to(REPO))],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_readme_test_command_runs_the_image_check_before_pytest() -> None:
    text = TEST.read_text()
    check = text.index('"$ROOT/scripts/image-check"')
    assert check < text.index("exec pytest")
    assert '"$ROOT/scripts/test-go"' in text  # the Go client, before the image and pytest
    assert "--ignore=tests/image" in text  # run once, inside image-check, against the images it built
    assert "scripts/test" in (REPO / ".ci" / "run").read_text()


def test_the_readme_test_command_runs_the_cluster_tests_once_against_the_api_server() -> None:
    text = TEST.read_text()
    assert text.index('"$ROOT/scripts/test-cluster"') < text.index("exec pytest")
    # Run once, inside scripts/test-cluster: collected without its API server they fail.
    assert "--ignore=tests/cluster" in text


def test_the_image_check_builds_every_target_the_way_the_issue_requires() -> None:
    text = IMAGE_CHECK.read_text()
    assert "debootstrap --variant=minbase" in text
    assert "bah from scratch" in text
    builds = re.findall(r"^build (\w+)(.*)$", text, re.MULTILINE)
    assert {name for name, _ in builds} == {"service", "loadtest", "slim"}
    assert "--isolation chroot" in text
    assert "--secret id=pip.conf" in text and "--secret id=pip-ca" in text
    assert "--runtime runc --cgroup-manager cgroupfs" in text
    assert "trap cleanup EXIT" in text
    # No skip path: a missing tool is installed, a failure fails the step.
    assert "exit 0" not in text and "skip" not in text.lower()


def test_the_image_tests_run_the_container_as_the_chart_does() -> None:
    source = (REPO / "tests" / "image" / "test_image.py").read_text()
    for flag in ('"--read-only"', '"--cap-drop"', '"ALL"', '"10001:10001"', '"no-new-privileges"'):
        assert flag in source, flag
    assert "/tmp:rw,size=256m" in source  # the chart's emptyDir sizeLimit for the server
    assert "nofile=4096:4096" in source and "nproc=4096:4096" in source
