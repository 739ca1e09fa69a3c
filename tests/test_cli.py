"""The CLI without a server: what it needs of ibex_context.devtools (which the image leaves out)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner
from ibex_context.cli import main


def test_the_service_and_its_cli_import_nothing_of_the_dev_tools() -> None:
    # The image deletes ibex_context.devtools: serving, migrating and every client command
    # must work without it.
    probe = (
        "import sys, ibex_context.cli, ibex_context.cli_render, ibex_context.server.app; "
        "print(sorted(m for m in sys.modules if m.startswith('ibex_context.devtools')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.parametrize("command", ["dev", "stores"])
def test_without_the_dev_tools_dev_and_stores_say_how_to_get_them(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ibex_context.devtools.dev", None)
    result = CliRunner().invoke(main, [command])
    assert result.exit_code == 1
    assert "the dev tools are not installed here" in result.output
    assert "pip install 'ibex-context[embedded]'" in result.output
