"""Every environment installs locked versions, and the locks agree with pyproject.toml.

scripts/lock-requirements.sh writes the locks; scripts/bootstrap.sh installs the dev lock
(scripts/dev, scripts/test, CI) and the Dockerfile the image lock. A dependency added to
pyproject.toml without re-locking, a lock edited by hand, or a generator that moved without
a regeneration fails here.
"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
IMAGE_LOCK = ROOT / "requirements.lock"
DEV_LOCK = ROOT / "requirements-dev.lock"
LITELLM_LOCK = ROOT / "requirements-litellm.lock"
GENERATED_STUBS = ROOT / "clients/python/ibex_context_client/proto/ibex/context/v1/context_pb2_grpc.py"
_PIN = re.compile(r"^([A-Za-z0-9_.-]+)==([^ \\;]+)")


def _pins(lock: Path) -> dict[str, str]:
    return {
        canonicalize_name(m.group(1)): m.group(2)
        for line in lock.read_text().splitlines()
        if (m := _PIN.match(line))
    }


def _hashes_per_pin(lock: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    current = ""
    for line in lock.read_text().splitlines():
        if m := _PIN.match(line):
            current = canonicalize_name(m.group(1))
            counts[current] = 0
        elif line.strip().startswith("--hash=sha256:"):
            counts[current] += 1
    return counts


def _projects() -> dict[str, dict[str, Any]]:
    """Our two distributions' [project] tables by name: the server and the client it depends on."""
    tables = [
        tomllib.loads((ROOT / path).read_text())["project"]
        for path in ("pyproject.toml", "clients/python/pyproject.toml")
    ]
    return {canonicalize_name(table["name"]): table for table in tables}


def _requirements(extras: set[str]) -> list[Requirement]:
    """The server's requirements with those extras, our own distributions expanded into theirs
    (they are built from the tree, never pins)."""
    projects = _projects()
    found: list[Requirement] = []
    seen: set[tuple[str, str]] = set()
    pending = [("ibex-context", ""), *(("ibex-context", extra) for extra in extras)]
    while pending:
        name, extra = pending.pop()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        project = projects[name]
        for text in project["optional-dependencies"][extra] if extra else project["dependencies"]:
            req = Requirement(text)
            own = canonicalize_name(req.name)
            if own in projects:
                pending.extend([(own, ""), *((own, e) for e in req.extras)])
            else:
                found.append(req)
    return [r for r in found if r.marker is None or r.marker.evaluate()]


@pytest.mark.parametrize("lock", [IMAGE_LOCK, DEV_LOCK, LITELLM_LOCK], ids=lambda p: p.name)
def test_every_pin_carries_a_hash(lock: Path) -> None:
    missing = [name for name, count in _hashes_per_pin(lock).items() if count == 0]
    assert missing == []


def test_the_dev_lock_pins_every_requirement_of_the_dev_environment_within_its_range() -> None:
    pins = _pins(DEV_LOCK)
    wrong = [
        f"{req} (locked: {pins.get(canonicalize_name(req.name))})"
        for req in _requirements({"dev"})
        if canonicalize_name(req.name) not in pins
        or not req.specifier.contains(pins[canonicalize_name(req.name)], prereleases=True)
    ]
    assert wrong == []


def test_the_image_lock_pins_every_runtime_requirement_within_its_range() -> None:
    pins = _pins(IMAGE_LOCK)
    wrong = [
        str(req)
        for req in _requirements({"operator", "loadtest", "minilm"})
        if canonicalize_name(req.name) not in pins
        or not req.specifier.contains(pins[canonicalize_name(req.name)], prereleases=True)
    ]
    assert wrong == []


def test_a_package_has_one_version_in_the_image_and_in_development() -> None:
    image, dev = _pins(IMAGE_LOCK), _pins(DEV_LOCK)
    shared = image.keys() & dev.keys()
    differ = {name: (image[name], dev[name]) for name in shared if image[name] != dev[name]}
    assert differ == {}


def test_the_litellm_proxy_is_the_vetted_release_with_the_clients_packages_at_the_image_versions() -> None:
    script = (ROOT / "scripts/lock-requirements.sh").read_text()
    vetted = re.search(r'^LITELLM_VERSION="([^"]+)"', script, re.MULTILINE)
    assert vetted is not None
    litellm, image = _pins(LITELLM_LOCK), _pins(IMAGE_LOCK)
    assert litellm["litellm"] == vetted.group(1)
    # Reported compromised on PyPI.
    assert litellm["litellm"] not in ("1.82.7", "1.82.8")
    # The client distribution's requirements with the extras the hook uses (tracing, metrics).
    client = ("grpcio", "protobuf", "opentelemetry-api", "prometheus-client")
    assert {name: litellm[name] for name in client} == {name: image[name] for name in client}


def test_the_locked_grpcio_tools_is_the_generator_of_the_committed_stubs() -> None:
    generated = re.search(r"GRPC_GENERATED_VERSION = '([^']+)'", GENERATED_STUBS.read_text())
    assert generated is not None
    assert _pins(DEV_LOCK)["grpcio-tools"] == generated.group(1)


def test_this_environment_is_the_dev_lock() -> None:
    """The tests run on exactly the locked versions (scripts/bootstrap.sh installed them)."""
    differ = {}
    for name, version in _pins(DEV_LOCK).items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = "absent"
        if installed == "absent" or Version(installed) != Version(version):
            differ[name] = (version, installed)
    assert differ == {}
