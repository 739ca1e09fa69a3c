"""The operator's dependency on the service is its ``profiles`` package only (ADR-0004)."""

from __future__ import annotations

import subprocess
import sys


def test_the_operator_imports_the_services_profile_schema_and_loader_but_no_server_or_store() -> None:
    script = (
        "import sys, ibex_operator.__main__, ibex_operator.handlers\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('ibex_context'))))"
    )
    loaded = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
    modules = set(loaded.stdout.split())
    assert "ibex_context.profiles.schema" in modules and "ibex_context.profiles.loader" in modules
    # The messages' value types (ChatMessage, roles, categories) come from the client distribution,
    # their one home; nothing of the client's transport loads.
    allowed = {
        "ibex_context",
        "ibex_context.errors",
        "ibex_context.models",
        "ibex_context.profiles",
        "ibex_context_client",
        "ibex_context_client.messages",
    }
    assert {m for m in modules if not m.startswith("ibex_context.profiles.")} <= allowed
