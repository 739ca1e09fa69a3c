"""What a client presents: TLS (the CA that verifies the server, optionally its own
certificate for mutual TLS) and a bearer token, from flags or ``IBEX_TLS_*`` /
``IBEX_TOKEN`` (docs/security.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

__all__ = ["ClientCredentials", "bearer_metadata"]


def _read(path: Path | None) -> str | None:
    # A token file that is not there (an optional Secret not created) sends no token: the
    # server's UNAUTHENTICATED then says what is missing.
    if path is None or not path.is_file():
        return None
    return path.read_text().strip() or None


def bearer_metadata(token: str | None) -> dict[str, str]:
    """The call metadata carrying ``token`` (empty without one)."""
    return {"authorization": f"Bearer {token}"} if token else {}


@dataclass(frozen=True)
class ClientCredentials:
    ca_file: Path | None = None  # set: TLS, the server verified against this bundle
    cert_file: Path | None = None  # with key_file: this client's certificate (mutual TLS)
    key_file: Path | None = None
    token: str | None = None
    tls: bool = False  # TLS with the system's CAs when no ca_file is given

    def __repr__(self) -> str:  # never print the token
        return (
            f"ClientCredentials(ca_file={self.ca_file}, cert_file={self.cert_file}, "
            f"key_file={self.key_file}, token={'set' if self.token else None}, tls={self.tls})"
        )

    def with_overrides(
        self,
        *,
        ca_file: Path | None = None,
        cert_file: Path | None = None,
        key_file: Path | None = None,
        token_file: Path | None = None,
        tls: bool = False,
    ) -> ClientCredentials:
        """These credentials with the given flags in place of what they replace."""
        return ClientCredentials(
            ca_file=ca_file or self.ca_file,
            cert_file=cert_file or self.cert_file,
            key_file=key_file or self.key_file,
            token=token_file.read_text().strip() if token_file is not None else self.token,
            tls=tls or self.tls,
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> ClientCredentials:
        def path(name: str) -> Path | None:
            return Path(env[name]) if env.get(name) else None

        return cls(
            ca_file=path("IBEX_TLS_CA"),
            cert_file=path("IBEX_TLS_CERT"),
            key_file=path("IBEX_TLS_KEY"),
            token=env.get("IBEX_TOKEN") or _read(path("IBEX_TOKEN_FILE")),
            tls=env.get("IBEX_TLS", "").lower() in ("1", "true", "yes"),
        )

    @property
    def uses_tls(self) -> bool:
        return self.tls or self.ca_file is not None or self.cert_file is not None

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """grpcio's TLS credentials (the server verified against ``ca_file``, or the
        system's CAs; this client's certificate for mutual TLS), or None for plaintext."""
        if not self.uses_tls:
            return None
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("a client certificate needs both its certificate and its key file")
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_file.read_bytes() if self.ca_file is not None else None,
            private_key=self.key_file.read_bytes() if self.key_file is not None else None,
            certificate_chain=self.cert_file.read_bytes() if self.cert_file is not None else None,
        )
