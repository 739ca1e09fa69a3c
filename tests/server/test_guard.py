"""The credentials in force (``server/guard.py``'s CredentialsFile) and which methods the
guard checks. Calls refused and allowed over real sockets are test_auth.py's."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import pytest
from ibex_context.errors import ConfigurationError
from ibex_context.server.auth import METHOD_ROLES, Role, token_digest
from ibex_context.server.guard import CallGuard, CredentialsFile


def _principal(name: str, token: str, role: str = "read") -> str:
    return (
        f"principals:\n  - name: {name}\n    roles: [{role}]\n    token_sha256: {token_digest(token).hex()}\n"
    )


def _swap_in(path: Path, text: str) -> None:
    """As Kubernetes updates a mounted Secret: a new file renamed over the old one."""
    staged = path.with_suffix(".new")
    staged.write_text(text)
    os.replace(staged, path)


def test_a_missing_or_invalid_file_refuses_to_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot be read"):
        CredentialsFile(tmp_path / "absent.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("principals: [")
    with pytest.raises(ConfigurationError):
        CredentialsFile(broken)


def test_a_changed_file_is_in_force_after_one_reload(tmp_path: Path) -> None:
    path = tmp_path / "credentials.yaml"
    path.write_text(_principal("first", "token-1"))
    credentials = CredentialsFile(path)
    assert not credentials.reload_if_changed()  # unchanged

    _swap_in(path, _principal("second", "token-2", role="admin"))

    assert credentials.reload_if_changed()
    assert not credentials.reload_if_changed()
    assert credentials.reloads == 1
    assert token_digest("token-1") not in credentials.current.by_token_digest
    second = credentials.current.by_token_digest[token_digest("token-2")]
    assert second.name == "second" and Role.ADMIN in second.roles


def test_a_file_broken_by_an_edit_or_removed_refuses_every_credential_until_a_good_one_loads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Fails closed: a revocation with a typo must not leave the revoked token valid."""
    path = tmp_path / "credentials.yaml"
    path.write_text(_principal("revoked", "token-1"))
    loads: list[bool] = []
    credentials = CredentialsFile(path, on_load=loads.append)
    assert loads == [True] and credentials.loaded

    _swap_in(path, "principals:\n  - name: half written\n")

    assert not credentials.reload_if_changed()
    assert credentials.reloads == 0 and not credentials.loaded
    assert credentials.current.by_token_digest == {} and credentials.current.by_identity == {}
    assert loads == [True, False]
    assert "every credential is refused until a good file is loaded" in caplog.text
    assert token_digest("token-1").hex() not in caplog.text

    _swap_in(path, _principal("fixed", "token-3"))
    assert credentials.reload_if_changed() and credentials.loaded and loads[-1] is True
    assert list(credentials.current.by_token_digest) == [token_digest("token-3")]

    path.unlink()
    assert not credentials.reload_if_changed()
    assert credentials.current.by_token_digest == {} and loads[-1] is False


async def test_run_polls_the_file_until_cancelled(tmp_path: Path) -> None:
    path = tmp_path / "credentials.yaml"
    path.write_text(_principal("first", "token-1"))
    credentials = CredentialsFile(path, poll_seconds=0.01)
    poller = asyncio.create_task(credentials.run())
    try:
        _swap_in(path, _principal("second", "token-2"))
        for _ in range(200):
            if credentials.reloads:
                break
            await asyncio.sleep(0.01)
        assert token_digest("token-2") in credentials.current.by_token_digest
    finally:
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller


def test_every_method_is_guarded_but_grpc_health_and_reflection() -> None:
    guard = CallGuard(lambda: pytest.fail("no credentials are read to decide what is guarded"))
    assert all(guard.guards(path) for path in METHOD_ROLES)
    assert guard.guards("/ibex.context.v1.MemoryService/SomeNewMethod")  # fails closed
    assert not guard.guards("/grpc.health.v1.Health/Check")
    assert not guard.guards("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
