"""`loadtest/run` stops at once, saying what to do, when a tool the run needs is
missing or cannot start: never a minute of seeding and then a results file marked
FAILED full of '-' (what the README's load-test command did after `scripts/dev`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "loadtest" / "run"


def _run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RUN), "--scenario", "smoke", "--results-dir", str(tmp_path / "results"),
         "--out-dir", str(tmp_path / "out"), *args],
        cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip


def test_locust_that_cannot_start_stops_the_run_before_any_store_or_report(tmp_path: Path) -> None:
    assert shutil.which("taskset"), "util-linux's taskset pins locust; the run uses it here"
    # The original failure: taskset could not execute locust. A CPU that does not
    # exist fails the same command the same way.
    done = _run(tmp_path, "--locust-cpus", "4095")
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "loadtest/run cannot start" in done.stderr and "taskset" in done.stderr
    assert "seed" not in done.stdout.lower(), "nothing started before the check"
    assert not list((tmp_path / "results").glob("*")), "no results file"


def test_an_interpreter_without_the_loadtest_extra_is_named_with_the_install_command(
    tmp_path: Path,
) -> None:
    # The venv's base interpreter: Python without locust, grpcio or ibex-context.
    bare = getattr(sys, "_base_executable", "") or shutil.which("python3") or "python3"
    done = _run(tmp_path, IBEX_PYTHON=bare)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "lacks the 'loadtest' extra" in done.stderr and "pip install -e" in done.stderr
    assert not (tmp_path / "results").exists()
