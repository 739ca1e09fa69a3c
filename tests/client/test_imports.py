"""The clients are the proxy's and the CLI's dependency: importing them loads nothing of
the server's (its edge, pipeline, observability or stores), nor the OpenTelemetry SDK."""

from __future__ import annotations

import subprocess
import sys

SERVER_SIDE = ("server", "pipeline", "observability", "stores", "devtools", "memory_api", "profiles")


def test_importing_the_clients_loads_nothing_of_the_server() -> None:
    script = (
        "import sys, ibex_context_client, ibex_context_client.memory_views\n"
        "prefixes = ('ibex_context', 'opentelemetry.sdk')\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith(prefixes))))"
    )
    loaded = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
    modules = loaded.stdout.split()
    assert "ibex_context_client.context" in modules and "ibex_context_client.memory" in modules
    server_side = [m for m in modules if m.split(".")[1:2] and m.split(".")[1] in SERVER_SIDE]
    assert not server_side, server_side
    assert not [m for m in modules if m.startswith("opentelemetry.sdk")]
