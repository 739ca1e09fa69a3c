"""The check every served method runs before its handler: who is calling, may they.

``server/rpc.py`` calls ``CallGuard.check`` after parsing the request (the org check
needs its ``org_id``) and before the handler, so a refused call reads and writes
nothing. A refusal ends the call with UNAUTHENTICATED (no credential, or one nobody
issued) or PERMISSION_DENIED (wrong role, or another org), is counted by method and
reason (no ids), and logged with the principal's label only: never a token, a digest
or a tenant id.

The credentials come from a file (a mounted Secret) that ``CredentialsFile`` reloads
when it changes; a file that no longer parses leaves the last good credentials in
force and is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import grpc

from ibex_context.errors import ConfigurationError
from ibex_context.server.auth import (
    METHOD_ROLES,
    Credentials,
    Principal,
    Refusal,
    Role,
    authorize,
    parse_credentials,
    token_digest,
)
from ibex_context.server.rpc import CallError, Context

log = logging.getLogger(__name__)

__all__ = ["CallGuard", "CredentialsFile"]

_BEARER = "bearer "
# Reached without credentials: probes (health) and tools (reflection).
OPEN_PREFIXES = ("/grpc.health.", "/grpc.reflection.")
UNAUTHENTICATED_DETAIL = (
    "authentication required: send 'authorization: Bearer <token>' or a client certificate"
)
_STATUS = {
    Refusal.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Refusal.ROLE: grpc.StatusCode.PERMISSION_DENIED,
    Refusal.ORG: grpc.StatusCode.PERMISSION_DENIED,
}

RefusalSink = Callable[[str, Refusal], None]


class CredentialsFile:
    """The credentials in force, from ``path``; ``run()`` reloads them when the file changes.

    Kubernetes updates a mounted Secret by swapping a symlink: the file's ``stat``
    (followed) changes, which is what is polled.
    """

    def __init__(self, path: Path, *, poll_seconds: float = 1.0) -> None:
        self._path = path
        self._poll_seconds = poll_seconds
        self._signature = self._stat()
        if self._signature is None:
            raise ConfigurationError(f"auth_credentials_file: {path} cannot be read")
        self.current: Credentials = parse_credentials(path.read_text(), source=str(path))
        self.reloads = 0

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self._path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def reload_if_changed(self) -> bool:
        """Reads the file again if it changed; True if new credentials are in force."""
        signature = self._stat()
        if signature is None or signature == self._signature:
            return False
        self._signature = signature
        try:
            credentials = parse_credentials(self._path.read_text(), source=str(self._path))
        except (ConfigurationError, OSError, UnicodeDecodeError) as exc:
            log.error("credentials file not reloaded, the previous credentials stay in force: %s", exc)
            return False
        self.current = credentials
        self.reloads += 1
        log.info("credentials reloaded: %d principals", credentials.principal_count)
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._poll_seconds)
            with contextlib.suppress(Exception):
                self.reload_if_changed()


class CallGuard:
    """Refuses, before its handler runs, a call whose caller may not make it."""

    def __init__(
        self,
        credentials: Callable[[], Credentials],
        *,
        on_refused: RefusalSink | None = None,
        method_roles: Mapping[str, Role] = METHOD_ROLES,
    ) -> None:
        self._credentials = credentials
        self._on_refused = on_refused
        self._roles = method_roles

    def guards(self, path: str) -> bool:
        """Every method but gRPC's own health and reflection: fails closed, so a method
        added to a service without a role in ``METHOD_ROLES`` is refused, not opened."""
        return not path.startswith(OPEN_PREFIXES)

    def check(self, path: str, request: Any, context: Context) -> Principal:
        """The caller, if it may make this call; else raises ``CallError``."""
        principal = self.identify(context)
        role = self._roles.get(path)
        if role is None:
            log.error("refused %s: the method has no role (METHOD_ROLES)", path.rsplit("/", 1)[-1])
            raise CallError(
                grpc.StatusCode.PERMISSION_DENIED, "permission denied: no role may call this method"
            )
        refusal = authorize(principal, role, request.org_id)
        if refusal is None:
            assert principal is not None
            return principal
        if self._on_refused is not None:
            self._on_refused(path, refusal)
        method = path.rsplit("/", 1)[-1]
        if refusal is Refusal.UNAUTHENTICATED:
            log.warning("refused %s: %s", method, refusal.value)
            raise CallError(_STATUS[refusal], UNAUTHENTICATED_DETAIL)
        assert principal is not None
        log.warning("refused %s for principal %s: %s", method, principal.name, refusal.value)
        detail = (
            f"permission denied: {method} needs the role {self._roles[path].value}"
            if refusal is Refusal.ROLE
            else "permission denied: this credential is bound to another org"
        )
        raise CallError(_STATUS[refusal], detail)

    def identify(self, context: Context) -> Principal | None:
        """The principal of a bearer token if one is sent (a wrong token is not made
        good by a certificate), else of the verified client certificate, else None."""
        credentials = self._credentials()
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                if not isinstance(value, str) or value[:7].lower() != _BEARER:
                    return None
                return credentials.by_token_digest.get(token_digest(value[7:].strip()))
        if not credentials.by_identity:
            return None
        for identity in context.peer_identities() or ():
            principal = credentials.by_identity.get(identity.decode("utf-8", "replace"))
            if principal is not None:
                return principal
        return None
