"""The chart's gRPC probes and `helm test` health check, asked of the real health service over a real
socket with the real `ibex-context health` CLI (what the helm test Pod runs): the service names the
chart probes must exist, readiness must drop when the server stops accepting, liveness must not.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from ibex_context.server.grpc_server import ServiceServer
from ibex_context.server.health import ServiceHealth

from tests.chart.conftest import FULLNAME, Rendered

CLI = str(Path(sys.executable).parent / "ibex-context")


async def cli_health(port: int, service: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        CLI,
        "health",
        "--target",
        f"127.0.0.1:{port}",
        "--service",
        service,
        "--timeout",
        "5",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, output.decode().strip()


@pytest.fixture()
async def health_server() -> AsyncIterator[tuple[ServiceHealth, int]]:
    health = ServiceHealth([])  # no stores configured: the stores check passes
    server = ServiceServer(health.methods([]), max_request_bytes=1024)
    port = await server.start("127.0.0.1", 0)  # a free port, never a fixed one
    try:
        yield health, port
    finally:
        await server.stop(0)


def probe_services(rendered: Rendered) -> dict[str, str]:
    spec = rendered.one("Deployment", FULLNAME)["spec"]["template"]["spec"]
    server = next(c for c in spec["containers"] if c["name"] == "server")
    return {
        probe: server[probe]["grpc"]["service"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe")
    }


async def test_every_probe_service_is_served_and_readiness_alone_drops_on_shutdown(
    render: Callable[..., Rendered], health_server: tuple[ServiceHealth, int]
) -> None:
    health, port = health_server
    services = probe_services(render())
    for probe, service in services.items():
        code, output = await cli_health(port, service)
        assert (code, output) == (0, "SERVING"), f"{probe} ({service!r}): {output}"

    health.set_not_serving()  # what SIGTERM does before the drain
    code, output = await cli_health(port, services["readinessProbe"])
    assert (code, output.splitlines()[-1]) == (1, "NOT_SERVING")
    for probe in ("livenessProbe", "startupProbe"):
        code, output = await cli_health(port, services[probe])
        assert (code, output) == (0, "SERVING"), f"{probe} must not restart a draining pod"


async def test_helm_test_health_arguments_work_against_a_serving_server(
    render: Callable[..., Rendered], health_server: tuple[ServiceHealth, int]
) -> None:
    _, port = health_server
    pod = render().one("Pod", f"{FULLNAME}-test-grpc")
    args = list(pod["spec"]["initContainers"][0]["args"])
    args[args.index("--target") + 1] = f"127.0.0.1:{port}"
    process = await asyncio.create_subprocess_exec(
        CLI, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, output.decode()
    assert output.decode().strip() == "SERVING"


async def _helm_test_assemble(render: Callable[..., Rendered], target: str) -> tuple[int, str]:
    pod = render().one("Pod", f"{FULLNAME}-test-grpc")
    args = list(pod["spec"]["containers"][0]["args"])
    args[args.index("--target") + 1] = target
    process = await asyncio.create_subprocess_exec(
        CLI, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, output.decode()


async def test_helm_tests_assemble_step_fails_when_the_service_refuses_or_is_unreachable(
    render: Callable[..., Rendered], health_server: tuple[ServiceHealth, int]
) -> None:
    # A server that answers health but refuses AssembleContext (UNIMPLEMENTED here).
    _, port = health_server
    code, output = await _helm_test_assemble(render, f"127.0.0.1:{port}")
    assert code == 1, output
    assert "the assembly was not full: fallback_reason=client_" in output
    code, output = await _helm_test_assemble(render, "127.0.0.1:1")
    assert code == 1, output
    assert "fallback_reason=client_unavailable" in output
