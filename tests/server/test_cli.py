"""The CLI against a real server: import JSONL, set a directive, assemble, health."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

import asyncpg
from ibex_context.server.app import ContextService

from tests.conftest import Tenant


async def _cli(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ibex_context",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_import_directive_and_assemble_round_trip(
    shared_service: ContextService, tenant: Tenant, tmp_path: Path
) -> None:
    target = f"127.0.0.1:{shared_service.port}"
    lines = [
        {"content": "The build server is called Falcon and lives in rack 7", "category": "factual"},
        {"content": "Prefer short answers with a code sample", "category": "preference", "confidence": 0.9},
    ]
    jsonl = tmp_path / "memories.jsonl"
    jsonl.write_text("\n".join(json.dumps(line) for line in lines) + "\n")

    code, out, err = await _cli(
        "import", str(jsonl), "--target", target, "--org", tenant.org_id, "--agent", tenant.agent_id
    )
    assert code == 0, err
    assert "imported 2 memories" in out

    code, out, err = await _cli(
        "directive",
        "set",
        "--target",
        target,
        "--org",
        tenant.org_id,
        "--agent",
        tenant.agent_id,
        "Always name the server.",
    )
    assert code == 0, err
    assert re.fullmatch(r"directive set \(version \d+\)\n", out), out

    code, out, err = await _cli(
        "assemble",
        "--target",
        target,
        "--org",
        tenant.org_id,
        "--agent",
        tenant.agent_id,
        "--json",
        "--timeout",
        "2",
        "where does the build server Falcon live?",
    )
    assert code == 0, err
    response = json.loads(out)
    system = response["messages"][0]
    assert system["role"] == "system"
    assert "Always name the server." in system["content"]
    assert "rack 7" in system["content"]
    assert response["messages"][-1]["content"] == "where does the build server Falcon live?"

    code, out, _ = await _cli("health", "--target", target)
    assert code == 0 and out.strip() == "SERVING"


async def test_import_keeps_each_memorys_occurred_at(
    shared_service: ContextService, postgres_dsn: str, tenant: Tenant, tmp_path: Path
) -> None:
    jsonl = tmp_path / "history.jsonl"
    jsonl.write_text(
        json.dumps(
            {"content": "Moved to Porto", "category": "episodic", "occurred_at": "2023-05-08T13:56:00Z"}
        )
        + "\n"
    )
    code, _, err = await _cli(
        "import", str(jsonl), "--target", f"127.0.0.1:{shared_service.port}",
        "--org", tenant.org_id, "--agent", tenant.agent_id,
    )  # fmt: skip
    assert code == 0, err
    conn = await asyncpg.connect(postgres_dsn)
    try:
        stored = await conn.fetchval(
            "SELECT extract(epoch FROM occurred_at)::float8 FROM memories"
            " WHERE org_id = $1 AND agent_id = $2",
            tenant.org_id,
            tenant.agent_id,
        )
    finally:
        await conn.close()
    assert stored == 1_683_554_160.0


async def test_import_rejects_a_bad_line_naming_it(shared_service: ContextService, tmp_path: Path) -> None:
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text('{"content": "fine", "category": "factual"}\nnot json\n')
    code, _, err = await _cli(
        "import",
        str(jsonl),
        "--target",
        f"127.0.0.1:{shared_service.port}",
        "--org",
        "0b6f7a4e-8f1c-4b53-9a51-5b1a3c7c2d01",
        "--agent",
        "5d2e9c1a-3b4f-4e6a-8c7d-9f0a1b2c3d11",
    )
    assert code != 0
    assert "bad.jsonl:2: not JSON" in err


async def test_assemble_against_nothing_listening_falls_back_without_failing() -> None:
    code, out, err = await _cli(
        "assemble",
        "--target",
        "127.0.0.1:1",
        "--org",
        "0b6f7a4e-8f1c-4b53-9a51-5b1a3c7c2d01",
        "--agent",
        "5d2e9c1a-3b4f-4e6a-8c7d-9f0a1b2c3d11",
        "hello",
    )
    assert code == 0, err
    assert "fallback_reason=client_unavailable" in out
    assert "hello" in out


async def test_a_dns_target_is_accepted_as_the_client_parses_it(
    shared_service: ContextService, tenant: Tenant
) -> None:
    target = f"dns:///127.0.0.1:{shared_service.port}"
    code, out, err = await _cli("health", "--target", target)
    assert code == 0, err
    assert out.strip() == "SERVING"

    code, out, err = await _cli(
        "directive", "set", "--target", target, "--org", tenant.org_id, "--agent", tenant.agent_id,
        "Answer in French.",
    )  # fmt: skip
    assert code == 0, err
    code, out, err = await _cli(
        "assemble", "--target", target, "--org", tenant.org_id, "--agent", tenant.agent_id,
        "--json", "--timeout", "2", "bonjour",
    )  # fmt: skip
    assert code == 0, err
    response = json.loads(out)
    # The service answered through the dns:/// target (the directive is its doing). Whether
    # the memories also made the 40 ms deadline depends on the machine's load, not the target.
    assert "Answer in French." in response["messages"][0]["content"]
    assert response["metadata"]["directiveInjected"] is True


async def test_a_target_the_client_cannot_parse_is_a_usage_error() -> None:
    code, _, err = await _cli("health", "--target", "127.0.0.1:notaport")
    assert code == 2
    assert "port 'notaport' is not a number" in err
