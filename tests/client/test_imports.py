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
        "import sys, ibex_context_client.memory_views\n"
        "from ibex_context_client import ContextClient, MemoryClient\n"
        "print('\\n'.join(sorted(sys.modules)))"
    )
    loaded = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
    modules = loaded.stdout.split()
    assert "ibex_context_client.context" in modules and "ibex_context_client.memory" in modules
    assert not [m for m in modules if m.split(".")[0] == "ibex_context"]
    assert not [m for m in modules if m.startswith(EXTRAS)]


def test_the_generated_messages_alone_load_neither_the_clients_nor_asyncio() -> None:
    """The gevent-based load generator imports the messages only (tests/loadtest checks it too)."""
    script = (
        "import sys\n"
        "from ibex_context_client.proto.ibex.context.v1 import context_pb2\n"
        "import ibex_context_client\n"
        "print('\\n'.join(sorted(sys.modules)))"
    )
    loaded = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
    modules = loaded.stdout.split()
    assert "ibex_context_client.proto.ibex.context.v1.context_pb2" in modules
    assert not [m for m in modules if m.split(".")[0] == "asyncio"]
    assert "ibex_context_client.context" not in modules


def test_every_exported_name_resolves_to_its_modules_object() -> None:
    import ibex_context_client
    from ibex_context_client import context, memory, messages

    for name in ibex_context_client.__all__:
        assert getattr(ibex_context_client, name) is not None
    assert ibex_context_client.ContextClient is context.ContextClient
    assert ibex_context_client.MemoryClientError is memory.MemoryClientError
    assert ibex_context_client.NewMemory is messages.NewMemory
