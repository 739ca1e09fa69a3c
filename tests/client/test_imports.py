"""The clients are a distribution of their own (clients/python): importing them loads nothing of
the server's (``ibex_context``), nor what their extras bring (the OpenTelemetry SDK, the Prometheus
client, gRPC's health package) until a caller asks for it."""

from __future__ import annotations

import subprocess
import sys

# grpc_health.v1, not grpc_health: grpc's own __init__ looks for the bare package.
EXTRAS = ("opentelemetry.sdk", "prometheus_client", "grpc_health.v1", "numpy")


def test_importing_the_clients_loads_nothing_of_the_server_nor_of_the_extras() -> None:
    script = (
        "import sys, ibex_context_client, ibex_context_client.memory_views\n"
        "print('\\n'.join(sorted(sys.modules)))"
    )
    loaded = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
    modules = loaded.stdout.split()
    assert "ibex_context_client.context" in modules and "ibex_context_client.memory" in modules
    assert not [m for m in modules if m.split(".")[0] == "ibex_context"]
    assert not [m for m in modules if m.startswith(EXTRAS)]
