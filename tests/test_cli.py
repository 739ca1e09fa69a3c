"""The CLI without a server: what it needs of ibex_context.devtools (which the image leaves out)."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import click
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


# --- --json on every command (issue 38): machine-readable output for scripts ------------------------


def _commands(
    group: click.Group, prefix: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], click.Command]]:
    found: list[tuple[tuple[str, ...], click.Command]] = []
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            found += _commands(command, (*prefix, name))
        else:
            found.append(((*prefix, name), command))
    return found


def test_every_command_takes_json() -> None:
    commands = _commands(main)
    assert len(commands) >= 15  # serve, migrate, dev, stores, import, assemble, memories ..., token new
    missing = [" ".join(path) for path, command in commands if "--json" not in _option_names(command)]
    assert not missing, missing


def _option_names(command: click.Command) -> set[str]:
    return {opt for param in command.params if isinstance(param, click.Option) for opt in param.opts}


def test_token_new_json_gives_the_token_and_the_digest_the_credentials_file_stores() -> None:
    from ibex_context.server.auth import token_digest

    result = CliRunner().invoke(main, ["token", "new", "--json"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    assert set(printed) == {"token", "sha256"}
    assert len(printed["token"]) >= 43 and token_digest(printed["token"]).hex() == printed["sha256"]


@pytest.mark.integration
def test_serve_json_writes_only_json_records_and_announces_its_ports(
    redis_url: str, postgres_dsn: str
) -> None:
    env = dict(
        os.environ,
        IBEX_REDIS_URL=redis_url,
        IBEX_POSTGRES_DSN=postgres_dsn,
        IBEX_GRPC_HOST="127.0.0.1",
        IBEX_GRPC_PORT="0",
        IBEX_METRICS_PORT="0",
        IBEX_EMBEDDER="hashing",
        IBEX_LOG_FORMAT="text",  # --json wins over the environment
        IBEX_LOG_LEVEL="INFO",
        IBEX_AUTH_ENABLED="false",
    )
    with subprocess.Popen(
        [sys.executable, "-m", "ibex_context", "serve", "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            records = _json_lines_until(proc, lambda r: r.get("event") == "serving", seconds=120)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    serving = records[-1]
    assert serving["level"] == "INFO" and serving["grpc_port"] > 0 and serving["metrics_port"] > 0
    assert serving["transport"] == "plaintext" and serving["authentication"] is False


def _json_lines_until(
    proc: subprocess.Popen[str], done: Callable[[dict[str, Any]], bool], *, seconds: float
) -> list[dict[str, Any]]:
    """Every stdout line parsed as JSON (a line that is not fails the test) until ``done``; read on a
    thread so a silent process fails the test instead of stalling it."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout or ()], daemon=True).start()
    records: list[dict[str, Any]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        record = json.loads(line)
        records.append(record)
        if done(record):
            return records
    raise AssertionError(f"no such record within {seconds} s: {records}")
