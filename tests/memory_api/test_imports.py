"""The memory API reaches the stores through ``stores.base``'s ports only: importing it
loads no adapter (PostgreSQL, Redis, the tenant data) and neither driver."""

from __future__ import annotations

import subprocess
import sys

MODULES = ("page_tokens", "purge", "reads", "throttle", "writes")


def test_the_memory_api_names_no_concrete_store() -> None:
    script = (
        "import importlib, sys\n"
        f"for name in {MODULES!r}: importlib.import_module('ibex_context.memory_api.' + name)\n"
        "prefixes = ('ibex_context.stores', 'asyncpg', 'redis')\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith(prefixes))))"
    )
    loaded = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
    assert set(loaded.stdout.split()) <= {"ibex_context.stores", "ibex_context.stores.base"}
