"""The decision and the credentials file, as pure functions (server/auth.py)."""

from __future__ import annotations

import uuid

import pytest
from ibex_context.errors import ConfigurationError
from ibex_context.server.auth import Principal, Refusal, Role, authorize, parse_credentials, token_digest

ORG = str(uuid.uuid4())


def test_no_principal_is_unauthenticated() -> None:
    assert authorize(None, Role.READ, ORG) is Refusal.UNAUTHENTICATED


def test_a_principal_needs_the_methods_role_and_no_role_implies_another() -> None:
    admin = Principal("ops", frozenset({Role.ADMIN}))
    assert authorize(admin, Role.ADMIN, ORG) is None
    assert authorize(admin, Role.READ, ORG) is Refusal.ROLE


def test_a_bound_principal_acts_for_its_org_only_in_any_spelling_of_it() -> None:
    bound = Principal("tenant", frozenset({Role.READ}), org_id=ORG)
    assert authorize(bound, Role.READ, ORG) is None
    assert authorize(bound, Role.READ, ORG.upper()) is None
    assert authorize(bound, Role.READ, str(uuid.uuid4())) is Refusal.ORG
    assert authorize(bound, Role.READ, "not-a-uuid") is Refusal.ORG
    assert authorize(bound, Role.READ, "") is Refusal.ORG


def test_the_file_maps_token_digests_and_identities_to_principals() -> None:
    credentials = parse_credentials(
        f"""
principals:
  - name: proxy
    roles: [assemble]
    token_sha256: [{token_digest("a").hex()}, {token_digest("b").hex()}]
    tls_identities: [proxy.ibex]
  - name: tenant
    roles: [read, write]
    org_id: "{ORG.upper()}"
    token_sha256: {token_digest("c").hex()}
"""
    )
    proxy = credentials.by_token_digest[token_digest("a")]
    assert proxy is credentials.by_token_digest[token_digest("b")] is credentials.by_identity["proxy.ibex"]
    assert proxy.roles == {Role.ASSEMBLE} and proxy.org_id is None
    tenant = credentials.by_token_digest[token_digest("c")]
    assert tenant.roles == {Role.READ, Role.WRITE} and tenant.org_id == ORG
    assert credentials.principal_count == 2


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("principals: [broken", "not valid YAML"),
        ("- a\n- b", "'principals' list"),
        ("principals:\n  - {roles: [read], token_sha256: [" + "0" * 64 + "]}", "principals[0].name"),
        (
            "principals:\n  - {name: a, roles: [root], token_sha256: [" + "0" * 64 + "]}",
            "principals[0].roles",
        ),
        ("principals:\n  - {name: a, roles: [], token_sha256: [" + "0" * 64 + "]}", "principals[0].roles"),
        ("principals:\n  - {name: a, roles: [read], token_sha256: [abc]}", "principals[0].token_sha256"),
        ("principals:\n  - {name: a, roles: [read]}", "token_sha256 or tls_identities"),
        (
            "principals:\n  - {name: a, roles: [read], org_id: acme, tls_identities: [x]}",
            "principals[0].org_id",
        ),
        ("principals:\n  - {name: a, roles: [read], tls_identities: [x], token: y}", "unknown fields"),
        (
            "principals:\n  - {name: a, roles: [read], tls_identities: [x]}\n"
            "  - {name: b, roles: [admin], tls_identities: [x]}",
            "principals[1].tls_identities",
        ),
    ],
)
def test_a_bad_file_is_refused_naming_the_entry_and_field_without_echoing_values(
    text: str, names: str
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        parse_credentials(text, source="creds.yaml")
    assert names in str(refused.value)
    assert "0" * 64 not in str(refused.value)


def test_token_new_prints_a_token_and_the_digest_the_file_stores() -> None:
    from click.testing import CliRunner
    from ibex_context.cli import main

    result = CliRunner().invoke(main, ["token", "new"])
    assert result.exit_code == 0, result.output
    lines = dict(line.split(":", 1) for line in result.output.strip().splitlines())
    value, digest = lines["token"].strip(), lines["sha256"].strip()
    assert len(value) >= 43 and token_digest(value).hex() == digest


def test_the_guard_fails_closed_for_a_method_without_a_role() -> None:
    import grpc
    from ibex_context.server.auth import Credentials
    from ibex_context.server.guard import CallGuard
    from ibex_context.server.rpc import CallError

    everything = Principal("ops", frozenset(Role))
    token = "t" * 43
    guard = CallGuard(lambda: Credentials({token_digest(token): everything}, {}))

    class Context:
        def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
            return (("authorization", f"Bearer {token}"),)

    class Request:
        org_id = ORG

    assert not guard.guards("/grpc.health.v1.Health/Check")
    assert not guard.guards("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo")
    assert guard.guards("/ibex.context.v1.MemoryService/SomethingNew")
    assert guard.check("/ibex.context.v1.MemoryService/PurgeOrg", Request(), Context()) is everything  # type: ignore[arg-type]
    with pytest.raises(CallError) as refused:
        guard.check("/ibex.context.v1.MemoryService/SomethingNew", Request(), Context())  # type: ignore[arg-type]
    assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED


def test_serve_without_credentials_refuses_to_start_and_says_how() -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("IBEX_")}
    done = subprocess.run(
        [sys.executable, "-m", "ibex_context", "serve"],
        env={**env, "IBEX_GRPC_PORT": "0", "IBEX_METRICS_PORT": "0"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "IBEX_AUTH_CREDENTIALS_FILE" in done.stderr and "IBEX_AUTH_ENABLED=false" in done.stderr
    assert "Traceback" not in done.stderr
