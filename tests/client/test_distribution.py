"""The client is a distribution of its own (clients/python, ibex-context-client): built as a wheel
and an sdist by scripts/build-client, it requires grpcio and protobuf and nothing of the server,
carries its version, and once installed alone in a fresh virtualenv makes the README's call."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import tarfile
import textwrap
import tomllib
import zipfile
from email.message import Message
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import ibex_context
import ibex_context_client
import pytest
from ibex_context.devtools.scripted_service import RunningServer
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "clients" / "python"
SERVER_PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CLIENT_PROJECT = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
VERSION = SERVER_PROJECT["version"]
# What the client needs without an extra: nothing of the server's.
BASE_REQUIREMENTS = {"grpcio", "protobuf"}

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(wheel, sdist), as scripts/build-client builds them for CI."""
    dest = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [str(ROOT / "scripts" / "build-client"), str(dest)],
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=300,
    )
    (wheel,) = dest.glob("ibex_context_client-*.whl")
    (sdist,) = dest.glob("ibex_context_client-*.tar.gz")
    return wheel, sdist


def _metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(archive.read(name).decode())


def test_the_client_is_released_with_the_server_at_its_version() -> None:
    pins = [Requirement(r) for r in SERVER_PROJECT["dependencies"]]
    (client_pin,) = [r for r in pins if r.name == "ibex-context-client"]
    assert str(client_pin.specifier) == f"=={VERSION}"
    assert CLIENT_PROJECT["version"] == VERSION
    assert ibex_context_client.__version__ == ibex_context.__version__ == VERSION


def test_the_wheel_requires_grpcio_and_protobuf_and_the_rest_only_behind_extras(
    dists: tuple[Path, Path],
) -> None:
    metadata = _metadata(dists[0])
    assert metadata["Name"] == "ibex-context-client" and metadata["Version"] == VERSION
    requirements = [Requirement(r) for r in metadata.get_all("Requires-Dist") or []]
    unconditional = {r.name for r in requirements if r.marker is None}
    assert unconditional == BASE_REQUIREMENTS
    extras = {r.name for r in requirements if r.marker is not None and "extra ==" in str(r.marker)}
    assert extras == {"opentelemetry-api", "prometheus-client", "mcp"}
    assert not [r for r in requirements if r.name.startswith("ibex-context")]
    assert set(metadata.get_all("Provides-Extra") or []) == {"otel", "prometheus", "litellm", "mcp"}


def test_the_wheel_holds_the_generated_code_typed_and_nothing_of_the_server(
    dists: tuple[Path, Path],
) -> None:
    with zipfile.ZipFile(dists[0]) as archive:
        names = archive.namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"ibex_context_client", f"ibex_context_client-{VERSION}.dist-info"}
    assert "ibex_context_client/py.typed" in names
    for module in ("context_pb2.py", "context_pb2.pyi", "context_pb2_grpc.py"):
        assert f"ibex_context_client/proto/ibex/context/v1/{module}" in names
    assert "ibex_context_client/litellm/hook.py" in names and "ibex_context_client/mcp/server.py" in names


def test_the_sdist_builds_the_same_package_with_its_readme(dists: tuple[Path, Path]) -> None:
    with tarfile.open(dists[1]) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    assert {"pyproject.toml", "README.md", "PKG-INFO", "ibex_context_client/py.typed"} <= names
    assert "ibex_context_client/proto/ibex/context/v1/context_pb2.pyi" in names


def test_the_long_description_is_the_readme_as_markdown(dists: tuple[Path, Path]) -> None:
    """What `twine check` checks: the description renders (markdown, declared as such)."""
    metadata = _metadata(dists[0])
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert metadata.get_payload().strip() == (CLIENT / "README.md").read_text().strip()


def _readme_call() -> str:
    """The README's five-line call, as written there."""
    blocks = re.findall(r"```python\n(.*?)```", (CLIENT / "README.md").read_text(), re.DOTALL)
    (call,) = [b for b in blocks if "ContextClient(" in b]
    assert len([line for line in call.splitlines() if line.strip()]) == 5
    return call


def _closure(names: set[str]) -> set[str]:
    """``names`` and what they require (no extras), as installed here: the dev lock's versions."""
    found: set[str] = set()
    pending = list(names)
    while pending:
        name = canonicalize_name(pending.pop())
        if name in found:
            continue
        found.add(name)
        for text in metadata.requires(name) or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                pending.append(req.name)
    return found


def _locked_wheel_requirements() -> str:
    """grpcio and protobuf, and what they require, as the image lock pins them, with their hashes."""
    wanted = _closure(BASE_REQUIREMENTS)
    text = (ROOT / "requirements.lock").read_text().replace("\\\n", " ")
    lines = [line for line in text.splitlines() if canonicalize_name(line.split("==")[0]) in wanted]
    assert len(lines) == len(wanted)
    return "\n".join(lines) + "\n"


async def _run(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    process = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    text = out.decode(errors="replace")
    assert process.returncode == 0, f"{args}: {text[-4000:]}"
    return text


async def test_installed_alone_it_makes_the_readme_call(
    dists: tuple[Path, Path], server: RunningServer, tmp_path: Path
) -> None:
    """A fresh virtualenv (not the tests' one: it would see the server), the wheel and the locked
    grpcio and protobuf wheels (hash-checked) from a wheelhouse, no index: the README's call
    reaches the service, and the server is not importable there."""
    venv, wheelhouse = tmp_path / "venv", tmp_path / "wheelhouse"
    python = str(venv / "bin" / "python")
    await _run(sys.executable, "-m", "venv", str(venv))
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(_locked_wheel_requirements())
    await _run(
        python, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
        "--only-binary", ":all:", "--require-hashes", "-r", str(requirements), "--dest", str(wheelhouse),
    )  # fmt: skip
    await _run(
        python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index",
        "--find-links", str(wheelhouse), str(dists[0]),
    )  # fmt: skip
    script = "\n".join(
        [
            "import asyncio, importlib.util",
            "async def main():",
            textwrap.indent(_readme_call().replace("127.0.0.1:50051", server.target), "    "),
            "    print(result.from_service, repr(result.fallback_reason), len(result.messages))",
            "asyncio.run(main())",
            "print('server importable:', importlib.util.find_spec('ibex_context') is not None)",
        ]
    )
    clean_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GRPC_ENABLE_FORK_SUPPORT": "false"}
    out = await _run(python, "-I", "-c", script, env=clean_env, timeout=120)
    *_, printed, ours, importable = out.splitlines()
    assert printed.startswith("(ChatMessage(role='system'") and "Which seat should I book?" in printed
    assert (ours, importable) == ("True '' 2", "server importable: False")
