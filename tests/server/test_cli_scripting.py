"""The CLI as scripts and platform tooling use it, run for real against a real server: IBEX_TARGET,
--json on every command that prints data, one-line errors (never a traceback unless --debug),
`import` streaming from stdin, and `assemble --require-full` (what `helm test` runs) failing on a
degraded answer, an unreachable service or one that refuses."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import asyncpg
from ibex_context.devtools.embedded import RedisProcess
from ibex_context.server.app import ContextService

from tests.conftest import Tenant
from tests.server.conftest import StartService

UNREACHABLE = "127.0.0.1:1"


async def cli(
    *args: str, env: dict[str, str] | None = None, stdin: bytes | None = None
) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ibex_context",
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    out, err = await asyncio.wait_for(process.communicate(stdin), 120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def ids(tenant: Tenant) -> list[str]:
    return ["--org", tenant.org_id, "--agent", tenant.agent_id]


# --- IBEX_TARGET and --json -----------------------------------------------------------------------


async def test_ibex_target_stands_in_for_target_and_the_flag_still_wins(
    shared_service: ContextService,
) -> None:
    env = {"IBEX_TARGET": f"127.0.0.1:{shared_service.port}"}
    code, out, err = await cli("health", "--json", env=env)
    assert code == 0, err
    assert json.loads(out) == {"service": "", "status": "SERVING"}
    code, _, err = await cli("health", "--target", UNREACHABLE, "--timeout", "1", env=env)
    assert code == 1 and UNREACHABLE in err


async def test_every_command_that_prints_data_prints_json_with_json(
    shared_service: ContextService, tenant: Tenant
) -> None:
    target = ["--target", f"127.0.0.1:{shared_service.port}"]
    code, out, err = await cli("directive", "set", *target, *ids(tenant), "--json", "Be brief.")
    assert code == 0, err
    set_reply = json.loads(out)
    assert list(set_reply) == ["version"] and set_reply["version"] > 0
    code, out, err = await cli("directive", "get", *target, *ids(tenant), "--json")
    assert code == 0, err
    assert json.loads(out)["content"] == "Be brief."
    line = json.dumps({"content": "The deploy window is Tuesday", "category": "factual"})
    code, out, err = await cli("import", "-", *target, *ids(tenant), "--json", stdin=line.encode())
    assert code == 0, err
    assert json.loads(out) == {"imported": 1}
    code, out, err = await cli("memories", "list", *target, *ids(tenant), "--json")
    assert code == 0, err
    assert [json.loads(row)["content"] for row in out.splitlines()] == ["The deploy window is Tuesday"]
    code, out, err = await cli("directive", "clear", *target, *ids(tenant), "--json")
    assert code == 0, err
    assert json.loads(out) == {"cleared": True}
    code, out, err = await cli("assemble", *target, *ids(tenant), "--json", "--timeout", "5", "deploy?")
    assert code == 0, err
    assert json.loads(out)["messages"][-1] == {"role": "user", "content": "deploy?"}


# --- import streams -------------------------------------------------------------------------------


async def _stored(dsn: str, tenant: Tenant) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        count: int = await conn.fetchval(
            "SELECT count(*) FROM memories WHERE org_id = $1::uuid AND agent_id = $2::uuid",
            tenant.org_id,
            tenant.agent_id,
        )
        return count
    finally:
        await conn.close()


async def test_import_streams_stdin_writing_each_batch_before_the_input_ends(
    shared_service: ContextService, tenant: Tenant, postgres_dsn: str
) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ibex_context", "import", "--target", f"127.0.0.1:{shared_service.port}",
        *ids(tenant), "--batch", "2",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdin is not None
    rows = [json.dumps({"content": f"fact number {i}", "category": "factual"}) + "\n" for i in range(5)]
    process.stdin.write("".join(rows[:2]).encode())
    await process.stdin.drain()
    # Two lines written, stdin still open: a streaming import has written the first batch already.
    deadline = asyncio.get_running_loop().time() + 60
    while await _stored(postgres_dsn, tenant) < 2:
        assert asyncio.get_running_loop().time() < deadline, "nothing written before the input ended"
        await asyncio.sleep(0.1)
    process.stdin.write("".join(rows[2:]).encode())
    process.stdin.close()
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    assert out.decode().strip() == "imported 5 memories"
    assert await _stored(postgres_dsn, tenant) == 5


async def test_a_bad_line_stops_the_import_there_and_says_how_many_came_before(
    shared_service: ContextService, tenant: Tenant
) -> None:
    good = json.dumps({"content": "fine", "category": "factual"})
    code, out, err = await cli(
        "import", "--target", f"127.0.0.1:{shared_service.port}", *ids(tenant), "--batch", "1",
        stdin=f"{good}\n{good}\nnot json\n".encode(),
    )  # fmt: skip
    assert code == 1 and out == ""
    assert err.strip() == "Error: <stdin>:3: not JSON: Expecting value (2 memories before it were imported)"


# --- one-line errors ------------------------------------------------------------------------------


async def test_migrate_against_an_unreachable_database_is_one_line_naming_the_variable() -> None:
    env = {"IBEX_POSTGRES_DSN": "postgresql://ibex:s3cret-pw@127.0.0.1:1/ibex"}
    code, out, err = await cli("migrate", env=env)
    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert "IBEX_POSTGRES_DSN (127.0.0.1:1/ibex)" in err
    assert "Traceback" not in err and "s3cret-pw" not in err
    code, _, err = await cli("--debug", "migrate", env=env)
    assert code == 1 and "Traceback" in err


async def test_a_settings_error_names_the_ibex_variable_not_the_field_or_its_value() -> None:
    code, _, err = await cli("migrate", env={"IBEX_GRPC_PORT": "not-a-port", "IBEX_EMBEDDING_DIM": "-3"})
    assert code == 1
    assert len(err.strip().splitlines()) == 1, err
    assert "IBEX_GRPC_PORT: " in err and "IBEX_EMBEDDING_DIM: " in err
    assert "not-a-port" not in err and "Traceback" not in err


# --- assemble --require-full: what `helm test` runs ----------------------------------------------


async def test_require_full_passes_on_a_full_assembly(shared_service: ContextService, tenant: Tenant) -> None:
    code, _, err = await cli(
        "assemble", "--target", f"127.0.0.1:{shared_service.port}", *ids(tenant),
        "--timeout", "5", "--json", "--require-full", "--attempts", "3", "hello",
    )  # fmt: skip
    assert code == 0, err


async def test_require_full_fails_when_unreachable(tenant: Tenant) -> None:
    code, out, err = await cli(
        "assemble", "--target", UNREACHABLE, *ids(tenant), "--json", "--require-full", "hello",
    )  # fmt: skip
    assert code == 1
    assert "fallback_reason=client_unavailable" in err
    assert json.loads(out)["messages"] == [{"role": "user", "content": "hello"}]
    # Without the flag the same call succeeds, as the proxy's would.
    code, _, _ = await cli("assemble", "--target", UNREACHABLE, *ids(tenant), "hello")
    assert code == 0


async def test_require_full_fails_on_a_degraded_answer_after_every_attempt(
    start_service: StartService, throwaway_redis: RedisProcess, tenant: Tenant
) -> None:
    service = await start_service(redis_url=throwaway_redis.url)
    throwaway_redis.stop()
    code, out, err = await cli(
        "assemble", "--target", f"127.0.0.1:{service.port}", *ids(tenant),
        "--timeout", "5", "--json", "--require-full", "--attempts", "2", "hello",
    )  # fmt: skip
    assert code == 1
    metadata: dict[str, Any] = json.loads(out)["metadata"]
    assert metadata["fallbackReason"].startswith(("hot_", "directive_"))
    assert err.count("attempt 1: fallback_reason=") == 1
    assert f"fallback_reason={metadata['fallbackReason']}" in err.splitlines()[-1]
