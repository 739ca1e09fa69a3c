"""The gRPC port's certificate files (``server/tls.py``): checked at start, and on a
handshake after they change, picked up only as a matching pair; a half-done rotation
keeps the pair in force. Real certificates, real files; the handshakes themselves are
tests/server/test_tls_rotation.py's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ibex_context.devtools.certs import Authority, Issued
from ibex_context.errors import ConfigurationError
from ibex_context.server.tls import ServerTls, TlsFiles


def _swap_in(path: Path, content: bytes) -> None:
    """As Kubernetes updates a mounted Secret: a new file renamed over the old one."""
    staged = path.with_suffix(path.suffix + ".new")
    staged.write_bytes(content)
    os.replace(staged, path)


@pytest.fixture
def authority() -> Authority:
    return Authority.create("test CA")


@pytest.fixture
def files(tmp_path: Path, authority: Authority) -> TlsFiles:
    cert, key = authority.server().write(tmp_path, "server")
    return TlsFiles(cert=cert, key=key)


def test_unreadable_or_mismatched_files_refuse_to_start(tmp_path: Path, authority: Authority) -> None:
    with pytest.raises(ConfigurationError, match="cannot read"):
        ServerTls(TlsFiles(cert=tmp_path / "missing.crt", key=tmp_path / "missing.key"))

    cert, _ = authority.server().write(tmp_path, "one")
    _, other_key = authority.server().write(tmp_path, "two")
    with pytest.raises(ConfigurationError, match="not usable"):
        ServerTls(TlsFiles(cert=cert, key=other_key))


def test_unchanged_files_keep_the_pair_in_force(files: TlsFiles) -> None:
    tls = ServerTls(files)
    assert tls._fetch() is None
    assert tls._fetch() is None
    assert tls.reloads == 0 and not tls.mutual


def test_a_rotated_pair_is_served_from_the_next_handshake_once(files: TlsFiles, authority: Authority) -> None:
    tls = ServerTls(files)
    renewed = authority.server()
    _swap_in(files.key, renewed.key_pem)
    _swap_in(files.cert, renewed.cert_pem)

    assert tls._fetch() is not None
    assert tls._fetch() is None  # picked up once, then in force
    assert tls.reloads == 1


def test_a_half_done_rotation_keeps_the_old_pair_until_the_key_arrives(
    files: TlsFiles, authority: Authority, caplog: pytest.LogCaptureFixture
) -> None:
    tls = ServerTls(files)
    renewed: Issued = authority.server()

    _swap_in(files.cert, renewed.cert_pem)  # the new certificate, the old key
    assert tls._fetch() is None
    assert tls.reloads == 0
    assert "not usable yet" in caplog.text

    _swap_in(files.key, renewed.key_pem)
    assert tls._fetch() is not None
    assert tls.reloads == 1


def test_a_client_ca_makes_it_mutual_and_must_be_a_certificate(
    tmp_path: Path, files: TlsFiles, authority: Authority
) -> None:
    ca = tmp_path / "clients.pem"
    ca.write_bytes(authority.cert_pem)
    assert ServerTls(TlsFiles(files.cert, files.key, client_ca=ca)).mutual

    ca.write_bytes(b"not a certificate")
    with pytest.raises(ConfigurationError):
        ServerTls(TlsFiles(files.cert, files.key, client_ca=ca))
