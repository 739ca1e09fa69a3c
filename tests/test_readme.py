"""The README is the newcomer's contract: its commands exist and every setting is listed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_lists_every_setting_as_generated() -> None:
    table = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "settings_table.py")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert table in README, "README settings table is stale: run scripts/settings_table.py"


def test_the_two_commands_exist_and_ci_runs_the_test_command() -> None:
    for script in ("scripts/dev", "scripts/test"):
        assert f"{script}" in README
        assert (ROOT / script).stat().st_mode & 0o111
    assert "scripts/test" in (ROOT / ".ci" / "run").read_text()
