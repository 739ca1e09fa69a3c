"""TLS of the gRPC port: certificate and key from files, picked up when they change.

grpc's dynamic SSL server credentials ask a fetcher for a new configuration on every
handshake; the fetcher here answers from the files' ``stat`` (cheap) and reads them
again only when one changed, so a rotated certificate (cert-manager renewing the
Secret, which Kubernetes swaps in atomically) serves the next connection without a
restart. Connections already open keep the certificate they were made with.

A half-written pair (the key of the new certificate not yet there) is not served:
the pair is checked to match before it replaces the one in force.

With ``client_ca`` set, every client must present a certificate that the CA bundle
verifies (mutual TLS); its identity (subject alternative names, else common name) is
what ``tls_identities`` in the credentials file match.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc

from ibex_context.errors import ConfigurationError

log = logging.getLogger(__name__)

__all__ = ["ServerTls", "TlsFiles"]


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path
    client_ca: Path | None = None  # set: mutual TLS, clients verified against this bundle

    def paths(self) -> tuple[Path, ...]:
        return (self.cert, self.key) if self.client_ca is None else (self.cert, self.key, self.client_ca)


Signature = tuple[tuple[int, int, int], ...]


class ServerTls:
    """The server credentials for ``files``; ``reloads`` counts pairs picked up since start."""

    def __init__(self, files: TlsFiles) -> None:
        self._files = files
        self._lock = threading.Lock()
        self.reloads = 0
        signature = self._signature()
        if signature is None:
            raise ConfigurationError(f"tls: cannot read {', '.join(map(str, files.paths()))}")
        self._signature_in_force = signature
        try:
            self._initial = self._configuration()
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise ConfigurationError(f"tls: certificate, key or CA not usable: {exc}") from None

    @property
    def mutual(self) -> bool:
        return self._files.client_ca is not None

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._initial, self._fetch, require_client_authentication=self.mutual
        )

    def _signature(self) -> Signature | None:
        try:
            stats = [os.stat(path) for path in self._files.paths()]
        except OSError:
            return None
        return tuple((st.st_ino, st.st_size, st.st_mtime_ns) for st in stats)

    def _configuration(self) -> grpc.ServerCertificateConfiguration:
        files = self._files
        cert, key = files.cert.read_bytes(), files.key.read_bytes()
        # Refuses a key that does not belong to the certificate (a rotation half done).
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(files.cert, files.key)
        root = files.client_ca.read_bytes() if files.client_ca is not None else None
        if root is not None:
            ssl.create_default_context(cadata=root.decode("ascii"))
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=root)

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """Called by gRPC's core on each handshake: a new configuration, or None to keep the current."""
        try:
            signature = self._signature()
            if signature is None or signature == self._signature_in_force:
                return None
            with self._lock:
                if signature == self._signature_in_force:
                    return None
                configuration = self._configuration()
                self._signature_in_force = signature
                self.reloads += 1
            log.info("TLS certificate reloaded from its files")
            return configuration
        except Exception as exc:
            # Not yet complete (or broken): keep serving the pair in force, try again next handshake.
            log.warning("TLS files changed but are not usable yet, keeping the current pair: %s", exc)
            return None
